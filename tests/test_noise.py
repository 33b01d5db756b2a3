"""The noise rule (``draftmeta.measure.noise``) that every benchmark applies to its ratios.

The negative control is a fake noisy run: an A/A control whose pairs of the same code all lean
one way is flagged "too noisy", whatever the comparison's own ratio, where the same ratio with a
quiet control gets its verdict; and a rule that ignored the control would call it faster.
"""

from __future__ import annotations

import pytest

from draftmeta.measure.noise import Control, Ratios, pair_ratios, rate_ratios, verdict


def test_a_pair_ratio_is_baseline_time_over_candidate_time_above_one_when_faster() -> None:
    ratios = pair_ratios([10.0, 12.0, 9.0], [5.0, 4.0, 3.0])
    assert ratios.values == (2.0, 3.0, 3.0)
    assert (ratios.median, ratios.low, ratios.high, ratios.pairs) == (3.0, 2.0, 3.0, 3)
    assert rate_ratios([100.0, 200.0], [150.0, 100.0]).values == (1.5, 0.5)
    assert ratios.span() == "3.00x (2.00-3.00)"


@pytest.mark.parametrize(("baseline", "candidate"), [([1.0, 2.0], [1.0]), ([], []),
                                                     ([1.0], [0.0]), ([-1.0], [1.0])])
def test_pairs_of_unequal_length_or_non_positive_times_are_refused(
    baseline: list[float], candidate: list[float],
) -> None:
    with pytest.raises(ValueError):
        pair_ratios(baseline, candidate)


def test_the_json_of_a_comparison_reads_back_as_the_same_ratios() -> None:
    ratios = Ratios((1.5, 0.9, 1.2))
    assert ratios.as_json() == {"median": 1.2, "min": 0.9, "max": 1.5, "pairs": 3,
                                "ratios": [1.5, 0.9, 1.2]}
    assert Ratios.from_json(ratios.as_json()) == ratios


QUIET = Control((Ratios((0.98, 1.03, 1.01)), Ratios((1.02, 0.99))))
"""The same code on both sides, pairs on both sides of 1.00, medians within 1% of it."""
NOISY = Control((Ratios((0.52, 0.61, 0.45)), Ratios((0.70, 0.58))))
"""A fake noisy run: the same code read 0.45-0.70x, every pair one way (a busy machine whose
load fell on one engine)."""


def test_a_quiet_control_gives_the_noise_its_configurations_medians_show() -> None:
    assert QUIET.straddles and QUIET.usable
    assert QUIET.noise == pytest.approx(0.01)
    assert verdict(Ratios((1.30, 1.25, 1.40)), QUIET).word == "faster"
    assert verdict(Ratios((0.80, 0.85, 0.75)), QUIET).word == "slower"
    assert verdict(Ratios((1.01, 0.95, 1.10)), QUIET).word == "within noise"


def test_a_fake_noisy_run_is_flagged_too_noisy_by_how_far_its_control_is_off() -> None:
    judged = verdict(Ratios((0.77, 0.74, 0.80)), NOISY)
    assert judged.word == "too noisy"
    assert judged.too_noisy_by == pytest.approx(1 - 0.58)
    sentence = judged.sentence()
    assert "too noisy" in sentence and "42% off 1.00" in sentence, sentence
    # even a ratio far beyond the control's spread gets no verdict from a run like this
    assert verdict(Ratios((4.0, 4.2)), NOISY).word == "too noisy"


def test_negative_control_the_same_ratio_ignoring_the_control_would_be_a_verdict() -> None:
    """Without the control (or judged by a quiet one) the ratio of the noisy run above is a
    verdict: so it is the control that withholds it."""
    assert verdict(Ratios((0.77, 0.74, 0.80))).word == "slower"
    assert verdict(Ratios((0.77, 0.74, 0.80)), QUIET).word == "slower"


def test_a_control_that_straddles_one_but_scatters_widely_widens_the_noise() -> None:
    wide = Control((Ratios((0.6, 1.3, 0.9)), Ratios((1.1, 0.95, 1.2))))
    assert wide.straddles and wide.noise == pytest.approx(0.1)
    assert verdict(Ratios((1.08, 1.2, 1.05)), wide).word == "within noise"
    assert verdict(Ratios((1.15, 1.2, 1.12)), wide).word == "faster"


def test_without_a_control_only_pairs_that_all_agree_give_a_verdict() -> None:
    assert verdict(Ratios((1.2, 1.1, 1.3))).word == "faster"
    assert verdict(Ratios((0.9, 0.8))).word == "slower"
    assert verdict(Ratios((1.2, 0.99, 1.3))).word == "within noise"
    assert "no A/A control" in verdict(Ratios((1.2, 1.1))).sentence()


def test_a_control_of_one_pair_counts_as_none() -> None:
    single = Control((Ratios((1.3,)),))
    assert not single.usable
    assert verdict(Ratios((1.2, 1.1)), single).word == "faster"  # rule 4, not "too noisy"
    assert "too few" in single.sentence()
    assert not Control(()).usable and Control(()).pooled is None


