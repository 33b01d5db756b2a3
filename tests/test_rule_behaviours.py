"""Rules and derivations do what their docstrings say, each on its own: the behaviours the
sampled mutation run (issue 38) found no test for."""

from __future__ import annotations

import functools
from typing import Any

import attrs
import pytest
import torch

from draftmeta import (
    Derive,
    HostAdvance,
    HostDerive,
    HostSet,
    Invalidate,
    Recompute,
    Reset,
    SpecError,
    Unchanged,
    WrittenBy,
)
from draftmeta.derivations import CopyFrom, RecomputeHook, TokenToRequest
from draftmeta.rules.base import _bound_name
from draftmeta.rules.tensor import Clamp
from draftmeta.testing import random_state
from draftmeta.workspace import Workspace
from tests.toy import Scheduler, toy_metadata, toy_rules, toy_spec


def test_token_to_request_maps_each_token_to_its_request_and_tokens_past_the_last_to_0() -> None:
    """Requests of 2, 1 and 3 tokens (query_start_loc 0, 2, 3, 6), two tokens past the end."""
    qsl = torch.tensor([0, 2, 3, 6, 6], dtype=torch.int32)
    out = torch.full((8,), -1, dtype=torch.int32)
    assert TokenToRequest().check(out, qsl, 3) is None
    TokenToRequest().apply(out, qsl, 3, workspace=Workspace())
    assert out.tolist() == [0, 0, 1, 2, 2, 2, 0, 0]


def test_a_flattened_copy_fills_the_field_with_the_sources_leading_elements() -> None:
    out = torch.zeros(2, 2, dtype=torch.int64)
    src = torch.arange(6)
    assert CopyFrom(flat=True).check(out, src) is None
    CopyFrom(flat=True).apply(out, src, workspace=Workspace())
    assert out.tolist() == [[0, 1], [2, 3]]


def test_a_row_copy_fits_a_source_with_more_rows_and_a_broadcasting_tail_only() -> None:
    copy = CopyFrom()
    assert copy.check(torch.zeros(2, 3), torch.zeros(4, 3)) is None
    assert copy.check(torch.zeros(2, 3), torch.zeros(2, 1)) is None  # as many rows: fits too
    assert copy.check(torch.zeros(2, 3), torch.zeros(1, 1)) == (  # fewer: does not
        "source shape (1, 1) does not fit (2, 3)")
    assert copy.check(torch.zeros(2, 3), torch.zeros(4, 1)) is None  # (1,) broadcasts to (3,)
    assert copy.check(torch.zeros(2, 3), torch.zeros(4, 2)) == (
        "source shape (4, 2) does not fit (2, 3)")


def test_a_derivation_applied_to_a_host_value_where_it_reads_a_tensor_names_what_it_got() -> None:
    from draftmeta.derivations import DcpLocalSeqLens

    out = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"^expected a tensor input, got int$"):
        DcpLocalSeqLens().apply(out, 5, 2, 0, 1, workspace=Workspace())


def test_a_derivation_given_as_a_class_is_refused_with_the_call_to_write() -> None:
    with pytest.raises(TypeError, match=r"^derivation must be a Derivation instance, got the class "
                                        r"CopyFrom; write CopyFrom\(\)$"):
        Derive(CopyFrom, ("decode.seq_lens",))  # type: ignore[arg-type]


def test_a_kernel_bound_argument_is_named_by_its_bound_and_signed_offset() -> None:
    """Two bounds of one kernel get one argument each: the name says which bound and offset."""
    assert _bound_name("max_model_len", 0) == "max_model_len"
    assert _bound_name("max_model_len", 1) == "max_model_len_plus_1"
    assert _bound_name("max_model_len", -1) == "max_model_len_minus_1"


def test_a_clamped_advance_says_its_bound() -> None:
    assert Clamp("max_model_len", -1).describe(1) == "+= 1, clamped to state.max_model_len-1"
    assert Clamp("max_model_len").describe(2) == "+= 2, clamped to state.max_model_len"


def test_a_reset_says_what_replaces_the_field_and_who_fills_it() -> None:
    assert Reset(Scheduler).describe() == "reset: replaced by a fresh Scheduler()"
    assert Reset(Scheduler, filled_on_device=True).describe() == (
        "reset: replaced by a fresh Scheduler(), filled on the device by its consumer")
    made = functools.partial(Scheduler)  # no __qualname__: its repr names it
    assert Reset(made).describe() == f"reset: replaced by a fresh {made!r}()"


