"""Seal once, step after (``DraftSpec.sealed``): what the seal checked is re-checked whenever the
object could have changed.

The seal is an object's first in-place update, with every check (classes, attribute names,
aliases, memory layout); it returns what those checks verified. A step trusts it only while the
object still holds exactly what was sealed: the same records and tensors, no attribute outside
the spec, state buffers that are the same objects or new views of the same memory. Anything else
writes nothing: an attribute outside the spec raises (as the full update does), anything the
seal no longer vouches for returns ``False`` so the caller runs the full update, which checks
everything again.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

import pytest
import torch

from draftmeta import (
    Alias,
    CopyFrom,
    Derive,
    DraftSpec,
    DraftState,
    HostConstant,
    advance_state,
)
from draftmeta.errors import UpdateError
from draftmeta.testing import compare_metadata, random_state
from tests.test_atomicity import _snapshot
from tests.toy import Scheduler, ToyDecode, ToyMeta, toy_metadata, toy_rules, toy_spec


def _state(seed: int = 0) -> DraftState:
    return random_state(torch.Generator().manual_seed(seed), batch_size=6, block_size=4,
                        max_model_len=32, steps=6)


def _opaque(obj: object) -> bool:
    return isinstance(obj, Scheduler)


def _sealed(seed: int = 0, spec: Any = None
            ) -> tuple[Any, DraftState, ToyMeta[ToyDecode], tuple[object, ...]]:
    """Metadata built for one step, then sealed at the next (its first in-place update), by
    ``spec`` (the toy spec unless given)."""
    spec = spec if spec is not None else toy_spec()
    state = _state(seed)
    meta = toy_metadata(state)
    seal, _ = spec.sealed
    advance_state(state, "clamp")
    sealed = seal(meta, state)
    assert compare_metadata(meta, toy_metadata(state), opaque=_opaque) == []
    return spec, state, meta, sealed


@pytest.mark.parametrize("seed", range(6))
def test_steps_of_a_sealed_object_equal_the_rebuild_at_every_step(seed: int) -> None:
    spec, state, meta, sealed = _sealed(seed)
    _, step = spec.sealed
    for k in range(1, 6):
        advance_state(state, "clamp")
        assert step(meta, state, sealed) is True
        assert compare_metadata(meta, toy_metadata(state), opaque=_opaque) == [], (seed, k)


def test_a_step_equals_the_full_update_on_a_copy() -> None:
    spec, state, meta, sealed = _sealed()
    _, step = spec.sealed
    other_state, other = copy.deepcopy((state, meta))
    advance_state(state, "clamp")
    advance_state(other_state, "clamp")
    assert step(meta, state, sealed)
    spec.update(other, other_state)
    assert compare_metadata(meta, other, opaque=_opaque) == []


def test_a_new_view_of_the_same_state_buffer_is_still_sealed() -> None:
    """vLLM's older proposer re-slices the slot mapping every step: the same memory passes."""
    spec, state, meta, sealed = _sealed()
    _, step = spec.sealed
    advance_state(state, "clamp")
    state.slot_mapping = state.slot_mapping[:]
    assert all(state.slot_mapping is not x for x in sealed)  # a new object
    assert step(meta, state, sealed) is True


def _refused(spec: Any, meta: Any, state: DraftState, sealed: tuple[object, ...]) -> None:
    """The step writes nothing and sends the caller to the full update."""
    _, step = spec.sealed
    before = _snapshot(meta, state)
    assert step(meta, state, sealed) is False
    assert _snapshot(meta, state) == before


def test_another_object_of_the_same_class_is_not_sealed() -> None:
    spec, state, _, sealed = _sealed()
    advance_state(state, "clamp")
    other = toy_metadata(state)
    _refused(spec, other, state, sealed)


def test_a_nested_record_replaced_after_the_seal_is_checked_again() -> None:
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    meta.decode = copy.copy(meta.decode)
    _refused(spec, meta, state, sealed)


def test_a_tensor_field_swapped_after_the_seal_is_checked_again() -> None:
    """A copy of an aliased field would go stale: the step refuses, the full update raises."""
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    meta.slot_mapping = meta.slot_mapping.clone()
    _refused(spec, meta, state, sealed)
    with pytest.raises(UpdateError, match=r"slot_mapping.*no longer shares storage"):
        spec.update(meta, state)


def test_a_state_buffer_in_other_memory_is_checked_again() -> None:
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    state.seq_lens = state.seq_lens.clone()  # the metadata's alias no longer views it
    _refused(spec, meta, state, sealed)
    with pytest.raises(UpdateError, match=r"decode\.seq_lens.*no longer shares storage"):
        spec.update(meta, state)


