"""Adversarial declarations: every malformed rule, precondition or spec is refused when it is
declared, with draftmeta's error (or a plain TypeError/ValueError from a rule's constructor)
naming what is wrong, and never a raw error later. Each case asserts the type and a fragment
of the message."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import attrs
import numpy as np
import pytest
import torch

from draftmeta import (
    Advance,
    Alias,
    Clamp,
    CopyFrom,
    Derive,
    DraftSpec,
    Equals,
    Fill,
    HostAdvance,
    HostConstant,
    HostDerive,
    IsNone,
    Recompute,
    Reset,
    SameValue,
    Satisfies,
    SpecError,
    Unchanged,
    Unsupported,
    Wrap,
    WrittenBy,
)
from draftmeta.derivations import DcpLocalSeqLens, Derivation, SlotMapping, TokenToRequest
from draftmeta.rules import Rule
from tests.toy import Scheduler, ToyDecode, toy_metadata, toy_rules, toy_spec


class _Nameless(Derivation):
    formula = "x"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        out.zero_()


class _Formulaless(_Nameless):
    name = "formulaless"
    formula = ""


def _hook() -> Any:
    from tests.test_spec_validation import _Hook

    return _Hook()


@dataclasses.dataclass(frozen=True)
class _FrozenMeta:
    seq_lens: torch.Tensor
    max_seq_len: int


@attrs.frozen
class _FrozenAttrs:
    seq_lens: torch.Tensor
    max_seq_len: int


@dataclasses.dataclass(frozen=True)
class _FrozenDecode:
    lens: torch.Tensor
    count: int


@dataclasses.dataclass
class _Outer:
    decode: _FrozenDecode


T = TypeVar("T")


@dataclasses.dataclass
class _Generic(Generic[T]):
    lens: T


@dataclasses.dataclass
class _Tensors:
    seq_lens: torch.Tensor
    out: torch.Tensor
    num_reqs: int


def _tensors_spec(rule: Rule) -> DraftSpec[_Tensors]:
    return DraftSpec(
        _Tensors, {"seq_lens": Alias("seq_lens"), "out": rule, "num_reqs": HostConstant()}
    )


def _toy_with(path: str, rule: Rule) -> Callable[[], object]:
    def make() -> object:
        rules = toy_rules()
        rules[path] = rule
        return toy_spec(rules=rules)

    return make


def _one(x: object) -> object:
    return x


# (id, what raises, error type, fragment of the message)
CASES: list[tuple[str, Callable[[], object], type[BaseException], str]] = [
    # a bare string as a list of inputs (read as characters)
    ("derive inputs as a bare string", lambda: Derive(CopyFrom(), "seq_lens"),  # type: ignore[arg-type]
     TypeError, "bare string 'seq_lens'"),
    ("host derive inputs as a bare string",
     lambda: HostDerive(_one, "state.max_model_len"),  # type: ignore[arg-type]
     TypeError, "bare string"),
    ("recompute inputs as a bare string", lambda: Recompute(_hook(), "seq_lens"),  # type: ignore[arg-type]
     TypeError, "bare string"),
    ("recompute also= as a bare string",
     lambda: Recompute(_hook(), ("seq_lens",), also="num_splits"),  # type: ignore[arg-type]
     TypeError, "bare string"),
    ("satisfies refs as a bare string",
     lambda: Satisfies("ok", bool, "num_reqs"),  # type: ignore[arg-type]
     TypeError, "bare string 'num_reqs'"),
    # a class where an instance is expected
    ("derive given the derivation class", lambda: Derive(CopyFrom, ("seq_lens",)),  # type: ignore[arg-type]
     TypeError, "got the class CopyFrom; write CopyFrom()"),
    ("recompute given a derivation", lambda: Recompute(CopyFrom(), ("seq_lens",)),  # type: ignore[arg-type]
     TypeError, "must be a RecomputeHook"),
    ("derive given a string", lambda: Derive("copy", ("seq_lens",)),  # type: ignore[arg-type]
     TypeError, "must be a Derivation"),
    ("derivation without a name", lambda: Derive(_Nameless(), ("seq_lens",)),
     TypeError, "_Nameless has no name"),
    ("derivation with an empty formula", lambda: Derive(_Formulaless(), ("seq_lens",)),
     TypeError, "has no formula"),
    ("reset given an instance", lambda: Reset(Scheduler()),  # type: ignore[arg-type]
     TypeError, "must be callable"),
    # rule parameters of the wrong type
    ("clamp offset not an int", lambda: Clamp("max_model_len", offset=1.5),  # type: ignore[arg-type]
     TypeError, "offset must be an int"),
    ("clamp offset a bool", lambda: Clamp("max_model_len", offset=True),
     TypeError, "offset must be an int"),
    ("wrap restart a string", lambda: Wrap("max_model_len", restart="0"),  # type: ignore[arg-type]
     TypeError, "restart must be an int"),
    ("wrap restart negative", lambda: Advance(Wrap("max_model_len", restart=-1)),
     ValueError, "restart must be >= 0"),
    ("advance by zero", lambda: Advance(Clamp("max_model_len"), by=0),
     ValueError, "by must be a positive int"),
    ("advance by a float", lambda: Advance(Clamp("max_model_len"), by=1.0),  # type: ignore[arg-type]
     ValueError, "by must be a positive int"),
    ("advance rows not an identifier", lambda: Advance(Clamp("max_model_len"), rows="num reqs"),
     ValueError, "rows must name a draft-state field"),
    ("advance without a policy", lambda: Advance("clamp"),  # type: ignore[arg-type]
     TypeError, "overflow"),
    ("clamp bound with code in it", lambda: Clamp("max_model_len); import os; ("),
     ValueError, "bound must name a draft-state field"),
    ("alias source with a dash", lambda: Alias("seq-lens"),
     ValueError, "source must name a draft-state field"),
    ("host advance clamp with a dot", lambda: HostAdvance(clamp="state.max_model_len"),
     ValueError, "clamp must name a draft-state field"),
    ("written-by owner with code", lambda: WrittenBy("a; b"),
     ValueError, "owner must be a dotted field path"),
    ("reset label not a str", lambda: Reset(Scheduler, label=3),  # type: ignore[arg-type]
     TypeError, "label must be a str"),
    ("host derive formula not a str", lambda: HostDerive(_one, ("num_reqs",), formula=None),  # type: ignore[arg-type]
     TypeError, "formula must be a str"),
    ("unsupported with an empty reason", lambda: Unsupported(""),
     ValueError, "Length of 'reason' must be >= 1"),
    ("unsupported with a non-str reason", lambda: Unsupported(3),  # type: ignore[arg-type]
     TypeError, "reason must be a str"),
    ("fill with a string", lambda: Fill("1"),  # type: ignore[arg-type]
     TypeError, "'value' must be"),
    ("copy flat not a bool", lambda: CopyFrom(flat=1),  # type: ignore[arg-type]
     TypeError, "'flat' must be"),
    ("derive input with code in it", lambda: Derive(CopyFrom(), ("seq_lens + 1",)),
     ValueError, "dotted field paths"),
    # preconditions
    ("equals NaN", lambda: Equals("num_prefills", float("nan")),
     ValueError, "NaN, which equals nothing"),
    ("equals a numpy int", lambda: Equals("num_prefills", np.int64(0)),
     ValueError, "literal"),
    ("equals a list", lambda: Equals("num_prefills", [0]),
     ValueError, "literal"),
    ("equals ref with code", lambda: Equals("num_prefills == 0 or True", 0),
     ValueError, "dotted field path"),
    ("equals with an empty name", lambda: Equals("num_prefills", 0, name=""),
     ValueError, "non-empty str"),
    ("equals with a non-str name", lambda: Equals("num_prefills", 0, name=3),  # type: ignore[arg-type]
     ValueError, "non-empty str"),
    ("is-none ref with a space", lambda: IsNone("decode x"),
     ValueError, "dotted field path"),
    ("same-value right ref with a dash", lambda: SameValue("num_decodes", "num-decodes"),
     ValueError, "dotted field path"),
    ("satisfies without a name", lambda: Satisfies(None, bool, ("num_reqs",)),  # type: ignore[arg-type]
     ValueError, "non-empty str"),
    ("satisfies with a non-str description",
     lambda: Satisfies("ok", bool, ("num_reqs",), description=5),  # type: ignore[arg-type]
     TypeError, "'description' must be"),
    ("satisfies ref with a call", lambda: Satisfies("ok", bool, ("f()",)),
     ValueError, "dotted field path"),
    # specs
    ("spec of an instance", lambda: DraftSpec(toy_metadata(_state()), {}),  # type: ignore[arg-type]
     SpecError, "instance of ToyMeta, not a class"),
    ("spec of a non-record class", lambda: DraftSpec(int, {}),
     SpecError, "neither a dataclass nor an attrs class"),
    ("spec with a non-str name", lambda: toy_spec(name=3),
     SpecError, "name the spec with a non-empty str"),
    ("nested given an instance",
     lambda: toy_spec(nested={"decode": ToyDecode(*[torch.zeros(1)] * 4, None)}),
     SpecError, "an instance of ToyDecode, not a class"),
    ("nested given torch.Tensor",
     lambda: DraftSpec(_Generic, {"lens": Unchanged()}, nested={"lens": torch.Tensor}),
     SpecError, "dtypes={'lens': its dtype}"),
    ("typevar tensor field without nested or dtypes",
     lambda: DraftSpec(_Generic, {"lens": Alias("seq_lens")}),
     SpecError, "dtypes={'lens': torch.int32} (its dtype) if it holds a tensor"),
    ("alias of a host int", _toy_with("slot_mapping", Alias("num_reqs")),
     SpecError, "alias of state.num_reqs, which is a host int"),
    ("alias of max_model_len", _toy_with("slot_mapping", Alias("max_model_len")),
     SpecError, "copy_of('state.max_model_len')"),
    ("alias of the workspace", _toy_with("slot_mapping", Alias("workspace")),
     SpecError, "not a tensor buffer"),
    ("written by itself", _toy_with("decode.lens_copy", WrittenBy("decode.lens_copy")),
     SpecError, "written by itself"),
    ("written by a host int", _toy_with("decode.lens_copy", WrittenBy("num_reqs")),
     SpecError, "only a tensor field's Recompute hook writes other fields"),
    ("written by an unknown field", _toy_with("decode.lens_copy", WrittenBy("decode.nothing")),
     SpecError, "does not exist"),
    ("written-by on a host int", _toy_with("num_reqs", WrittenBy("positions")),
     SpecError, "needs a tensor field"),
    ("written by a field without a recompute",
     _toy_with("decode.lens_copy", WrittenBy("positions")),
     SpecError, "not a Recompute listing it in also="),
    ("slot mapping with two inputs",
     lambda: _tensors_spec(Derive(SlotMapping(), ("seq_lens", "state.block_table"))),
     SpecError, "slot_mapping takes 5 input(s)"),
    ("copy without an input", lambda: _tensors_spec(Derive(CopyFrom(), ())),
     SpecError, "copy takes 1 input(s)"),
    ("copy of a host int", lambda: _tensors_spec(Derive(CopyFrom(), ("num_reqs",))),
     SpecError, "input 0 of copy must be a tensor"),
    ("copy of a state host int", lambda: _tensors_spec(Derive(CopyFrom(), ("state.block_size",))),
     SpecError, "input 0 of copy must be a tensor"),
    ("fill with an input", lambda: _tensors_spec(Derive(Fill(1), ("seq_lens",))),
     SpecError, "fill takes 0 input(s)"),
    ("dcp lengths with a tensor for the world size",
     lambda: _tensors_spec(Derive(DcpLocalSeqLens(), (
         "seq_lens", "state.seq_lens", "state.dcp_rank", "state.dcp_interleave"))),
     SpecError, "input 1 of dcp_local_seq_lens must be a host int"),
    ("token map with a tensor for num_reqs",
     lambda: _tensors_spec(Derive(TokenToRequest(), ("state.query_start_loc", "seq_lens"))),
     SpecError, "input 1 of token_to_request must be a host int"),
    ("host rule on a frozen dataclass",
     lambda: DraftSpec(_FrozenMeta, {"seq_lens": Alias("seq_lens"),
                                     "max_seq_len": HostAdvance(clamp="max_model_len")}),
     SpecError, "_FrozenMeta) is frozen"),
    ("host rule on a frozen attrs class",
     lambda: DraftSpec(_FrozenAttrs, {"seq_lens": Alias("seq_lens"),
                                      "max_seq_len": HostAdvance()}),
     SpecError, "is frozen"),
    ("host rule inside a frozen nested record",
     lambda: DraftSpec(_Outer, {"decode.lens": Alias("seq_lens"),
                                "decode.count": HostAdvance()}),
     SpecError, "'decode' (_FrozenDecode) is frozen"),
    ("precondition that is not one", lambda: toy_spec(preconditions=["num_prefills == 0"]),
     SpecError, "is not a Precondition"),
    ("precondition on an unknown field", lambda: toy_spec(preconditions=[Equals("nothing", 0)]),
     SpecError, "does not exist"),
    ("precondition on an unknown state field",
     lambda: toy_spec(preconditions=[Equals("state.world", 1)]),
     SpecError, "the draft state has no field 'world'"),
    ("rule bound to a non-rule", _toy_with("weights", "unchanged"),
     SpecError, "which is not a Rule"),
    ("advance bounded by a tensor", _toy_with("positions", Advance(Clamp("seq_lens"))),
     SpecError, "not a host int of the draft state"),
    ("advance rows bounded by a tensor",
     _toy_with("positions", Advance(Clamp("max_model_len", -1), rows="positions")),
     SpecError, "bounded by 'positions'"),
]


def _state() -> Any:
    from draftmeta.testing import random_state

    return random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=4,
                        max_model_len=32, steps=2)


@pytest.mark.parametrize(
    ("make", "error", "fragment"),
    [pytest.param(m, e, f, id=i) for i, m, e, f in CASES],
)
def test_a_malformed_declaration_is_refused_at_once(
    make: Callable[[], object], error: type[BaseException], fragment: str
) -> None:
    with pytest.raises(error) as info:
        make()
    assert fragment in str(info.value)


def test_a_typevar_tensor_field_is_accepted_with_dtypes() -> None:
    spec = DraftSpec(_Generic, {"lens": Alias("seq_lens")}, dtypes={"lens": torch.int32})
    state = _state()
    meta = _Generic(state.seq_lens)
    spec.update(meta, state)  # the alias check runs and passes
    with pytest.raises(SpecError, match="needs an integer tensor"):
        DraftSpec(_Generic, {"lens": Advance(Clamp("max_model_len"))},
                  dtypes={"lens": torch.float32})


class _Arity(Derivation):
    name = "arity"
    formula = "x"
    arguments: ClassVar[Any] = None  # unknown: checked only at run time

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        out.zero_()


def test_a_formula_without_a_signature_is_not_checked_at_declaration() -> None:
    """Negative control of the arity check: the same wrong inputs pass for a formula that
    declares no argument kinds."""
    _tensors_spec(Derive(_Arity(), ("num_reqs", "state.block_size")))
