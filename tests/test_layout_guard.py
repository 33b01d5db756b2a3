"""The memory-layout guard: exact verdicts by byte range, remembered per set of tensor objects."""

from __future__ import annotations

import itertools
import types

import pytest
import torch

from draftmeta.derivations import CopyFrom
from draftmeta.layout import LayoutGuard, Written, has_internal_overlap, overlaps


def _state(n: int = 4) -> types.SimpleNamespace:
    """A draft state's six buffers, each in its own fresh allocation."""
    return types.SimpleNamespace(
        positions=torch.zeros(n, dtype=torch.int64),
        seq_lens=torch.zeros(n, dtype=torch.int32),
        slot_mapping=torch.zeros(n, dtype=torch.int64),
        block_table=torch.zeros(n, 8, dtype=torch.int32),
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        dcp_local_seq_lens=None,
    )


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the guard's full verifications (the slow path)."""
    calls: list[int] = []
    original = LayoutGuard._verify

    def counting(self: LayoutGuard, *args: object) -> object:
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(LayoutGuard, "_verify", counting)
    return calls


def test_the_same_tensor_objects_pass_again_without_a_second_verification(
    verifications: list[int],
) -> None:
    guard = LayoutGuard([Written("seq_lens_copy")])
    state, field = _state(), torch.zeros(4, dtype=torch.int32)
    for _ in range(5):  # the later steps of one draft loop: the objects the first step saw
        assert guard.check(state, field) is None
    assert len(verifications) == 1


def test_new_tensor_objects_are_verified_afresh_at_every_draft_loop(
    verifications: list[int],
) -> None:
    guard = LayoutGuard([Written("seq_lens_copy")])
    for _ in range(5):  # every draft loop: fresh allocations at new addresses
        assert guard.check(_state(), torch.zeros(4, dtype=torch.int32)) is None
    assert len(verifications) == 5


def test_two_storages_over_one_memory_are_caught_by_address() -> None:
    memory = bytearray(64)
    state = _state()
    state.seq_lens = torch.frombuffer(memory, dtype=torch.int32, count=4)
    field = torch.frombuffer(memory, dtype=torch.int32, count=4, offset=8)  # another storage
    assert field.untyped_storage().data_ptr() != state.seq_lens.untyped_storage().data_ptr()
    problem = LayoutGuard([Written("seq_lens_copy")]).check(state, field)
    assert problem is not None and "shares memory with state.seq_lens" in problem[1]


def test_meta_tensors_have_no_memory_to_share() -> None:
    state = _state()
    state.seq_lens = torch.empty(4, dtype=torch.int32, device="meta")
    field = torch.empty(4, dtype=torch.int32, device="meta")
    assert LayoutGuard([Written("seq_lens_copy")]).check(state, field) is None


def test_a_non_contiguous_written_view_is_checked_over_its_whole_reach() -> None:
    state = _state()
    base = torch.zeros(4, 8, dtype=torch.int32)
    state.seq_lens = base[3, 4:]  # the last row's tail
    field = base[:, 5]  # a column: one element of it lies in state.seq_lens
    problem = LayoutGuard([Written("seq_lens_copy")]).check(state, field)
    assert problem is not None and "shares memory with state.seq_lens" in problem[1]
    assert LayoutGuard([Written("seq_lens_copy")]).check(_state(), base[:3, 5]) is None


def test_a_written_field_sharing_a_state_buffer_is_refused_after_a_clean_layout_was_verified(
    verifications: list[int],
) -> None:
    guard = LayoutGuard([Written("seq_lens_copy")])
    assert guard.check(_state(), torch.zeros(4, dtype=torch.int32)) is None
    state = _state()
    # same shapes, dtypes and offsets as before; only now the field views state.seq_lens
    problem = guard.check(state, state.seq_lens[:])
    assert problem is not None
    assert problem[0] == "seq_lens_copy"
    assert "shares memory with state.seq_lens" in problem[1]
    assert len(verifications) == 2


def test_two_written_fields_in_one_buffer_are_refused_even_when_each_layout_alone_passed() -> None:
    guard = LayoutGuard([Written("a"), Written("b")])
    assert guard.check(_state(), torch.zeros(4, dtype=torch.int32),
                       torch.zeros(4, dtype=torch.int32)) is None
    shared = torch.zeros(6, dtype=torch.int32)
    assert guard.check(_state(), shared[:4], shared[2:6]) == (
        "b", "shares memory with 'a', which this update also writes: give each written field "
        "its own buffer")


