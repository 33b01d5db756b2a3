"""Rules lower themselves: a rule kind is one class, and the code generator, the fused kernel,
spec validation and capture only ask it.

The proof is in this file: it declares two rule kinds and a fusable formula that draftmeta has
never heard of, and compiles, runs, explains and fuses specs that use them, with no other module
changed. The declaration-time answers each rule gives (what it may be bound to, what it may
read, whether a CUDA graph can replay it) are checked here too.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import attrs
import pytest
import torch

import draftmeta.codegen
import draftmeta.codegen.compiler
import draftmeta.codegen.describe
import draftmeta.codegen.phases
import draftmeta.codegen.product
import draftmeta.codegen.runtime
import draftmeta.codegen.spec_view
import draftmeta.codegen.writer
import draftmeta.fused
import draftmeta.loop
import draftmeta.loop_capture
import draftmeta.rules
import draftmeta.spec
import draftmeta.spec_tree
import draftmeta.spec_validation
import draftmeta.step_graph
from draftmeta import (
    Alias,
    Derive,
    DraftSpec,
    Equals,
    HostConstant,
    Invalidate,
    IsNotNone,
    Recompute,
    Reset,
    SameValue,
    Satisfies,
    SpecError,
    Unchanged,
    UpdateError,
    WrittenBy,
    advance_state,
    explain,
)
from draftmeta.advance import check_policy, overflow_policies
from draftmeta.derivations import Derivation, RecomputeHook, TritonKernel
from draftmeta.fields import FieldInfo, FieldKind
from draftmeta.fused import fusable_paths, fused_source
from draftmeta.layout import Written
from draftmeta.rules import Emitter, Memory, Rule, Target
from draftmeta.state import DraftState
from draftmeta.testing import random_state
from tests.toy import Scheduler, toy_metadata, toy_rules, toy_spec

# -- a new tensor rule kind, declared here and nowhere else -----------------------------------


@attrs.frozen
class CountDown(Rule):
    """A per-request budget: one less each step, never below ``floor``."""

    kind: ClassVar[str] = "count down"
    target: ClassVar[Target] = "int tensor"
    writes: ClassVar[bool] = True
    floor: int = 0

    def describe(self) -> str:
        return f"count down: -= 1, stops at {self.floor}"

    @property
    def fusable(self) -> bool:
        return True

    def lower_structure(self, em: Emitter, path: str) -> None:
        expr = em.ref(path)
        em.emit(f"if {expr}.is_floating_point():")
        em.error(path, repr("is a float tensor; a count down needs integers"), 1)

    def memory(self, em: Emitter, path: str) -> Sequence[Memory]:
        return ((Written(path), (em.ref(path),)),)

    def lower_write(self, em: Emitter, path: str) -> None:
        em.emit(f"{em.ref(path)}.sub_(1).clamp_(min={self.floor})")

    def lower_triton(self, kernel: TritonKernel, out: torch.Tensor, inputs: Sequence[object],
                     names: Sequence[str]) -> None:
        x = kernel.load1d(out, names[0])
        kernel.store1d(out, f"tl.maximum({x} - 1, {self.floor})", names[0])


# -- a new host rule kind that a CUDA graph cannot replay --------------------------------------


@attrs.frozen
class Toggle(Rule):
    """A host bool that flips every step."""

    kind: ClassVar[str] = "toggle"
    target: ClassVar[Target] = "host"
    writes: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True

    def describe(self) -> str:
        return "toggle: = not the old value"

    def field_problem(self, info: FieldInfo) -> tuple[str, str] | None:
        if info.kind is FieldKind.BOOL:
            return None
        return (f"a toggle flips a bool, but the field is annotated {info.annotation}",
                "toggle only bool fields")

    def capture_problem(self) -> str | None:
        return "flips on the host, which a captured graph cannot replay"

    def lower_host(self, em: Emitter, path: str) -> str:
        return f"not {em.ref(path)}"


@dataclasses.dataclass
class Budgeted:
    seq_lens: torch.Tensor
    budget: torch.Tensor
    num_reqs: int
    even: bool


def _budgeted_spec(**rules: Rule) -> DraftSpec[Budgeted]:
    return DraftSpec(Budgeted, {"seq_lens": Alias("seq_lens"), "budget": CountDown(),
                                "num_reqs": HostConstant(), "even": Toggle(), **rules})


def _state() -> DraftState:
    return random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=4,
                        max_model_len=32, steps=3)


def test_a_rule_kind_declared_outside_draftmeta_compiles_and_updates_in_place() -> None:
    state = _state()
    meta = Budgeted(state.seq_lens, torch.tensor([3, 1, 0, 5]), 4, True)
    budget = meta.budget
    spec = _budgeted_spec()
    for expected, even in (([2, 0, 0, 4], False), ([1, 0, 0, 3], True)):
        advance_state(state)
        spec.update(meta, state)
        assert meta.budget is budget and meta.budget.tolist() == expected
        assert meta.even is even


def test_explain_shows_the_new_rules_own_lines_in_their_phases() -> None:
    source = explain(_budgeted_spec())
    structure, _, rest = source.partition("# 3. new host values")
    assert "if metadata.budget.is_floating_point():" in structure
    assert "    # even: toggle: = not the old value\n    _new_even = not metadata.even\n" in rest
    assert "        # budget: count down: -= 1, stops at 0\n" in rest
    assert "        metadata.budget.sub_(1).clamp_(min=0)\n" in rest
    assert "metadata.even = _new_even" in rest.partition("# 5. host values stored")[2]


def test_the_new_rules_check_runs_before_any_write() -> None:
    state = _state()
    meta = Budgeted(state.seq_lens, torch.tensor([3.0, 1.0]), 4, True)  # a float budget
    with pytest.raises(UpdateError, match=r"budget.*a count down needs integers"):
        _budgeted_spec().update(meta, state)
    assert meta.budget.tolist() == [3.0, 1.0] and meta.even is True


def test_the_new_rules_fit_is_asked_at_declaration() -> None:
    @dataclasses.dataclass
    class NotBool:
        seq_lens: torch.Tensor
        budget: torch.Tensor
        num_reqs: int
        even: int

    with pytest.raises(SpecError, match="a toggle flips a bool, but the field is annotated int"):
        DraftSpec(NotBool, {"seq_lens": Alias("seq_lens"), "budget": CountDown(),
                            "num_reqs": HostConstant(), "even": Toggle()})


def test_the_new_tensor_rule_is_fused_into_the_kernel_it_says_it_fits() -> None:
    state = _state()
    meta = Budgeted(state.seq_lens, torch.tensor([3, 1, 0, 5]), 4, True)
    spec = _budgeted_spec()
    assert fusable_paths(spec) == {"budget"}
    kernel = fused_source(state, [(spec, meta)])
    assert "    # Budgeted: budget: count down: -= 1, stops at 0\n" in kernel
    assert "tl.maximum(" in kernel and " - 1, 0)" in kernel


@attrs.frozen
class LoopCountDown(CountDown):
    """A count down that says it moves with the draft loop's source advance."""

    policy: Literal["clamp", "wrap"] = "wrap"
    padded: bool = False

    @property
    def overflow_policy(self) -> Literal["clamp", "wrap"]:
        return self.policy

    @property
    def advances_padded_rows(self) -> bool:
        return self.padded


