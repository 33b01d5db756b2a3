"""Acceptance as vLLM counts it: the counter adds up vLLM's own ``observe_draft`` calls."""

from __future__ import annotations

import pytest

from draftmeta.integrations.vllm.tools.e2e.acceptance import (
    Acceptance,
    AcceptanceCounter,
    total_acceptance,
)


def test_the_counter_adds_up_what_vllms_scheduler_observes_and_restores_vllm_on_exit() -> None:
    metrics = pytest.importorskip("vllm.v1.spec_decode.metrics")
    original = metrics.SpecDecodingStats.observe_draft
    counter = AcceptanceCounter()
    with counter:
        counter.start()
        stats = metrics.SpecDecodingStats.new(3)
        stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=2)
        stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=0)
        stats.observe_draft(num_draft_tokens=2, num_accepted_tokens=1)
        counted = counter.read()
        assert stats.num_accepted_tokens_per_pos == [2, 1, 0]  # vLLM's own numbers unchanged
    assert metrics.SpecDecodingStats.observe_draft is original
    assert counted == Acceptance(3, 8, 3, (2, 1, 0), (3, 3, 2))
    assert counted.mean_acceptance_length == pytest.approx(2.0)
    assert counted.per_token == pytest.approx(3 / 8)
    assert counted.per_position == pytest.approx((2 / 3, 1 / 3, 0.0))
    counter.start()
    assert counter.read() == Acceptance()


def test_counts_add_position_by_position_and_an_empty_count_has_no_rates() -> None:
    a = Acceptance(2, 6, 3, (2, 1, 0), (2, 2, 2))
    b = Acceptance(1, 2, 2, (1, 1), (1, 1))
    assert total_acceptance([a, b]) == Acceptance(3, 8, 5, (3, 2, 0), (3, 3, 2))
    assert Acceptance().mean_acceptance_length is None and Acceptance().per_token is None
    assert a.as_json()["mean_acceptance_length"] == pytest.approx(2.5)


def test_the_json_of_a_count_gives_its_counts_and_its_rates_to_four_decimals() -> None:
    assert Acceptance(3, 8, 3, (2, 1, 0), (3, 3, 2)).as_json() == {
        "drafts": 3, "draft_tokens": 8, "accepted": 3, "accepted_per_position": [2, 1, 0],
        "draft_tokens_per_position": [3, 3, 2], "mean_acceptance_length": 2.0,
        "per_token": 0.375, "per_position": [0.6667, 0.3333, 0.0]}
    assert Acceptance(3, 7, 2, (2, 0, 0), (3, 3, 1)).as_json() == {
        "drafts": 3, "draft_tokens": 7, "accepted": 2, "accepted_per_position": [2, 0, 0],
        "draft_tokens_per_position": [3, 3, 1], "mean_acceptance_length": 1.6667,
        "per_token": 0.2857, "per_position": [0.6667, 0.0, 0.0]}
    none = Acceptance().as_json()
    assert (none["mean_acceptance_length"], none["per_token"], none["per_position"]) == (
        None, None, [])


def test_a_draft_longer_than_any_before_adds_only_its_extra_positions_to_the_counts() -> None:
    """vLLM's calls as the counter's wrapper receives them (a stand-in for vLLM's own
    ``observe_draft``, which it calls first): 2 drafts, 1 accepted; then 3 drafts, all
    accepted."""
    seen: list[tuple[int, int]] = []
    counter = AcceptanceCounter()
    observe = counter._wrap(lambda stats, drafts, accepted: seen.append((drafts, accepted)))
    observe(None, 2, 1)
    observe(None, 3, 3)
    assert seen == [(2, 1), (3, 3)]
    assert counter.read() == Acceptance(2, 5, 4, (2, 1, 1), (2, 2, 1))
