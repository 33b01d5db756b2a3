"""The update-or-rebuild policy on its own (no engine): decided once from the capability, at
each step the update in place or the rebuild with the reason recorded, a refusal for the rest of
the draft loop, a rule-out for good, the sealed update equal to the full one."""

from __future__ import annotations

from typing import Any

import torch

from draftmeta import DraftState, DraftUpdatable, advance_state
from draftmeta.errors import PreconditionFailed, UpdateError, WriteFailed
from draftmeta.loop import GroupStats
from draftmeta.protocol import SpecBuilder
from draftmeta.step_policy import StepPolicy, why_refused
from draftmeta.testing import compare_metadata, random_state
from tests.toy import Scheduler, ToyDecode, ToyMeta, toy_metadata, toy_spec


class ToyBuilder(DraftUpdatable[ToyMeta[ToyDecode]]):
    draft_spec = toy_spec()


class HandWritten:
    """Capable without a spec: its own ``update_draft_metadata``."""

    def __init__(self) -> None:
        self.calls = 0

    def update_draft_metadata(self, metadata: object, state: DraftState, /) -> None:
        self.calls += 1


def _state(seed: int = 0) -> DraftState:
    return random_state(torch.Generator().manual_seed(seed), batch_size=4, block_size=16,
                        max_model_len=512, steps=6)


def _policy(builder: object, **kwargs: Any) -> tuple[StepPolicy, list[tuple[str, bool]]]:
    """A policy over ``builder`` whose rebuild returns ``("rebuilt", draft_index)``, and the
    list its reports go to."""
    reports: list[tuple[str, bool]] = []
    policy = StepPolicy("toy", builder, GroupStats(), lambda source, index: ("rebuilt", index),
                        report=lambda name, reason, for_good: reports.append((reason, for_good)),
                        **kwargs)
    return policy, reports


def _opaque(obj: object) -> bool:
    return isinstance(obj, Scheduler)


def test_a_capable_builder_is_updated_in_place_and_counted() -> None:
    state = _state()
    metadata = toy_metadata(state)
    policy, reports = _policy(ToyBuilder())
    for index in (1, 2, 3):
        advance_state(state, "clamp")
        assert policy.step(metadata, state, state, index) is metadata
    assert policy.in_place and policy.record.reason is None and reports == []
    assert (policy.record.updates, policy.record.rebuilds) == (3, 0)
    assert compare_metadata(metadata, toy_metadata(state), opaque=_opaque) == []


def test_a_builder_without_the_capability_is_rebuilt_for_good_with_the_reason() -> None:
    policy, reports = _policy(object())
    assert reports == [("object declares no draft-update capability", True)]
    assert policy.step(None, _state(), "source", 1) == ("rebuilt", 1)
    assert not policy.new_loop()  # a new draft loop does not make it capable
    assert policy.step(None, _state(), "source", 2) == ("rebuilt", 2)
    assert (policy.record.updates, policy.record.rebuilds) == (0, 2)


def test_a_refused_step_rebuilds_for_the_rest_of_the_loop_and_the_next_loop_tries_again() -> None:
    state = _state(1)
    metadata = toy_metadata(state)
    metadata.num_prefills = 1  # the spec's decode_only precondition refuses it
    policy, reports = _policy(ToyBuilder())
    assert policy.step(metadata, state, state, 1) == ("rebuilt", 1)
    assert policy.step(metadata, state, state, 2) == ("rebuilt", 2)  # not tried again
    (reason, for_good), = reports
    assert reason.startswith("precondition 'decode_only' failed: ") and not for_good
    assert policy.record.reason == reason and policy.reason == reason
    metadata.num_prefills = 0
    assert policy.new_loop() and policy.reason is None
    assert policy.step(metadata, state, state, 1) is metadata
    assert policy.record.reason == reason  # the record keeps the last fallback's reason
    assert (policy.record.updates, policy.record.rebuilds) == (1, 2)