def test_a_new_rule_kind_with_an_overflow_policy_is_held_to_the_loops() -> None:
    assert overflow_policies(_budgeted_spec()) == {}  # a plain count down has no policy
    spec = _budgeted_spec(budget=LoopCountDown())
    assert overflow_policies(spec) == {"budget": "wrap"}
    check_policy(spec, "wrap")
    with pytest.raises(SpecError, match=r"budget.*wrap overflow policy, but the draft loop's "
                                        r"source advance uses clamp"):
        check_policy(spec, "clamp")
    with pytest.raises(SpecError, match=r"budget.*advances rows at or past state\.num_reqs"):
        check_policy(_budgeted_spec(budget=LoopCountDown(padded=True)), "wrap")


def test_a_spec_says_at_declaration_whether_a_graph_can_replay_it() -> None:
    assert _budgeted_spec(even=HostConstant()).capture_safe
    assert _budgeted_spec(even=HostConstant()).capture_unsafe_reason is None
    spec = _budgeted_spec()
    assert not spec.capture_safe
    assert spec.capture_unsafe_reason == (
        "even flips on the host, which a captured graph cannot replay")


# -- capture safety of the shipped rules --------------------------------------------------------


class _UnsafeHook(RecomputeHook):
    name = "unsafe_hook"
    formula = "a hook that reads the device on the host"
    capture_safe = False

    def check(self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
              ) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any,
              also: tuple[torch.Tensor, ...] = ()) -> None:
        out.zero_()


