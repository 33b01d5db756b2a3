"""A parameterized generic metadata class (``Top[Dec]``) is refused by name, for each class
kind a spec covers, with the declaration to use instead; that declaration is accepted."""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

import attrs
import pytest
import torch

from draftmeta import DraftSpec, HostConstant, SpecError, Unchanged
from draftmeta.testing import random_state

D = TypeVar("D")


@dataclasses.dataclass
class Dec:
    lens: torch.Tensor


@dataclasses.dataclass
class DataTop(Generic[D]):
    n: int
    decode: D | None


@attrs.define
class AttrsTop(Generic[D]):
    n: int
    decode: D


@attrs.frozen
class FrozenAttrsTop(Generic[D]):
    n: torch.Tensor
    decode: D


@dataclasses.dataclass(frozen=True)
class FrozenDataTop(Generic[D]):
    n: torch.Tensor
    decode: D


@dataclasses.dataclass
class Outer:
    n: int
    inner: Any


KINDS = {
    "dataclass": (DataTop, "dataclass"),
    "attrs class": (AttrsTop, "attrs class"),
    "frozen attrs class": (FrozenAttrsTop, "attrs class"),
    "frozen dataclass": (FrozenDataTop, "dataclass"),
}


def _rules(top: type) -> dict[str, Any]:
    n = Unchanged() if top in (FrozenAttrsTop, FrozenDataTop) else HostConstant()
    return {"n": n, "decode.lens": Unchanged()}


@pytest.mark.parametrize(("top", "kind"), list(KINDS.values()), ids=list(KINDS))
def test_a_parameterized_generic_class_is_named_and_its_origin_proposed(
    top: type, kind: str
) -> None:
    name = top.__qualname__
    with pytest.raises(SpecError) as info:
        DraftSpec(top[Dec], _rules(top))  # type: ignore[index]
    assert info.value.problem == (
        f"{name}[Dec] is a parameterized alias of the generic {kind} {name}, not a class a "
        "spec can cover")
    assert info.value.fix.endswith(f"DraftSpec({name}, ..., nested={{'decode': Dec}})")
    spec = DraftSpec(top, _rules(top), nested={"decode": Dec})  # the proposed declaration
    state = random_state(torch.Generator().manual_seed(0), batch_size=2, block_size=4,
                         max_model_len=16, steps=2)
    meta = top(3 if top in (DataTop, AttrsTop) else state.seq_lens.clone(),
               Dec(state.block_table))
    spec.update(meta, state)


@pytest.mark.parametrize(("top", "kind"), list(KINDS.values()), ids=list(KINDS))
def test_a_parameterized_generic_class_in_nested_is_named_and_its_origin_proposed(
    top: type, kind: str
) -> None:
    name = top.__qualname__
    rules = {"n": HostConstant(), **{f"inner.{p}": r for p, r in _rules(top).items()}}
    with pytest.raises(SpecError) as info:
        DraftSpec(Outer, rules, nested={"inner": top[Dec]})  # type: ignore[index]
    assert info.value.path == "inner"
    assert f"{name}[Dec], a parameterized alias of the generic {kind} {name}" in (
        info.value.problem)
    assert info.value.fix.endswith(f"nested={{'inner': {name}, 'inner.decode': Dec}}")
    DraftSpec(Outer, rules, nested={"inner": top, "inner.decode": Dec})


def test_a_generic_parameterized_by_a_tensor_proposes_its_dtype() -> None:
    with pytest.raises(SpecError) as info:
        DraftSpec(DataTop[torch.Tensor], {"n": HostConstant(), "decode": Unchanged()})
    assert info.value.fix.endswith("DraftSpec(DataTop, ..., dtypes={'decode': its dtype})")
    DraftSpec(DataTop, {"n": HostConstant(), "decode": Unchanged()},
              dtypes={"decode": torch.int32})
