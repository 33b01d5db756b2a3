"""The draftmeta command: arguments, explain, verify (including a deliberately broken spec),
coverage and a small bench run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from draftmeta import DraftSpec, HostConstant
from draftmeta.cli import main
from draftmeta.integrations.vllm import equivalence

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="builds metadata with vLLM's real builders (pip install 'draftmeta[vllm]')",
)


def test_explain_prints_the_generated_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "TRITON_MLA"]) == 0
    out = capsys.readouterr().out
    assert "\ndef draft_update_TRITON_MLA_advance(metadata, state):\n" in out
    assert "metadata.max_seq_len = _new_max_seq_len" in out


def test_explain_unknown_backend_exits_2_with_a_did_you_mean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "TRITON_MLAX"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'TRITON_MLAX'; did you mean 'TRITON_MLA'" in err
    assert "draftmeta explain --list" in err and err.count("\n") == 1


def test_a_backend_nothing_resembles_gets_no_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "zzz"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'zzz'" in err and "did you mean" not in err


def test_explain_list_prints_every_spec_name_one_per_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from draftmeta.registry import SPECS

    assert main(["explain", "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == list(SPECS)


def test_explain_without_a_name_or_list_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain"]) == 2
    assert "--list" in capsys.readouterr().err


_FRESH_EXPLAIN = """
import io, contextlib, sys, time
start = time.perf_counter()
import draftmeta.cli
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = draftmeta.cli.main(["explain", "TRITON_MLA"])
wall = time.perf_counter() - start
assert code == 0 and "def draft_update_TRITON_MLA_advance" in out.getvalue()
print(sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm.")), f"{wall:.2f}")
"""


def test_explain_in_a_fresh_process_never_imports_vllm() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DRAFTMETA_VLLM_CLASSES"}
    done = subprocess.run([sys.executable, "-c", _FRESH_EXPLAIN], capture_output=True,
                          text=True, env=env, check=True)
    modules, wall = done.stdout.strip().rsplit(" ", 1)
    print(f"explain TRITON_MLA in a fresh process: {wall} s (torch import included)")
    assert modules == "[]", done.stdout


_EXPLAIN_THEN_VLLM = """
import io, contextlib
import draftmeta.cli
from draftmeta.registry import get_spec
with contextlib.redirect_stdout(io.StringIO()):
    assert draftmeta.cli.main(["explain", "TRITON_MLA"]) == 0
spec = get_spec("TRITON_MLA")
print(spec.cls.__module__, hasattr(spec.cls, "__dataclass_fields__"), spec.cls.__init__.__module__)
"""


def test_specs_declared_after_explain_use_vllms_own_classes_again() -> None:
    # explain declares against recorded stand-ins; a later caller that imports vLLM must not
    # be handed those cached stand-ins (whose __init__ is made by dataclasses.make_dataclass)
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DRAFTMETA_VLLM_CLASSES"}
    done = subprocess.run([sys.executable, "-c", _EXPLAIN_THEN_VLLM], capture_output=True,
                          text=True, env=env, check=True)
    module, _, init_module = done.stdout.split()
    assert module.startswith("vllm.") and init_module.startswith("vllm."), done.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--batches", "0"], "must be a positive integer, got 0"),
        (["verify", "--steps", "1"], "must be an integer from 2 to 16, got 1"),
        (["verify", "--device", "tpu"], "invalid choice: 'tpu'"),
        (["bench", "--batch-sizes", "-4"], "must be a positive integer, got -4"),
        ([], "the following arguments are required: command"),
    ],
)
def test_argument_errors_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@needs_vllm
def test_verify_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--batches", "3", "--steps", "4", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    for builder in ("CPU_MLA", "TRITON_MLA", "INDEXER"):
        assert builder in out
    assert "all updated metadata equals the rebuilt metadata" in out


@needs_vllm
def test_verify_fails_on_a_broken_spec(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = equivalence.BUILDERS["TRITON_MLA"]("advance")
    broken = DraftSpec(good.cls, {**good.rules, "max_seq_len": HostConstant()},
                       nested=good.nested, preconditions=good.preconditions, name="broken")
    monkeypatch.setitem(equivalence.BUILDERS, "TRITON_MLA",
                        lambda policy, builder=None: broken)
    assert main(["verify", "--batches", "2", "--seed", "11"]) == 1
    out = capsys.readouterr().out
    assert "FAIL TRITON_MLA seed=11" in out and "field=max_seq_len" in out


@needs_vllm
def test_coverage_says_which_vllm_it_found_and_who_covers_each_builder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "1")
    assert main(["coverage"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("vLLM 0.") and "supported: 0.32, 0.33, 0.34" in lines[0]
    assert lines[1].startswith("plugin: active")
    assert any(line.split()[:3] == ["TRITON_MLA", "hook", "vllm"] for line in lines)
    assert any(line.split()[:3] == ["FLASHMLA", "hook", "none"] for line in lines)
    assert max(len(line) for line in lines) <= 100


@needs_vllm
def test_coverage_json_is_one_object_with_the_documented_fields(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "1")
    assert main(["coverage", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["plugin"]) == {"installed", "enabled", "active", "reason"}
    assert report["plugin"]["active"] is True
    rows = {(r["backend"], r["path"]): r for r in report["builders"]}
    assert rows[("TRITON_MLA", "hook")]["covered_by"] == "vllm"
    assert rows[("CPU_MLA", "hook")]["covered_by"] == "draftmeta"
    assert rows[("CPU_MLA", "hook")]["builder"] == "MLACommonMetadataBuilder"
    assert "FLASHMLA" in report["blocking_full_capture"]


@needs_vllm
def test_coverage_says_when_the_plugin_is_turned_off(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "0")
    assert main(["coverage", "--json"]) == 0
    plugin = json.loads(capsys.readouterr().out)["plugin"]
    assert plugin["active"] is False and plugin["enabled"] is False
    assert plugin["reason"] == "turned off by DRAFTMETA_VLLM_PLUGIN"


@needs_vllm
def test_bench_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--batch-sizes", "1", "4", "--max-steps", "3", "--repeats", "2",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "rebuild" in out and "update" in out and "advance" in out
    data = json.loads((tmp_path / "bench-cpu.json").read_text())
    assert data["environment"]["vllm"].startswith("0.3")
    assert data["environment"]["torch"]
    paths = {(r["backend"], r["path"]) for r in data["summary"]}
    assert ("INDEXER", "rebuild") in paths and ("CPU_MLA", "update") in paths
    assert all(r["host_median_us"] > 0 for r in data["summary"])
    assert (tmp_path / "bench-cpu.png").stat().st_size > 10_000


def test_a_seed_beyond_63_bits_is_refused_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["verify", "--seed", str(2**64)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "a seed must be an integer from 0 to 2**63 - 1" in err and "Traceback" not in err


def test_bench_output_under_a_regular_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "results"
    blocker.write_text("not a folder")
    assert main(["bench", "--out", str(blocker), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"draftmeta bench: --out {blocker}: {blocker} is a file, not a folder; name a folder "
        "for the results\n"
    )
    nested = blocker / "deeper"
    assert main(["bench", "--out", str(nested), "--quiet"]) == 2
    assert capsys.readouterr().err.endswith(f"{blocker} is a file, not a folder; name a "
                                            "folder for the results\n")


def test_ctrl_c_during_verify_exits_130_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import draftmeta.verify

    def interrupted(**_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(draftmeta.verify, "verify", interrupted)
    assert main(["verify", "--batches", "1"]) == 130
    assert capsys.readouterr().err == "draftmeta verify: interrupted\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["e2e", "--ks", "9"], "K (draft tokens per step) must be an integer from 1 to 8, got 9"),
    (["e2e", "--warmups", "-1"], "must be an integer >= 0, got -1"),
    (["infer", "TRITON_MLA", "--batches", "x"], "must be a positive integer, got 'x'"),
    (["infer", "TRITON_MLA", "--seed", "-3"], "a seed must be an integer from 0 to 2**63 - 1"),
])
def test_every_sub_command_refuses_an_out_of_range_integer_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
