"""The shipped trained checkpoint: it loads, its drafts are accepted, training is deterministic,
and every simulated draft-metadata bug costs at least the margin it claims (no vLLM needed).

Each check is a function that raises ``AssertionError`` on a bad input, and each has a negative
control here: the same check run on a deliberately broken input must fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch

from draftmeta.integrations.vllm.tools.e2e.trained import (
    CHECKPOINT,
    MAX_TOKENS,
    MIN_ACCEPTANCE,
    SENSITIVITY,
    TASK,
    prompts,
)
from draftmeta.integrations.vllm.tools.e2e.trained.draft_loop import Bug, speculative_generate
from draftmeta.integrations.vllm.tools.e2e.trained.reference import (
    ModelConfig,
    Reference,
    checkpoint_tensors,
    load_reference,
)
from draftmeta.integrations.vllm.tools.e2e.trained.train import (
    TrainSettings,
    run_bug,
    train,
    write_checkpoint,
)

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def model() -> Reference:
    return load_reference(CHECKPOINT)


# -- the checkpoint ----------------------------------------------------------------------------

def _expected_names(c: ModelConfig) -> set[str]:
    """The tensor names vLLM's DeepSeek-V3 loaders read for this shape."""
    attn = ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
            "kv_b_proj", "o_proj"]
    block = [f"self_attn.{a}.weight" for a in attn] + [
        "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "mlp.down_proj.weight"]
    n = c.num_hidden_layers
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    names |= {f"model.layers.{i}.{b}" for i in range(n + 1) for b in block}
    names |= {f"model.layers.{n}.{m}.weight" for m in (
        "enorm", "hnorm", "eh_proj", "embed_tokens", "shared_head.norm", "shared_head.head")}
    return names


def check_checkpoint(folder: Path) -> Reference:
    """Load ``folder`` into the reference; assert its config and tensor names are the ones
    vLLM expects (DeepSeek-V3, one dense MTP layer at ``model.layers.{n}``)."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert config["num_nextn_predict_layers"] == 1
    assert config["kv_lora_rank"] == 512 and config["qk_rope_head_dim"] == 64
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    model = load_reference(folder)
    assert names == _expected_names(model.config), names ^ _expected_names(model.config)
    return model


def test_checkpoint_loads_with_deepseek_v3_names(model: Reference) -> None:
    check_checkpoint(CHECKPOINT)
    assert (CHECKPOINT / "train-log.txt").is_file()
    assert (CHECKPOINT / "model.safetensors").stat().st_size < 8 * 2 ** 20


def test_checkpoint_check_fails_on_a_misnamed_tensor(model: Reference, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_bytes((CHECKPOINT / "config.json").read_bytes())
    tensors = checkpoint_tensors(model)
    n = model.config.num_hidden_layers
    # vLLM's in-memory name instead of the checkpoint's: its loader would not map it
    tensors[f"model.layers.{n}.mtp_block.mlp.up_proj.weight"] = tensors.pop(
        f"model.layers.{n}.mlp.up_proj.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises((AssertionError, ValueError)):
        check_checkpoint(tmp_path)


def test_checkpoint_check_fails_when_the_mtp_head_copy_differs(model: Reference,
                                                               tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_bytes((CHECKPOINT / "config.json").read_bytes())
    tensors = checkpoint_tensors(model)
    n = model.config.num_hidden_layers
    tensors[f"model.layers.{n}.shared_head.head.weight"] += 1
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="differs"):
        check_checkpoint(tmp_path)


# -- acceptance --------------------------------------------------------------------------------

def check_acceptance(model: Reference, k: int = 3) -> float:
    """Assert greedy per-token acceptance >= MIN_ACCEPTANCE on the task's prompts; return it."""
    stats = speculative_generate(model, prompts(), k, MAX_TOKENS)
    assert stats.acceptance_rate >= MIN_ACCEPTANCE, stats.acceptance_per_position
    return stats.acceptance_rate


def test_drafts_are_accepted(model: Reference) -> None:
    check_acceptance(model)


def test_acceptance_check_fails_without_the_mtp_layers_attention(model: Reference) -> None:
    broken = load_reference(CHECKPOINT)
    with torch.no_grad():
        broken.mtp.self_attn.o_proj.weight.zero_()
    with pytest.raises(AssertionError):
        check_acceptance(broken)


def test_reference_generation_follows_the_task(model: Reference) -> None:
    # the target continues every prompt by the task's table
    stats = speculative_generate(model, prompts(), 3, MAX_TOKENS)
    for prompt, out in zip(prompts(), stats.outputs):
        assert out == TASK.continuation(prompt, MAX_TOKENS)


# -- determinism -------------------------------------------------------------------------------

TINY = ModelConfig(vocab_size=TASK.vocab_size, hidden_size=32, intermediate_size=64,
                   num_attention_heads=2, q_lora_rank=16, kv_lora_rank=512,
                   qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=16)
FEW = TrainSettings(steps=4, batch=32, length=64, warmup=1, hidden_noise=0.5, token_noise=0.5)


def _weights(settings: TrainSettings) -> dict[str, torch.Tensor]:
    return train(TASK, TINY, settings, log=lambda line: None).state_dict()


def check_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Assert two state dicts are bitwise equal."""
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_training_is_deterministic() -> None:
    check_same_weights(_weights(FEW), _weights(FEW))


def test_determinism_check_fails_for_another_seed() -> None:
    with pytest.raises(AssertionError):
        check_same_weights(_weights(FEW), _weights(attrs.evolve(FEW, seed=1)))


def test_written_checkpoint_round_trips(tmp_path: Path) -> None:
    model = train(TASK, TINY, FEW, log=lambda line: None)
    write_checkpoint(model, tmp_path)
    loaded = check_checkpoint(tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16).float()), name


# -- sensitivity -------------------------------------------------------------------------------

_CLEAN: dict[tuple[int, int], float] = {}


def check_drop(model: Reference, bug: Bug | None, k: int, max_length: float) -> float:
    """Assert the mean acceptance length with ``bug`` is below ``max_length`` (the clean run's
    is above it); return it. ``max_seq_len`` runs one prompt per batch (every request is the
    longest)."""
    if (id(model), k) not in _CLEAN:
        _CLEAN[id(model), k] = speculative_generate(
            model, prompts(), k, MAX_TOKENS).mean_acceptance_length
    clean = _CLEAN[id(model), k]
    assert clean > max_length, (clean, max_length)
    alone = bug is not None and bug.kind == "max_seq_len"
    length = run_bug(model, prompts(), k, bug, MAX_TOKENS, alone).mean_acceptance_length
    assert length < max_length, (bug, k, length, max_length)
    return length


@pytest.mark.parametrize(("kind", "first_step", "k"), sorted(SENSITIVITY))
def test_metadata_bug_collapses_drafts(model: Reference, kind: str, first_step: int,
                                       k: int) -> None:
    check_drop(model, Bug(kind, first_step), k, SENSITIVITY[kind, first_step, k])  # type: ignore[arg-type]


@pytest.mark.parametrize("broken", ["no bug", "bug after the last draft step"])
def test_drop_check_fails_when_the_bug_does_nothing(model: Reference, broken: str) -> None:
    (kind, _, k), bound = next(iter(sorted(SENSITIVITY.items())))
    bug: Bug | None = None if broken == "no bug" else Bug(kind, k)  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        check_drop(model, bug, k, bound)
