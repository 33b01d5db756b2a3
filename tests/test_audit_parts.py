"""The audit's parts that need neither vLLM nor a GPU: its criteria's helpers, its CUDA-side
comparisons run on CPU tensors, its negative controls' bugs, its report and run record, and
the GPU script that calls it."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import draftmeta
from draftmeta.compare import compare_metadata
from draftmeta.integrations.vllm.tools import audit_record
from draftmeta.integrations.vllm.tools.audit import AuditReport, AuditRow, audit_table, gpu_command
from draftmeta.integrations.vllm.tools.audit_controls import (
    ControlResult,
    increment,
    matches,
    skip_refresh,
    write_wrong,
)
from draftmeta.integrations.vllm.tools.audit_criteria import (
    PAD_SLOT_ID,
    copy_inputs,
    snapshot,
    write_capture_inputs,
)
from draftmeta.integrations.vllm.tools.audit_gpu import (
    FP8_TILES,
    TILE,
    compare_on_cuda,
    crossing_lengths,
    fa3_read_entries,
)
from draftmeta.testing import random_state
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Scheduler:
    tile_scheduler_metadata: torch.Tensor | None
    num_splits: torch.Tensor | None
    have_initialized: bool = False


@dataclasses.dataclass
class Decode:
    seq_lens: torch.Tensor
    scheduler_metadata: Any = None
    schedule_metadata: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Metadata:
    decode: Decode
    max_seq_len: int
    softmax_segm_output: torch.Tensor | None = None


def _metadata(schedule: Any = None, **decode: Any) -> Metadata:
    return Metadata(Decode(torch.tensor([5, 7, 9], dtype=torch.int32), schedule, **decode), 9)


# -- FA3's schedule, FlashMLA's FP8 tiles, DeepGEMM: compared as their kernels read them --------


def test_fa3s_read_entries_are_each_vectors_first_batch_entries_and_the_semaphore() -> None:
    schedule = torch.arange(17, dtype=torch.int32)  # batch 3: 4 vectors of 4, then 1
    assert fa3_read_entries(schedule, 3).tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16]


def test_a_schedule_of_another_layout_is_refused_with_its_size() -> None:
    with pytest.raises(ValueError, match="10 entries for batch 3"):
        fa3_read_entries(torch.zeros(10, dtype=torch.int32), 3)


def test_fa3s_rounding_padding_may_differ_but_an_entry_its_kernels_read_may_not() -> None:
    ours = torch.arange(17, dtype=torch.int32)
    padding, read = ours.clone(), ours.clone()
    padding[3] += 1  # the first vector's rounding slot: never written nor read
    read[8] += 1
    assert compare_on_cuda(_metadata(ours), _metadata(padding), batch=3) == []
    found = compare_on_cuda(_metadata(ours), _metadata(read), batch=3)
    assert [(m.path, m.detail) for m in found] == [
        ("decode.scheduler_metadata", "1 of the 13 entries FA3's kernels read differ")]


def test_fp8_tiles_are_compared_on_the_five_fields_flashmlas_decode_reads() -> None:
    tiles = torch.arange(16, dtype=torch.int32).view(2, 8)
    unread, read = tiles.clone(), tiles.clone()
    unread[1, 6] = -5  # slots 5..7: left as torch.empty gave them
    read[1, 2] = -5
    splits = torch.tensor([0, 1, 2], dtype=torch.int32)

    def with_tiles(t: torch.Tensor) -> Metadata:
        return _metadata(Scheduler(t, splits))

    assert compare_on_cuda(with_tiles(tiles), with_tiles(unread), batch=3) == []
    assert [m.path for m in compare_on_cuda(with_tiles(tiles), with_tiles(read), batch=3)] == [
        FP8_TILES]


def test_deepgemms_schedule_is_compared_by_value_only_where_deepgemm_filled_it() -> None:
    a = _metadata(schedule_metadata=torch.zeros(3, 2, dtype=torch.int32))
    b = _metadata(schedule_metadata=torch.ones(3, 2, dtype=torch.int32))
    assert compare_on_cuda(a, b, batch=3, deep_gemm=False) == []
    assert [m.path for m in compare_on_cuda(a, b, batch=3, deep_gemm=True)] == [
        "decode.schedule_metadata"]
    c = _metadata(schedule_metadata=torch.ones(4, 2, dtype=torch.int32))
    assert [m.path for m in compare_on_cuda(a, c, batch=3, deep_gemm=False)] == [
        "decode.schedule_metadata"]  # the shape still counts


def test_a_workspace_is_compared_by_shape_and_dtype_only() -> None:
    def scratch(t: torch.Tensor) -> Metadata:
        return dataclasses.replace(_metadata(), softmax_segm_output=t)

    space = frozenset({"softmax_segm_output"})
    assert compare_on_cuda(scratch(torch.zeros(4)), scratch(torch.ones(4)), batch=3,
                           workspaces=space) == []
    assert compare_on_cuda(scratch(torch.zeros(4)), scratch(torch.zeros(5)), batch=3,
                           workspaces=space) != []
    assert compare_on_cuda(scratch(torch.zeros(4)), scratch(torch.ones(4)), batch=3) != []


def test_placed_lengths_enter_a_new_tile_at_the_first_advance() -> None:
    g = torch.Generator().manual_seed(3)
    lengths = crossing_lengths(g, 40, 4096, 8)
    assert (lengths % TILE == 0).all() and (lengths > 0).all()
    assert (-(-(lengths + 1) // TILE) == lengths // TILE + 1).all()  # one more tile


def test_placed_lengths_under_dcp_put_each_ranks_share_at_a_tile_boundary() -> None:
    def rank0_of_two(lengths: torch.Tensor) -> torch.Tensor:  # interleave 1: rank 0 of 2
        return (lengths + 1) // 2

    lengths = crossing_lengths(torch.Generator().manual_seed(0), 16, 4096, 4, rank0_of_two)
    local, after = rank0_of_two(lengths), rank0_of_two(lengths + 1)
    assert (local % TILE == 0).all() and (after == local + 1).all()


def test_a_limit_too_low_for_any_placed_length_says_to_raise_it() -> None:
    with pytest.raises(ValueError, match="raise max_model_len"):
        crossing_lengths(torch.Generator(), 2, 200, 4)


# -- the criteria's helpers ---------------------------------------------------------------------


def test_a_snapshot_is_equal_to_its_original_and_keeps_its_values_when_that_one_changes() -> None:
    meta = _metadata(Scheduler(torch.ones(2, 8, dtype=torch.int32), None))
    object.__setattr__(meta.decode, "extra", torch.zeros(2))  # set outside the fields
    copy = snapshot(meta)
    assert compare_metadata(meta, copy) == []
    meta.decode.seq_lens += 1
    meta.decode.scheduler_metadata.tile_scheduler_metadata += 1
    meta.decode.extra += 1  # type: ignore[attr-defined]
    assert sorted(m.path for m in compare_metadata(meta, copy)) == [
        "decode.extra", "decode.scheduler_metadata.tile_scheduler_metadata", "decode.seq_lens"]


def test_capture_inputs_are_the_runners_dummies_in_the_same_buffers() -> None:
    state = random_state(torch.Generator().manual_seed(1), batch_size=5, block_size=16,
                         max_model_len=512, steps=3, num_padded=2)
    buffers = (state.seq_lens, state.slot_mapping, state.block_table)
    write_capture_inputs(state)
    assert (state.seq_lens, state.slot_mapping, state.block_table) == buffers  # same objects
    assert state.seq_lens.tolist() == [1] * 7 and state.positions.tolist() == [0] * 7
    assert state.slot_mapping.tolist() == [PAD_SLOT_ID] * 7
    assert int(state.block_table.abs().sum()) == 0 and state.max_seq_len == 512
    assert state.query_start_loc.tolist() == list(range(8))


def test_capture_inputs_under_dcp_give_each_request_context_and_need_the_local_lengths() -> None:
    state = random_state(torch.Generator().manual_seed(1), batch_size=3, block_size=16,
                         max_model_len=512, steps=3)
    state.dcp_world_size, state.dcp_interleave = 2, 8
    state.dcp_local_seq_lens = state.seq_lens.clone()
    with pytest.raises(ValueError, match="local_lens"):
        write_capture_inputs(state)
    write_capture_inputs(state, local_lens=lambda lens: lens // 2)
    assert state.seq_lens.tolist() == [17] * 3 and state.positions.tolist() == [16] * 3
    assert state.dcp_local_seq_lens.tolist() == [8] * 3


def test_copying_the_inputs_back_keeps_the_buffers_the_metadata_views() -> None:
    g = torch.Generator().manual_seed(2)
    state = random_state(g, batch_size=4, block_size=16, max_model_len=512, steps=3)
    real = state.clone()
    seq_lens = state.seq_lens
    write_capture_inputs(state)
    copy_inputs(state, real)
    assert state.seq_lens is seq_lens and torch.equal(seq_lens, real.seq_lens)
    assert torch.equal(state.block_table, real.block_table)
    assert state.max_seq_len == real.max_seq_len


# -- the negative controls' bugs ----------------------------------------------------------------


def _refresh(builder: object, metadata: Metadata) -> None:
    """A hook that refreshes decode.seq_lens and replaces the scheduler object."""
    metadata.decode.seq_lens.copy_(torch.tensor([6, 8, 10], dtype=torch.int32))
    metadata.decode.scheduler_metadata = Scheduler(None, None)


def test_an_incrementing_hook_is_right_once_and_wrong_twice() -> None:
    hook = increment("decode.seq_lens")(_refresh)
    meta = _metadata()
    hook(None, meta)
    assert meta.decode.seq_lens.tolist() == [6, 8, 10]
    hook(None, meta)
    assert meta.decode.seq_lens.tolist() == [7, 9, 11]


def test_skipping_a_refresh_puts_back_a_replaced_object_and_its_values() -> None:
    tiles = torch.ones(2, 8, dtype=torch.int32)
    meta = _metadata(Scheduler(tiles, None, True))
    stale = meta.decode.scheduler_metadata

    def refill(builder: object, metadata: Metadata) -> None:
        tiles.fill_(7)  # in place, then a new object
        _refresh(builder, metadata)

    skip_refresh("decode.scheduler_metadata")(refill)(None, meta)
    assert meta.decode.scheduler_metadata is stale and stale.have_initialized
    assert int(tiles.sum()) == 16 and meta.decode.seq_lens.tolist() == [6, 8, 10]


def test_skipping_a_refresh_in_place_puts_back_the_objects_flag_and_values() -> None:
    tiles = torch.ones(2, 8, dtype=torch.int32)
    meta = _metadata(Scheduler(tiles, torch.zeros(3, dtype=torch.int32), True))
    sched = meta.decode.scheduler_metadata

    def refill_in_place(builder: object, metadata: Metadata) -> None:  # FlashMLA FP8's way
        metadata.decode.scheduler_metadata.have_initialized = False
        metadata.decode.scheduler_metadata.tile_scheduler_metadata.fill_(7)
        metadata.decode.scheduler_metadata.num_splits = torch.ones(3, dtype=torch.int32)

    skip_refresh("decode.scheduler_metadata")(refill_in_place)(None, meta)
    assert meta.decode.scheduler_metadata is sched and sched.have_initialized
    assert int(tiles.sum()) == 16 and sched.tile_scheduler_metadata is tiles
    assert sched.num_splits is not None and int(sched.num_splits.sum()) == 0


def test_a_wrong_write_adds_one_to_the_first_entry_of_its_field() -> None:
    meta = _metadata()
    write_wrong("decode.seq_lens")(_refresh)(None, meta)
    assert meta.decode.seq_lens.tolist() == [7, 8, 10]


@pytest.mark.parametrize(("path", "field", "named"), [
    ("decode.scheduler_metadata.num_splits", "decode.scheduler_metadata", True),
    ("after replay: decode.scheduler_metadata", "decode.scheduler_metadata", True),
    ("runner input seq_lens", "seq_lens", True),
    ("decode.seq_lens", "seq_lens", False),
    ("decode.scheduler_metadata_x", "decode.scheduler_metadata", False),
])
def test_a_reported_path_names_a_field_itself_or_one_of_its_parts(
    path: str, field: str, named: bool
) -> None:
    assert matches(path, field) is named


# -- the report, its JSON and its table ---------------------------------------------------------


def _report(*rows: AuditRow, controls: tuple[ControlResult, ...] = ()) -> AuditReport:
    return AuditReport("0.34.0", "0.34", True, rows, controls, command="draftmeta audit",
                       commit="abc1234", device="cuda: NVIDIA H100 80GB HBM3",
                       date="2026-12-07T00:00:00Z")


GOOD = AuditRow("FLASHMLA (FP8)", "FlashMLAMetadataBuilder", "draftmeta", 4, 12, 0, (), "equal",
                "", "yes", (), "equal", (), "cuda", "fp8", 4, 1)


def test_a_row_failing_any_criterion_fails_the_report_and_a_control_that_did_not_run_does_not(
) -> None:
    not_run = ControlResult("stale", "FLASHMLA", "decode.scheduler_metadata", False, (),
                            note="its builder does not construct here (ImportError: x)")
    assert _report(GOOD, controls=(not_run,)).ok and GOOD.failed == ()
    for change, criterion in (({"verdict": "mismatch"}, "update == rebuild"),
                              ({"verdict": "error"}, "error"),
                              ({"idempotent": "no"}, "idempotent"),
                              ({"first_step": "mismatch"}, "first step")):
        row = _evolve(GOOD, **change)
        assert row.failed == (criterion,) and not _report(row).ok
    missed = ControlResult("stale", "FLASHMLA", "decode.scheduler_metadata", False, (),
                           batches=2, informative=2, missed=2)
    assert not _report(GOOD, controls=(missed,)).ok


def _evolve(row: AuditRow, **change: Any) -> AuditRow:
    import attrs

    return attrs.evolve(row, **change)


def test_the_json_records_the_run_at_the_top_and_keeps_the_rows_keys() -> None:
    data = json.loads(json.dumps(_report(GOOD).to_json()))
    assert {k: data[k] for k in ("command", "commit", "device", "date", "vllm_version")} == {
        "command": "draftmeta audit", "commit": "abc1234",
        "device": "cuda: NVIDIA H100 80GB HBM3", "date": "2026-12-07T00:00:00Z",
        "vllm_version": "0.34.0"}
    row = data["rows"][0]
    assert list(row)[:9] == ["backend", "builder", "owner", "batches", "steps",
                             "mismatched_steps", "mismatches", "verdict", "note"]
    assert (row["idempotent"], row["first_step"], row["replayed"], row["kv_cache_dtype"]) == (
        "yes", "equal", 4, "fp8")
    assert data["ok"] is True


def test_the_table_names_each_failing_hook_with_its_criteria_and_says_why_a_control_did_not_run(
) -> None:
    bad = _evolve(GOOD, backend="KPOOL_TAIL", owner="vllm", first_step="mismatch",
                  first_step_mismatches=("seed 0 step 1: slot_mapping: values differ",))
    not_run = ControlResult("stale", "FLASH_ATTN_MLA", "decode.scheduler_metadata", False, (),
                            note="its builder does not construct here (ImportError: no FA3)")
    text = audit_table(_report(GOOD, bad, controls=(not_run,)))
    assert "audit: FAILED: hooks failing: KPOOL_TAIL (first step)" in text
    assert "first step: seed 0 step 1: slot_mapping: values differ" in text
    assert "not run FLASH_ATTN_MLA [equal]: stale (its builder does not construct here" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert text.splitlines()[0].endswith("on cuda: NVIDIA H100 80GB HBM3; draftmeta's plugin "
                                         "active")


def test_a_gpu_rows_command_is_the_audit_on_cuda_for_that_builder() -> None:
    assert gpu_command("FLASHMLA") == "draftmeta audit --device cuda FLASHMLA"
    assert gpu_command() == "draftmeta audit --device cuda"


# -- the run record ----------------------------------------------------------------------------


def test_the_commit_of_a_checkout_is_what_git_describe_says() -> None:
    said = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert audit_record.commit() == said


def test_outside_a_checkout_the_commit_is_draftmetas_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(draftmeta, "__file__", str(tmp_path / "draftmeta" / "__init__.py"))
    assert audit_record.commit() == f"draftmeta {draftmeta.__version__}"


def test_the_date_is_utc_and_the_cpu_has_a_name() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", audit_record.now())
    assert audit_record.device_name("cpu").strip()


# -- the GPU script, now a caller of the audit --------------------------------------------------


@pytest.fixture
def hook_equivalence(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("benchmarks/h200/hook_equivalence.py")


def test_the_gpu_script_audits_its_builders_on_cuda_and_writes_the_audits_json(
    hook_equivalence: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from draftmeta.integrations.vllm.tools import audit as audit_module

    asked: dict[str, Any] = {}

    def fake(names: list[str], **kwargs: Any) -> AuditReport:
        asked.update(kwargs, names=names)
        return _report(GOOD)

    monkeypatch.setattr(audit_module, "audit", fake)
    assert hook_equivalence.main(["--batches", "3", "--dcp", "2", "--out", str(tmp_path)]) == 0
    assert asked["names"] == ["FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"]
    assert (asked["device"], asked["dcp"], asked["batches"]) == ("cuda", (2,), 3)
    assert asked["controls"] == audit_module.GPU_CONTROLS and asked["negative_control"]
    data = json.loads((tmp_path / "hook-equivalence-dcp2.json").read_text())
    assert data["rows"][0]["backend"] == "FLASHMLA (FP8)" and "FLASHMLA (FP8)" in \
        capsys.readouterr().out
    with pytest.raises(SystemExit) as stopped:  # a second run replaces nothing without --force
        hook_equivalence.main(["--dcp", "2", "--out", str(tmp_path)])
    assert stopped.value.code == 2


def test_the_gpu_script_exits_1_when_the_audit_fails(
    hook_equivalence: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from draftmeta.integrations.vllm.tools import audit as audit_module

    monkeypatch.setattr(audit_module, "audit",
                        lambda *a, **k: _report(_evolve(GOOD, idempotent="no")))
    assert hook_equivalence.main(["--out", str(tmp_path)]) == 1


def test_importing_the_audits_parts_imports_no_vllm() -> None:
    code = ("import sys; import draftmeta.integrations.vllm.tools.audit, "
            "draftmeta.integrations.vllm.tools.audit_gpu, "
            "draftmeta.integrations.vllm.tools.audit_drive; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip() == "[]"
