"""The older proposer path (vLLM 0.32 and 0.33): ``build_for_drafting`` at every draft index.

:func:`replacement_build_for_drafting` makes the replacement the plugin installs on a builder
class: the metadata vLLM builds at draft index 1 is kept and, at the later indices of the same
draft loop, updated in place instead of rebuilt. Index 1 itself only keeps it; where K <= 2 no
index follows it, so at its first draft loop the builder instance gets vLLM's own method back
and the plugin costs nothing from then on. The loop's first in-place step (index 2)
runs every check of the spec on it, updates it and seals it
(:attr:`~draftmeta.spec.DraftSpec.sealed`); the later indices run the sealed step, which re-checks
at every step what can change between steps and falls back to the full update (every check again)
where the object no longer holds what was sealed. With ``DRAFTMETA_CARRY_OVER=1`` the last loop's
index-1 object is carried over where the batch allows
(:mod:`~draftmeta.integrations.vllm.carry_over`); with ``DRAFTMETA_SHADOW=N`` every Nth loop also
rebuilds and compares (:mod:`draftmeta.shadow`).
"""

from __future__ import annotations

import copy
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from draftmeta.codegen import SealFunction, StepFunction
from draftmeta.errors import DraftMetaError
from draftmeta.integrations.vllm.carry_over import Snapshot, spec_refuses, unchanged_values
from draftmeta.integrations.vllm.carry_over import enabled as carry_over_enabled
from draftmeta.integrations.vllm.common_metadata import draft_state_of, rebind
from draftmeta.integrations.vllm.log import LOGGER_NAME, fallback
from draftmeta.integrations.vllm.plan import Decision, SpecOverride, spec_for
from draftmeta.shadow import Sentinel, sentinel_for
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = ["BuilderStats", "replacement_build_for_drafting"]

logger = logging.getLogger(LOGGER_NAME)


@attrs.define
class BuilderStats:
    """Per-builder counters of the older proposer path.

    Attributes:
        in_place: draft steps (index >= 2) whose metadata draftmeta updated in place.
        rebuilt: draft steps (index >= 2) that went to vLLM's build instead (a refused
            precondition, an uncovered attribute, DCP > 1).
        carried_over: draft loops whose index-1 metadata was the previous loop's object,
            refreshed in place (the batch matched it in everything the build reads).
    """

    in_place: int = 0
    rebuilt: int = 0
    carried_over: int = 0


@attrs.define
class _OlderBuilder:
    """What the plugin keeps per builder instance on the older proposer path.

    A draft loop itself is one tuple on the builder, ``_draftmeta_loop``: ``(common metadata,
    metadata built at index 1)`` until its first in-place step, then ``(common metadata,
    metadata, this record, its seal or None)`` (creating an object per loop costs more host time
    than the update saves). It is dropped after the loop's last index, so the loop's objects die
    with vLLM's references to them, not during the next loop.
    """

    spec: DraftSpec[Any]
    state: DraftState  # rebound to each draft step's common metadata (_rebind)
    sentinel: Sentinel
    last_index: int  # the last draft index of a loop (K - 1): the loop ends there
    # the spec's (seal, step) pair, looked up once: a property call per step costs in the engine
    sealed: tuple[SealFunction[Any], StepFunction[Any]]
    counters: BuilderStats  # the builder class's counters (plugin.stats)
    carry: Callable[[object], str | None] | None = None  # unchanged-field check, if it carries
    checked: bool = False  # the first built object was checked for uncovered attributes
    refused: bool = False  # it carried something the spec does not cover: always rebuild
    shadowed: bool = False  # the current loop also rebuilds and compares (DRAFTMETA_SHADOW)
    # draft indices 0 and 1 only build and keep (K known and >= 3, no carry-over; a record
    # exists only for a builder with DCP off): fixed per builder, so those indices take the
    # short path at the top of the replacement
    builds_first: bool = False


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


