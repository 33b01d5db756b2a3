"""``draftmeta e2e --model PATH``: any local MLA model folder with a draft, checked before any
engine starts. Each refusal (no such folder, not MLA, no draft, no weights, a draft that is not
MLA or not a draft, too large for the GPU, parallelism that cannot work, a bad prompts file) is
one line with exit code 2; the built-in shapes go through the same path."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from draftmeta.integrations.vllm.tools.e2e.cli import add_parser
from draftmeta.integrations.vllm.tools.e2e.models import (
    ENGINE_HEADROOM_GIB,
    SHORTCUTS,
    ModelProblem,
    estimate_parameters,
    resolve,
)
from draftmeta.integrations.vllm.tools.e2e.prompts import PromptProblem, Prompts, prompts_for
from draftmeta.integrations.vllm.tools.e2e.shapes import MODEL_CONFIG, V2_LITE_CONFIG


def _folder(tmp_path: Path, config: dict[str, Any] | None = None, *, weights: bool = True,
            name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config if config is not None
                                                   else dict(MODEL_CONFIG)))
    if weights:
        (folder / "model.safetensors").write_bytes(b"\0" * 1024)
    return folder


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="draftmeta")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["e2e", *argv])
    code = args.run(args)
    return code, capsys.readouterr().err


def test_a_model_folder_with_mtp_layers_and_weights_resolves_to_its_own_weights(
        tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    model = resolve(str(folder))
    assert model.folder == folder and model.name == "model"
    assert model.load_format == "auto" and not model.dummy_weights
    assert model.draft.method == "mtp" and model.draft.folder is None
    assert model.weights_gib == pytest.approx(1024 / 2**30)  # the files, not an estimate
    assert model.max_model_len == 4096
    assert "draft MTP, 1 layer in the model" in model.describe()


def test_the_built_in_shapes_are_the_same_path_with_dummy_weights_and_the_trained_checkpoint(
) -> None:
    from draftmeta.integrations.vllm.tools.e2e.trained import CHECKPOINT

    tiny = resolve("tiny")
    assert tiny.shortcut == "tiny" and tiny.dummy_weights and tiny.folder is None
    trained = resolve("trained")
    assert trained.folder == CHECKPOINT and trained.load_format == "auto"
    assert trained.max_model_len == 128
    assert set(SHORTCUTS) == {"tiny", "large", "v3-rank", "v2-lite", "trained"}


def test_the_weights_estimate_matches_the_checkpoint_and_the_sizes_measured_on_gpus() -> None:
    """The trained checkpoint's bf16 file (2,945,624 bytes) and the GiB the built-in shapes
    were seen to take (large 5, v2-lite 31, v3-rank 81 in FP8), each within 10%."""
    trained = resolve("trained")
    assert estimate_parameters(trained.config) * 2 == pytest.approx(2_945_624, rel=0.02)
    for name, gib in (("large", 5.0), ("v2-lite", 31.0), ("v3-rank", 81.0)):
        assert resolve(name).weights_gib == pytest.approx(gib, rel=0.1), name


def test_a_folder_that_is_missing_or_has_no_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelProblem, match="no such folder"):
        resolve(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelProblem, match=r"no config\.json there"):
        resolve(str(tmp_path / "empty"))


def test_a_model_without_mla_is_refused_naming_its_model_type(tmp_path: Path) -> None:
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 10}
    with pytest.raises(ModelProblem, match=r"not an MLA model .*'llama'.* no kv_lora_rank"):
        resolve(str(_folder(tmp_path, llama)))


def test_a_model_without_a_draft_is_refused_with_the_two_ways_to_give_one(
        tmp_path: Path) -> None:
    config = {**MODEL_CONFIG, "num_nextn_predict_layers": 0}
    with pytest.raises(ModelProblem, match=r"no draft.*num_nextn_predict_layers.*--draft-model"):
        resolve(str(_folder(tmp_path, config)))


def test_a_model_without_weights_is_refused_unless_dummy_weights_are_asked_for(
        tmp_path: Path) -> None:
    folder = _folder(tmp_path, weights=False)
    with pytest.raises(ModelProblem, match=r"no weights there.*--dummy-weights"):
        resolve(str(folder))
    model = resolve(str(folder), dummy_weights=True)
    assert model.load_format == "dummy"
    assert model.weights_gib == pytest.approx(estimate_parameters(MODEL_CONFIG) * 2 / 2**30)


def test_a_separate_draft_must_be_an_mla_eagle_or_mtp_model(tmp_path: Path) -> None:
    target = _folder(tmp_path, {**MODEL_CONFIG, "num_nextn_predict_layers": 0})
    eagle = _folder(tmp_path, {**MODEL_CONFIG, "architectures": ["Eagle3DeepseekV3ForCausalLM"],
                               "num_nextn_predict_layers": 0, "num_hidden_layers": 1},
                    name="eagle")
    model = resolve(str(target), draft_model=eagle)
    assert (model.draft.method, model.draft.folder) == ("eagle3", eagle)
    llama_draft = _folder(tmp_path, {"architectures": ["LlamaForCausalLMEagle3"]},
                          name="llama-eagle")
    with pytest.raises(ModelProblem, match="not MLA"):
        resolve(str(target), draft_model=llama_draft)
    plain = _folder(tmp_path, {**MODEL_CONFIG, "architectures": ["DeepseekV3ForCausalLM"],
                               "model_type": "deepseek_v3"}, name="plain")
    with pytest.raises(ModelProblem, match="cannot tell its draft method"):
        resolve(str(target), draft_model=plain)


def test_a_model_too_large_for_the_gpu_is_refused_with_the_sizes() -> None:
    v2_lite = resolve("v2-lite")
    problem = v2_lite.fit_problem(gpus=1, gpu_gib=24.0)
    assert problem is not None
    assert f"{v2_lite.weights_gib:.1f} GiB of weights" in problem and "24 GiB" in problem
    assert f"+ {ENGINE_HEADROOM_GIB:.0f} GiB for the engine" in problem
    assert v2_lite.fit_problem(gpus=1, gpu_gib=80.0) is None
    assert v2_lite.fit_problem(gpus=2, gpu_gib=32.0) is not None
    assert v2_lite.fit_problem(gpus=2, gpu_gib=32.0, tensor_parallel_size=2) is None
    assert "needs 2 GPUs; this machine has 1" in (
        v2_lite.fit_problem(gpus=1, gpu_gib=80.0, tensor_parallel_size=2) or "")
    with pytest.raises(ModelProblem):
        v2_lite.placement(24.0)
    share = (v2_lite.weights_gib + ENGINE_HEADROOM_GIB) / 139
    assert v2_lite.placement(139.0) == (True, pytest.approx(share, abs=1e-3))
    assert v2_lite.placement(80.0)[0] is False  # one engine at a time on an H100


def test_a_prompts_file_gives_token_ids_in_order_and_batches_take_its_prompts_again(
        tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt_token_ids": [3, 4, 5]}\n\n[7, 8]\n')
    pool = prompts_for(trained=False, count=4, seed=0, vocab_size=10, file=path)
    assert pool.token_ids == ((3, 4, 5), (7, 8)) and pool.origin == str(path)
    assert pool.batch(3) == ((3, 4, 5), (7, 8), (3, 4, 5))


@pytest.mark.parametrize(("text", "message"), [
    ("", "no prompt in it"),
    ("not json\n", "line 1: not JSON"),
    ('{"prompt_token_ids": []}\n', "line 1: expected"),
    ('{"prompt_token_ids": [1, 99]}\n', "token id 99 is outside the model's vocabulary"),
    ('[1]\n{"text": "hello"}\n', "line 2: a text prompt, but .* has no tokenizer"),
])
def test_a_prompts_file_that_cannot_be_used_is_refused_naming_the_line(
        tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    with pytest.raises(PromptProblem, match=message):
        prompts_for(trained=False, count=1, seed=0, vocab_size=10, file=path,
                    folder=_folder(tmp_path))


def test_a_prompt_longer_than_the_engines_can_take_is_refused_and_generated_ones_are_cut(
        tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps(list(range(2, 40))) + "\n")
    with pytest.raises(PromptProblem, match="does not fit --max-model-len"):
        prompts_for(trained=False, count=1, seed=0, vocab_size=100, file=path, room=20)
    generated = prompts_for(trained=False, count=4, seed=0, vocab_size=100, room=20)
    assert generated.longest <= 20 and all(2 <= t < 100 for p in generated.token_ids for t in p)


def test_the_trained_model_runs_its_tasks_prompts_and_others_random_ids() -> None:
    from draftmeta.integrations.vllm.tools.e2e.trained import prompts

    assert prompts_for(trained=True, count=3, seed=0, vocab_size=18).token_ids == prompts(3, 0)
    assert Prompts(((1,),), "x").longest == 1


# -- the command: each refusal one line, exit 2, nothing started ---------------------------------


def test_the_command_refuses_a_model_without_a_draft_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path, {**MODEL_CONFIG, "num_nextn_predict_layers": 0})
    code, err = _run(["--model", str(folder), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("draftmeta e2e: --model ")
    assert "no draft" in err


def test_the_command_refuses_a_model_that_is_not_mla(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path, {"model_type": "qwen3", "vocab_size": 10})
    code, err = _run(["--model", str(folder), "--out", str(tmp_path / "out")], capsys)
    assert (code, err.count("\n")) == (2, 1) and "not an MLA model" in err


def test_the_command_refuses_draft_options_without_a_model_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["--dummy-weights", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "go with --model PATH" in err


def test_the_command_refuses_tensor_parallelism_on_a_gpu_where_it_cannot_observe_the_ranks_yet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["--device", "cuda", "--tensor-parallel-size", "2", "--out",
                      str(tmp_path / "out")], capsys)
    assert (code, err.count("\n")) == (2, 1)
    assert "--tensor-parallel-size 2 on --device cuda" in err and "worker processes" in err


def test_the_command_refuses_negative_controls_with_ranks_in_worker_processes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["--tensor-parallel-size", "2", "--negative-control", "--out",
                      str(tmp_path / "out")], capsys)
    assert (code, err.count("\n")) == (2, 1)
    assert "--negative-control with --tensor-parallel-size 2" in err


def test_the_command_refuses_decode_context_parallelism_on_the_cpu_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["--tensor-parallel-size", "2", "--decode-context-parallel-size", "2",
                      "--out", str(tmp_path / "out")], capsys)
    assert (code, err.count("\n")) == (2, 1)
    assert "do not run decode context parallelism" in err and "leave it at 1" in err


def test_the_command_refuses_decode_context_parallelism_on_a_gpu_until_it_runs_tp_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for tp in ("1", "2"):
        code, err = _run(["--device", "cuda", "--tensor-parallel-size", tp,
                          "--decode-context-parallel-size", "2", "--out", str(tmp_path / "out")],
                         capsys)
        assert (code, err.count("\n")) == (2, 1), (tp, err)
        assert "--decode-context-parallel-size 2 on --device cuda" in err, (tp, err)
        assert "does not run tensor parallelism yet" in err, (tp, err)


def test_the_command_refuses_gpu_backends_on_the_cpu_and_cpu_backends_on_a_gpu(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["--backends", "FLASHMLA", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "FLASHMLA need(s) --device cuda" in err
    code, err = _run(["--device", "cuda", "--backends", "CPU_MLA", "--out",
                      str(tmp_path / "out")], capsys)
    assert code == 2 and "CPU_MLA run(s) on the CPU engine" in err


def test_the_v2_lite_config_declares_an_mtp_layer_so_it_needs_no_draft_folder() -> None:
    assert V2_LITE_CONFIG["num_nextn_predict_layers"] == 1
    assert resolve("v2-lite").draft.method == "mtp"
