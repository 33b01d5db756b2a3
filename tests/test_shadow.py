"""Shadow mode: a deliberately stale spec is caught, logged once with builder and field, counted
and switched to rebuilding for the rest of the process; a correct spec is never switched off;
off by default; the environment variable is parsed strictly; a clamp/wrap or padded-row
mismatch between a spec and the loop is refused when the loop is built."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from draftmeta import Advance, Clamp, DraftState, SpecError, Unchanged, Wrap
from draftmeta.loop import AttentionGroup, DraftLoop
from draftmeta.shadow import ENV, Sentinel, reset_sentinels, sentinel_for, shadow_interval
from draftmeta.testing import compare_metadata, random_state
from tests.toy import Scheduler, toy_group, toy_metadata, toy_rules, toy_spec


@pytest.fixture(autouse=True)
def _fresh_sentinels() -> Iterator[None]:
    reset_sentinels()
    yield
    reset_sentinels()


def _state(seed: int = 0) -> DraftState:
    return random_state(torch.Generator().manual_seed(seed), batch_size=4, block_size=4,
                        max_model_len=64, steps=6, num_padded=1)


def _opaque(obj: object) -> bool:
    return isinstance(obj, Scheduler)


def _stale_spec() -> Any:
    """A spec that forgets that decode.lens_copy follows the sequence lengths."""
    rules = toy_rules()
    rules["decode.lens_copy"] = Unchanged()
    return toy_spec(rules=rules, name="stale")


def _group(spec: Any, state: DraftState, name: str = "FLASH") -> AttentionGroup:
    group: AttentionGroup = toy_group(name, state, spec=spec)
    return group


def _run(spec: Any, shadow: int, runs: int = 1, seed: int = 0) -> tuple[DraftLoop, DraftState]:
    loop = None
    state = _state(seed)
    for _ in range(runs):
        state = _state(seed)
        loop = DraftLoop([_group(spec, state)], state, shadow=shadow)
        loop.sentinels["FLASH"].opaque = _opaque
        loop.run(lambda i, m: None, 5)
    assert loop is not None
    return loop, state


def test_a_stale_spec_is_caught_logged_once_counted_and_switched_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="draftmeta.shadow"):
        loop, state = _run(_stale_spec(), shadow=1)
    sentinel = loop.sentinels["FLASH"]
    assert sentinel.switched_off and sentinel.mismatches == 1 and sentinel.checks == 1
    assert sentinel.first_mismatch is not None
    assert sentinel.first_mismatch.path == "decode.lens_copy"
    stats = loop.stats.groups["FLASH"]
    assert stats.path == "rebuild" and str(stats.reason).startswith(
        "shadow mode found field decode.lens_copy stale (")
    assert stats.updates == 1 and stats.rebuilds == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "builder FLASH" in lines[0] and "decode.lens_copy" in lines[0]
    # the loop continued with correct metadata
    assert compare_metadata(loop.groups[0].metadata, toy_metadata(state), opaque=_opaque) == []


def test_a_switched_off_builder_rebuilds_for_the_rest_of_the_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="draftmeta.shadow"):
        _run(_stale_spec(), shadow=1)
        assert len(caplog.records) == 1
        caplog.clear()
        loop, _ = _run(_stale_spec(), shadow=1, runs=3)
    stats = loop.stats.groups["FLASH"]
    assert stats.path == "rebuild" and stats.updates == 0 and stats.rebuilds == 4
    assert str(stats.reason).startswith("shadow mode found field decode.lens_copy stale (")
    assert caplog.records == []  # logged once per process, not per loop
    assert sentinel_for("FLASH").mismatches == 1


def test_a_correct_spec_is_compared_and_never_switched_off() -> None:
    loop, _ = _run(toy_spec(), shadow=1, runs=3)
    sentinel = loop.sentinels["FLASH"]
    assert not sentinel.switched_off and sentinel.mismatches == 0
    assert loop.stats.groups["FLASH"].shadow_checks == 4 and sentinel.checks == 12


def test_only_every_nth_loop_is_shadowed() -> None:
    checks = []
    for _ in range(6):
        loop, _ = _run(toy_spec(), shadow=3)
        checks.append(loop.stats.groups["FLASH"].shadow_checks)
    assert checks == [4, 0, 0, 4, 0, 0]


def test_shadow_mode_is_off_by_default_and_a_stale_spec_then_goes_unnoticed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control: without shadow mode the stale spec is not caught (which is why
    shadow mode exists)."""
    monkeypatch.delenv(ENV, raising=False)
    loop, state = _run(_stale_spec(), shadow=None)  # type: ignore[arg-type]
    assert loop.sentinels["FLASH"].interval == 0 and loop.sentinels["FLASH"].checks == 0
    assert loop.stats.groups["FLASH"].updates == 4
    diff = compare_metadata(loop.groups[0].metadata, toy_metadata(state), opaque=_opaque)
    assert [m.path for m in diff] == ["decode.lens_copy"]