def test_a_reset_host_object_makes_a_spec_unsafe_to_capture() -> None:
    spec = toy_spec()  # scheduler: Reset(Scheduler)
    assert not spec.capture_safe
    assert spec.capture_unsafe_reason == (
        "scheduler is replaced by a host object every step (Reset), which a captured graph "
        "cannot replay")


def test_a_reset_object_its_consumer_fills_on_the_device_is_safe_to_capture() -> None:
    spec = toy_spec(rules={**toy_rules(), "scheduler": Reset(Scheduler, filled_on_device=True)})
    assert spec.capture_safe and spec.capture_unsafe_reason is None
    assert "filled on the device by its consumer" in spec.rule_for("scheduler").describe()


def test_a_spec_without_host_objects_replaced_is_safe_to_capture() -> None:
    spec = toy_spec(rules={**toy_rules(), "scheduler": Unchanged()})
    assert spec.capture_safe and spec.capture_unsafe_reason is None


def test_an_invalidated_field_makes_a_spec_unsafe_to_capture() -> None:
    spec = toy_spec(rules={**toy_rules(), "scheduler": Unchanged(),
                           "decode.dcp_tot_seq_lens": Invalidate()})
    assert spec.capture_unsafe_reason == (
        "decode.dcp_tot_seq_lens is replaced by a host object every step (Invalidate), which a "
        "captured graph cannot replay")


def test_a_recompute_hook_that_is_not_capture_safe_makes_its_spec_unsafe() -> None:
    rules = {**toy_rules(), "scheduler": Unchanged(),
             "decode.lens_copy": Recompute(_UnsafeHook(), ("decode.seq_lens",))}
    spec = toy_spec(rules=rules)
    assert spec.capture_unsafe_reason == (
        "decode.lens_copy is refilled by the recompute hook unsafe_hook, which is not "
        "capture-safe")


def test_the_reason_names_the_first_unsafe_field_in_declaration_order() -> None:
    unsafe = Recompute(_UnsafeHook(), ("decode.seq_lens",))
    later = toy_spec(rules={**toy_rules(), "decode.lens_copy": unsafe})
    first = toy_spec(rules={"decode.lens_copy": unsafe,
                            **{k: v for k, v in toy_rules().items() if k != "decode.lens_copy"}})
    assert str(later.capture_unsafe_reason).startswith("scheduler is replaced")
    assert str(first.capture_unsafe_reason).startswith("decode.lens_copy is refilled")


# -- derivations opt into fusion by giving their Triton form ------------------------------------


@attrs.frozen
class Doubled(Derivation):
    """``out = 2 * x``, elementwise."""

    name: ClassVar[str] = "doubled"
    formula: ClassVar[str] = "2 * x"
    arguments: ClassVar[tuple[Any, ...]] = ("tensor",)

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        assert isinstance(inputs[0], torch.Tensor)
        torch.mul(inputs[0], 2, out=out)

    def emit_triton(self, kernel: TritonKernel, out: torch.Tensor, inputs: Sequence[object],
                    names: Sequence[str]) -> None:
        assert isinstance(inputs[0], torch.Tensor)
        kernel.store1d(out, f"{kernel.load1d(inputs[0], names[1])} * 2", names[0])


