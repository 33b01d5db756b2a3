"""The best K from step times and an acceptance model."""

from __future__ import annotations

import pytest

from draftmeta.integrations.vllm.tools.e2e.best_k import (
    best_k,
    expected_tokens_per_step,
    step_times,
)


def test_a_step_yields_one_token_plus_the_geometric_run_of_accepted_drafts() -> None:
    assert expected_tokens_per_step(0, 0.8) == 1.0
    assert expected_tokens_per_step(3, 0.8) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert expected_tokens_per_step(3, 1.0) == 4.0
    assert expected_tokens_per_step(3, 0.0) == 1.0
    with pytest.raises(ValueError):
        expected_tokens_per_step(3, 1.5)


def test_the_best_k_moves_up_where_a_cheaper_draft_loop_makes_longer_drafts_pay() -> None:
    """Off, each draft token costs 2 ms on a 10 ms step; on, 0.2 ms: at alpha 0.6 the
    plugin-off engine stops at K = 2 while the plugin-on engine goes on to K = 5."""
    times = {k: (10.0 + 2.0 * k, 10.0 + 0.2 * k) for k in range(1, 6)}
    (row,) = best_k(times, batch_size=4, alphas=[0.6])
    assert row.k_off == 2
    assert row.k_on == 5
    rate_on = 4 * expected_tokens_per_step(5, 0.6) / 11.0 * 1e3
    assert row.tokens_per_s_on == pytest.approx(rate_on)
    assert row.gain == pytest.approx(rate_on / (4 * expected_tokens_per_step(2, 0.6) / 14.0
                                                * 1e3))
    with pytest.raises(ValueError):
        best_k({}, 1)


def test_step_times_come_from_timed_hooked_cases_only() -> None:
    base = {"model": "v3-rank", "backend": "FLASH_ATTN_MLA", "batch_size": 1,
            "control": None, "override_upstream": False, "kv_cache_dtype": "auto",
            "eager": False, "aa": False}
    entries = [{**base, "k": 2, "step_ms": {"off": 20.0, "on": 19.0}},
               {**base, "k": 3, "step_ms": {"off": 21.0, "on": 19.5}},
               {**base, "k": 3, "aa": True, "step_ms": {"off": 21.0, "on": 21.5}},
               {**base, "k": 4, "control": "stale-scheduler",
                "step_ms": {"off": 1.0, "on": 1.0}},
               {**base, "k": 6, "eager": True, "step_ms": {"off": 9.0, "on": 9.0}},
               {**base, "k": 5, "step_ms": {"off": None, "on": None}}]
    assert step_times(entries) == {("v3-rank", "FLASH_ATTN_MLA", 1): {2: (20.0, 19.0),
                                                                     3: (21.0, 19.5)}}
