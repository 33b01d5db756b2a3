"""check_spec: the ready update-versus-rebuild check for any metadata class and builder.

The paged family (tests/paged.py) is FlashInfer-shaped: kv_indptr, a fixed-capacity kv_indices
valid up to kv_indptr[-1], kv_last_page_len valid for the first num_reqs rows, seq_lens.
Every check check_spec makes is shown failing on a deliberately broken spec or builder here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draftmeta import Advance, Alias, Derive, DraftState, Unchanged, Wrap, advance_state
from draftmeta.testing import (
    COVERAGE,
    EDGE_CASES,
    CheckFailure,
    SpecCheckFailed,
    SpecCheckReport,
    ValidPrefix,
    batch_case,
    check_spec,
    compare_metadata,
)
from tests import paged
from tests.paged import GARBAGE, VALID, PagedMeta, PageIndices, build


def failure_of(check: Callable[[], object]) -> CheckFailure:
    with pytest.raises(SpecCheckFailed) as caught:
        check()
    assert isinstance(caught.value, AssertionError)
    return caught.value.failure


# -- a correct spec passes ----------------------------------------------------------------------


def test_a_correct_paged_spec_passes_200_batches_under_both_policies_with_every_edge_case() -> None:
    report = check_spec(paged.spec(), build, valid=VALID)
    assert isinstance(report, SpecCheckReport)
    assert report.batches == 200 and report.policies == ("clamp", "wrap")
    assert report.steps >= 2 * 200  # at least one compared step per batch
    assert set(report.coverage) == set(COVERAGE)
    assert all(count >= 40 for count in report.coverage.values()), report.coverage
    assert report.valid == {"kv_indices": "up to kv_indptr[-1]",
                            "kv_last_page_len": "first state.num_reqs rows"}
    assert "kv_indices        up to kv_indptr[-1]" in str(report)


def test_a_spec_per_policy_with_its_own_advances_passes() -> None:
    specs = {
        "clamp": paged.spec("paged.clamp", seq_lens=paged.CLAMP_SEQ_LENS),
        "wrap": paged.spec(
            "paged.wrap",
            seq_lens=Advance(Wrap("max_model_len", restart=1), rows="num_reqs"),
        ),
    }
    report = check_spec(specs, build, valid=VALID, batches=40)
    assert report.policies == ("clamp", "wrap")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_spec_is_checked_on_cuda_states_and_a_stale_field_still_shows() -> None:
    report = check_spec(paged.spec(), build, valid=VALID, batches=50, device="cuda")
    assert report.steps > 50
    stale = paged.spec("stale", kv_last_page_len=Unchanged())
    failure = failure_of(lambda: check_spec(stale, build, valid=VALID, device="cuda"))
    cpu = failure_of(lambda: check_spec(stale, build, valid=VALID))
    assert (failure.seed, failure.step, failure.field, failure.index) == (
        cpu.seed, cpu.step, cpu.field, cpu.index)


def test_the_frozen_host_bound_is_checked_when_asked() -> None:
    report = check_spec(paged.spec(), build, valid=VALID, batches=10, host_bound="frozen")
    assert report.host_bound == "frozen"


# -- negative controls: each must fail, precisely -----------------------------------------------


def test_a_forgotten_field_is_reported_with_seed_step_field_index_expected_and_got() -> None:
    stale = paged.spec("stale", kv_last_page_len=Unchanged())
    failure = failure_of(lambda: check_spec(stale, build, valid=VALID))
    case = failure.case
    assert case is not None
    assert (failure.seed, failure.step, failure.field, failure.index) == (
        0, 1, "kv_last_page_len", (0,))
    seq = int(case.state().seq_lens[0])
    assert failure.got == (seq - 1) % case.block_size + 1  # the value as built, never updated
    assert failure.expected == seq % case.block_size + 1  # one token later
    text = str(failure)
    for line in ("seed 0 (batch of one)", "step:     1", "field:    kv_last_page_len",
                 "index:    (0,)", f"expected: {failure.expected}", f"got:      {failure.got}",
                 "reproduce: check_spec(spec, build, seed=0, batches=1, policies=('clamp',))"):
        assert line in text, (line, text)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_the_reproduce_call_reruns_exactly_the_failing_batch(seed: int) -> None:
    stale = paged.spec("stale", kv_last_page_len=Unchanged())
    first = failure_of(lambda: check_spec(stale, build, valid=VALID, seed=seed))
    case = first.case
    assert case is not None and seed <= case.seed
    again = failure_of(lambda: check_spec(stale, build, valid=VALID, seed=case.seed, batches=1,
                                          policies=(case.policy,)))
    assert again == first
    assert f"seed={case.seed}, batches=1, policies=({case.policy!r},)" in str(first)


def test_an_advance_without_wrap_fails_under_the_wrap_policy_only() -> None:
    clamped = paged.spec("clamped", seq_lens=paged.CLAMP_SEQ_LENS)
    check_spec(clamped, build, valid=VALID, batches=20, policies=("clamp",))
    failure = failure_of(lambda: check_spec(clamped, build, valid=VALID))
    assert failure.case is not None and failure.case.policy == "wrap"
    assert failure.field == "seq_lens"
    # the rebuilt sequence wrapped to 1; the clamped copy stayed at max_model_len
    assert (failure.expected, failure.got) == (1, failure.case.max_model_len)
    assert failure.hint is not None and "clamp" in failure.hint and "wrap" in failure.hint


def test_a_wrap_with_the_wrong_restart_is_caught_by_the_comparison_alone() -> None:
    wrong = paged.spec(
        "restart0", seq_lens=Advance(Wrap("max_model_len", restart=0), rows="num_reqs")
    )
    failure = failure_of(lambda: check_spec(wrong, build, valid=VALID, policies=("wrap",)))
    assert failure.hint is None  # the loop's policy check accepts it: only the values tell
    assert (failure.field, failure.expected, failure.got) == ("seq_lens", 1, 0)


def test_garbage_beyond_the_valid_prefix_is_ignored() -> None:
    scribbled = paged.spec("beyond", kv_indices=Derive(
        PageIndices(scribble="beyond"), ("kv_indptr", "state.block_table")))
    check_spec(scribbled, build, valid=VALID, batches=50)


def test_garbage_inside_the_valid_prefix_is_caught_at_its_index() -> None:
    scribbled = paged.spec("inside", kv_indices=Derive(
        PageIndices(scribble="inside"), ("kv_indptr", "state.block_table")))
    failure = failure_of(lambda: check_spec(scribbled, build, valid=VALID))
    assert failure.case is not None
    state = failure.case.state()
    for _ in range(failure.step):
        advance_state(state, failure.case.policy)
    total = int(build(state).kv_indptr[-1])
    assert (failure.field, failure.index, failure.got) == ("kv_indices", (total - 1,), GARBAGE)


def test_padded_rows_are_compared_unless_declared_outside_the_valid_prefix() -> None:
    only_indices = {"kv_indices": VALID["kv_indices"]}
    failure = failure_of(lambda: check_spec(paged.spec(), build, valid=only_indices))
    assert failure.case is not None and failure.case.kind == "padded_rows"
    assert failure.field == "kv_last_page_len"
    assert failure.index == (failure.case.batch_size,)  # the first padded row
    assert (failure.expected, failure.got) == (0, failure.case.block_size)


def test_without_a_valid_prefix_the_tail_of_a_fixed_capacity_buffer_is_compared() -> None:
    only_rows = {"kv_last_page_len": VALID["kv_last_page_len"]}
    failure = failure_of(lambda: check_spec(paged.spec(), build, valid=only_rows))
    assert failure.field == "kv_indices" and failure.step == 1


def test_an_update_that_raises_is_reported_with_its_batch_and_step() -> None:
    aliased = paged.spec("alias", seq_lens=Alias("seq_lens"))  # build makes a copy, not a view
    failure = failure_of(lambda: check_spec(aliased, build, valid=VALID))
    assert (failure.seed, failure.step) == (0, 1)
    assert failure.error is not None and "UpdateError" in failure.error
    assert failure.cause is not None


def test_a_build_that_raises_is_reported_as_step_0_and_chained() -> None:
    def picky(state: DraftState) -> PagedMeta:
        if state.batch_size > state.num_reqs:
            raise RuntimeError("padding is not supported")
        return build(state)

    with pytest.raises(SpecCheckFailed) as caught:
        check_spec(paged.spec(), picky, valid=VALID)
    failure = caught.value.failure
    assert failure.step == 0 and failure.case is not None and failure.case.num_padded > 0
    assert isinstance(caught.value.__cause__, RuntimeError)
    # a builder without padding support is checked with padded_rows=False
    check_spec(paged.spec(), picky, valid=VALID, batches=20, padded_rows=False)


def test_what_the_spec_does_not_cover_is_reported() -> None:
    def with_extra(state: DraftState) -> PagedMeta:
        metadata = build(state)
        metadata.plan = None  # type: ignore[attr-defined]
        return metadata

    failure = failure_of(lambda: check_spec(paged.spec(), with_extra, valid=VALID))
    assert failure.step == 0 and failure.error is not None and "plan" in failure.error


def test_a_rebuild_that_overwrites_the_updated_buffers_is_refused() -> None:
    class Builder:
        """Reuses one kv_last_page_len buffer, as builders with persistent buffers do."""

        def __init__(self) -> None:
            self.last: torch.Tensor | None = None

        def build(self, state: DraftState) -> PagedMeta:
            metadata = build(state)
            if self.last is None or self.last.shape != metadata.kv_last_page_len.shape:
                self.last = metadata.kv_last_page_len
            else:
                self.last.copy_(metadata.kv_last_page_len)
            metadata.kv_last_page_len = self.last
            return metadata

    stale = paged.spec("stale", kv_last_page_len=Unchanged())
    one = Builder()
    failure = failure_of(lambda: check_spec(stale, one.build, valid=VALID))
    assert failure.error is not None and "kv_last_page_len shares storage" in failure.error
    # an ignored field is neither compared nor checked for shared storage
    check_spec(stale, Builder().build, valid=VALID, batches=10,
               ignore=lambda path: path == "kv_last_page_len")
    # with a second instance for the rebuild, the stale field shows
    failure = failure_of(lambda: check_spec(stale, Builder().build, rebuild=Builder().build,
                                            valid=VALID))
    assert failure.field == "kv_last_page_len"


def test_a_field_that_aliases_the_state_is_not_mistaken_for_a_shared_rebuild_buffer() -> None:
    def with_view(state: DraftState) -> PagedMeta:
        return dataclasses.replace(build(state), seq_lens=state.seq_lens)  # a view, as vLLM's

    aliased = paged.spec("alias", seq_lens=Alias("seq_lens"))
    check_spec(aliased, with_view, valid=VALID, batches=20)  # the rebuild reads a copy


def test_a_spec_the_draft_loop_refuses_fails_even_if_the_compared_fields_agree() -> None:
    clamped = paged.spec("clamped", seq_lens=paged.CLAMP_SEQ_LENS)
    failure = failure_of(lambda: check_spec(
        clamped, build, valid=VALID, batches=10, ignore=lambda path: path == "seq_lens"))
    assert failure.case is None and failure.error is not None
    assert "refuses this spec under the wrap policy" in failure.error
    assert failure.policy == "wrap" and "check_policy(spec, 'wrap')" in str(failure)


# -- declarations and options are checked before anything runs ---------------------------------


@pytest.mark.parametrize(("valid", "says"), [
    ({"kv_indice": ValidPrefix("kv_indptr", at=-1)}, "did you mean 'kv_indices'"),
    ({"kv_indices": ValidPrefix("kv_indptr")}, "ValidPrefix('kv_indptr', at=-1)"),
    ({"kv_indices": ValidPrefix("num_reqs", at=-1)}, "drop it"),
    ({"num_reqs": ValidPrefix("num_reqs")}, "not a tensor"),
    ({"kv_indices": ValidPrefix("state.num_req")}, "did you mean 'state.num_reqs'"),
    ({"kv_indices": ValidPrefix("kv_indptr", at="seq_lens")}, "must name a host int"),
])
def test_a_malformed_valid_declaration_is_refused_with_the_fix(
    valid: dict[str, ValidPrefix], says: str
) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check_spec(paged.spec(), build, valid=valid)


@pytest.mark.parametrize(("options", "says"), [
    ({"max_model_lens": (20,)}, "use max_model_len >= 26"),
    ({"batches": 0}, "batches is 0"),
    ({"max_steps": 1}, "max_steps is 1"),
    ({"policies": ("round",)}, "'clamp' or 'wrap'"),
    ({"policies": ()}, "policies is empty"),
    ({"host_bound": "loose"}, "host_bound"),
])
def test_malformed_options_are_refused(options: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_spec(paged.spec(), build, valid=VALID, **options)  # type: ignore[arg-type]


def test_a_spec_per_policy_must_cover_the_policies_asked_for() -> None:
    with pytest.raises(ValueError, match=r"add spec\['wrap'\]"):
        check_spec({"clamp": paged.spec()}, build, policies=("clamp", "wrap"))


# -- the schedule and the comparison it relies on -----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), policy=st.sampled_from(["clamp", "wrap"]))
def test_a_batch_case_is_drawn_from_its_seed_alone_and_meets_its_edge_case(
    seed: int, policy: str
) -> None:
    case = batch_case(seed, policy)  # type: ignore[arg-type]
    assert case == batch_case(seed, policy)  # type: ignore[arg-type]
    assert case.kind == EDGE_CASES[seed % 5]
    state, again = case.state(), case.state()
    assert torch.equal(state.seq_lens, again.seq_lens)
    assert torch.equal(state.block_table, again.block_table)
    assert 2 <= case.steps <= 8
    n, bs, top = state.num_reqs, case.block_size, case.max_model_len
    start = state.seq_lens[:n].clone()
    seen_max = start.clone()
    for _ in range(case.steps - 1):
        advance_state(state, case.policy)
        seen_max = torch.maximum(seen_max, state.seq_lens[:n])
    if case.kind == "batch_of_one":
        assert n == 1 and state.batch_size == 1
    elif case.kind == "padded_rows":
        assert state.batch_size > n
    elif case.kind == "block_crossing":  # every request starts a new block while drafting
        assert bool(((seen_max + bs - 1) // bs > (start + bs - 1) // bs).all())
    elif case.kind == "at_max_model_len":  # every request reaches the limit
        assert bool((seen_max == top).all())


@settings(max_examples=200, deadline=None)
@given(
    valid=st.integers(0, 12),
    tail_a=st.integers(0, 6),
    tail_b=st.integers(0, 6),
    bad=st.sets(st.integers(0, 17), max_size=3),
    data=st.data(),
)
def test_a_valid_prefix_ignores_the_tail_and_finds_the_first_bad_element_inside(
    valid: int, tail_a: int, tail_b: int, bad: set[int], data: st.DataObject
) -> None:
    values = data.draw(st.lists(st.integers(0, 100), min_size=valid, max_size=valid))
    garbage_a = data.draw(st.lists(st.integers(-100, -1), min_size=tail_a, max_size=tail_a))
    garbage_b = data.draw(st.lists(st.integers(-100, -1), min_size=tail_b, max_size=tail_b))
    tail = torch.tensor(values + garbage_b, dtype=torch.int64)
    rebuilt = PagedMeta(1, 1, torch.zeros(1), torch.zeros(2), tail, torch.zeros(1))
    got = list(values)
    inside = sorted(i for i in bad if i < valid)
    for i in inside:
        got[i] = 1000 + i
    updated = dataclasses.replace(rebuilt, kv_indices=torch.tensor(got + garbage_a,
                                                                   dtype=torch.int64))
    found = compare_metadata(updated, rebuilt, valid_prefix={"kv_indices": valid})
    if not inside:
        assert found == []
    else:
        first = inside[0]
        assert [(m.path, m.index, m.expected, m.got) for m in found] == [
            ("kv_indices", (first,), values[first], 1000 + first)]
        assert f"at {len(inside)} element(s)" in found[0].detail


def test_a_buffer_shorter_than_its_valid_prefix_is_reported() -> None:
    short, full = torch.arange(3), torch.arange(8)
    found = compare_metadata(short, full, path="kv_indices", valid_prefix={"kv_indices": 5})
    assert [m.path for m in found] == ["kv_indices"] and "allocate it" in found[0].detail
    found = compare_metadata(full, short, path="kv_indices", valid_prefix={"kv_indices": 5})
    assert "ValidPrefix declaration" in found[0].detail