def test_an_object_the_spec_does_not_cover_rules_the_group_out_for_good() -> None:
    state = _state(2)
    metadata = toy_metadata(state)
    spec = ToyBuilder.draft_spec
    policy, reports = _policy(ToyBuilder())
    assert policy.check_object(spec, metadata)  # the control: covered, nothing reported
    assert reports == []
    metadata.decode.kernel_hint = torch.zeros(1)
    assert not policy.check_object(spec, metadata)
    (reason, for_good), = reports
    assert for_good and reason.startswith("its built metadata carries decode.kernel_hint")
    assert reason.endswith(f"which spec {spec.name} has no rule for")
    assert not policy.new_loop()
    assert policy.step(metadata, state, state, 1) == ("rebuilt", 1)


def test_the_sealed_update_equals_the_full_update_and_seals_once_per_loop() -> None:
    state = _state(3)
    sealed_meta, full_meta = toy_metadata(state), toy_metadata(state)
    sealed, _ = _policy(SpecBuilder(toy_spec()), sealed=True)
    full, _ = _policy(ToyBuilder())
    assert sealed.seal is None
    for index in (1, 2, 3, 4):
        advance_state(state, "clamp")
        assert sealed.sealed_step(sealed_meta, state, state, index) is sealed_meta
        assert full.step(full_meta, state, state, index) is full_meta
        assert compare_metadata(sealed_meta, full_meta, opaque=_opaque) == []
        if index == 1:
            first_seal = sealed.seal
            assert first_seal is not None
    assert sealed.seal is first_seal  # sealed once, stepped after
    assert sealed.new_loop() and sealed.seal is None  # a new loop seals anew
    assert sealed.record.updates == 4


def test_the_capabilitys_own_update_is_the_one_called() -> None:
    builder = HandWritten()
    policy, reports = _policy(builder)
    state = _state(4)
    assert policy.step("meta", state, state, 1) == "meta" and builder.calls == 1
    assert reports == []


def test_a_capable_builder_without_a_spec_has_no_sealed_update() -> None:
    builder = HandWritten()
    policy, reports = _policy(builder, sealed=True)
    assert reports == [("HandWritten declares no spec, so it has no sealed update", True)]
    assert policy.sealed_step("meta", _state(), "source", 2) == ("rebuilt", 2)
    assert builder.calls == 0


def test_a_write_that_fails_after_the_checks_rebuilds_the_partly_written_object() -> None:
    class Failing(HandWritten):
        def update_draft_metadata(self, metadata: object, state: DraftState, /) -> None:
            raise WriteFailed("toy", "decode.seq_lens", "RuntimeError: boom")

    policy, reports = _policy(Failing())
    state = _state(5)
    assert policy.step("partly written", state, state, 2) == ("rebuilt", 2)
    assert reports == [("field 'decode.seq_lens': write failed: RuntimeError: boom", False)]


def test_each_refusal_is_worded_by_what_failed() -> None:
    assert why_refused(PreconditionFailed("s", "decode_only", "num_prefills is 1")) == (
        "precondition 'decode_only' failed: num_prefills is 1")
    assert why_refused(UpdateError("s", "decode.seq_lens", "is None")) == (
        "field 'decode.seq_lens': is None")
    assert why_refused(WriteFailed("s", "max_seq_len", "boom")) == (
        "field 'max_seq_len': write failed: boom")


def test_a_refused_sealed_step_rebuilds_the_step_it_was_given() -> None:
    """The sealed step's refusal hands ``rebuild`` the caller's source and draft index (the
    older proposer's rebuild is vLLM's ``build_for_drafting(common, draft_index)``), and
    counts the rebuild, not an update."""
    state = _state(6)
    metadata = toy_metadata(state)
    metadata.num_prefills = 1  # the spec's decode_only precondition refuses it
    calls: list[tuple[object, int]] = []
    policy = StepPolicy("toy", SpecBuilder(toy_spec()), GroupStats(),
                        lambda source, index: calls.append((source, index)) or "rebuilt",
                        sealed=True)
    assert policy.sealed_step(metadata, state, "the step's source", 3) == "rebuilt"
    assert calls == [("the step's source", 3)]
    assert policy.reason is not None and policy.reason.startswith("precondition 'decode_only'")
    assert (policy.record.updates, policy.record.rebuilds) == (0, 1)
