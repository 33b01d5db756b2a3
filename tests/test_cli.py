"""The draftmeta command: arguments, explain, verify (including a deliberately broken spec),
coverage and a small bench run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftmeta import DraftSpec, HostConstant
from draftmeta.cli import main
from draftmeta.integrations.vllm import equivalence


def test_explain_prints_the_generated_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "mla.triton"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def draft_update_mla_triton_advance(metadata, state):")
    assert "metadata.max_seq_len = _new_max_seq_len" in out


def test_explain_unknown_backend_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "mla.nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'mla.nope'" in err and "mla.triton" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--batches", "0"], "must be a positive integer, got 0"),
        (["verify", "--steps", "1"], "must be between 2 and 16, got 1"),
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


def test_verify_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--batches", "3", "--steps", "4", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    for builder in ("CPU_MLA", "TRITON_MLA", "INDEXER"):
        assert builder in out
    assert "all updated metadata equals the rebuilt metadata" in out


def test_verify_fails_on_a_broken_spec(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = equivalence.BUILDERS["TRITON_MLA"]("advance")
    broken = DraftSpec(good.cls, {**good.rules, "max_seq_len": HostConstant()},
                       nested=good.nested, preconditions=good.preconditions, name="broken")
    monkeypatch.setitem(equivalence.BUILDERS, "TRITON_MLA", lambda policy: broken)
    assert main(["verify", "--batches", "2", "--seed", "11"]) == 1
    out = capsys.readouterr().out
    assert "FAIL TRITON_MLA seed=11" in out and "field=max_seq_len" in out


def test_coverage_lists_every_builder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coverage"]) == 0
    out = capsys.readouterr().out
    assert "flashmla               draftmeta" in out
    assert "triton                 upstream" in out
    assert "flashattn_mla          neither" in out
    assert "indexer" in out


def test_bench_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--batch-sizes", "1", "4", "--max-steps", "3", "--repeats", "2",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "rebuild" in out and "update" in out and "advance" in out
    data = json.loads((tmp_path / "bench-cpu.json").read_text())
    assert data["environment"]["vllm"] == "0.33.0"
    assert data["environment"]["torch"]
    paths = {(r["backend"], r["path"]) for r in data["summary"]}
    assert ("INDEXER", "rebuild") in paths and ("CPU_MLA", "update") in paths
    assert all(r["host_median_us"] > 0 for r in data["summary"])
    assert (tmp_path / "bench-cpu.png").stat().st_size > 10_000