def test_a_different_offset_in_one_storage_is_a_different_layout() -> None:
    guard = LayoutGuard([Written("a"), Written("b")])
    shared = torch.zeros(8, dtype=torch.int32)
    assert guard.check(_state(), shared[:4], shared[4:8]) is None  # adjacent, disjoint
    shared = torch.zeros(8, dtype=torch.int32)
    assert guard.check(_state(), shared[:4], shared[3:7]) is not None  # one element shared


def test_a_dtype_change_with_the_same_element_size_is_a_different_layout() -> None:
    # a copy onto itself writes nothing only when the dtypes agree
    guard = LayoutGuard([Written("a", inputs=1, fn=CopyFrom())])
    src = torch.zeros(4, dtype=torch.int32)
    assert guard.check(_state(), src, src) is None
    src = torch.zeros(4, dtype=torch.float32)
    problem = guard.check(_state(), src.view(torch.int32), src)
    assert problem is not None and "overlaps the memory of its input 0" in problem[1]


def test_an_update_whose_guarded_fields_are_all_absent_skips_the_layout_work(
    verifications: list[int],
) -> None:
    guard = LayoutGuard([Written("dcp_tot_seq_lens", unchanged=True)])
    for _ in range(3):  # a new state every loop, the optional field None (no DCP)
        assert guard.check(_state(), None) is None
    assert verifications == []
    assert guard.check(_state(), torch.zeros(4, dtype=torch.int32)) is None
    assert verifications == [1]


def test_a_written_field_that_is_not_a_tensor_is_still_refused() -> None:
    guard = LayoutGuard([Written("seq_lens_copy")])
    problem = guard.check(_state(), 5)
    assert problem == ("seq_lens_copy", "is a int, expected a tensor")


def test_an_absent_written_field_and_a_non_tensor_unchanged_one_are_passed_over() -> None:
    """A written field that is None this step (an optional field) writes nothing, and a field
    declared unchanged that is no tensor cannot alias a buffer: neither is refused, while the
    tensor beside them is still verified."""
    guard = LayoutGuard([Written("dcp_tot_seq_lens"), Written("max_seq_len", unchanged=True),
                         Written("seq_lens_copy")])
    state = _state()
    assert guard.check(state, None, 7, torch.zeros(4, dtype=torch.int32)) is None
    assert guard.check(state, None, 7, state.seq_lens) == (
        "seq_lens_copy", "shares memory with state.seq_lens, so writing it would corrupt the "
        "draft state; declare it Alias('seq_lens') if it is a view of that buffer, or give it "
        "its own buffer")