def test_an_invalidated_field_is_set_to_none_at_every_step_and_says_so() -> None:
    rule = Invalidate()
    assert rule.describe() == "invalidate: set to None, refilled lazily by its consumer"
    spec = toy_spec(rules={**toy_rules(), "decode.dcp_tot_seq_lens": Invalidate()})
    state = random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=4,
                         max_model_len=32, steps=3)
    meta = toy_metadata(state)
    assert meta.decode is not None
    meta.decode.dcp_tot_seq_lens = torch.ones(4, dtype=torch.int32)  # filled by a consumer
    spec.update(meta, state)
    assert meta.decode.dcp_tot_seq_lens is None


def test_invalidating_a_field_that_cannot_be_none_is_refused_with_the_fix() -> None:
    with pytest.raises(SpecError) as caught:
        toy_spec(rules={**toy_rules(), "decode.seq_lens": Invalidate()})
    assert str(caught.value) == (
        "field 'decode.seq_lens' of spec 'toy': rule invalidate sets it to None, but its "
        "annotation (Tensor) does not allow None. Fix: invalidate only optional, lazily filled "
        "fields")


def test_a_host_constant_that_is_no_literal_is_refused_with_the_rules_that_take_it() -> None:
    with pytest.raises(TypeError) as caught:
        HostSet(object())
    assert str(caught.value).startswith("value must be None, a bool, an int, a finite float or "
                                        "a str (written into the generated source as a literal)")
    assert str(caught.value).endswith("; use HostDerive or Reset for other values")


class _Refill(RecomputeHook):
    """Fills its field with 1 and each ``also`` field with 2, 3, ..."""

    name = "refill"
    formula = "out = 1, also[i] = i + 2"

    def check(self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
              ) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any,
              also: tuple[torch.Tensor, ...] = ()) -> None:
        out.fill_(1)
        for i, t in enumerate(also):
            t.fill_(i + 2)


def test_a_recompute_hook_refills_every_field_it_lists_in_also() -> None:
    rules = {**toy_rules(),
             "decode.lens_copy": Recompute(_Refill(), ("decode.seq_lens",),
                                           also=("decode.decode_lens", "weights")),
             "decode.decode_lens": WrittenBy("decode.lens_copy"),
             "weights": WrittenBy("decode.lens_copy")}
    spec = toy_spec(rules=rules)
    state = random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=4,
                         max_model_len=32, steps=3)
    meta = toy_metadata(state)
    spec.update(meta, state)
    assert meta.decode is not None
    assert set(meta.decode.lens_copy.tolist()) == {1}
    assert set(meta.decode.decode_lens.tolist()) == {2}
    assert set(meta.weights.tolist()) == {3}


def test_a_host_advance_without_a_clamp_says_only_its_step() -> None:
    assert HostAdvance().describe() == "host advance: += 1"
    assert HostAdvance(clamp="max_model_len").describe() == (
        "host advance: += 1, clamped to state.max_model_len")


def test_a_rule_said_fusable_without_a_triton_form_is_refused_by_its_name() -> None:
    @attrs.frozen
    class ClaimsToFuse(Unchanged):
        @property
        def fusable(self) -> bool:
            return True

    with pytest.raises(NotImplementedError, match=r"^test_a_rule_said_fusable_without_a_triton_"
                       r"form_is_refused_by_its_name\.<locals>\.ClaimsToFuse says it is fusable "
                       r"but defines no lower_triton$"):
        ClaimsToFuse().lower_triton(None, torch.zeros(1), (), ())  # type: ignore[arg-type]


def test_a_host_derive_reading_a_tensor_is_refused_with_the_fix() -> None:
    """A host value computed from a tensor would make the host wait for the device."""
    rules = {**toy_rules(), "scale": HostDerive(lambda t: 1.0, ("state.seq_lens",), formula="1")}
    with pytest.raises(SpecError) as caught:
        toy_spec(rules=rules)
    assert str(caught.value).endswith(
        "host rule reads the tensor 'state.seq_lens', which would wait for the device. Fix: "
        "read host scalars only (state.max_seq_len, ...), or make the field a tensor rule")
