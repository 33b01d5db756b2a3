"""Train the target and its MTP layer on the task; write the checkpoint vLLM loads.

``python -m draftmeta.integrations.vllm.tools.e2e.trained.train --out FOLDER`` trains in plain
torch on
two CPU threads, deterministically from ``--seed``, and writes ``config.json``,
``model.safetensors`` (bf16, DeepSeek-V3 names) and ``train-log.txt`` (loss curve, accuracies,
the reference draft loop's acceptance and the simulated metadata bugs' effect, wall time).

The MTP layer is trained the way vLLM uses it with ``K > 1`` and one MTP layer: its first step
on the target's normed hidden state, then chained on its own post-norm hidden state
(:meth:`~draftmeta.integrations.vllm.tools.e2e.trained.reference.Reference.mtp_chain`, unrolled over
``mtp_steps`` steps), with teacher-forced tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F

from draftmeta.integrations.vllm.tools.e2e.trained.draft_loop import (
    BUG_KINDS,
    Bug,
    DraftStats,
    speculative_generate,
)
from draftmeta.integrations.vllm.tools.e2e.trained.reference import (
    ModelConfig,
    Reference,
    checkpoint_tensors,
    load_reference,
    new_model,
)
from draftmeta.integrations.vllm.tools.e2e.trained.task import (
    DEFAULT_TASK,
    EVAL_MAX_TOKENS,
    EVAL_PROMPTS,
    Task,
)

__all__ = [
    "DEFAULT_SETTINGS",
    "DEFAULT_SHAPE",
    "TrainSettings",
    "CANDIDATES",
    "bug_table",
    "compare_candidates",
    "main",
    "run_bug",
    "train",
    "write_checkpoint",
]

DEFAULT_SHAPE = ModelConfig(
    vocab_size=DEFAULT_TASK.vocab_size, hidden_size=128, intermediate_size=384,
    num_attention_heads=2, q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=64,
    qk_rope_head_dim=64, v_head_dim=128)
"""The shipped model's shape: 2 layers + the MTP layer, hidden 128, 2 heads, MLA with
``kv_lora_rank`` 512 and ``qk_rope_head_dim`` 64 (the CPU MLA kernel's 576-wide cache)."""

@attrs.frozen
class TrainSettings:
    """How to train.

    Attributes:
        steps: optimizer steps.
        batch: sequences per step.
        length: tokens per sequence.
        lr: peak learning rate (AdamW, linear warm-up, cosine decay to 10%).
        warmup: warm-up steps.
        mtp_steps: MTP steps unrolled (the chained draft steps trained).
        mtp_weight: loss weight of each MTP step (the target's is 1).
        hidden_noise: probability that the MTP's hidden input is another row's.
        chain_hidden_noise: the same at the chained steps (the recycled hidden), if not
            ``hidden_noise``.
        token_noise: probability that the MTP's residual stream gets another row's token
            (attention still sees the right one).
        seed: seed of the initialisation and the data stream.
        threads: torch CPU threads.
    """

    steps: int = 1500
    batch: int = 32
    length: int = 64
    lr: float = 3e-3
    warmup: int = 50
    mtp_steps: int = 3
    mtp_weight: float = 1.0
    hidden_noise: float = 0.0
    chain_hidden_noise: float | None = None
    token_noise: float = 0.0
    seed: int = 0
    threads: int = 2


def _lr(settings: TrainSettings, step: int) -> float:
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(settings.steps - settings.warmup, 1)
    return settings.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def losses(model: Reference, tokens: torch.Tensor, mtp_steps: int, hidden_noise: float = 0.0,
           generator: torch.Generator | None = None, token_noise: float = 0.0,
           chain_hidden_noise: float | None = None) -> list[torch.Tensor]:
    """Cross-entropy of the target (first) and of each MTP step on ``tokens`` ``[B, T]``."""
    hidden, logits = model.target(tokens)
    out = [F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())]
    for j, step_logits in enumerate(model.mtp_chain(tokens, hidden, mtp_steps, hidden_noise,
                                                    generator, token_noise,
                                                    chain_hidden_noise)):
        out.append(F.cross_entropy(step_logits[:, :-1].flatten(0, 1),
                                   tokens[:, j + 2:].flatten()))
    return out


