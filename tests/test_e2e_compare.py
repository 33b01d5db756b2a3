"""What decides an end-to-end verdict: off against on over every engine pair (identity, drafts
counted, hidden states, acceptance), the speed figures, and the GPU's limit, on runs made by
hand (``tests/e2e_fakes.py``) so that every way two runs can differ is fed to it."""

from __future__ import annotations

import pytest
import torch
from e2e_fakes import DRAFTS, SHAPE, TOKENS, comparison, generated, side

from draftmeta.integrations.vllm.tools.e2e.compare import (
    Case,
    Comparison,
    draft_token_difference,
    hidden_max_abs_difference,
)
from draftmeta.integrations.vllm.tools.e2e.gpu_time import union_length


def test_two_runs_alike_in_everything_are_strictly_identical_with_every_draft_compared() -> None:
    c = comparison()
    assert c.output_tokens_identical and c.draft_tokens_identical and c.acceptance_identical
    assert c.hidden_max_abs_difference == 0.0
    assert c.draft_tokens_counted == (0, 12)
    assert c.strictly_identical


def test_one_differing_draft_token_is_counted_and_breaks_identity() -> None:
    drafts = [[[5, 6, 7], [8, 9, 10]], [[11, 12, 13], [14, 99, 16]]]
    c = comparison(pairs=[(side(), side(generated(drafts=drafts)))])
    assert not c.draft_tokens_identical and not c.strictly_identical
    assert c.draft_tokens_counted == (1, 12)


def test_a_propose_call_only_one_run_made_counts_every_token_it_holds_as_differing() -> None:
    longer = [*DRAFTS, [[1, 1, 1], [1, 1, 1]]]
    c = comparison(pairs=[(side(), side(generated(drafts=longer)))])
    assert c.draft_tokens_counted == (6, 18)
    assert draft_token_difference(DRAFTS, longer) == draft_token_difference(longer, DRAFTS)
    assert not c.strictly_identical


def test_runs_with_no_draft_at_all_are_not_called_strictly_identical() -> None:
    empty = generated(drafts=[], hidden=[])
    c = comparison(pairs=[(side(empty), side(generated(drafts=[], hidden=[])))])
    assert c.draft_tokens_identical and c.draft_tokens_counted == (0, 0)
    assert not c.strictly_identical


def test_hidden_states_of_another_count_or_shape_differ_infinitely() -> None:
    one, two = [torch.zeros(2, 4)], [torch.zeros(2, 4), torch.zeros(2, 4)]
    assert hidden_max_abs_difference(one, two) == float("inf")
    assert hidden_max_abs_difference([torch.zeros(2, 4)], [torch.zeros(3, 4)]) == float("inf")
    moved = [torch.zeros(2, 4), torch.full((2, 4), 0.5)]
    c = comparison(pairs=[(side(), side(generated(hidden=moved)))])
    assert c.hidden_max_abs_difference == 0.5 and not c.strictly_identical
    assert c.draft_tokens_identical  # the drafts alone would not have shown it


def test_output_tokens_that_differ_in_one_request_or_in_length_break_identity() -> None:
    for tokens in ([[1, 2, 3, 4], [5, 6, 7, 9]], [[1, 2, 3, 4], [5, 6, 7]]):
        c = comparison(pairs=[(side(), side(generated(tokens=tokens)))])
        assert not c.output_tokens_identical and not c.strictly_identical


def test_acceptance_that_differs_at_one_draft_position_breaks_identity() -> None:
    c = comparison(pairs=[(side(), side(generated(accepted=(2, 1, 1))))])
    assert not c.acceptance_identical and not c.strictly_identical


def test_a_later_pairs_plugin_off_engine_is_held_to_the_first_pairs() -> None:
    """Fresh engines of one configuration must agree with each other too: the second pair's
    plugin-off run differing from the first's is no identity, though each pair agrees within."""
    other = generated(tokens=[[1, 2, 3, 4], [5, 6, 7, 0]])
    c = comparison(pairs=[(side(), side()), (side(other), side(other))])
    assert not c.output_tokens_identical


def test_an_engine_whose_generates_disagree_with_its_recorded_one_is_not_deterministic() -> None:
    wobbly = side()
    wobbly = type(wobbly)(wobbly.recorded, (generated(tokens=[[0], [0]]),))
    c = comparison(pairs=[(side(), wobbly)])
    assert c.deterministic == (True, False)


