"""``draftmeta audit``: vLLM's own draft hooks (and draftmeta's) against vLLM's rebuild."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from draftmeta.integrations.vllm.catalogue import current_release

pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")
pytestmark = pytest.mark.skipif("hook" not in current_release().paths,
                                reason="this vLLM release has no draft hook path to audit")

from draftmeta.cli import main  # noqa: E402
from draftmeta.integrations.vllm import audit as audit_module  # noqa: E402
from draftmeta.integrations.vllm.audit import CONTROLS, Control, audit  # noqa: E402

CPU_HOOKS = {"TRITON_MLA": "vllm", "INDEXER": "vllm", "KPOOL_TAIL": "vllm",
             "CPU_MLA": "draftmeta", "AMX_MLA": "draftmeta"}
"""The hooks whose builders construct on a CPU, and whose they are with the plugin on."""


@pytest.fixture(scope="module")
def report() -> audit_module.AuditReport:
    return audit(batches=6, plugin=True)


def test_every_hook_that_constructs_on_a_cpu_equals_vllms_rebuild(
    report: audit_module.AuditReport,
) -> None:
    ran = {r.backend: r for r in report.rows if r.verdict != "not run"}
    assert {name: ran[name].owner for name in CPU_HOOKS} == CPU_HOOKS
    assert "TRITON_MLA (DCP 2)" in ran and ran["TRITON_MLA (DCP 2)"].owner == "draftmeta"
    for row in ran.values():
        assert row.verdict == "equal", row
        assert row.batches == 6 and row.steps >= row.batches  # K >= 2: one step per batch
    assert report.ok


def test_hooks_that_construct_only_on_a_gpu_are_listed_with_why_they_did_not_run(
    report: audit_module.AuditReport,
) -> None:
    not_run = {r.backend: r.note for r in report.rows if r.verdict == "not run"}
    assert "FLASH_ATTN_MLA_SPARSE" in not_run  # vLLM's hook; its builder needs CUDA
    if "FLASHINFER" in not_run:  # vLLM 0.33 and 0.34 give it a hook; it needs its layers
        assert "does not construct on a CPU" in not_run["FLASHINFER"]
    assert all("GPU" in note or "does not import" in note for note in not_run.values())


def test_standard_attention_hooks_run_for_a_tiny_llama_and_say_what_a_cpu_cannot_check(
    report: audit_module.AuditReport,
) -> None:
    rows = {r.backend: r for r in report.rows}
    for name in ("TRITON_ATTN", "FLASH_ATTN"):  # vLLM's no-op and its FA3 schedule refresh
        assert (rows[name].owner, rows[name].verdict) == ("vllm", "equal"), rows[name]
        assert "only on CUDA" in rows[name].note


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: c.field)
def test_each_negative_control_is_reported_with_its_field(control: Control) -> None:
    result = audit_module._run_control(control, batches=4, seed=0)
    assert result.caught, result
    assert control.field in result.reported or f"runner input {control.field}" in \
        result.reported


def _leaves(field: str, value: Callable[[Any], Any]) -> Control:
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def changed(builder: Any, metadata: Any) -> None:
            hook(builder, metadata)
            setattr(metadata, field, value(metadata))
        return changed
    return Control(f"sets {field}", "INDEXER", field, wrap)


def test_a_control_whose_bug_changes_nothing_is_reported_missed() -> None:
    inert = _leaves("max_seq_len", lambda m: m.max_seq_len)  # writes back what was there
    result = audit_module._run_control(inert, batches=3, seed=0)
    assert not result.caught and result.reported == ()


def test_a_host_bound_below_the_longest_sequence_is_a_mismatch() -> None:
    # a hook may keep the runner's bound or max_model_len, never less than the lengths need
    short = _leaves("max_seq_len", lambda m: 1)
    result = audit_module._run_control(short, batches=3, seed=0)
    assert result.caught and "max_seq_len" in result.reported


def test_a_hook_that_keeps_max_model_len_as_its_bound_passes() -> None:
    at_limit = _leaves("max_seq_len", lambda m: None)  # replaced below by the builder's limit

    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def keeping(builder: Any, metadata: Any) -> None:
            hook(builder, metadata)
            metadata.max_seq_len = builder.vllm_config.model_config.max_model_len
        return keeping
    result = audit_module._run_control(
        Control(at_limit.name, "INDEXER", "max_seq_len", wrap), batches=3, seed=0)
    assert not result.caught, result.reported


def test_audit_refuses_a_builder_without_a_hook_and_names_those_with_one() -> None:
    with pytest.raises(ValueError, match=r"no draft hook to audit for CPU_MLA.*INDEXER"):
        audit(["CPU_MLA"], batches=1, plugin=False)  # without the plugin vLLM gives it none


def test_the_command_prints_the_table_writes_json_and_exits_0_when_all_is_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "folder"
    assert main(["audit", "INDEXER", "KPOOL_TAIL", "--batches", "2", "--quiet",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "INDEXER" in text and "audit: 2 hooks equal to vLLM's rebuild" in text
    data = json.loads((out / f"audit-vllm-{current_release().version}.json").read_text())
    assert data["ok"] is True and [r["backend"] for r in data["rows"]] == ["INDEXER",
                                                                            "KPOOL_TAIL"]


def test_the_command_exits_1_when_a_hook_is_wrong(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    skip = CONTROLS[0]  # the K-pool tail skipping its slot refresh, as a shipped hook
    with audit_module._hook_replaced(skip.backend, skip.wrap):
        assert main(["audit", skip.backend, "--batches", "2", "--quiet"]) == 1
    assert "audit: FAILED: mismatches in KPOOL_TAIL" in capsys.readouterr().out


def test_the_command_says_in_one_line_what_it_cannot_audit(
    capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "NO_SUCH_BACKEND", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftmeta audit: no draft hook to audit for "
                                               "NO_SUCH_BACKEND")


def test_an_output_under_a_regular_file_is_refused_in_one_line_before_the_audit_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[object] = []
    monkeypatch.setattr(audit_module, "audit", lambda *a, **k: ran.append(a))
    (tmp_path / "file").write_text("")
    assert main(["audit", "--quiet", "--out", str(tmp_path / "file" / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftmeta audit: --out") and not ran
