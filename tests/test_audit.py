"""``draftmeta audit``: vLLM's own draft hooks (and draftmeta's) against vLLM's rebuild, on a
CPU; the GPU rows' selection and messages as a CPU sees them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from draftmeta.integrations.vllm.catalogue import current_release

pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")
pytestmark = pytest.mark.skipif("hook" not in current_release().paths,
                                reason="this vLLM release has no draft hook path to audit")

from draftmeta.cli import main  # noqa: E402
from draftmeta.integrations.vllm.tools import audit as audit_module  # noqa: E402
from draftmeta.integrations.vllm.tools import audit_builders  # noqa: E402
from draftmeta.integrations.vllm.tools.audit import (  # noqa: E402
    CONTROLS,
    GPU_CONTROLS,
    AuditReport,
    Control,
    audit,
    gpu_command,
)
from draftmeta.integrations.vllm.tools.audit_drive import (  # noqa: E402
    BatchFindings,
    Found,
    NotConstructed,
)

CPU_HOOKS = {"TRITON_MLA": "vllm", "INDEXER": "vllm", "KPOOL_TAIL": "vllm",
             "CPU_MLA": "draftmeta", "AMX_MLA": "draftmeta"}
"""The hooks whose builders construct on a CPU, and whose they are with the plugin on."""


@pytest.fixture(scope="module")
def report() -> AuditReport:
    return audit(batches=6, plugin=True)


def test_every_hook_that_constructs_on_a_cpu_equals_vllms_rebuild_and_is_idempotent(
    report: AuditReport,
) -> None:
    ran = {r.backend: r for r in report.rows if r.verdict != "not run"}
    assert {name: ran[name].owner for name in CPU_HOOKS} == CPU_HOOKS
    assert "TRITON_MLA (DCP 2)" in ran and ran["TRITON_MLA (DCP 2)"].owner == "draftmeta"
    for row in ran.values():
        assert (row.verdict, row.idempotent, row.device) == ("equal", "yes", "cpu"), row
        assert row.batches == 6 and row.steps >= row.batches  # K >= 2: one step per batch
        assert row.first_step in ("equal", "mismatch") and row.replayed == 0


def test_vllms_k_pool_tail_hook_fails_the_first_step_with_its_slot_mapping(
    report: AuditReport,
) -> None:
    # its build computes each request's tail block from the block table (a builder buffer);
    # its hook moves only the offset in that block, so the capture's block stays
    row = {r.backend: r for r in report.rows}["KPOOL_TAIL"]
    assert (row.verdict, row.first_step) == ("equal", "mismatch")
    assert all(": slot_mapping: values differ" in m for m in row.first_step_mismatches)
    assert not report.ok


def test_draftmetas_amx_hook_is_equal_at_the_first_step_from_captured_metadata(
    report: AuditReport,
) -> None:
    # Its block-table expansion is recomputed at every call (ExpandBlockTable); when
    # the spec kept it as state, the first step after capture read a stale expansion.
    row = {r.backend: r for r in report.rows}["AMX_MLA"]
    assert (row.owner, row.verdict, row.first_step) == ("draftmeta", "equal", "equal"), row


def test_hooks_whose_builders_view_the_runners_buffers_are_equal_at_the_first_step(
    report: AuditReport,
) -> None:
    rows = {r.backend: r for r in report.rows}
    for name in ("TRITON_MLA", "TRITON_MLA (DCP 2)", "INDEXER", "CPU_MLA"):
        assert rows[name].first_step == "equal", rows[name]


def test_hooks_that_construct_only_on_a_gpu_say_so_with_the_command_to_run_there(
    report: AuditReport,
) -> None:
    not_run = {r.backend: r.note for r in report.rows if r.verdict == "not run"}
    assert "FLASH_ATTN_MLA_SPARSE" in not_run  # vLLM's hook; its builder needs CUDA
    if "FLASHINFER" in not_run:  # vLLM 0.33 and 0.34 give it a hook; it needs its layers
        assert "does not construct on a CPU" in not_run["FLASHINFER"]
    for name, note in not_run.items():
        assert note.endswith(f"on a GPU machine run {gpu_command(name)}"), note
        assert "owed" not in note


def test_standard_attention_hooks_run_for_a_tiny_llama_and_say_what_a_cpu_cannot_check(
    report: AuditReport,
) -> None:
    rows = {r.backend: r for r in report.rows}
    for name in ("TRITON_ATTN", "FLASH_ATTN"):  # vLLM's no-op and its FA3 schedule refresh
        assert (rows[name].owner, rows[name].verdict) == ("vllm", "equal"), rows[name]
        assert "only on CUDA" in rows[name].note and gpu_command(name) in rows[name].note


def test_the_report_records_its_run(report: AuditReport) -> None:
    assert report.device.startswith("cpu: ") and len(report.device) > len("cpu: ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", report.date)
    assert report.commit and report.vllm_version.startswith(current_release().version)


@pytest.fixture
def plugin_on() -> Iterator[None]:
    with audit_module._plugin_as_configured(True):
        yield


@pytest.mark.usefixtures("plugin_on")
@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: f"{c.backend}-{c.field}")
def test_each_negative_control_is_reported_with_its_field_under_its_criterion(
    control: Control,
) -> None:
    result = audit_module._run_control(control, batches=4, seed=0)
    assert result.caught and result.batches == 4, result
    assert any(audit_module.matches(p, control.field) for p in result.reported)


def test_a_control_on_a_hook_the_plugin_would_install_does_not_run_with_the_plugin_off() -> None:
    amx = next(c for c in CONTROLS if c.backend == "AMX_MLA")
    result = audit_module._run_control(amx, batches=2, seed=0)
    assert (result.ran, result.caught) == (False, False) and "no hook" in result.note


def _leaves(field: str, value: Callable[[Any], Any], criterion: str = "equal") -> Control:
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def changed(builder: Any, metadata: Any) -> None:
            hook(builder, metadata)
            setattr(metadata, field, value(metadata))
        return changed
    return Control(f"sets {field}", "INDEXER", field, wrap, criterion)  # type: ignore[arg-type]


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
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def keeping(builder: Any, metadata: Any) -> None:
            hook(builder, metadata)
            metadata.max_seq_len = builder.vllm_config.model_config.max_model_len
        return keeping
    for criterion in ("equal", "first step"):
        result = audit_module._run_control(
            Control("keeps max_model_len", "INDEXER", "max_seq_len", wrap,
                    criterion), batches=3, seed=0)  # type: ignore[arg-type]
        assert not result.caught, (criterion, result.reported)


def test_audit_refuses_a_builder_without_a_hook_and_names_those_with_one() -> None:
    with pytest.raises(ValueError, match=r"no draft hook to audit for CPU_MLA.*INDEXER"):
        audit(["CPU_MLA"], batches=1, plugin=False)  # without the plugin vLLM gives it none


def test_dcp_sizes_alone_audit_only_the_hooks_that_serve_dcp() -> None:
    report = audit(["TRITON_MLA", "INDEXER"], batches=1, plugin=True, dcp=(2,))
    assert [r.backend for r in report.rows] == ["TRITON_MLA (DCP 2)"]
    with pytest.raises(ValueError, match="DCP sizes must be at least 1"):
        audit(["INDEXER"], batches=1, dcp=(0,))


@pytest.mark.usefixtures("no_hook_patch")
def test_a_control_whose_hook_raises_ran_and_was_not_caught_and_says_what_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_module, "drive", _fake_drive({
        0: BatchFindings("vllm", 2), 1: TypeError("decode.scheduler_metadata is a str")}))
    result = audit_module._run_control(CONTROLS[0], 3, 0)
    assert (result.ran, result.caught, result.batches) == (True, False, 2)
    assert result.note == "seed 1: TypeError: decode.scheduler_metadata is a str"


def test_audit_on_cuda_in_a_process_whose_vllm_runs_on_the_cpu_is_refused() -> None:
    with pytest.raises(RuntimeError, match="vLLM keeps one per process"):
        audit(["INDEXER"], batches=1, device="cuda")


# -- the GPU rows as a CPU can check them: which builders, which KV caches, which DCP ----------


@pytest.mark.usefixtures("plugin_on")
def test_on_a_gpu_every_builder_that_loads_is_audited_and_one_that_does_not_says_why() -> None:
    on_cpu = {h.name: h for h in audit_module.hooked_builders(device="cpu")}
    on_gpu = {h.name: h for h in audit_module.hooked_builders(device="cuda")}
    assert on_gpu.keys() == on_cpu.keys()
    for name, hooked in on_gpu.items():
        if hooked.runs_here is not None:  # its class does not import: no command to a GPU
            assert hooked.runs_here.startswith("does not import here (")
            assert "--device cuda" not in hooked.runs_here
        else:
            assert on_cpu[name].runs_here is None or "--device cuda" in on_cpu[name].runs_here
    # vLLM's hook from 0.33 on (0.32's sparse builder has none); no recipe in the catalogue
    sparse_class = audit_builders.registry_backend("FLASHINFER_MLA_SPARSE")
    hooked = (sparse_class is not None
              and audit_builders._declares_hook(sparse_class.get_builder_cls()))
    assert ("FLASHINFER_MLA_SPARSE" in on_gpu) == hooked
    if hooked:
        sparse = on_gpu["FLASHINFER_MLA_SPARSE"]
        assert sparse.runs_here is None and sparse.recipe is not None
        assert sparse.recipe.block_size == 64 and sparse.recipe.backend is not None
        assert sparse.recipe.backend.qualname == "FlashInferMLASparseTRTLLMBackend"
    assert on_gpu["TRITON_MLA"].dcp and on_gpu["TRITON_MLA"].kv_cache_dtypes == ("auto",)


def test_on_a_gpu_flashmla_is_audited_with_both_kv_caches_and_under_dcp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_UNPROVEN", "1")  # 0.33 has no GPU proof: the plan's opt-in
    with audit_module._plugin_as_configured(True):
        flashmla = {h.name: h for h in audit_module.hooked_builders(device="cuda")}["FLASHMLA"]
        on_cpu = {h.name: h for h in audit_module.hooked_builders(device="cpu")}["FLASHMLA"]
    assert (flashmla.owner, flashmla.runs_here, flashmla.flashmla) == ("draftmeta", None, True)
    assert flashmla.kv_cache_dtypes == ("auto", "fp8") and flashmla.dcp
    assert on_cpu.kv_cache_dtypes == ("auto",) and not on_cpu.dcp
    assert on_cpu.runs_here == ("its builder constructs only on a GPU: on a GPU machine run "
                                "draftmeta audit --device cuda FLASHMLA")


def _fake_drive(findings: dict[int, BatchFindings | Exception]) -> Callable[..., BatchFindings]:
    def drive(target: Any, seed: int, *, placed: bool = False) -> BatchFindings:
        found = findings[seed]
        if isinstance(found, Exception):
            raise found
        return found
    return drive


def _gpu_row(**kwargs: Any) -> audit_module.HookedBuilder:
    return audit_module.HookedBuilder("FLASHMLA", "FlashMLAMetadataBuilder", "draftmeta", None,
                                      dcp=True, flashmla=True, kv_cache_dtypes=("auto", "fp8"),
                                      **kwargs)


def test_a_gpu_row_counts_replays_and_placed_batches_and_names_fp8_and_dcp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_module, "drive", _fake_drive({
        0: BatchFindings("draftmeta", 3, replayed=True, crossing=False),
        1: BatchFindings("draftmeta", 2, replayed=True, crossing=True,
                         idempotent=[Found(2, "decode.scheduler_metadata", "differs")])}))
    row = audit_module._audit_one(_gpu_row(), 2, 0, "cuda", "fp8", 2)
    assert (row.backend, row.device, row.kv_cache_dtype) == ("FLASHMLA (FP8, DCP 2)", "cuda",
                                                              "fp8")
    assert (row.batches, row.steps, row.replayed, row.crossing_batches) == (2, 5, 2, 1)
    assert (row.verdict, row.idempotent, row.first_step) == ("equal", "no", "equal")
    assert row.idempotence_failures == ("seed 1 step 2: decode.scheduler_metadata: differs",)


def test_a_builder_that_does_not_construct_on_the_gpu_is_a_row_saying_why_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = NotConstructed("ImportError: vllm._flashmla_C")
    monkeypatch.setattr(audit_module, "drive", _fake_drive({0: missing}))
    row = audit_module._audit_one(_gpu_row(), 3, 0, "cuda")
    assert (row.verdict, row.batches) == ("not run", 0)
    assert row.note == "does not construct here (ImportError: vllm._flashmla_C)"
    assert row.failed == ()
    on_cpu = audit_module._audit_one(_gpu_row(), 3, 0, "cpu")
    assert on_cpu.note.endswith("on a GPU machine run draftmeta audit --device cuda FLASHMLA")


def test_a_hook_that_raises_later_is_an_error_row_that_fails_the_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_module, "drive", _fake_drive({
        0: BatchFindings("draftmeta", 2), 1: RuntimeError("operation not permitted when "
                                                          "stream is capturing\nmore")}))
    row = audit_module._audit_one(_gpu_row(), 3, 0, "cuda")
    assert (row.verdict, row.batches, row.failed) == ("error", 1, ("error",))
    assert row.note == "seed 1: RuntimeError: operation not permitted when stream is capturing"


@pytest.fixture
def no_hook_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import nullcontext

    monkeypatch.setattr(audit_module, "_hook_replaced", lambda *a: nullcontext())


@pytest.mark.usefixtures("no_hook_patch")
@pytest.mark.parametrize(("changed", "reports", "caught"), [
    ((True, True, False), (True, True, False), True),  # FA3 kept its schedule in the 3rd
    ((True, True, True), (True, True, False), False),  # ... it changed and went unreported
    ((False, False, False), (False, False, False), False),  # no batch could show it
])
def test_a_placed_control_must_be_reported_in_every_batch_whose_schedule_changed(
    monkeypatch: pytest.MonkeyPatch, changed: tuple[bool, ...], reports: tuple[bool, ...],
    caught: bool,
) -> None:
    stale = Found(2, "decode.scheduler_metadata", "2 of the 13 entries FA3's kernels read differ")
    monkeypatch.setattr(audit_module, "drive", _fake_drive({
        s: BatchFindings("draftmeta", 2, equal=[stale] if reports[s] else [],
                         schedule_changed=changed[s]) for s in range(3)}))
    fa3 = next(c for c in GPU_CONTROLS if c.backend == "FLASH_ATTN_MLA")
    result = audit_module._run_control(fa3, 3, 0, "cuda")
    assert result.caught is caught
    assert (result.batches, result.informative) == (3, sum(changed))


@pytest.mark.usefixtures("no_hook_patch")
def test_a_control_whose_builder_does_not_construct_is_not_run_and_fails_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_module, "drive", _fake_drive({0: NotConstructed("no FA3")}))
    result = audit_module._run_control(GPU_CONTROLS[0], 2, 0, "cuda")
    assert (result.ran, result.caught) == (False, False)
    assert result.note == "its builder does not construct here (no FA3)"
    assert AuditReport("0.34.0", "0.34", True, (), (result,)).ok


@attrs.define
class _Graph:
    """A CUDA graph stand-in: replaying runs the captured hook again (or, broken, nothing)."""

    hook: Callable[[], None]
    runs: bool = True

    def replay(self) -> None:
        if self.runs:
            self.hook()


@pytest.fixture
def cuda_branch_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """The driver's CUDA branch with its tensors and builders on the CPU and capture emulated
    (the graph's replay calls the hook again); called with ``False``, replays do nothing."""
    import torch

    import draftmeta.testing as testing
    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.integrations.vllm.tools import audit_gpu

    def on_cpu(function: Callable[..., Any]) -> Callable[..., Any]:
        return lambda *a, **k: function(*a, **{**k, "device": "cpu"})

    for module, name in ((testing, "random_state"), (testing, "state_for_lengths"),
                         (harness, "make_builder"), (harness, "make_attention_builder")):
        monkeypatch.setattr(module, name, on_cpu(getattr(module, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def replays(runs: bool) -> None:
        def capture(hook: Callable[[], None], kernel: Any) -> tuple[_Graph, list[Any]]:
            hook()
            return _Graph(hook, runs), []
        monkeypatch.setattr(audit_gpu, "capture", capture)
    return replays


@pytest.mark.usefixtures("plugin_on")
def test_the_cuda_branch_places_every_fourth_batch_and_replays_every_one(
    cuda_branch_on_cpu: Callable[[bool], None],
) -> None:
    from draftmeta.integrations.vllm.tools.audit_drive import Target, drive

    cuda_branch_on_cpu(True)
    for target in (Target("INDEXER", "cuda"), Target("KPOOL_TAIL", "cuda"),
                   Target("TRITON_MLA", "cuda", dcp_world=2)):
        found = [drive(target, seed) for seed in range(4)]
        assert [f.crossing for f in found] == [False, False, False, True]
        assert all(f.replayed and f.equal == [] and f.idempotent == [] for f in found), found
        assert all(f.schedule_changed is None for f in found)  # no FA3 schedule here


@pytest.mark.usefixtures("plugin_on")
def test_a_replay_that_leaves_the_hooks_buffer_stale_is_reported_after_replay(
    cuda_branch_on_cpu: Callable[[bool], None],
) -> None:
    from draftmeta.integrations.vllm.tools.audit_drive import Target, drive

    cuda_branch_on_cpu(False)  # the K-pool tail's slot mapping is a buffer its hook refills
    found = drive(Target("KPOOL_TAIL", "cuda"), 0)
    assert [f.path for f in found.equal] == ["after replay: slot_mapping"]


# -- the command --------------------------------------------------------------------------------


def test_the_command_prints_the_table_writes_json_with_its_run_and_exits_0_when_all_is_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "folder"
    assert main(["audit", "INDEXER", "TRITON_MLA", "--batches", "2", "--quiet", "--plugin", "on",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "INDEXER" in text and ("audit: 3 hooks equal to vLLM's rebuild, idempotent, and "
                                  "equal at the first step") in text
    data = json.loads((out / f"audit-vllm-{current_release().version}.json").read_text())
    assert data["ok"] is True and [r["backend"] for r in data["rows"]] == [
        "INDEXER", "TRITON_MLA", "TRITON_MLA (DCP 2)"]
    assert data["command"] == (f"draftmeta audit INDEXER TRITON_MLA --device cpu --batches 2 "
                               f"--seed 0 --dcp 1 2 --plugin on --out {out}")
    assert data["device"].startswith("cpu: ") and data["commit"] and data["date"]


def test_the_command_exits_1_when_a_hook_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    skip = CONTROLS[0]  # the K-pool tail skipping its slot refresh, as a shipped hook
    with audit_module._hook_replaced(skip.backend, skip.wrap):
        assert main(["audit", skip.backend, "--batches", "2", "--quiet"]) == 1
    assert "audit: FAILED: hooks failing: KPOOL_TAIL (update == rebuild, first step)" in \
        capsys.readouterr().out


def test_the_command_says_in_one_line_what_it_cannot_audit(
    capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "NO_SUCH_BACKEND", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftmeta audit: no draft hook to audit for "
                                               "NO_SUCH_BACKEND")


def test_the_command_on_cuda_without_a_cuda_device_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["audit", "--device", "cuda", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda needs a CUDA device" in err[0]


def test_the_command_picks_cuda_where_torch_sees_a_device_and_writes_the_cuda_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from draftmeta.integrations.vllm.testing import harness

    asked: dict[str, Any] = {}

    def fake(names: Any, **kwargs: Any) -> AuditReport:
        asked.update(kwargs)
        return AuditReport("0.33.0", "0.33", True, (), command=kwargs["command"])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(harness, "use_device", lambda device: asked.setdefault("use", device))
    monkeypatch.setattr(audit_module, "audit", fake)
    assert main(["audit", "--json", "--quiet", "--negative-control", "--out",
                 str(tmp_path)]) == 0
    assert (asked["use"], asked["device"]) == ("cuda", "cuda")
    data = json.loads((tmp_path / "audit-vllm-0.33-cuda.json").read_text())
    assert data["command"] == (f"draftmeta audit --device cuda --batches 16 --seed 0 --dcp 1 2 "
                               f"--negative-control --json --out {tmp_path}")
    assert json.loads(capsys.readouterr().out) == data


def test_an_output_under_a_regular_file_is_refused_in_one_line_before_the_audit_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[object] = []
    monkeypatch.setattr(audit_module, "audit", lambda *a, **k: ran.append(a))
    (tmp_path / "file").write_text("")
    assert main(["audit", "--quiet", "--out", str(tmp_path / "file" / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftmeta audit: --out") and not ran


def test_a_row_keeps_the_keys_the_committed_results_and_coverage_read() -> None:
    keys = [a.name for a in attrs.fields(audit_module.AuditRow)]
    assert keys[:9] == ["backend", "builder", "owner", "batches", "steps", "mismatched_steps",
                        "mismatches", "verdict", "note"]
