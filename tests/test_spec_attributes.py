"""Specs cover the object a builder actually builds, not only its declared class."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from draftmeta import CopyFrom, Derive, DraftSpec, HostConstant, SpecError, Unchanged
from draftmeta.state import DraftState
from draftmeta.testing import compare_metadata


@dataclasses.dataclass
class Meta:
    num_reqs: int
    seq_lens: torch.Tensor


@dataclasses.dataclass
class MetaWithExtraField(Meta):
    seq_lens_i64: torch.Tensor | None = None


def _state(seq_lens: list[int]) -> DraftState:
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    n = len(seq_lens)
    return DraftState(
        positions=(lens - 1).long(),
        seq_lens=lens,
        slot_mapping=torch.zeros(n, dtype=torch.int64),
        block_table=torch.zeros(n, 4, dtype=torch.int32),
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        num_reqs=n,
        max_seq_len=max(seq_lens),
        max_model_len=64,
        block_size=16,
    )


def _spec_with_i64_attribute() -> DraftSpec[Meta]:
    return DraftSpec(
        Meta,
        {
            "num_reqs": HostConstant(),
            "seq_lens": Unchanged(),
            "seq_lens_i64": Derive(CopyFrom(), ["state.seq_lens"]),
        },
        name="with_attribute",
        attributes={"seq_lens_i64": torch.Tensor},
    )


def _built(state: DraftState) -> Meta:
    meta = Meta(state.num_reqs, state.seq_lens.clone())
    meta.seq_lens_i64 = state.seq_lens.to(torch.int64)  # type: ignore[attr-defined]
    return meta


def test_a_declared_attribute_is_updated_like_a_field() -> None:
    spec = _spec_with_i64_attribute()
    state = _state([5, 9])
    meta = _built(state)
    state.seq_lens += 1
    spec.update(meta, state)
    assert meta.seq_lens_i64.tolist() == [6, 10]  # type: ignore[attr-defined]
    assert meta.seq_lens_i64.dtype == torch.int64  # type: ignore[attr-defined]


def test_a_declared_attribute_without_a_rule_is_refused_at_declaration() -> None:
    with pytest.raises(SpecError, match="seq_lens_i64"):
        DraftSpec(
            Meta,
            {"num_reqs": HostConstant(), "seq_lens": Unchanged()},
            attributes={"seq_lens_i64": torch.Tensor},
        )


def test_declaring_an_existing_field_as_an_attribute_is_refused_with_the_fix() -> None:
    with pytest.raises(SpecError, match="remove 'seq_lens' from attributes="):
        DraftSpec(
            Meta,
            {"num_reqs": HostConstant(), "seq_lens": Unchanged()},
            attributes={"seq_lens": torch.Tensor},
        )


def test_an_attribute_under_an_unknown_record_is_refused() -> None:
    with pytest.raises(SpecError, match="decode"):
        DraftSpec(
            Meta,
            {"num_reqs": HostConstant(), "seq_lens": Unchanged(), "decode.x": Unchanged()},
            attributes={"decode.x": torch.Tensor},
        )


def test_a_spec_covers_a_built_object_carrying_only_declared_attributes() -> None:
    assert _spec_with_i64_attribute().uncovered(_built(_state([3]))) == ()


def test_an_attribute_set_after_construction_is_reported_as_uncovered() -> None:
    spec = DraftSpec(Meta, {"num_reqs": HostConstant(), "seq_lens": Unchanged()})
    meta = _built(_state([3]))
    (problem,) = spec.uncovered(meta)
    assert "seq_lens_i64" in problem and "outside the class's fields" in problem


def test_a_subclass_instance_is_reported_as_uncovered() -> None:
    spec = DraftSpec(Meta, {"num_reqs": HostConstant(), "seq_lens": Unchanged()})
    (problem,) = spec.uncovered(MetaWithExtraField(1, torch.ones(1)))
    assert "MetaWithExtraField" in problem and "not the declared Meta" in problem


def test_comparison_sees_an_extra_attribute_that_differs() -> None:
    state = _state([4, 8])
    a, b = _built(state), _built(state)
    b.seq_lens_i64 = b.seq_lens_i64 + 1  # type: ignore[attr-defined]
    (mismatch,) = compare_metadata(a, b)
    assert mismatch.path == "seq_lens_i64"


def test_comparison_sees_an_extra_attribute_set_on_one_side_only() -> None:
    state = _state([4])
    a = _built(state)
    b = Meta(a.num_reqs, a.seq_lens.clone())
    (mismatch,) = compare_metadata(a, b)
    assert mismatch.path == "seq_lens_i64" and "only on the updated" in mismatch.detail


def test_an_attribute_set_after_the_first_update_is_refused_at_the_next_one() -> None:
    from draftmeta import UpdateError

    spec = _spec_with_i64_attribute()
    state = _state([5, 9])
    meta = _built(state)
    spec.update(meta, state)  # checked once: covered
    meta.kernel_hint = torch.zeros(2)  # type: ignore[attr-defined]  # set by someone else later
    before = meta.seq_lens_i64.clone()  # type: ignore[attr-defined]
    state.seq_lens += 1
    with pytest.raises(UpdateError, match=r"kernel_hint \(an attribute outside the class's"):
        spec.update(meta, state)
    assert torch.equal(meta.seq_lens_i64, before)  # type: ignore[attr-defined]  # nothing written


def test_an_attribute_set_on_a_nested_record_after_the_first_update_is_refused() -> None:
    from draftmeta import UpdateError
    from draftmeta.testing import random_state
    from tests.toy import toy_metadata, toy_spec

    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                         max_model_len=256, steps=3)
    meta = toy_metadata(state)
    spec = toy_spec()
    spec.update(meta, state)
    meta.decode.kernel_hint = 1
    with pytest.raises(UpdateError, match=r"decode\.kernel_hint"):
        spec.update(meta, state)


def test_a_declared_attribute_swapped_for_an_unknown_one_is_refused_at_the_next_update() -> None:
    """The attribute names are compared on every call, not only their number: deleting a
    declared attribute and setting an unknown one keeps the count and is still refused."""
    from draftmeta import UpdateError

    spec = _spec_with_i64_attribute()
    state = _state([5, 9])
    meta = _built(state)
    spec.update(meta, state)
    del meta.seq_lens_i64  # type: ignore[attr-defined]
    meta.kernel_hint = torch.zeros(2)  # type: ignore[attr-defined]
    with pytest.raises(UpdateError, match=r"kernel_hint \(an attribute outside the class's"):
        spec.update(meta, state)


def test_a_new_object_from_the_same_builder_is_checked_like_the_first() -> None:
    """Every object is checked on every call: a second object carrying an unknown attribute is
    refused even though an object of the same class passed just before."""
    from draftmeta import UpdateError

    spec = _spec_with_i64_attribute()
    state = _state([5, 9])
    spec.update(_built(state), state)
    other = _built(state)
    other.kernel_hint = 1  # type: ignore[attr-defined]
    with pytest.raises(UpdateError, match=r"kernel_hint"):
        spec.update(other, state)