def replacement_build_for_drafting(
    decision: Decision, overrides: Mapping[str, SpecOverride] | None, counters: BuilderStats
) -> Callable[..., Any]:
    """The replacement of ``decision``'s builder class's ``build_for_drafting``: vLLM's build
    at draft index 1, draftmeta's in-place update at the later indices of the same loop,
    counted in ``counters``."""
    cls, entry = decision.cls, decision.entry
    assert cls is not None
    original = cls.build_for_drafting  # type: ignore[attr-defined]
    declared = entry.carry_over if carry_over_enabled() else None

    def new_record(builder: Any, cad: Any) -> _OlderBuilder:
        """The builder's spec, state and loop length, made at its first draft loop and kept
        on the builder (``_draftmeta_older_builder``)."""
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
        kept = _OlderBuilder(spec, draft_state_of(cad, builder), sentinel_for(entry.name), last,
                             spec.sealed, counters, carry=carry,
                             builds_first=2 <= last < _NO_LAST_INDEX and declared is None)
        builder._draftmeta_older_builder = kept
        return kept

    def bound(builder: Any, cad: Any, metadata: Any) -> _OlderBuilder | None:
        """At a draft loop's first in-place update: the builder's record, its first built
        object checked once for uncovered attributes, whether the loop is shadowed; ``None``
        if this builder must rebuild."""
        kept: _OlderBuilder | None = builder.__dict__.get("_draftmeta_older_builder")
        if kept is None:
            kept = new_record(builder, cad)
        if not kept.checked:
            kept.checked = True
            uncovered = kept.spec.uncovered(metadata)
            if uncovered:
                kept.refused = True
                fallback(
                    entry.name,
                    "draftmeta: %s keeps rebuilding: its built metadata carries %s, which "
                    "spec %s has no rule for", entry.name, uncovered[0], kept.spec.name,
                )
        sentinel = kept.sentinel
        if kept.refused or sentinel.switched_off:
            return None
        kept.shadowed = sentinel.interval != 0 and sentinel.should_check()
        return kept

    def carried_over(builder: Any, cad: Any) -> Any:
        """Draft index 1: the last loop's index-1 metadata refreshed in place for this loop,
        or ``None`` where this loop's batch differs from it in anything the build reads."""
        carried: _Carried | None = builder.__dict__.get("_draftmeta_carried")
        if carried is None or carried.snapshot.mismatch(cad) is not None:
            return None
        kept = bound(builder, cad, carried.metadata)
        if kept is None or kept.carry is None or kept.carry(carried.metadata) is not None:
            return None
        state = rebind(kept.state, cad)
        try:
            kept.spec.update(carried.metadata, state)
        except DraftMetaError as exc:
            fallback(entry.name, "draftmeta: %s builds this draft loop: %s", entry.name, exc)
            return None
        builder._draftmeta_loop = (cad, carried.metadata, kept, None)  # no seal: full updates
        if kept.shadowed:
            return _shadow_step(builder, original, kept, cad, carried.metadata, 1)
        counters.carried_over += 1
        return carried.metadata

    def first_step(builder: Any, cad: Any, metadata: Any) -> _OlderBuilder | None:
        """A loop's first in-place step (draft index 2): every check of the spec on the object
        vLLM built at index 1, the update, and the seal the later steps compare with; ``None``
        (nothing written) where this loop must rebuild."""
        kept = bound(builder, cad, metadata)
        if kept is None:
            return None
        try:
            sealed = kept.sealed[0](metadata, rebind(kept.state, cad))
        except DraftMetaError as exc:
            fallback(entry.name, "draftmeta: %s rebuilds this draft loop: %s", entry.name, exc)
            return None
        builder._draftmeta_loop = (cad, metadata, kept, sealed)
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
            metadata = loop[1]
            kept: _OlderBuilder | None
            if len(loop) == 2:  # the loop's first in-place step: check everything, seal
                kept = first_step(self, common_attn_metadata, metadata)
            else:
                kept, sealed = loop[2], loop[3]
                state = rebind(kept.state, common_attn_metadata)
                try:
                    if sealed is None:  # carried over at index 1: full updates
                        kept.spec.update(metadata, state)
                    elif not kept.sealed[1](metadata, state, sealed):
                        # the object changed since it was sealed: every check again, seal anew
                        self._draftmeta_loop = (common_attn_metadata, metadata, kept,
                                                kept.sealed[0](metadata, state))
                except DraftMetaError as exc:
                    fallback(entry.name, "draftmeta: %s rebuilds this draft loop: %s",
                             entry.name, exc)
                    kept = None
            if kept is not None:
                if kept.shadowed:
                    metadata = _shadow_step(self, original, kept, common_attn_metadata,
                                            metadata, draft_index)
                else:
                    counters.in_place += 1
                if draft_index >= kept.last_index:  # the loop ends: let go of it
                    self._draftmeta_loop = None
                return metadata
            self._draftmeta_loop = None
        # index 1 starts a draft loop (DCP > 1: the older proposer keeps DCP-local lengths in
        # the builder, so those loops rebuild)
        starts = draft_index == 1 and getattr(self, "dcp_world_size", 1) == 1
        if starts and declared is not None:
            metadata = carried_over(self, common_attn_metadata)
            if metadata is not None:
                return metadata
        if draft_index > 1:
            counters.rebuilt += 1
        metadata = original(self, common_attn_metadata, draft_index)
        # the checks wait for the loop's first in-place step (none where K = 2)
        self._draftmeta_loop = None
        if starts:
            kept = self.__dict__.get("_draftmeta_older_builder")
            if kept is None:
                if declared is None and _last_draft_index(self) < 2:
                    _keep_vllms_build(self, original, entry.name)
                    return metadata
                kept = new_record(self, common_attn_metadata)
            if kept.last_index >= 2:
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
    On a mismatch the sentinel logs once and switches the builder off; the rebuilt metadata is
    returned and the builder rebuilds from then on.
    """
    counters = kept.counters
    updated = copy.deepcopy(metadata)
    rebuilt = original(builder, cad, draft_index)
    if (mismatch := kept.sentinel.compare(updated, rebuilt)) is not None:
        fallback(kept.sentinel.builder, "draftmeta: %s rebuilds from now on: shadow mode found "
                 "field %s stale (%s)", kept.sentinel.builder, mismatch.path, mismatch.detail)
        builder._draftmeta_loop = builder._draftmeta_carried = None
        counters.rebuilt += 1
        return rebuilt
    if draft_index == 1:
        counters.carried_over += 1
    else:
        counters.in_place += 1
    return metadata