class DoubledOnTheHostOnly(Doubled):
    """The same formula without a Triton form."""

    emit_triton = Derivation.emit_triton


def _doubling_spec(derivation: Derivation) -> DraftSpec[Any]:
    return toy_spec(rules={**toy_rules(), "decode.lens_copy": Derive(derivation,
                                                                     ("decode.seq_lens",))})


def test_a_derivation_with_a_triton_form_is_fused() -> None:
    assert Doubled().fusable
    spec = _doubling_spec(Doubled())
    assert "decode.lens_copy" in fusable_paths(spec)
    state = _state()
    kernel = fused_source(state, [(spec, toy_metadata(state))])
    assert "# toy: decode.lens_copy: derive: 2 * x\n" in kernel and " * 2\n" in kernel


def test_a_derivation_without_a_triton_form_stays_in_the_generated_update() -> None:
    assert not DoubledOnTheHostOnly().fusable
    spec = _doubling_spec(DoubledOnTheHostOnly())
    assert "decode.lens_copy" not in fusable_paths(spec)
    assert {"positions", "decode.decode_lens"} <= fusable_paths(spec)  # the rest is unaffected


# -- declaration checks the shipped rules answer themselves -------------------------------------


def test_invalidating_a_field_that_cannot_be_none_is_refused() -> None:
    with pytest.raises(SpecError, match=r"rule invalidate sets it to None, but its annotation"):
        toy_spec(rules={**toy_rules(), "decode.seq_lens": Invalidate()})


def test_a_recompute_refilling_a_field_not_declared_written_by_it_is_refused() -> None:
    rules = {**toy_rules(), "decode.lens_copy": Recompute(
        _UnsafeHook(), ("decode.seq_lens",), also=("decode.decode_lens",))}
    with pytest.raises(SpecError, match=r"refilled by the recompute hook of 'decode\.lens_copy'"):
        toy_spec(rules=rules)
    rules["decode.decode_lens"] = WrittenBy("decode.lens_copy")
    assert toy_spec(rules=rules).rules["decode.decode_lens"].written_by == "decode.lens_copy"


def test_a_host_derive_reading_a_tensor_is_refused() -> None:
    from draftmeta import HostDerive

    with pytest.raises(SpecError, match=r"host rule reads the tensor 'state\.seq_lens'"):
        toy_spec(rules={**toy_rules(), "max_seq_len": HostDerive(max, ("state.seq_lens",))})


def test_covering_rules_say_so_and_others_do_not() -> None:
    covering = {n for n in draftmeta.rules.__all__
                if getattr(getattr(draftmeta.rules, n), "covers_record", False) is True}
    assert covering == {"Unchanged", "Reset", "Unsupported"}
    rules = {k: v for k, v in toy_rules().items() if not k.startswith("decode.")}
    assert toy_spec(rules={**rules, "decode": Reset(object)}).rule_for("decode.seq_lens").kind \
        == "reset"
    with pytest.raises(SpecError, match=r"decode\.block_table.*has no rule"):
        toy_spec(rules={**rules, "decode": Invalidate()})  # a rule of the record, not covering


# -- structure only: the drivers name no rule class ---------------------------------------------


def _rule_classes() -> set[str]:
    return {n for n in draftmeta.rules.__all__
            if isinstance(getattr(draftmeta.rules, n), type)
            and issubclass(getattr(draftmeta.rules, n), Rule)} - {"Rule"}


