"""Malformed specs are rejected when declared, with a message naming the field and the fix."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

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
    HostUpperBound,
    Recompute,
    Reset,
    SpecError,
    Unchanged,
    Unsupported,
    Wrap,
)
from draftmeta.derivations import RecomputeHook
from tests.toy import Scheduler, ToyDecode, toy_rules, toy_spec

Edit = Callable[[dict[str, Any]], None]


def _set(path: str, rule: object) -> Edit:
    def edit(rules: dict[str, Any]) -> None:
        rules[path] = rule

    return edit


def _drop(*paths: str) -> Edit:
    def edit(rules: dict[str, Any]) -> None:
        for p in paths:
            del rules[p]

    return edit


def _move_to_front(path: str) -> Edit:
    def edit(rules: dict[str, Any]) -> None:
        rule = rules.pop(path)
        items = list(rules.items())
        rules.clear()
        rules[path] = rule
        rules.update(items)

    return edit


class _Hook(RecomputeHook):
    name = "hook"
    formula = "test"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        out.zero_()


# (id, edit of the correct rules, field path expected in the error, words expected in it)
CASES: list[tuple[str, Edit, str, tuple[str, ...]]] = [
    ("missing top-level field", _drop("max_seq_len"), "max_seq_len", ("has no rule",)),
    ("missing nested field", _drop("decode.lens_copy"), "decode.lens_copy", ("has no rule",)),
    (
        "several missing fields listed",
        _drop("causal", "decode.decode_lens"),
        "causal",
        ("2 field(s) without a rule", "'decode.decode_lens'"),
    ),
    (
        "unknown top-level path",
        _set("max_seq_lens", HostConstant()),
        "max_seq_lens",
        ("does not exist", "did you mean", "'max_seq_len'"),
    ),
    (
        "unknown nested path",
        _set("decode.seq_len", Unchanged()),
        "decode.seq_len",
        ("does not exist", "'decode.seq_lens'"),
    ),
    (
        "path through a scalar",
        _set("num_reqs.value", Unchanged()),
        "num_reqs.value",
        ("through 'num_reqs'", "a host int", "has no fields",
         "Fix: address a field that exists; if 'num_reqs' holds a record typed by a TypeVar, "
         "pass nested={'num_reqs': ItsClass}"),
    ),
    (
        "rule on a record and on its field",
        _set("decode", Unchanged()),
        "decode.block_table",
        ("enclosing record 'decode'",),
    ),
    (
        "advance on a float tensor",
        _set("weights", Advance(Clamp("max_model_len"))),
        "weights",
        ("needs an integer tensor", "torch.float32"),
    ),
    (
        "advance on a host int",
        _set("max_seq_len", Advance(Clamp("max_model_len"))),
        "max_seq_len",
        ("needs an integer tensor", "host int", "HostAdvance"),
    ),
    (
        "host rule on a tensor",
        _set("positions", HostAdvance()),
        "positions",
        ("host rule host advance", "tensor"),
    ),
    (
        "host constant on a tensor",
        _set("decode.seq_lens", HostConstant()),
        "decode.seq_lens",
        ("cannot update a tensor",),
    ),
    (
        "host advance on a bool",
        _set("causal", HostAdvance()),
        "causal",
        ("needs a host int", "host bool"),
    ),
    (
        "host advance on a float",
        _set("scale", HostUpperBound("max_model_len")),
        "scale",
        ("needs a host int", "host float"),
    ),
    (
        "alias of a host field",
        _set("num_reqs", Alias("seq_lens")),
        "num_reqs",
        ("rule alias needs a tensor field",),
    ),
    (
        "reset on a tensor",
        _set("decode.seq_lens", Reset(Scheduler)),
        "decode.seq_lens",
        ("replaces a host object", "tensor"),
    ),
    (
        "alias of an unknown state buffer",
        _set("slot_mapping", Alias("slot_map")),
        "slot_mapping",
        ("draft state has no field 'slot_map'", "slot_mapping"),
    ),
    (
        "derive reading an unknown field",
        _set("decode.lens_copy", Derive(CopyFrom(), ("decode.seqlens",))),
        "decode.lens_copy",
        ("reads 'decode.seqlens', which does not exist",),
    ),
    (
        "clamp bounded by an unknown scalar",
        _set("positions", Advance(Clamp("max_len"))),
        "positions",
        ("bounded by 'max_len'", "max_model_len"),
    ),
    (
        "wrap bounded by a tensor",
        _set("positions", Advance(Wrap("seq_lens"))),
        "positions",
        ("bounded by 'seq_lens'", "not a host int"),
    ),
    (
        "derive reading its own field",
        _set("decode.lens_copy", Derive(CopyFrom(), ("decode.lens_copy",))),
        "decode.lens_copy",
        ("reads the field it writes", "Advance"),
    ),
    (
        "derived fields in a cycle",
        lambda r: r.update(
            {
                "decode.lens_copy": Derive(CopyFrom(), ("decode.decode_lens",)),
                "decode.decode_lens": Derive(CopyFrom(), ("decode.lens_copy",)),
            }
        ),
        "decode.lens_copy",
        ("cycle", "'decode.lens_copy' -> 'decode.decode_lens' -> 'decode.lens_copy'"),
    ),
    (
        "derive declared before the advanced field it reads",
        lambda r: (
            r.update({"decode.lens_copy": Derive(CopyFrom(), ("positions",))}),
            _move_to_front("decode.lens_copy")(r),
        ),
        "decode.lens_copy",
        ("declared later", "ambiguous", "declare 'positions' before 'decode.lens_copy'"),
    ),
    (
        "host derive reading a tensor",
        _set("max_seq_len", HostDerive(max, ("state.seq_lens",))),
        "max_seq_len",
        ("reads the tensor 'state.seq_lens'", "wait for the device"),
    ),
    (
        "recompute on a host object",
        _set("scheduler", Recompute(_Hook(), ())),
        "scheduler",
        ("needs a tensor field",),
    ),
    (
        "not a rule",
        _set("causal", "unchanged"),
        "causal",
        ("not a Rule", "Unchanged()"),
    ),
]


@pytest.mark.parametrize(
    ("edit", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_malformed_spec_is_rejected(edit: Edit, path: str, words: tuple[str, ...]) -> None:
    rules = toy_rules()
    edit(rules)
    with pytest.raises(SpecError) as info:
        toy_spec(rules=rules)
    err = info.value
    assert err.spec == "toy"
    assert err.path == path, str(err)
    message = str(err)
    assert f"field {path!r} of spec 'toy'" in message
    assert "Fix:" in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_the_correct_spec_is_accepted() -> None:
    spec = toy_spec()
    assert spec.supported
    assert "decode.seq_lens" in spec.fields
    assert spec.rule_for("decode.block_table") == Unchanged()


def test_typevar_field_without_concrete_class() -> None:
    rules = toy_rules()
    with pytest.raises(SpecError, match=r"TypeVar .*nested=\{'decode': TheConcreteClass\}"):
        toy_spec(rules=rules, nested={})


def test_typevar_field_covered_as_a_whole_needs_no_class() -> None:
    rules = {k: v for k, v in toy_rules().items() if not k.startswith("decode.")}
    rules["decode"] = Unchanged()
    assert toy_spec(rules=rules, nested={}).rule_for("decode.seq_lens") == Unchanged()


def test_dtype_given_by_the_spec_is_checked() -> None:
    rules = toy_rules()
    rules["slot_mapping"] = Advance(Clamp("max_model_len"))
    with pytest.raises(SpecError, match=r"but the field is a tensor of torch\.float16"):
        toy_spec(rules=rules, dtypes={"slot_mapping": torch.float16})


def test_nested_override_must_name_a_record_field() -> None:
    with pytest.raises(SpecError, match=r"field 'num_reqs' .*nested= gives it a class"):
        toy_spec(nested={"decode": ToyDecode, "num_reqs": ToyDecode})


def test_nested_override_must_be_a_record_class() -> None:
    with pytest.raises(SpecError, match="not a dataclass or attrs class"):
        toy_spec(nested={"decode": int})


def test_precondition_reading_unknown_field() -> None:
    with pytest.raises(SpecError, match="reads 'num_prefill', which does not exist"):
        toy_spec(preconditions=[Equals("num_prefill", 0)])


def test_precondition_comparing_a_tensor_on_the_host() -> None:
    with pytest.raises(SpecError, match=r"compares the tensor 'state\.seq_lens' on the host"):
        toy_spec(preconditions=[Equals("state.seq_lens", 0)])


def test_spec_for_a_plain_class() -> None:
    class Plain:
        x: int

    with pytest.raises(SpecError, match="neither a dataclass nor an attrs class"):
        DraftSpec(Plain, {"x": HostConstant()})


def test_rule_constructors_validate_their_arguments() -> None:
    with pytest.raises(ValueError, match="by must be a positive int"):
        Advance(Clamp("max_model_len"), by=0)
    with pytest.raises(ValueError, match="restart must be >= 0"):
        Advance(Wrap("max_model_len", restart=-1))
    with pytest.raises(ValueError, match="source must name a draft-state field"):
        Alias("seq lens")
    with pytest.raises(ValueError, match="dotted field paths"):
        Derive(Fill(0), ("decode.seq lens",))
    with pytest.raises(ValueError):
        Unsupported("")


def test_unsupported_rule_makes_the_spec_unsupported() -> None:
    rules = toy_rules()
    rules["scheduler"] = Unsupported("the kernel keeps state across steps")
    spec = toy_spec(rules=rules)
    assert not spec.supported
    assert spec.unsupported_reasons == (("scheduler", "the kernel keeps state across steps"),)


@dataclasses.dataclass
class _Flat:
    a: torch.Tensor


def test_errors_are_type_errors_too() -> None:
    with pytest.raises(TypeError):
        DraftSpec(_Flat, {})


def _refused(rules: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        toy_spec(rules={**toy_rules(), **rules})
    return str(caught.value)


def test_a_plain_cycle_of_derived_fields_is_refused_with_the_chain_alone() -> None:
    """No recompute hook in the cycle: the message names the chain, with no hook note."""
    assert _refused({
        "decode.lens_copy": Derive(CopyFrom(), ("decode.decode_lens",)),
        "decode.decode_lens": Derive(CopyFrom(), ("decode.lens_copy",)),
    }) == (
        "field 'decode.lens_copy' of spec 'toy': derived fields depend on each other in a cycle: "
        "'decode.lens_copy' -> 'decode.decode_lens' -> 'decode.lens_copy'. Fix: break the cycle: "
        "derive one of them from the draft state or an unchanged field")


class _Hook(RecomputeHook):
    name = "hook"
    formula = "refill"

    def check(self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
              ) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any,
              also: tuple[torch.Tensor, ...] = ()) -> None:
        out.zero_()


def test_a_recompute_listing_its_own_field_in_also_is_refused_with_the_fix() -> None:
    message = _refused({"decode.lens_copy": Recompute(_Hook(), ("decode.seq_lens",),
                                                      also=("decode.lens_copy",))})
    assert message == (
        "field 'decode.lens_copy' of spec 'toy': lists its own field in also=, but a Recompute "
        "always refills its own field; also= names the hook's other outputs. Fix: remove "
        "'decode.lens_copy' from also=")


def test_a_tensor_given_where_a_formula_takes_a_host_int_is_refused_with_the_fix() -> None:
    from draftmeta.derivations import TokenToRequest

    message = _refused({"decode.lens_copy": Derive(TokenToRequest(),
                                                   ("decode.seq_lens", "decode.seq_lens"))})
    assert message.startswith("field 'decode.lens_copy' of spec 'toy': input 1 of "
                              "token_to_request must be a host int, but 'decode.seq_lens' is ")
    assert message.endswith(". Fix: pass a host int reference as input 1")


def test_an_optional_field_a_tensor_rule_writes_found_none_is_refused_naming_the_field() -> None:
    from draftmeta import UpdateError
    from draftmeta.testing import random_state
    from tests.toy import toy_metadata

    spec = toy_spec(rules={**toy_rules(), "decode.dcp_tot_seq_lens": Derive(
        CopyFrom(), ("decode.seq_lens",))})
    state = random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=4,
                         max_model_len=32, steps=3)
    meta = toy_metadata(state)
    assert meta.decode is not None
    meta.decode.dcp_tot_seq_lens = None
    with pytest.raises(UpdateError) as caught:
        spec.update(meta, state)
    assert str(caught.value) == ("spec 'toy', field 'decode.dcp_tot_seq_lens': is None, "
                                 "expected a tensor; the metadata was left untouched")


def test_a_field_named_by_a_keyword_is_refused_with_the_rename_to_make() -> None:
    """Generated code addresses every field as an attribute (``m.lambda`` does not parse)."""
    import dataclasses

    class Odd:
        __annotations__ = {"seq_lens": torch.Tensor, "lambda": int}

    odd = dataclasses.dataclass(init=False, repr=False, eq=False)(Odd)
    with pytest.raises(SpecError) as info:
        DraftSpec(odd, {"seq_lens": Unchanged(), "lambda": Unchanged()}, name="odd")
    assert info.value.path == "lambda"
    assert info.value.problem == (f"{odd.__qualname__} has a field named 'lambda', which "
                                  "generated code cannot address as an attribute")
    assert info.value.fix == "rename the field to a Python identifier that is not a keyword"
