"""Padded rows (rows at or past ``state.num_reqs``) behave the same at every entry point: a
plain ``Advance`` advances only the real rows, as the source advance does, and a rule that
would advance padded rows is refused when its spec is declared, before any entry point."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

from draftmeta import Advance, Clamp, DraftSpec, SpecError, Wrap, advance_state
from draftmeta.loop import DraftLoop
from draftmeta.testing import check_spec, random_state
from tests.test_rule_lowering import LoopCountDown, _budgeted_spec
from tests.toy import Scheduler, toy_group, toy_metadata, toy_rules, toy_spec

POLICIES = {"clamp": Clamp("max_model_len", -1), "wrap": Wrap("max_model_len", -1)}


def _plain(policy: str) -> Any:
    rules = toy_rules(policy)
    rules["positions"] = Advance(POLICIES[policy])  # no rows=
    return toy_spec(rules=rules)


def _state() -> Any:
    return random_state(torch.Generator().manual_seed(1), batch_size=4, block_size=4,
                        max_model_len=64, steps=6, num_padded=3)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_plain_advance_advances_only_the_real_rows(policy: Any) -> None:
    """``Advance(...)`` without ``rows=`` moves rows below ``state.num_reqs`` by one step and
    leaves every padded row as it was (here 40, which no advance of a row at 40 would keep)."""
    assert Advance(Clamp("max_model_len")).rows == "num_reqs"
    state = _state()
    meta = toy_metadata(state)
    n = state.num_reqs
    assert 0 < n < state.batch_size
    meta.positions[n:] = 40
    for _ in range(3):
        before = meta.positions[:n].clone()
        advance_state(state, policy)
        _plain(policy).update(meta, state)
        assert not torch.equal(meta.positions[:n], before)  # an advance ran
        assert torch.equal(meta.positions[:n], state.positions[:n])  # as the source advance
        assert meta.positions[n:].tolist() == [40] * (state.batch_size - n)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_plain_advance_matches_the_source_advance_through_spec_update(policy: Any) -> None:
    """The README's own loop: advance_state, then spec.update."""
    state = _state()
    meta = toy_metadata(state)
    spec = _plain(policy)
    for _ in range(5):
        advance_state(state, policy)
        spec.update(meta, state)
        assert torch.equal(meta.positions, state.positions)  # padded rows included
    assert (meta.positions[state.num_reqs:] == 0).all()


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_plain_advance_passes_check_spec_with_padded_rows(policy: Any) -> None:
    report = check_spec(_plain(policy), toy_metadata, batches=5, policies=[policy],
                        opaque=lambda obj: isinstance(obj, Scheduler))
    assert report.coverage["padded_rows"] > 0  # it raises SpecCheckFailed on a mismatch


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_plain_advance_is_accepted_by_the_draft_loop_and_leaves_padded_rows(
    policy: Any,
) -> None:
    state = _state()
    meta = toy_metadata(state)
    group = toy_group("FLASH", state, spec=_plain(policy), metadata=meta)
    loop = DraftLoop([group], state, policy=policy, shadow=0)
    loop.run(lambda i, m: None, 5)
    assert loop.stats.groups["FLASH"].path == "update"
    assert torch.equal(group.metadata.positions, state.positions)


@pytest.mark.parametrize("rows", [None, "step", "max_model_len"])
def test_an_advance_of_padded_rows_is_refused_when_declared_with_a_fix_that_is_accepted(
    rows: str | None,
) -> None:
    rules = toy_rules()
    rules["positions"] = Advance(Clamp("max_model_len", -1), rows=rows)
    with pytest.raises(SpecError) as info:
        toy_spec(rules=rules)  # so neither spec.update, check_spec nor DraftLoop can run it
    assert info.value.path == "positions"
    assert "advances rows at or past state.num_reqs (padding)" in info.value.problem
    assert info.value.fix.startswith(f"omit rows={rows!r}")
    rules["positions"] = Advance(Clamp("max_model_len", -1))
    toy_spec(rules=rules)


def test_a_new_rule_kind_that_advances_padded_rows_is_refused_when_declared() -> None:
    with pytest.raises(SpecError) as info:
        _budgeted_spec(budget=LoopCountDown(padded=True))
    assert info.value.path == "budget"
    assert "advances rows at or past state.num_reqs" in info.value.problem
    assert "leave rows at or past state.num_reqs" in info.value.fix
    _budgeted_spec(budget=attrs.evolve(LoopCountDown(padded=True), padded=False))


def test_the_spec_is_not_even_built_for_an_all_rows_advance() -> None:
    """No entry point sees it: DraftSpec itself raises."""
    rules = toy_rules()
    rules["positions"] = Advance(Clamp("max_model_len", -1), rows=None)
    with pytest.raises(SpecError):
        DraftSpec(toy_spec().cls, rules, nested=toy_spec().nested)