@pytest.mark.parametrize(
    "module",
    [draftmeta.codegen, draftmeta.codegen.compiler, draftmeta.codegen.describe,
     draftmeta.codegen.phases, draftmeta.codegen.product, draftmeta.codegen.runtime,
     draftmeta.codegen.spec_view, draftmeta.codegen.writer, draftmeta.fused, draftmeta.loop,
     draftmeta.loop_capture, draftmeta.spec, draftmeta.spec_tree, draftmeta.spec_validation,
     draftmeta.step_graph],
    ids=lambda m: m.__name__,
)
def test_structure_only_the_phase_drivers_hold_and_name_no_rule_kind(module: Any) -> None:
    held = {name for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, Rule) and value is not Rule}
    assert held == set()
    tree = ast.parse(inspect.getsource(module))
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert named & _rule_classes() == set()


# -- the alias check, as its rule writes it -----------------------------------------------------


def test_an_alias_check_is_short_and_its_helper_is_listed_in_the_header() -> None:
    source = explain(toy_spec())
    assert "#   _shares_storage = (view, buffer) -> whether view starts at buffer's address" \
        in source
    assert ("        if _decode.seq_lens is not state.seq_lens and "
            "not _shares_storage(_decode.seq_lens, state.seq_lens):\n") in source
    # one line per alias: an identity test, then the storage helper
    assert max(len(line) for line in source.splitlines() if "_shares_storage(" in line) < 130


@pytest.mark.parametrize("view", ["same start", "inside", "a copy"])
def test_an_alias_passes_for_a_view_of_its_buffer_and_fails_for_a_copy(view: str) -> None:
    state = _state()
    meta = toy_metadata(state)
    assert meta.decode is not None
    meta.decode.seq_lens = {"same start": state.seq_lens[:2], "inside": state.seq_lens[1:],
                            "a copy": state.seq_lens.clone()}[view]
    spec = toy_spec(rules={**toy_rules(), "decode.lens_copy": Unchanged()})
    checked = draftmeta.codegen.compile_spec(spec, "check")
    if view == "a copy":
        with pytest.raises(UpdateError, match=r"no longer shares storage with state\.seq_lens"):
            checked(meta, state)
    else:
        checked(meta, state)


# -- preconditions say whether they compare on the host -----------------------------------------


@pytest.mark.parametrize("make", [
    lambda: Equals("decode.seq_lens", 1),
    lambda: SameValue("decode.seq_lens", "num_reqs"),
    lambda: Satisfies("positive", bool, ("decode.seq_lens",), "seq_lens is truthy"),
], ids=["equals", "same value", "satisfies"])
def test_a_precondition_comparing_on_the_host_refuses_a_tensor(make: Any) -> None:
    cond = make()
    assert cond.host_only
    with pytest.raises(SpecError, match=r"compares the tensor 'decode\.seq_lens' on the host"):
        toy_spec(preconditions=[cond])


def test_a_none_test_may_read_a_tensor_field() -> None:
    assert not IsNotNone("decode.seq_lens").host_only
    toy_spec(preconditions=[IsNotNone("decode"), IsNotNone("decode.seq_lens")])


def test_a_rule_that_stores_a_host_value_without_computing_it_says_so_when_compiled() -> None:
    @attrs.frozen
    class Forgetful(Toggle):
        lower_host = Rule.lower_host  # type: ignore[assignment]

    spec = _budgeted_spec(even=Forgetful())
    with pytest.raises(NotImplementedError, match="sets stores_host_value but defines no "
                                                  "lower_host"):
        explain(spec)


def test_the_layout_check_is_given_the_tensors_declared_unchanged_and_no_host_value() -> None:
    """``Unchanged`` hands the layout guard a tensor field (it must not view a buffer the loop
    advances) but never a host value, which has no memory to share."""
    from draftmeta.layout import LayoutGuard

    rules = {**toy_rules(), "causal": Unchanged(), "max_seq_len": Unchanged()}
    spec = toy_spec(rules=rules)
    guards = [g for g in spec.update.__globals__.values()  # type: ignore[attr-defined]
              if isinstance(g, LayoutGuard)]
    unchanged = {e.path for g in guards for e in g.entries if e.unchanged}
    assert unchanged == {"weights", "decode.block_table", "decode.dcp_tot_seq_lens"}