def test_each_pairs_ratio_is_its_median_rate_on_over_its_median_rate_off() -> None:
    """Rates are tokens (8 per generate here) over seconds: the medians 8/2 off and 8/1 on."""
    c = comparison(pairs=[(side(seconds=(2.0, 2.0, 9.0)), side(seconds=(1.0, 1.0, 0.1))),
                          (side(seconds=(1.0, 1.0, 1.0)), side(seconds=(1.0, 1.0, 1.0)))])
    assert c.pair_speedups == [pytest.approx(2.0), pytest.approx(1.0)]
    assert c.speedup == pytest.approx(1.5)
    off, on = c.generate_seconds
    assert off == [2.0, 2.0, 9.0, 1.0, 1.0, 1.0] and len(on) == 6


def test_a_configuration_without_timed_generates_has_no_ratio() -> None:
    c = comparison(pairs=[(side(seconds=()), side(seconds=()))])
    assert not c.timed and c.pair_speedups == [] and c.speedup is None
    assert c.step_ms("off") is None


def test_the_step_time_is_all_measured_seconds_over_all_their_draft_loops() -> None:
    c = comparison(pairs=[(side(seconds=(1.0, 2.0), loops=10), side(seconds=(0.5, 0.5),
                                                                     loops=10))])
    assert c.step_ms("off") == pytest.approx(1e3 * 3.0 / 20)
    assert c.step_ms("on") == pytest.approx(1e3 * 1.0 / 20)


def test_host_time_per_step_counts_every_loop_and_per_loop_only_those_on_the_host() -> None:
    replayed = generated(loops=10, host_loops=0, host_seconds=0.0)
    eager = generated(loops=10, host_loops=10, host_seconds=0.002)
    on = type(side())(generated(), (replayed, eager))
    c = comparison(pairs=[(side(seconds=(1.0, 1.0), host_seconds=0.004), on)])
    assert c.host_us_per_step("off") == pytest.approx(1e6 * 0.008 / 20)
    assert c.host_us_per_loop("on") == pytest.approx(1e6 * 0.002 / 10)
    assert c.host_us_per_step("on") == pytest.approx(1e6 * 0.002 / 20)


def test_the_limit_is_the_off_step_over_the_on_engines_gpu_busy_time_per_step() -> None:
    """T off = 1 s / 10 loops = 100 ms; GPU busy on = 0.5 s / 10 = 50 ms: at most 2x; the off
    engine's GPU was busy 0.8 s of 1 s, idle 20 ms per step."""
    c = comparison(pairs=[(side(seconds=(1.0,), busy=0.8), side(seconds=(0.9,), busy=0.5))])
    assert c.gpu_busy_ms_per_step("off") == pytest.approx(80.0)
    assert c.gpu_busy_ms_per_step("on") == pytest.approx(50.0)
    assert c.limit == pytest.approx(2.0)
    assert c.gpu_idle_ms_off == pytest.approx(20.0)


def test_without_a_profiled_generate_there_is_no_limit() -> None:
    c = comparison()
    assert c.gpu_busy_ms_per_step("on") is None and c.limit is None and c.gpu_idle_ms_off is None