@torch.no_grad()
def accuracies(model: Reference, task: Task, mtp_steps: int, seed: int = 1234
               ) -> list[float]:
    """Greedy accuracy of the target (first) and each chained MTP step on noise-free held-out
    sequences (positions whose prediction the table determines)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = task.sequences(64, 64, generator, noise=0.0)
    hidden, logits = model.target(tokens)
    start = max(task.lags) + 1  # the first token the table determines
    acc = [(logits[:, start - 1:-1].argmax(-1) == tokens[:, start:]).float().mean().item()]
    for j, step_logits in enumerate(model.mtp_chain(tokens, hidden, mtp_steps)):
        # row i predicts tokens[:, i + j + 2]
        first = max(start - j - 2, 0)
        pred = step_logits[:, first:-1].argmax(-1)
        acc.append((pred == tokens[:, first + j + 2:]).float().mean().item())
    return acc


def train(task: Task, shape: ModelConfig, settings: TrainSettings,
          log: Callable[[str], None] = print) -> Reference:
    """A model trained on ``task`` (deterministic in ``settings.seed`` and thread count)."""
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    model = new_model(shape, settings.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    other = [p for n, p in model.named_parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": other, "weight_decay": 0.0}],
                                  lr=settings.lr, betas=(0.9, 0.98))
    data = torch.Generator().manual_seed(settings.seed + 1)
    noise = torch.Generator().manual_seed(settings.seed + 2)
    start = time.perf_counter()
    running: list[float] = []
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr(settings, step)
        tokens = task.sequences(settings.batch, settings.length, data)
        parts = losses(model, tokens, settings.mtp_steps, settings.hidden_noise, noise,
                       settings.token_noise, settings.chain_hidden_noise)
        loss = parts[0] + settings.mtp_weight * sum(parts[1:], torch.zeros(()))
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        values = [float(p.detach()) for p in parts]
        running = values if not running else [
            0.9 * r + 0.1 * v for r, v in zip(running, values)]
        if step % 100 == 0 or step == settings.steps - 1:
            log(f"step {step:5d}  {time.perf_counter() - start:6.1f}s  lr {_lr(settings, step):.2e}"
                f"  loss target {running[0]:.3f}  mtp "
                + " ".join(f"{r:.3f}" for r in running[1:]))
    return model.eval()


def run_bug(model: Reference, prompts: Sequence[Sequence[int]], k: int, bug: Bug | None,
            max_tokens: int = EVAL_MAX_TOKENS, one_per_batch: bool = False) -> DraftStats:
    """The reference draft loop over ``prompts`` with ``bug``: all prompts in one batch, or each
    alone (``one_per_batch``: every request is then the batch's longest), counts summed."""
    if not one_per_batch:
        return speculative_generate(model, prompts, k, max_tokens, bug)
    total = DraftStats(k=k, accepted_per_position=[0] * k)
    for prompt in prompts:
        stats = speculative_generate(model, [prompt], k, max_tokens, bug)
        total.drafts += stats.drafts
        total.accepted_per_position = [
            a + b for a, b in zip(total.accepted_per_position, stats.accepted_per_position)]
        total.outputs += stats.outputs
        total.proposals += stats.proposals
    return total


def bug_table(model: Reference, prompts: Sequence[Sequence[int]], ks: Sequence[int] = (3, 4),
              max_tokens: int = EVAL_MAX_TOKENS) -> list[dict[str, object]]:
    """Per K, the clean acceptance and each simulated bug's (from draft step 1 and from step
    2 on): rows with ``k``, ``bug`` (``"none"`` or ``kind@first_step``; ``max_seq_len`` twice:
    the prompts in one batch, and one prompt per batch, marked ``/1``), acceptance rate, mean
    acceptance length and acceptance per position."""
    rows: list[dict[str, object]] = []
    for k in ks:
        cases: list[tuple[Bug | None, bool]] = [(None, False)]
        for first in (1, 2):
            if first < k:
                cases += [(Bug(kind, first), False) for kind in BUG_KINDS]
                cases.append((Bug("max_seq_len", first), True))
        for bug, alone in cases:
            stats = run_bug(model, prompts, k, bug, max_tokens, alone)
            name = "none" if bug is None else f"{bug.kind}@{bug.first_step}"
            rows.append({
                "k": k,
                "bug": name + ("/1" if alone else ""),
                "acceptance": round(stats.acceptance_rate, 4),
                "mean_length": round(stats.mean_acceptance_length, 3),
                "per_position": [round(a, 3) for a in stats.acceptance_per_position],
            })
    return rows


def format_bug_table(rows: Sequence[dict[str, object]]) -> list[str]:
    """``bug_table``'s rows as aligned text lines."""
    lines = [f"{'K':>2} {'bug':<16} {'accept':>7} {'mean len':>8}  per position"]
    for row in rows:
        lines.append(f"{row['k']:>2} {row['bug']!s:<16} {row['acceptance']:>7.3f} "
                     f"{row['mean_length']:>8.3f}  {row['per_position']}")
    return lines


def write_checkpoint(model: Reference, folder: Path) -> None:
    """``config.json`` and ``model.safetensors`` (bf16) of ``model`` into ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.hf_config("bfloat16")
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    save_file(checkpoint_tensors(model, torch.bfloat16), str(folder / "model.safetensors"),
              metadata={"format": "pt"})


DEFAULT_SETTINGS = TrainSettings(steps=900, hidden_noise=0.5, token_noise=0.5)
"""How the shipped checkpoint was trained."""

CANDIDATES: dict[str, tuple[Task, TrainSettings]] = {
    "A lags (1,2), 16 symbols, plain": (Task(16, (1, 2)), TrainSettings(steps=600)),
    "B lags (1,2), 16 symbols, hidden noise 0.5": (
        Task(16, (1, 2)), TrainSettings(steps=600, hidden_noise=0.5)),
    "C lags (1,2), 16 symbols, hidden noise 0.5, token noise 0.5": (
        Task(16, (1, 2)), TrainSettings(steps=600, hidden_noise=0.5, token_noise=0.5)),
    "D lags (1,2,3), 8 symbols, hidden noise 0.5, token noise 0.5": (
        Task(8, (1, 2, 3)), TrainSettings(steps=600, hidden_noise=0.5, token_noise=0.5)),
    "E lags (1,2), 16 symbols, hidden noise 0.5, token noise 0.25": (
        Task(16, (1, 2)), TrainSettings(steps=600, hidden_noise=0.5, token_noise=0.25)),
    "F lags (1,2), 16 symbols, hidden noise 0.5 (1.0 at chained steps), token noise 0.5": (
        Task(16, (1, 2)), TrainSettings(steps=600, hidden_noise=0.5, chain_hidden_noise=1.0,
                                        token_noise=0.5)),
}
"""The recipes compared before the shipped one was chosen (600 steps each)."""


def _bf16(model: Reference) -> Reference:
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).to(param.dtype))
    return model


def compare_candidates(log: Callable[[str], None] = print,
                       names: Sequence[str] | None = None) -> None:
    """Train each of :data:`CANDIDATES` (or those named) and log its accuracies and bug
    table (weights rounded to bf16, as shipped)."""
    for name, (task, settings) in CANDIDATES.items():
        if names and name.split()[0] not in names:
            continue
        start = time.perf_counter()
        shape = attrs.evolve(DEFAULT_SHAPE, vocab_size=task.vocab_size)
        model = _bf16(train(task, shape, settings, log=lambda line: None))
        acc = accuracies(model, task, settings.mtp_steps)
        log(f"candidate {name}: {settings.steps} steps in {time.perf_counter() - start:.0f} s;"
            f" accuracy target {acc[0]:.3f}, MTP steps " + " ".join(f"{a:.3f}" for a in acc[1:]))
        for line in format_bug_table(bug_table(model, task.prompts(EVAL_PROMPTS, seed=0))):
            log(f"  {line}")


def main(argv: Sequence[str] | None = None) -> int:
    """Train, write the checkpoint and the log into ``--out``; returns the exit status.

    ``--compare``: instead, train the :data:`CANDIDATES` and write ``candidates-log.txt``.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="checkpoint folder (created)")
    parser.add_argument("--steps", type=int, default=DEFAULT_SETTINGS.steps)
    parser.add_argument("--seed", type=int, default=DEFAULT_SETTINGS.seed)
    parser.add_argument("--compare", nargs="*", metavar="LETTER",
                        help="train the candidate recipes (all, or those lettered) instead")
    args = parser.parse_args(argv)
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(DEFAULT_SETTINGS.threads)
    if args.compare is not None:
        compare_candidates(log, args.compare)
        (args.out / "candidates-log.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return 0
    settings = attrs.evolve(DEFAULT_SETTINGS, steps=args.steps, seed=args.seed)
    start = time.perf_counter()
    log(f"task: {DEFAULT_TASK}")
    log(f"shape: {DEFAULT_SHAPE}")
    log(f"settings: {settings}")
    log(f"torch {torch.__version__}, {settings.threads} threads")
    model = train(DEFAULT_TASK, DEFAULT_SHAPE, settings, log)
    log(f"training wall time: {time.perf_counter() - start:.1f} s")
    write_checkpoint(model, args.out)
    size = (args.out / "model.safetensors").stat().st_size
    params = sum(p.numel() for p in model.parameters())
    log(f"checkpoint: {params} parameters (+ the MTP layer's embedding and head copies), "
        f"bf16, model.safetensors {size} bytes")
    stored = load_reference(args.out)
    log("evaluation: the stored bf16 weights, computed in float32 by the reference")
    acc = accuracies(stored, DEFAULT_TASK, settings.mtp_steps)
    log("greedy accuracy on noise-free held-out data: target "
        f"{acc[0]:.4f}, MTP steps " + " ".join(f"{a:.4f}" for a in acc[1:]))
    prompts = DEFAULT_TASK.prompts(EVAL_PROMPTS, seed=0)
    log(f"reference draft loop: {EVAL_PROMPTS} prompts (task.prompts(16, seed=0)), "
        f"{EVAL_MAX_TOKENS} tokens each, greedy; bug@1: stale from draft step 1 on (GPU hook), "
        "bug@2: from step 2 on (CPU plugin); max_seq_len/1: one prompt per batch")
    for line in format_bug_table(bug_table(stored, prompts)):
        log(line)
    for recycle in ("post_norm", "pre_norm"):
        stats = speculative_generate(stored, prompts, 3, EVAL_MAX_TOKENS, recycle=recycle)
        log(f"K=3, MTP hidden recycled {recycle}: acceptance {stats.acceptance_rate:.3f}, "
            f"mean length {stats.mean_acceptance_length:.3f}"
            + (" (as vLLM does)" if recycle == "post_norm" else " (not any release)"))
    log(f"total wall time: {time.perf_counter() - start:.1f} s")
    log("the recipes compared before this one was chosen: candidates-log.txt (recipe C, "
        "trained longer, is this one)")
    (args.out / "train-log.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
