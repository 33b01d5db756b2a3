"""The verdict on a negative control: caught by a stated margin, inert, or missed."""

from __future__ import annotations

import pytest

from draftmeta.integrations.vllm.tools.e2e.controls import (
    CAUGHT_DRAFT_SHARE,
    CAUGHT_LENGTH_DROP,
    CONTROLS,
    controls_for,
    injected,
    judged,
    verdict,
)


def test_a_control_is_caught_by_either_margin_and_never_when_nothing_was_compared() -> None:
    assert CAUGHT_LENGTH_DROP == 0.25 and CAUGHT_DRAFT_SHARE == 0.10
    assert verdict(3.6, 2.7, 0, 100, 0.5) == "caught"  # length -25%
    assert verdict(3.6, 2.8, 0, 100, 0.5) == "missed"  # length -22%, no draft differs
    assert verdict(3.6, 3.6, 10, 100, 0.5) == "caught"  # 10% of the drafts differ
    assert verdict(3.6, 3.6, 9, 100, 0.5) == "missed"
    assert verdict(None, None, 5, 0, None) == "missed"  # nothing compared: never caught


def test_a_control_that_changes_nothing_to_the_bit_is_inert_not_caught() -> None:
    assert verdict(3.6, 3.6, 0, 100, 0.0) == "inert"
    assert verdict(3.6, 3.6, 0, 100, 1e-6) == "missed"  # the hidden states moved


def test_an_unknown_control_or_index_is_refused_before_vllm_is_touched() -> None:
    assert controls_for("cpu") == ("seq-lens", "slot-mapping", "positions", "max-seq-len")
    assert controls_for("cuda") == ("stale-scheduler",) and "stale-scheduler" in CONTROLS
    with pytest.raises(ValueError, match="unknown negative control 'lengths'"), \
            injected("lengths"):
        pass
    with pytest.raises(ValueError, match="unknown negative control 'stale-scheduler'"), \
            injected("stale-scheduler"):  # a wrong spec, not an injected advance
        pass
    with pytest.raises(ValueError, match="draft index 1 is the first"), \
            injected("seq-lens", first_index=0):
        pass


def test_a_tile_control_is_caught_at_exactly_the_margin_of_the_drafts_after_a_crossing() -> None:
    """1 draft in 100 differs (under 10% over every draft), and it is 1 of the 10 after a
    tile crossing: 10%, the margin itself."""
    assert judged(3.6, 3.6, 1, 100, 0.5, crossings=(1, 10)) == "caught"
    assert judged(3.6, 3.6, 1, 100, 0.5, crossings=(0, 10)) == "missed"
    assert judged(3.6, 3.6, 1, 100, 0.5, crossings=(1, 20)) == "missed"  # 5% of them
    assert judged(3.6, 3.6, 1, 100, 0.5) == "missed"  # no tile to act through


def test_a_tile_control_is_blind_only_where_nothing_changed_and_no_loop_crossed_a_tile() -> None:
    assert judged(3.6, 3.6, 0, 100, 0.0, crossings=(0, 0)) == "blind"
    assert judged(3.6, 3.6, 1, 100, 0.5, crossings=(0, 0)) == "missed"  # it changed drafts
    assert judged(3.6, 3.6, 0, 100, 0.0, crossings=(0, 5)) == "inert"  # loops did cross
