"""A recompute hook's outputs (its own field and the fields in ``also=``) are validated at
declaration like derivations: no hook reads or lists what it refills, each output has one
hook, and a field reading a hook's output is declared after the hook. Each error proposes a
fix, and the fix is accepted."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
import torch

from draftmeta import (
    Alias,
    CopyFrom,
    Derive,
    DraftSpec,
    HostConstant,
    Recompute,
    Rule,
    SpecError,
    Unchanged,
    WrittenBy,
)
from draftmeta.derivations import RecomputeHook


class _Hook(RecomputeHook):
    name = "hook"
    formula = "test"

    def check(self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
              ) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any,
              also: tuple[torch.Tensor, ...] = ()) -> None:
        out.zero_()
        for extra in also:
            extra.zero_()


@dataclasses.dataclass
class _Hooked:
    seq_lens: torch.Tensor
    tiles: torch.Tensor
    splits: torch.Tensor
    reader: torch.Tensor
    other: torch.Tensor
    count: int


def _rules(**changes: Rule) -> dict[str, Rule]:
    rules: dict[str, Rule] = {
        "seq_lens": Alias("seq_lens"),
        "tiles": Recompute(_Hook(), ("seq_lens",), also=("splits",)),
        "splits": WrittenBy("tiles"),
        "reader": Derive(CopyFrom(), ("splits",)),
        "other": Unchanged(),
        "count": HostConstant(),
    }
    rules.update(changes)
    return rules


def _spec(rules: dict[str, Rule]) -> DraftSpec[_Hooked]:
    return DraftSpec(_Hooked, rules, name="hooked")


def _hook(inputs: tuple[str, ...] = ("seq_lens",), also: tuple[str, ...] = ("splits",)
          ) -> Recompute:
    return Recompute(_Hook(), inputs, also=also)


# (id, the malformed rules, the field named, words of the problem, the fix's text, the rules
# after applying that fix)
CASES: list[tuple[str, dict[str, Rule], str, str, str, dict[str, Rule]]] = [
    ("a hook reading an output it refills",
     _rules(tiles=_hook(("seq_lens", "splits"))),
     "tiles", "reads 'splits', which its own hook refills",
     "remove 'splits' from the inputs of 'tiles'", _rules()),
    ("a hook listing its own field in also=",
     _rules(tiles=_hook(also=("tiles",)), splits=Unchanged(), reader=Unchanged()),
     "tiles", "lists its own field in also=", "remove 'tiles' from also=",
     _rules(tiles=_hook(also=()), splits=Unchanged(), reader=Unchanged())),
    ("a hook listing its own field and another in also=",
     _rules(tiles=_hook(also=("splits", "tiles"))),
     "tiles", "lists its own field in also=", "remove 'tiles' from also=", _rules()),
    ("two hooks listing one output",
     _rules(other=_hook()),
     "splits", "is listed in also= of both 'tiles' and 'other'",
     "keep 'splits' in the also= of the hook that computes it and remove it from the other's",
     _rules(other=_hook(also=()))),
    ("an output listed twice",
     _rules(tiles=_hook(also=("splits", "splits"))),
     "tiles", "lists 'splits' twice in also=", "list 'splits' once", _rules()),
    ("a draft-state buffer in also=",
     _rules(tiles=_hook(also=("splits", "state.seq_lens"))),
     "tiles", "lists the draft-state buffer 'state.seq_lens' in also=",
     "remove 'state.seq_lens' from also=", _rules()),
    ("a host int in also=",
     _rules(tiles=_hook(also=("splits", "count"))),
     "tiles", "lists 'count' in also=, which is a host int",
     "remove 'count' from also=", _rules()),
]


@pytest.mark.parametrize(
    ("rules", "path", "problem", "fix", "fixed"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_a_malformed_hook_output_is_refused_with_a_fix_that_is_accepted(
    rules: dict[str, Rule], path: str, problem: str, fix: str, fixed: dict[str, Rule]
) -> None:
    with pytest.raises(SpecError) as info:
        _spec(rules)
    assert info.value.path == path, str(info.value)
    assert problem in info.value.problem and fix in info.value.fix, str(info.value)
    _spec(fixed)  # the proposed fix is accepted


def test_a_hook_reading_an_output_it_refills_is_told_to_compute_it_from_its_sources() -> None:
    with pytest.raises(SpecError) as info:
        _spec(_rules(tiles=_hook(("seq_lens", "splits"))))
    assert info.value.fix == (
        "remove 'splits' from the inputs of 'tiles': compute the hook from the fields or "
        "draft-state buffers that buffer is computed from")


ORDERS = list(itertools.permutations(["tiles", "splits", "reader"]))


@pytest.mark.parametrize("order", ORDERS, ids=[" ".join(o) for o in ORDERS])
def test_a_reader_of_a_hook_output_must_follow_the_hook_in_every_ordering(
    order: tuple[str, ...],
) -> None:
    base = _rules()
    rules = {p: base[p] for p in (*order, "seq_lens", "other", "count")}
    if order.index("tiles") < order.index("reader"):
        _spec(rules)  # where the output's own WrittenBy entry stands does not matter
        return
    with pytest.raises(SpecError) as info:
        _spec(rules)
    assert info.value.path == "reader"
    assert "reads 'splits', which the recompute hook of 'tiles' refills" in info.value.problem
    assert info.value.fix.startswith("declare 'tiles' before 'reader'")
    fixed = {p: rules[p] for p in ("tiles", *(p for p in rules if p != "tiles"))}
    _spec(fixed)


def test_a_cycle_through_a_hook_output_names_the_output() -> None:
    rules = _rules(tiles=_hook(("reader",)))
    with pytest.raises(SpecError) as info:
        _spec(rules)
    assert "in a cycle: 'tiles' -> 'reader' -> 'tiles'" in info.value.problem
    assert "'reader' reads 'splits', which the recompute hook of 'tiles' refills" in str(
        info.value)
    _spec(_rules(tiles=_hook(("seq_lens",))))  # the fix: the hook reads the draft state


def test_the_well_formed_hook_spec_updates_both_outputs() -> None:
    from draftmeta.testing import random_state

    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=4,
                         max_model_len=32, steps=2)
    meta = _Hooked(state.seq_lens, torch.ones(4, dtype=torch.int32),
                   torch.ones(4, dtype=torch.int32), torch.ones(4, dtype=torch.int32),
                   torch.ones(4, dtype=torch.int32), 3)
    _spec(_rules(reader=Unchanged())).update(meta, state)
    assert not meta.tiles.any() and not meta.splits.any() and meta.reader.all()

