"""The shared source advance matches a plain-Python model of vLLM's two draft loops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draftmeta import DraftState, PreconditionFailed, advance_spec, advance_state
from draftmeta.errors import UpdateError
from draftmeta.testing import random_state


def reference_step(state: DraftState, policy: str) -> None:
    """One step, element by element, as vLLM's kernels describe it."""
    limit, bs = state.max_model_len, state.block_size
    width = state.block_table.shape[1]
    for r in range(state.batch_size):
        if r >= state.num_reqs:  # padding: vLLM's runners leave it at 0, slot -1
            state.slot_mapping[r] = -1
            continue
        p, q = int(state.positions[r]) + 1, int(state.seq_lens[r]) + 1
        if policy == "wrap":
            if p >= limit:  # the older proposer: restart, pad the slot
                p, q = 0, 1
        else:  # the new runner: clamp, keep a real slot
            p, q = min(p, limit - 1), min(q, limit)
        state.positions[r], state.seq_lens[r] = p, q
        padded = r >= state.num_reqs or q <= 1
        block = int(state.block_table[r, min(p // bs, width - 1)])
        state.slot_mapping[r] = -1 if padded else block * bs + p % bs
    state.max_seq_len = min(state.max_seq_len + 1, limit)
    state.step += 1


def reference_dcp_local(seq: int, world: int, rank: int, interleave: int) -> int:
    """Deal tokens to ranks round-robin, ``interleave`` at a time, and count this rank's."""
    return sum(1 for t in range(seq) if (t // interleave) % world == rank)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 33),
    padded=st.integers(0, 3),
    block_size=st.sampled_from([1, 4, 16]),
    steps=st.integers(1, 8),
    policy=st.sampled_from(["wrap", "clamp"]),
)
def test_advance_matches_the_reference(
    seed: int, batch: int, padded: int, block_size: int, steps: int, policy: str
) -> None:
    g = torch.Generator().manual_seed(seed)
    max_model_len = int(torch.randint(block_size * 2, 200, (1,), generator=g))
    state = random_state(
        g, batch_size=batch, block_size=block_size, max_model_len=max_model_len,
        steps=steps, num_padded=padded,
    )
    model = state.clone()
    for step in range(steps):
        advance_state(state, policy)  # type: ignore[arg-type]
        reference_step(model, policy)
        for name in ("positions", "seq_lens", "slot_mapping"):
            got, want = getattr(state, name), getattr(model, name)
            assert torch.equal(got, want), f"seed {seed} step {step} {name}: {got} != {want}"
        assert (state.max_seq_len, state.step) == (model.max_seq_len, model.step)


def test_positions_reaching_max_model_len() -> None:
    g = torch.Generator().manual_seed(0)
    state = random_state(g, batch_size=1, block_size=4, max_model_len=10, steps=1)
    for policy, positions, seq_lens, slots_real in (
        ("wrap", [9, 0, 1], [10, 1, 2], [True, False, True]),
        ("clamp", [9, 9, 9], [10, 10, 10], [True, True, True]),
    ):
        s = state.clone()
        s.positions.fill_(8)
        s.seq_lens.fill_(9)
        seen = []
        for _ in range(3):
            advance_state(s, policy)  # type: ignore[arg-type]
            seen.append((int(s.positions[0]), int(s.seq_lens[0]), int(s.slot_mapping[0]) >= 0))
        assert seen == list(zip(positions, seq_lens, slots_real)), policy


def test_frozen_host_bound() -> None:
    state = random_state(torch.Generator().manual_seed(1), batch_size=3, block_size=4,
                         max_model_len=64, steps=2)
    advance_state(state, "clamp", "frozen")
    assert state.max_seq_len == 64


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleave", [1, 2, 16])
def test_dcp_local_seq_lens_are_recomputed_each_step(world: int, interleave: int) -> None:
    g = torch.Generator().manual_seed(world * 100 + interleave)
    base = random_state(g, batch_size=17, block_size=16, max_model_len=300, steps=6)
    for rank in range(world):
        state = base.clone()
        state.dcp_world_size, state.dcp_rank, state.dcp_interleave = world, rank, interleave
        state.dcp_local_seq_lens = torch.full_like(state.seq_lens, -5)  # stale garbage
        for _ in range(6):
            advance_state(state, "clamp")
            want = [reference_dcp_local(int(q), world, rank, interleave) for q in state.seq_lens]
            assert state.dcp_local_seq_lens.tolist() == want


def test_dcp_spec_refuses_a_state_without_dcp() -> None:
    state = random_state(torch.Generator().manual_seed(2), batch_size=2, block_size=4,
                         max_model_len=32, steps=1)
    with pytest.raises(PreconditionFailed, match="dcp_enabled"):
        advance_spec("clamp", "advance", True).update(state, state)
    with pytest.raises(ValueError, match="overflow policy must be 'wrap' or 'clamp'"):
        advance_spec("saturate")  # type: ignore[arg-type]


@pytest.mark.parametrize("rank", [2, 3, -1])
def test_a_dcp_rank_outside_the_world_is_refused_before_any_write(rank: int) -> None:
    """Ranks are 0 .. world - 1: ``dcp_rank == dcp_world_size`` (one past the last rank) is as
    invalid as any other, and the advance refuses it with the state untouched."""
    state = random_state(torch.Generator().manual_seed(3), batch_size=5, block_size=4,
                         max_model_len=64, steps=2)
    state.dcp_world_size, state.dcp_rank, state.dcp_interleave = 2, rank, 1
    state.dcp_local_seq_lens = torch.zeros_like(state.seq_lens)
    before = state.clone()
    with pytest.raises(UpdateError, match=rf"invalid DCP setting: world 2, rank {rank}"):
        advance_state(state)
    for name in ("positions", "seq_lens", "slot_mapping", "dcp_local_seq_lens"):
        assert torch.equal(getattr(state, name), getattr(before, name)), name
    assert (state.max_seq_len, state.step) == (before.max_seq_len, before.step)


def test_the_default_overflow_policy_is_clamp() -> None:
    """``advance_state(state)`` is the new model runner's advance: a position at the limit
    stays at ``max_model_len - 1`` with a real slot (the wrap policy would restart it at 0)."""
    state = random_state(torch.Generator().manual_seed(4), batch_size=3, block_size=4,
                         max_model_len=16, steps=1)
    state.positions[: state.num_reqs] = 15
    state.seq_lens[: state.num_reqs] = 16
    advance_state(state)
    real = slice(0, state.num_reqs)
    assert state.positions[real].tolist() == [15] * state.num_reqs
    assert state.seq_lens[real].tolist() == [16] * state.num_reqs
    assert bool((state.slot_mapping[real] >= 0).all())
    assert advance_spec().name == "draft_state.clamp.advance"


def test_an_unknown_host_bound_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^host bound must be 'advance' or 'frozen', got "
                                         r"'stuck'$"):
        advance_spec("clamp", "stuck")  # type: ignore[arg-type]


@pytest.mark.parametrize(("own", "loop"), [("clamp", "wrap"), ("wrap", "clamp")])
def test_a_policy_mismatch_names_the_spec_the_field_and_both_fixes(own: str, loop: str) -> None:
    """The refusal says which spec and field advance with which policy, the declaration that
    would match the loop, and the loop policy that would match the spec."""
    from draftmeta import SpecError
    from draftmeta.advance import check_policy
    from tests.toy import toy_rules, toy_spec

    spec = toy_spec(rules=toy_rules(own))
    check_policy(spec, own)  # type: ignore[arg-type]
    matching = "Wrap" if loop == "wrap" else "Clamp"
    with pytest.raises(SpecError) as caught:
        check_policy(spec, loop)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"field 'positions' of spec 'toy': advances with the {own} overflow policy, but the "
        f"draft loop's source advance uses {loop}, so the field would drift from the state at "
        f"max_model_len. Fix: declare it Advance({matching}(...)) to match, or run the loop "
        f"with policy={own!r}")


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_state_to_copies_every_buffer_onto_the_device_and_keeps_the_host_values(
    device: str,
) -> None:
    """``DraftState.to`` gives fresh tensors on ``device`` (never views of the original, even
    on the same device), the same host scalars, and an empty workspace."""
    state = random_state(torch.Generator().manual_seed(6), batch_size=4, block_size=4,
                         max_model_len=32, steps=2)
    state.dcp_local_seq_lens = state.seq_lens.clone()
    state.workspace.buffer("x", (2,), torch.int32, state.device)
    moved = state.to(device)
    for name in ("positions", "seq_lens", "slot_mapping", "block_table", "query_start_loc",
                 "dcp_local_seq_lens"):
        original, copy = getattr(state, name), getattr(moved, name)
        assert copy.device.type == device and copy.dtype == original.dtype, name
        assert copy.shape == original.shape, name
        if device == "cpu":
            assert torch.equal(copy, original), name
            assert copy.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()
    assert (moved.num_reqs, moved.max_seq_len, moved.max_model_len, moved.block_size) == (
        state.num_reqs, state.max_seq_len, state.max_model_len, state.block_size)
    assert len(moved.workspace) == 0 and len(state.workspace) == 1
