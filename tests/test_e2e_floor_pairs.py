"""``benchmarks/e2e_floor.py``'s ratios per pair of generates, judged by
``draftmeta.measure.noise``:
it has no A/A control, so a ratio is faster or slower only where every pair agrees. Nothing
runs an engine here: the per-run times are made up."""

from __future__ import annotations

from types import ModuleType


def _runs(off: list[float], on: list[float]) -> dict[str, dict[str, list[float]]]:
    return {"off": {"in_place": off, "all_refreshes": off},
            "on": {"in_place": on, "all_refreshes": on}}


def test_every_pair_cheaper_with_the_plugin_is_faster_with_its_spread(
    e2e_floor: ModuleType,
) -> None:
    pairs = e2e_floor.pair_result(_runs([30.0, 32.0, 31.0], [25.0, 26.0, 31.0 / 1.05]))
    entry = pairs["off_over_on_in_place"]
    assert entry["verdict"] == "faster" and entry["noise"] is None
    assert entry["ratio"]["min"] == 1.05 and entry["ratio"]["pairs"] == 3
    assert pairs["off_over_floor_in_place"] is None  # no floor mode in this run


def test_a_noisy_floor_run_whose_pairs_disagree_is_within_noise(e2e_floor: ModuleType) -> None:
    """The negative control: the same medians, one pair the other way round (a busy moment
    during one plugin-off generate), give no verdict."""
    pairs = e2e_floor.pair_result(_runs([30.0, 32.0, 20.0], [25.0, 26.0, 31.0]))
    assert pairs["off_over_on_in_place"]["verdict"] == "within noise"
    assert pairs["off_over_on_all_refreshes"]["verdict"] == "within noise"


def test_k_2_has_no_in_place_pairs(e2e_floor: ModuleType) -> None:
    runs = {"off": {"in_place": [], "all_refreshes": [30.0]},
            "on": {"in_place": [], "all_refreshes": [29.0]}}
    pairs = e2e_floor.pair_result(runs)
    assert pairs["off_over_on_in_place"] is None
    assert pairs["off_over_on_all_refreshes"]["verdict"] == "faster"