@dataclasses.dataclass
class _Views:
    """Metadata of views only (like the dense MLA specs': nothing written, no memory check)."""

    num_reqs: int
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor


def test_a_state_buffer_in_other_memory_is_checked_again_where_the_spec_writes_no_tensor(
) -> None:
    spec = DraftSpec(_Views, {"num_reqs": HostConstant(), "seq_lens": Alias("seq_lens"),
                              "slot_mapping": Alias("slot_mapping")}, name="views")
    state = _state()
    meta = _Views(state.num_reqs, state.seq_lens, state.slot_mapping)
    seal, step = spec.sealed
    advance_state(state, "clamp")
    sealed = seal(meta, state)
    advance_state(state, "clamp")
    assert step(meta, state, sealed) is True  # the same buffers: still sealed
    state.seq_lens = state.seq_lens.clone()  # the metadata's alias no longer views it
    _refused(spec, meta, state, sealed)
    with pytest.raises(UpdateError, match=r"seq_lens.*no longer shares storage"):
        spec.update(meta, state)


def test_a_state_buffer_resliced_to_another_shape_is_checked_again() -> None:
    """Same address, another extent: the memory check's verdict may differ."""
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    state.slot_mapping = state.slot_mapping[:2]
    _refused(spec, meta, state, sealed)


def test_an_attribute_set_after_the_seal_is_refused_at_the_next_step() -> None:
    """The step writes nothing; the full update the caller runs then names the attribute."""
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    meta.extra = torch.zeros(3)  # type: ignore[attr-defined]
    _refused(spec, meta, state, sealed)
    with pytest.raises(UpdateError, match="extra"):
        spec.update(meta, state)


def test_an_attribute_set_on_a_nested_record_after_the_seal_is_refused() -> None:
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    assert meta.decode is not None
    meta.decode.extra = 1  # type: ignore[attr-defined]
    _refused(spec, meta, state, sealed)
    with pytest.raises(UpdateError, match="extra"):
        spec.update(meta, state)


def test_a_field_deleted_and_another_added_after_the_seal_is_refused() -> None:
    """Same number of attributes, another set of names: still an attribute outside the spec."""
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    del meta.causal
    meta.extra = True  # type: ignore[attr-defined]
    _, step = spec.sealed
    assert step(meta, state, sealed) is False  # (a snapshot cannot read the deleted field)
    with pytest.raises(UpdateError, match="extra"):
        spec.update(meta, state)


def test_host_values_and_preconditions_are_checked_at_every_step() -> None:
    from draftmeta.errors import PreconditionFailed

    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    meta.num_prefills = 1
    _refused(spec, meta, state, sealed)
    with pytest.raises(PreconditionFailed, match="decode_only"):
        spec.update(meta, state)
    meta.num_prefills = 0
    state.max_model_len = 0  # a bound out of range
    _refused(spec, meta, state, sealed)
    with pytest.raises(UpdateError, match="max_model_len"):
        spec.update(meta, state)


def test_the_seal_raises_what_the_full_update_raises() -> None:
    spec = toy_spec()
    state = _state()
    meta = toy_metadata(state)
    meta.slot_mapping = meta.slot_mapping.clone()
    seal, _ = spec.sealed
    advance_state(state, "clamp")
    before = _snapshot(meta, state)
    with pytest.raises(UpdateError, match=r"slot_mapping.*no longer shares storage"):
        seal(meta, state)
    assert _snapshot(meta, state) == before


def test_the_seal_runs_the_memory_check_a_written_field_viewing_a_state_buffer_fails_it() -> None:
    """The seal is the first in-place update of every older-proposer loop: a field it writes
    that views a state buffer (here ``decode.decode_lens`` over ``state.seq_lens``) must stop
    it before the first write, as the full update stops, not overwrite the draft state."""
    spec = toy_spec()
    state = _state()
    meta = toy_metadata(state)
    assert meta.decode is not None
    meta.decode.decode_lens = state.seq_lens[:]  # written with 1s: would clobber seq_lens
    seal, _ = spec.sealed
    advance_state(state, "clamp")
    seq_lens = state.seq_lens.clone()
    before = _snapshot(meta, state)
    with pytest.raises(UpdateError, match=r"decode\.decode_lens.*shares memory with "
                                          r"state\.seq_lens"):
        seal(meta, state)
    assert _snapshot(meta, state) == before
    assert torch.equal(state.seq_lens, seq_lens)


def test_a_written_field_made_a_view_of_a_state_buffer_after_the_seal_is_checked_again() -> None:
    """The step trusts the seal's memory check only for the sealed tensor: a written field
    re-pointed at ``state.seq_lens`` writes nothing, and the full update names the overlap."""
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    assert meta.decode is not None
    meta.decode.decode_lens = state.seq_lens[:]
    _refused(spec, meta, state, sealed)
    with pytest.raises(UpdateError, match=r"decode\.decode_lens.*shares memory"):
        spec.update(meta, state)