def test_every_verdict_sentence_names_its_word_and_the_noise() -> None:
    assert verdict(Ratios((1.3, 1.25)), QUIET).sentence() == (
        "faster (beyond this run's noise of 1%)")
    assert verdict(Ratios((1.0, 1.01)), QUIET).sentence() == (
        "within noise (inside this run's noise of 1% around 1.00)")
    assert "0.45-0.70" in NOISY.sentence() and "5 pairs" in NOISY.sentence()


def test_the_sides_of_a_pair_take_turns_going_first() -> None:
    from draftmeta.measure.noise import alternating

    assert list(alternating(["off", "on"], 3)) == [(0, "off"), (0, "on"), (1, "on"), (1, "off"),
                                                   (2, "off"), (2, "on")]
    order = [side for _, side in alternating(["rebuild", "update", "rebuild (A/A)"], 2)]
    assert order == ["rebuild", "update", "rebuild (A/A)", "rebuild (A/A)", "update", "rebuild"]


def test_a_ratio_the_control_does_not_measure_is_judged_by_its_pairs_unless_too_noisy() -> None:
    """The e2e's K = 1 rows give the noise of tokens/s; refresh time they do not have."""
    assert verdict(Ratios((1.015, 1.005, 1.008)), QUIET, measures_the_same=False).word == "faster"
    assert verdict(Ratios((1.015, 1.005, 1.008)), QUIET).word == "within noise"  # < 1 + n
    assert verdict(Ratios((1.05, 1.02)), NOISY, measures_the_same=False).word == "too noisy"


def test_a_pair_ratio_that_is_not_positive_and_finite_is_refused_by_name() -> None:
    refused = r"^pair ratios must be positive and finite, got "
    with pytest.raises(ValueError, match=refused + r"\[0\.0\]$"):
        Ratios((1.2, 0.0))
    with pytest.raises(ValueError, match=refused + r"\[inf\]$"):
        Ratios((float("inf"),))


def test_the_controls_json_gives_its_pooled_pairs_the_noise_and_each_configurations_median(
) -> None:
    assert QUIET.as_json() == {
        "pooled": {"median": 1.01, "min": 0.98, "max": 1.03, "pairs": 5,
                   "ratios": [0.98, 1.03, 1.01, 1.02, 0.99]},
        "configuration_medians": [1.01, 1.005], "noise": 0.01, "straddles_1": True,
        "usable": True}
    assert Control(()).as_json()["pooled"] is None


def test_a_control_sentence_lists_up_to_four_configuration_medians_and_gives_more_as_a_range(
) -> None:
    def control(*medians: float) -> Control:
        return Control(tuple(Ratios((m - 0.01, m, m + 0.01)) for m in medians))

    assert control(0.99, 1.0, 1.01, 1.02).sentence().endswith(
        "(medians per configuration: 0.99x, 1.00x, 1.01x, 1.02x)")
    assert control(0.99, 1.0, 1.01, 1.02, 0.98).sentence().endswith(
        "(medians per configuration: 0.98x to 1.02x over 5)")


def test_without_a_control_a_pair_at_exactly_one_leaves_the_ratio_within_noise() -> None:
    """Rule 4 asks every pair to lean the same way: a pair of exactly 1.00 leans neither."""
    assert verdict(Ratios((1.0, 1.2, 1.3))).word == "within noise"
    assert verdict(Ratios((0.7, 0.8, 1.0))).word == "within noise"
    assert verdict(Ratios((1.2, 0.99, 1.3))).sentence() == (
        "within noise (its pairs fall on both sides of 1.00; no A/A control for this ratio)")


def test_a_time_that_is_not_positive_is_refused_as_a_time() -> None:
    with pytest.raises(ValueError, match=r"^times must be positive and finite, got \[0\.0\]$"):
        pair_ratios([1.0], [0.0])
    with pytest.raises(ValueError, match=r"^times must be positive and finite, got \[-1\.0\]$"):
        pair_ratios([-1.0], [1.0])


def test_the_json_of_a_comparison_gives_its_ratios_to_four_decimals() -> None:
    assert Ratios((1.234567, 0.987654, 1.111111)).as_json() == {
        "median": 1.1111, "min": 0.9877, "max": 1.2346, "pairs": 3,
        "ratios": [1.2346, 0.9877, 1.1111]}


def test_a_control_whose_pairs_reach_one_exactly_from_one_side_straddles_it() -> None:
    """Rule 2: lowest <= 1.00 <= highest, 1.00 itself included on either end."""
    assert Control((Ratios((0.95, 1.0)),)).straddles
    assert Control((Ratios((1.0, 1.05)),)).straddles
    assert not Control((Ratios((1.01, 1.05)),)).straddles


def test_a_control_too_small_to_judge_says_how_many_pairs_it_has() -> None:
    assert Control((Ratios((1.3,)),)).sentence() == (
        "the A/A control has 1 pair, too few to tell this machine's noise")
    assert Control(()).sentence() == (
        "the A/A control has 0 pairs, too few to tell this machine's noise")
