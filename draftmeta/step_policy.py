"""Update in place, or rebuild and record why: the one policy of both draft loops.

A draft loop refreshes each attention group's metadata at every draft step after the first.
Whether a group's metadata is updated in place through its builder's capability
(:class:`~draftmeta.protocol.SupportsDraftUpdate`) or rebuilt, and why, is decided and done
here, by one :class:`StepPolicy` per group, for both of draftmeta's loops:
:class:`~draftmeta.loop.DraftLoop` and the vLLM plugin's older-proposer path
(:mod:`draftmeta.integrations.vllm.plugin.older_proposer`: vLLM 0.32 and 0.33 call
``build_for_drafting`` at every draft index). What belongs to the engine is handed in: the
draft state of the step (the loop advances it; the plugin reads vLLM's common metadata into
it) and the ``rebuild`` callable (the loop's group; vLLM's own build).

The policy, in the order it applies:

1. **Before the first step**, once per group (:class:`StepPolicy`'s constructor): the builder
   declares the capability and its spec can update in place (:func:`why_not_capable`, which
   asks :func:`~draftmeta.protocol.why_not_in_place`); else the group rebuilds for good.
2. **Before the first update of a built object** (:meth:`StepPolicy.check_object`): an object
   carrying an attribute its spec has no rule for would be left partly stale
   (:func:`why_uncovered`): the group rebuilds for good.
3. **At each step** (:meth:`StepPolicy.step`, or :meth:`StepPolicy.sealed_step` with the spec's
   sealed update): the update in place; where it raises (a
   precondition or a structure check: nothing was written; a write: partly written), the
   reason (:func:`why_refused`) is recorded and the metadata rebuilt, for the rest of the draft
   loop (:meth:`StepPolicy.new_loop` lets the next loop try again).
4. **Shadow mode** (:mod:`draftmeta.shadow`): a rebuild found to differ from the update
   (:meth:`StepPolicy.stale`, :func:`why_stale`) switches the group to rebuilding for good.

Each reason is recorded in the group's :class:`StepRecord` (with its counts of updates and
rebuilds) and handed to the loop's :data:`Report` once, when the group starts rebuilding, never
per step. The same failure gives the same words on both loops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from draftmeta.codegen import SealFunction, StepFunction
from draftmeta.compare import Mismatch
from draftmeta.errors import DraftMetaError, PreconditionFailed, UpdateError, WriteFailed
from draftmeta.protocol import SupportsDraftUpdate, spec_of, why_not_in_place
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = [
    "Report",
    "StepPolicy",
    "StepRecord",
    "why_not_capable",
    "why_refused",
    "why_stale",
    "why_uncovered",
]

Report = Callable[[str, str, bool], None]
"""``report(group, reason, for_good)``: a group starts rebuilding, for good or for the rest of
this draft loop; called once per change, never per step."""


class StepRecord(Protocol):
    """What a policy records: the last reason and the counts (a loop's
    :class:`~draftmeta.loop.GroupStats`; the plugin's per-builder counters)."""

    reason: str | None
    updates: int
    rebuilds: int


def why_not_capable(builder: object) -> str | None:
    """``None`` if ``builder`` can update its metadata in place, else why not: it does not
    satisfy :class:`~draftmeta.protocol.SupportsDraftUpdate`, or the spec it declares cannot
    (:func:`~draftmeta.protocol.why_not_in_place`). A capable builder without a spec (a
    hand-written ``update_draft_metadata``) can."""
    if not isinstance(builder, SupportsDraftUpdate):
        return f"{type(builder).__qualname__} declares no draft-update capability"
    spec = spec_of(builder)
    return None if spec is None else why_not_in_place(spec)


def why_refused(exc: DraftMetaError) -> str:
    """Why a step's update did not happen, from what it raised."""
    if isinstance(exc, PreconditionFailed):
        return f"precondition {exc.name!r} failed: {exc.detail}"
    if isinstance(exc, UpdateError):
        return f"field {exc.path!r}: {exc.detail}"
    if isinstance(exc, WriteFailed):
        return f"field {exc.path!r}: write failed: {exc.detail}"
    return str(exc)


def why_stale(mismatch: Mismatch) -> str:
    """Why shadow mode switched a group to rebuilding: the field its update left stale."""
    return f"shadow mode found field {mismatch.path} stale ({mismatch.detail})"


def why_uncovered(spec: DraftSpec[Any], metadata: object) -> str | None:
    """Why ``metadata`` cannot be updated in place by ``spec`` (an attribute, or a record of a
    subclass, that the spec has no rule for), or ``None`` where the spec covers it. One walk
    of the object (:meth:`~draftmeta.spec.DraftSpec.uncovered`): once per built object."""
    uncovered = spec.uncovered(metadata)
    if not uncovered:
        return None
    return f"its built metadata carries {uncovered[0]}, which spec {spec.name} has no rule for"


def _no_report(group: str, reason: str, for_good: bool) -> None:
    """The default :data:`Report`: the reason is recorded, nothing is logged."""


class StepPolicy:
    """One group's policy: update its metadata in place through the capability, or rebuild
    it and record why.

    Args:
        name: the group's name, handed to ``report``.
        builder: the group's builder; decided on once, here (:func:`why_not_capable`).
        record: where the reason and the counts go.
        rebuild: builds the group's metadata from scratch, ``rebuild(source, draft_index)``,
            for the step ``source`` describes (the loop's draft state; vLLM's common metadata).
        report: told once whenever the group starts rebuilding.
        sealed: also make :meth:`sealed_step` ready, the spec's sealed pair
            (:attr:`~draftmeta.spec.DraftSpec.sealed`), for a builder whose update is its
            spec's; a builder that carries no spec is then ruled out, with the reason.

    Attributes:
        name: the group's name.
        reason: why the group rebuilds now, ``None`` while it updates in place.
        record: the group's record.
        seal: the sealed update's seal of the object being updated (:meth:`sealed_step`),
            ``None`` between draft loops; it holds the loop's records and tensors, so whoever
            ends a loop sets it to ``None``.
    """

    __slots__ = (
        "_for_good",
        "_report",
        "_seal",
        "_step",
        "_update",
        "name",
        "reason",
        "rebuild",
        "record",
        "seal",
    )

    def __init__(self, name: str, builder: object, record: StepRecord,
                 rebuild: Callable[[Any, int], Any], *,
                 report: Report = _no_report, sealed: bool = False) -> None:
        self.name = name
        self.record = record
        self.rebuild = rebuild
        self._report = report
        self.reason: str | None = None
        self._for_good = False
        self.seal: tuple[object, ...] | None = None  # the sealed pair's seal of the object
        self._update: Callable[[Any, DraftState], object] | None = None
        self._seal: SealFunction[Any] | None = None
        self._step: StepFunction[Any] | None = None
        problem = why_not_capable(builder)
        if problem is None:
            spec = spec_of(builder)
            self._update = builder.update_draft_metadata  # type: ignore[attr-defined]
            if sealed and spec is None:
                problem = (f"{type(builder).__qualname__} declares no spec, so it has no "
                           "sealed update")
            elif sealed and spec is not None:
                self._seal, self._step = spec.sealed
        if problem is not None:
            self.rule_out(problem)

    @property
    def in_place(self) -> bool:
        """Whether the group updates in place now."""
        return self.reason is None

    def rule_out(self, reason: str) -> None:
        """The group rebuilds for good, for ``reason`` (recorded and reported once)."""
        if self._for_good:
            return
        self._for_good = True
        self._fall_back(reason, True)

    def check_object(self, spec: DraftSpec[Any], metadata: object) -> bool:
        """Before the first update of a built ``metadata``: whether ``spec`` covers it; an
        object it does not cover rules the group out (:func:`why_uncovered`)."""
        problem = why_uncovered(spec, metadata)
        if problem is not None:
            self.rule_out(problem)
        return problem is None

    def stale(self, mismatch: Mismatch) -> None:
        """Shadow mode found ``mismatch`` between an update and a rebuild: rebuild for good."""
        self.rule_out(why_stale(mismatch))

    def new_loop(self) -> bool:
        """A new draft loop starts: a refusal of the last loop's steps is forgotten (the seal
        too: a new object, or the same one with new contents); whether it updates in place.

        A loop that ends normally should let go of its seal itself (``policy.seal = None``
        after its last step): the seal holds the loop's records and tensors, which would
        otherwise live until this call and be freed inside the next loop's first step."""
        self.seal = None
        if not self._for_good:
            self.reason = None
        return self.reason is None

    def step(self, metadata: Any, state: DraftState, source: Any, draft_index: int) -> Any:
        """One draft step of the group: ``metadata`` updated in place for ``state`` by the
        builder's ``update_draft_metadata`` and returned, or, where the group rebuilds or the
        update raises (the reason recorded then), ``rebuild(source, draft_index)``."""
        if self.reason is not None:
            self.record.rebuilds += 1
            return self.rebuild(source, draft_index)
        try:
            self._update(metadata, state)  # type: ignore[misc]
        except DraftMetaError as exc:
            return self._refused(exc, source, draft_index)
        self.record.updates += 1
        return metadata

    def sealed_step(self, metadata: Any, state: DraftState, source: Any, draft_index: int
                    ) -> Any:
        """:meth:`step` with the spec's sealed update (a policy made with ``sealed=True``):
        at the first step of an object every check, the update and a seal; at the later ones
        the sealed step, sealing anew where the object no longer holds what was sealed."""
        if self.reason is not None:
            self.record.rebuilds += 1
            return self.rebuild(source, draft_index)
        try:
            seal = self.seal
            if seal is None or not self._step(metadata, state, seal):  # type: ignore[misc]
                self.seal = self._seal(metadata, state)  # type: ignore[misc]
        except DraftMetaError as exc:
            return self._refused(exc, source, draft_index)
        self.record.updates += 1
        return metadata

    def _refused(self, exc: DraftMetaError, source: Any, draft_index: int) -> Any:
        """The step's update raised ``exc``: record why, rebuild for the rest of the loop."""
        self._fall_back(why_refused(exc), False)
        self.record.rebuilds += 1
        return self.rebuild(source, draft_index)

    def _fall_back(self, reason: str, for_good: bool) -> None:
        self.reason = self.record.reason = reason
        self._report(self.name, reason, for_good)
