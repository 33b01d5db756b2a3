"""The fused per-step Triton kernel (``draftmeta.fused``) writes what the generated in-place
update writes: run on the CPU by Triton's interpreter (``TRITON_INTERPRET=1``), so the kernel
source each rule emits is checked by its effect here, not only on a CUDA machine."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from draftmeta import Derive, DraftState, advance_state
from draftmeta.derivations import CopyFrom
from draftmeta.fused import FusedStep
from draftmeta.testing import compare_metadata, random_state
from tests.toy import toy_metadata, toy_rules, toy_spec

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs Triton (its interpreter runs on the CPU)")


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Kernels made from here on run in Triton's interpreter, cached in a fresh folder."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("DRAFTMETA_CACHE", str(tmp_path))


def _state(seed: int, **kw: Any) -> DraftState:
    params: dict[str, Any] = {"batch_size": 6, "block_size": 4, "max_model_len": 32,
                              "steps": 6, "near_limit": 0.5, "near_boundary": 0.5}
    params.update(kw)
    return random_state(torch.Generator().manual_seed(seed), **params)


def _opaque(obj: object) -> bool:
    return not isinstance(obj, (torch.Tensor, int, float, bool, type(None)))


def _alongside(step: FusedStep, spec: Any, meta: Any, state: DraftState, steps: int,
               policy: str = "clamp") -> Iterator[int]:
    """Steps 1..``steps``: one fused launch, and on the copy (``state``, ``meta``) the source
    advance and the generated update; yields each step's number for the caller's checks."""
    for n in range(1, steps + 1):
        step()
        advance_state(state, policy)  # type: ignore[arg-type]
        spec.update(meta, state)
        yield n


def _with_dcp(state: DraftState, world: int, rank: int, interleave: int) -> DraftState:
    state.dcp_world_size, state.dcp_rank, state.dcp_interleave = world, rank, interleave
    state.dcp_local_seq_lens = torch.full_like(state.seq_lens, -5)  # stale: recomputed
    return state


@pytest.mark.parametrize("policy", ["clamp", "wrap"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_fused_kernel_steps_the_state_and_the_metadata_as_the_generated_update_does(
    policy: str, seed: int,
) -> None:
    """Six steps of the toy spec, each one fused launch against the source advance and the
    generated update on a copy: the same state (positions, lengths, slots, past the model's
    length too) and the same metadata."""
    fused_state = _state(seed)
    fused_meta = toy_metadata(fused_state)
    state = copy.deepcopy(fused_state)
    meta = toy_metadata(state)
    spec = toy_spec()
    step = FusedStep(fused_state, [(spec, fused_meta)], policy=policy)  # type: ignore[arg-type]
    assert "tl.program_id" in step.source  # a real kernel, interpreted
    for n in _alongside(step, spec, meta, state, 6, policy):
        for name in ("positions", "seq_lens", "slot_mapping"):
            assert torch.equal(getattr(fused_state, name), getattr(state, name)), (n, name)
        assert compare_metadata(fused_meta, meta, opaque=_opaque) == [], n


@pytest.mark.parametrize(("world", "rank", "interleave"), [(2, 1, 1), (4, 3, 2), (3, 0, 4)])
def test_the_fused_kernel_recomputes_each_ranks_dcp_local_lengths(
    world: int, rank: int, interleave: int,
) -> None:
    fused_state = _with_dcp(_state(3), world, rank, interleave)
    state = copy.deepcopy(fused_state)
    step = FusedStep(fused_state, [])
    for n in range(1, 5):
        step()
        advance_state(state)
        assert fused_state.dcp_local_seq_lens is not None
        assert torch.equal(fused_state.dcp_local_seq_lens, state.dcp_local_seq_lens), n
        assert torch.equal(fused_state.seq_lens, state.seq_lens), n


@pytest.mark.parametrize("own_buffer", [True, False], ids=["own-buffer", "view-of-the-source"])
def test_the_fused_kernel_copies_a_2d_table_into_its_own_buffer_and_skips_a_view_of_it(
    own_buffer: bool,
) -> None:
    """A field copied from the state's block table: into a buffer of its own (stale at first)
    the kernel copies every row; a field that views the table is left as it is (the copy
    would write each element onto itself)."""
    rules = {**toy_rules(), "decode.block_table": Derive(CopyFrom(), ("state.block_table",))}
    spec = toy_spec(rules=rules)
    fused_state = _state(4)
    state = copy.deepcopy(fused_state)
    metas = []
    for s in (fused_state, state):
        meta = toy_metadata(s)
        assert meta.decode is not None
        if own_buffer:
            meta.decode.block_table = torch.zeros_like(s.block_table)
        metas.append(meta)
    fused_meta, meta = metas
    step = FusedStep(fused_state, [(spec, fused_meta)])
    for n in _alongside(step, spec, meta, state, 2):
        assert compare_metadata(fused_meta, meta, opaque=_opaque) == [], n
        assert fused_meta.decode is not None
        assert torch.equal(fused_meta.decode.block_table, fused_state.block_table)
        assert (fused_meta.decode.block_table.data_ptr() == fused_state.block_table.data_ptr()
                ) is not own_buffer


def test_the_fused_kernel_skips_a_1d_field_copied_from_the_buffer_it_views() -> None:
    """A 1-D field declared a copy of the state's lengths while it views them: the kernel
    emits no copy for it (the source it compiles says so in a comment) and the metadata stays
    equal to the generated update's."""
    rules = {**toy_rules(), "decode.seq_lens": Derive(CopyFrom(), ("state.seq_lens",))}
    spec = toy_spec(rules=rules)
    fused_state = _state(4)
    state = copy.deepcopy(fused_state)
    fused_meta, meta = toy_metadata(fused_state), toy_metadata(state)
    assert fused_meta.decode is not None
    assert fused_meta.decode.seq_lens.data_ptr() == fused_state.seq_lens.data_ptr()
    step = FusedStep(fused_state, [(spec, fused_meta)])
    for n in _alongside(step, spec, meta, state, 2):
        assert compare_metadata(fused_meta, meta, opaque=_opaque) == [], n


def test_the_fused_kernel_reads_a_position_past_the_block_table_from_its_last_column() -> None:
    """A block table two blocks wide, positions up to the model's length: a position whose block
    lies past the table reads the last column, as the generated update does."""
    fused_state = _state(5)
    fused_state.block_table = fused_state.block_table[:, :2].clone()
    assert int(fused_state.positions.max()) // 4 > 1  # some positions lie past the table
    state = copy.deepcopy(fused_state)
    step = FusedStep(fused_state, [])
    for n in range(1, 4):
        step()
        advance_state(state)
        assert torch.equal(fused_state.slot_mapping, state.slot_mapping), n
