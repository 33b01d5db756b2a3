"""HostSet: a host field set to a constant every step, written as a literal."""

from __future__ import annotations

import math

import pytest
import torch

from draftmeta import SpecError, advance_state, explain
from draftmeta.rules import HostSet
from draftmeta.testing import random_state
from tests.toy import toy_metadata, toy_rules, toy_spec


def test_a_host_set_field_takes_its_value_every_step() -> None:
    spec = toy_spec(rules={**toy_rules(), "causal": HostSet(True)})
    state = random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=4,
                         max_model_len=32, steps=3)
    meta = toy_metadata(state)
    for _ in range(2):
        meta.causal = False
        advance_state(state, "clamp")
        spec.update(meta, state)
        assert meta.causal is True


def test_explain_writes_the_value_as_a_literal_not_a_call() -> None:
    source = explain(toy_spec(rules={**toy_rules(), "causal": HostSet(True)}))
    assert "    # causal: host set: = True\n    _new_causal = True\n" in source
    assert "metadata.causal = _new_causal" in source


def test_an_int_host_set_needs_no_run_time_type_check() -> None:
    source = explain(toy_spec(rules={**toy_rules(), "num_reqs": HostSet(4)}))
    assert "_new_num_reqs = 4\n" in source and "type(_new_num_reqs)" not in source


@pytest.mark.parametrize("value", [object(), [1], math.nan, math.inf, torch.tensor(1)],
                         ids=["object", "list", "nan", "inf", "tensor"])
def test_a_value_that_is_not_a_literal_is_refused(value: object) -> None:
    with pytest.raises(TypeError, match="written into the generated source as a literal"):
        HostSet(value)


def test_host_set_on_a_tensor_field_is_refused_by_the_spec() -> None:
    with pytest.raises(SpecError, match="host rule host set cannot update a tensor"):
        toy_spec(rules={**toy_rules(), "weights": HostSet(0)})