def _view(shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    return torch.zeros(64).as_strided(shape, stride)


@pytest.mark.parametrize(("shape", "stride", "overlapping"), [
    ((3, 4), (4, 1), False),  # contiguous
    ((4, 3), (1, 4), False),  # a transposed contiguous tensor
    ((2, 5), (6, 1), False),  # padded rows: the larger dimension has the smaller stride
    ((1, 3), (0, 1), False),  # a dimension of size 1 never repeats an element
    ((4, 3), (0, 1), True),   # an expanded row
    ((2, 2), (1, 1), True),   # element (0, 1) is element (1, 0)
    ((3, 3), (2, 1), True),   # rows two apart, three long
    ((2, 2, 2), (3, 2, 1), True),  # only the reach of the two inner dimensions together
    ((2, 2, 2), (4, 2, 1), False),  # contiguous, three dimensions
], ids=["contiguous", "transposed", "padded-rows", "size-1-stride-0", "expanded",
        "unit-strides", "rows-overlapping", "three-dims-overlapping", "three-dims-contiguous"])
def test_internal_overlap_is_found_exactly_where_two_elements_share_an_address(
    shape: tuple[int, ...], stride: tuple[int, ...], overlapping: bool,
) -> None:
    """``has_internal_overlap`` against the ground truth: whether two index tuples give one
    element offset."""
    offsets = [sum(i * s for i, s in zip(index, stride))
               for index in itertools.product(*(range(n) for n in shape))]
    assert (len(set(offsets)) < len(offsets)) is overlapping  # the case says what it claims
    assert has_internal_overlap(_view(shape, stride)) is overlapping


def test_an_empty_view_shares_no_memory_and_a_one_byte_view_does() -> None:
    """An empty view inside a buffer has no element to share; a one-byte view has one."""
    buffer = torch.zeros(8, dtype=torch.uint8)
    assert not overlaps(buffer[3:3], buffer)
    assert overlaps(buffer[3:4], buffer)
    assert not overlaps(buffer[3:4], buffer[4:5])


_CORRUPTS_SEQ_LENS = (
    "seq_lens_copy", "shares memory with state.seq_lens, so writing it would corrupt the draft "
    "state; declare it Alias('seq_lens') if it is a view of that buffer, or give it its own "
    "buffer")


def test_the_fields_after_an_unchanged_one_are_still_verified() -> None:
    guard = LayoutGuard([Written("max_seq_len", unchanged=True), Written("seq_lens_copy")])
    state = _state()
    assert guard.check(state, torch.zeros(1), state.seq_lens) == _CORRUPTS_SEQ_LENS


def test_the_fields_after_a_copy_onto_itself_are_still_verified() -> None:
    guard = LayoutGuard([Written("a", inputs=1, fn=CopyFrom()), Written("seq_lens_copy")])
    state, src = _state(), torch.zeros(4, dtype=torch.int32)
    assert guard.check(state, src, src, state.seq_lens) == _CORRUPTS_SEQ_LENS


def test_a_self_overlapping_written_view_is_refused_with_its_strides_and_the_fix() -> None:
    guard = LayoutGuard([Written("seq_lens_copy")])
    expanded = torch.zeros(1, dtype=torch.int32).expand(4)
    assert guard.check(_state(), expanded) == (
        "seq_lens_copy", "has elements sharing memory (strides (0,) for shape (4,), an expanded "
        "view?); an in-place write would be undefined: make it a real buffer")


def test_a_destination_sharing_its_inputs_memory_is_refused_with_the_input_and_the_fix() -> None:
    guard = LayoutGuard([Written("seq_lens_copy", inputs=2)])  # a formula of two inputs
    src = torch.zeros(8, dtype=torch.int32)
    assert guard.check(_state(), src[:4], torch.zeros(4), src[2:6]) == (
        "seq_lens_copy", "overlaps the memory of its input 1 (a destination may not share "
        "memory with its source): write into a separate buffer")


def test_a_field_declared_unchanged_over_an_advanced_buffer_is_refused_even_with_nothing_written(
) -> None:
    """The loop advances ``seq_lens`` every step, so a field declared unchanged that views it
    would change under the update's feet; with no written field beside it, still refused."""
    guard = LayoutGuard([Written("seq_lens_view", unchanged=True)])
    state = _state()
    assert guard.check(state, state.seq_lens[:2]) == (
        "seq_lens_view", "is declared unchanged but shares memory with state.seq_lens, which "
        "the loop advances every step; declare it Alias('seq_lens')")
    assert guard.check(state, state.block_table[0]) is None  # not advanced: may be unchanged


def test_a_strided_view_reaches_exactly_to_its_last_element() -> None:
    """Every other element of a buffer, ending at element 4: it meets a view starting there, not
    one starting at element 5."""
    buffer = torch.zeros(8, dtype=torch.int32)
    strided = buffer[0:5:2]
    assert not strided.is_contiguous()
    assert overlaps(strided, buffer[4:])
    assert not overlaps(strided, buffer[5:])


def test_a_spec_of_the_draft_state_that_writes_every_tensor_of_it_still_checks_their_memory(
) -> None:
    """The source advance leaves the block table and query starts unchanged; a spec of the
    state that writes them too (nothing declared unchanged) keeps the memory check."""
    from draftmeta import Derive, DraftSpec, DraftState, Fill
    from draftmeta.advance import advance_spec
    from draftmeta.errors import UpdateError
    from draftmeta.testing import random_state

    advance = advance_spec("clamp", "advance", True)
    rules = {"block_table": Derive(Fill(0), ()), "query_start_loc": Derive(Fill(0), ()),
             **{p: r for p, r in advance.rules.items()
                if p not in ("block_table", "query_start_loc")}}
    spec = DraftSpec(DraftState, rules, name="state_rewritten",
                     preconditions=advance.preconditions)
    state = random_state(torch.Generator().manual_seed(0), batch_size=6, block_size=4,
                         max_model_len=32, steps=6)
    state.dcp_world_size, state.dcp_rank = 2, 0
    state.dcp_local_seq_lens = state.seq_lens.clone()
    control = state.clone()
    spec.update(control, control)  # the control: separate buffers pass
    state.slot_mapping = state.positions[:]  # the slot mapping would overwrite the positions
    positions = state.positions.clone()
    with pytest.raises(UpdateError, match=r"field 'slot_mapping': overlaps the memory of its "
                                          r"input 0"):
        spec.update(state, state)
    assert torch.equal(state.positions, positions)  # nothing written