def test_the_environment_variable_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "2")
    loop, _ = _run(_stale_spec(), shadow=None)  # type: ignore[arg-type]
    assert loop.sentinels["FLASH"].interval == 2 and loop.sentinels["FLASH"].switched_off


@pytest.mark.parametrize(("raw", "expected"), [("", 0), ("0", 0), ("7", 7), (" 3 ", 3)])
def test_the_interval_is_parsed(raw: str, expected: int) -> None:
    assert shadow_interval({ENV: raw}) == expected
    assert shadow_interval({}) == 0


@pytest.mark.parametrize("raw", ["-1", "abc", "1.5", "yes"])
def test_a_malformed_interval_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=f"{ENV}="):
        shadow_interval({ENV: raw})


@pytest.mark.parametrize("interval", [-1, 1.0, "2", True])
def test_a_sentinel_refuses_a_bad_interval(interval: Any) -> None:
    with pytest.raises(ValueError, match="non-negative int"):
        Sentinel("b", interval)


def test_the_sentinel_api_for_a_plugin() -> None:
    sentinel = sentinel_for("PLUGIN_BUILDER", 2)
    assert sentinel.enabled
    assert [sentinel.should_check() for _ in range(4)] == [True, False, True, False]
    assert sentinel.compare(torch.ones(3), torch.ones(3)) is None
    assert (sentinel.checks, sentinel.mismatches, sentinel.switched_off) == (1, 0, False)
    mismatch = sentinel.compare(torch.ones(3), torch.zeros(3))
    assert mismatch is not None and mismatch.path == "<root>"
    assert sentinel.first_mismatch == mismatch and sentinel.mismatches == 1
    assert sentinel.switched_off and not sentinel.should_check()
    # one sentinel per builder name, process-wide: the switched-off one stays off
    assert sentinel_for("PLUGIN_BUILDER", 2) is sentinel and sentinel.switched_off
    assert sentinel_for("OTHER_BUILDER", 2) is not sentinel


def test_a_clamp_spec_in_a_wrap_loop_is_refused() -> None:
    state = _state()
    with pytest.raises(SpecError, match="clamp overflow policy, but the draft loop's source "
                                        "advance uses wrap"):
        DraftLoop([_group(toy_spec(), state)], state, policy="wrap", shadow=0)
    with pytest.raises(SpecError, match="wrap overflow policy"):
        DraftLoop([_group(toy_spec(rules=toy_rules("wrap")), state)], state, policy="clamp",
                  shadow=0)
    DraftLoop([_group(toy_spec(rules=toy_rules("wrap")), state)], state, policy="wrap", shadow=0)


def test_a_spec_advancing_padded_rows_cannot_reach_the_loop() -> None:
    for overflow in (Clamp("max_model_len", -1), Wrap("max_model_len", -1)):
        rules = toy_rules()
        rules["positions"] = Advance(overflow, rows=None)
        with pytest.raises(SpecError, match="omit rows="):
            toy_spec(rules=rules)