def test_the_seal_is_the_full_update_of_its_step() -> None:
    spec, state, meta, _ = _sealed(3)
    other_state, other = copy.deepcopy((state, meta))
    advance_state(state, "clamp")
    advance_state(other_state, "clamp")
    seal, _ = spec.sealed
    seal(meta, state)
    spec.update(other, other_state)
    assert compare_metadata(meta, other, opaque=_opaque) == []


def test_a_state_buffer_viewed_as_another_dtype_is_checked_again() -> None:
    """Same storage, offset, sizes and strides, another dtype: not the memory that was sealed."""
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    assert state.slot_mapping.dtype == torch.int64
    state.slot_mapping = state.slot_mapping.view(torch.float64)
    _refused(spec, meta, state, sealed)


def test_a_state_buffer_of_another_storage_at_the_same_address_range_is_checked_again() -> None:
    """A new tensor with equal values is not the buffer the metadata views."""
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    state.block_table = state.block_table.clone()
    _refused(spec, meta, state, sealed)


def test_a_state_buffer_that_became_none_is_checked_again() -> None:
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    state.dcp_local_seq_lens = torch.zeros_like(state.seq_lens)  # None when sealed
    _refused(spec, meta, state, sealed)


def test_new_views_of_the_same_memory_stay_sealed_and_other_memory_does_not() -> None:
    """vLLM's older proposer re-slices the slot mapping at every step: a new view of the sealed
    memory passes at every step, a buffer in other memory does not."""
    spec, state, meta, sealed = _sealed()
    _, step = spec.sealed
    for _ in range(2):
        advance_state(state, "clamp")
        state.slot_mapping = state.slot_mapping[:]
        assert step(meta, state, sealed) is True
    advance_state(state, "clamp")
    state.slot_mapping = state.slot_mapping.clone()  # other memory: the metadata's view is stale
    _refused(spec, meta, state, sealed)


def test_a_state_buffer_replaced_by_something_else_than_a_tensor_is_refused() -> None:
    spec, state, meta, sealed = _sealed()
    advance_state(state, "clamp")
    state.block_table = state.block_table.tolist()  # type: ignore[assignment]
    _, step = spec.sealed
    assert step(meta, state, sealed) is False  # no exception: the full update says what


class _CountedCopy(CopyFrom):
    """``CopyFrom`` counting its checks (class-level: attrs instances are frozen)."""

    checks: ClassVar[list[int]] = []

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        type(self).checks.append(1)
        return super().check(out, *inputs)


class _CountedCopyReadingMore(_CountedCopy):
    """The same, declared to read more than the layout (a check on values, say)."""

    checks: ClassVar[list[int]] = []
    checks_layout_only: ClassVar[bool] = False


def _copying_with(formula: CopyFrom) -> Any:
    """The toy spec, its copied lengths written by ``formula``."""
    return toy_spec(rules={**toy_rules(), "decode.lens_copy": Derive(formula,
                                                                       ("decode.seq_lens",))})


@pytest.mark.parametrize(("formula", "checks_per_step"), [(_CountedCopy, 0),
                                                          (_CountedCopyReadingMore, 1)])
def test_a_layout_only_formula_check_on_sealed_tensors_runs_at_the_seal_not_at_each_step(
    formula: type[_CountedCopy], checks_per_step: int,
) -> None:
    formula.checks.clear()
    spec, state, meta, sealed = _sealed(spec=_copying_with(formula()))
    _, step = spec.sealed
    assert len(formula.checks) == 1
    for k in range(1, 4):
        advance_state(state, "clamp")
        assert step(meta, state, sealed) is True
        assert compare_metadata(meta, toy_metadata(state), opaque=_opaque) == []
        assert len(formula.checks) == 1 + k * checks_per_step


def test_a_layout_only_formula_check_runs_again_where_the_tensor_is_not_the_sealed_one() -> None:
    _CountedCopy.checks.clear()
    spec, state, meta, sealed = _sealed(spec=_copying_with(_CountedCopy()))
    _, step = spec.sealed
    advance_state(state, "clamp")
    assert meta.decode is not None
    rows = meta.decode.lens_copy.shape[0]
    meta.decode.lens_copy = torch.zeros(rows, 3, dtype=torch.int32)  # another, misshapen tensor
    assert step(meta, state, sealed) is False  # not the sealed tensor: the full update decides
    assert len(_CountedCopy.checks) == 1  # the step wrote nothing and checked nothing
    with pytest.raises(UpdateError, match=r"decode\.lens_copy"):
        spec.update(meta, state)
    assert len(_CountedCopy.checks) == 2