def test_the_gpus_busy_time_counts_overlapping_kernels_once() -> None:
    assert union_length([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_length([(20, 30), (0, 10), (2, 3)]) == 20
    assert union_length([(0, 10), (10, 20)]) == 20
    assert union_length([(5, 5), (7, 6)]) == 0
    assert union_length([]) == 0


def test_a_case_names_what_sets_it_apart() -> None:
    assert Case("tiny", "FLASHMLA", 3).label == "tiny FLASHMLA K=3"
    assert (Case("m", "TRITON_MLA", 2, override_upstream=True, kv_cache_dtype="fp8",
                 eager=True).label == "m TRITON_MLA K=2 override fp8 eager")
    assert Case("m", "FLASHMLA", 3, aa=True).label.endswith("A/A: both off")
    assert Case("m", "FLASHMLA", 3, control="stale-scheduler").label.endswith(
        "control stale-scheduler")
    assert not Case("m", "FLASHMLA", 3, control="seq-lens").timed


def test_the_recorded_generates_reference_is_the_first_pairs_plugin_off_one() -> None:
    first = generated(tokens=TOKENS)
    c = comparison(pairs=[(side(first), side()), (side(), side())])
    assert c.reference is first
    assert len(c.against) == 3


def test_only_drafts_after_a_tile_crossing_count_for_a_stale_schedule() -> None:
    """K = 4 (draft tokens 0..3, loop steps 1..3): a request whose loop starts at length 63
    reaches 65 at step 3, a new 64-token tile; one starting at 10 never does. Only that one
    draft can show a stale FlashMLA schedule, and it is counted whether it differs or not."""
    drafts = [[[1, 2, 3, 4], [5, 6, 7, 8]]]
    lengths = [[63, 10]]
    off = generated(drafts=drafts, loop_lengths=lengths)
    same = comparison(pairs=[(side(off), side(generated(drafts=drafts)))])
    assert same.tile_crossings(64) == (0, 1)
    moved = [[[1, 2, 3, 9], [5, 6, 0, 0]]]  # the crossing draft and two others differ
    c = comparison(pairs=[(side(off), side(generated(drafts=moved)))])
    assert c.tile_crossings(64) == (1, 1)
    assert c.draft_tokens_counted == (3, 8)
    at_64 = generated(drafts=drafts, loop_lengths=[[64, 10]])  # 64 -> 65 at step 2
    c = comparison(pairs=[(side(at_64), side(generated(drafts=moved)))])
    assert c.tile_crossings(64) == (1, 2)
    nowhere = generated(drafts=drafts, loop_lengths=[[10, 20]])
    assert comparison(pairs=[(side(nowhere), side(generated(drafts=moved)))]
                      ).tile_crossings(64) == (0, 0)


def test_runs_without_hidden_states_or_with_only_empty_steps_differ_by_nothing() -> None:
    assert hidden_max_abs_difference([], []) == 0.0
    empty = [torch.zeros(0, 4), torch.zeros(0, 4)]
    assert hidden_max_abs_difference(empty, [torch.ones(0, 4), torch.ones(0, 4)]) == 0.0


def test_a_comparison_of_no_engine_pairs_compares_nothing_and_is_not_strictly_identical(
) -> None:
    c = Comparison(Case("tiny", "FLASHMLA", 3), 2, (), (SHAPE, SHAPE))
    assert c.against == [] and c.draft_tokens_counted == (0, 0)
    assert c.hidden_max_abs_difference == 0.0
    assert not c.strictly_identical


def test_a_run_with_fewer_propose_calls_counts_the_crossing_drafts_it_lacks_as_differing(
) -> None:
    """The reference made two calls whose first request crosses a tile at step 3 (63 -> 65);
    a run that made only the first call differs at the second call's crossing draft."""
    drafts = [[[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 6, 7, 8]]]
    off = generated(drafts=drafts, loop_lengths=[[63, 10], [63, 10]])
    c = comparison(pairs=[(side(off), side(generated(drafts=drafts[:1])))])
    assert c.tile_crossings(64) == (1, 2)
    assert c.draft_tokens_counted == (8, 16)


def test_the_busy_time_of_kernels_that_never_overlap_is_the_sum_of_their_durations() -> None:
    assert union_length([(1, 2), (3, 5), (6, 9)]) == 6
    assert union_length([(6, 9), (1, 2), (3, 5), (3.5, 4)]) == 6


def test_identical_hidden_states_that_are_not_zero_differ_by_nothing_and_a_moved_one_by_its_move(
) -> None:
    ones = [torch.ones(2, 4), torch.full((2, 4), -2.0)]
    assert hidden_max_abs_difference(ones, [t.clone() for t in ones]) == 0.0
    moved = [torch.ones(2, 4), torch.full((2, 4), -1.75)]
    assert hidden_max_abs_difference(ones, moved) == 0.25
    same = comparison(pairs=[(side(generated(hidden=ones)),
                              side(generated(hidden=[t.clone() for t in ones])))])
    assert same.hidden_max_abs_difference == 0.0 and same.strictly_identical


def test_a_gpu_that_recorded_no_busy_time_gives_no_limit_and_stood_idle_the_whole_step() -> None:
    c = comparison(pairs=[(side(seconds=(1.0,), busy=0.0), side(seconds=(1.0,), busy=0.0))])
    assert c.gpu_busy_ms_per_step("on") == 0.0
    assert c.limit is None  # no division by a busy time of nothing
    assert c.gpu_idle_ms_off == pytest.approx(100.0)
