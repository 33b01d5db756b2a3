"""The vLLM general plugin: draftmeta's generated updates inside vLLM's draft loops.

Installed with draftmeta, the entry point ``draftmeta`` in group ``vllm.general_plugins`` makes
vLLM call :func:`register` once per process (in every process of a multiprocess engine), before
any metadata builder exists. It reads the installed release's catalogue
(:mod:`~draftmeta.integrations.vllm.catalogue`: vLLM 0.32, 0.33 and 0.34) and installs the
plan :func:`~draftmeta.integrations.vllm.plan.make_plan` makes, **per builder**:

* **older proposer** (0.32 and 0.33: ``build_for_drafting`` at every draft index): the metadata
  built at draft index 1 is kept and, at later indices of the same draft loop, updated in place
  instead of rebuilt. Index 1 itself only keeps it (where K = 2 there is no later index, and
  the plugin costs nothing there); the loop's first in-place step (index 2) runs every check of
  the spec on it, updates it and seals it (:attr:`~draftmeta.spec.DraftSpec.sealed`); the later
  indices run the sealed step, which re-checks at every step what can change between steps and
  falls back to the full update (every check again) where the object no longer holds what was
  sealed. With
  ``DRAFTMETA_CARRY_OVER=1`` (opt-in), at draft index 1 of the next loop, where the catalogue
  declares what the builder's build reads (``carry_over``: ``CPU_MLA``, ``TRITON_MLA``) and the
  new loop's batch matches the last one in all of it (same buffer views, same host structure; see
  :mod:`~draftmeta.integrations.vllm.carry_over`), the last loop's object is carried over and
  refreshed in place instead of built; a new batch shape builds. The first time a builder's
  metadata is seen, the spec must cover every attribute of the built object (subclass fields,
  attributes set after construction); otherwise that builder keeps rebuilding, with one log
  line naming the attribute. Anything the spec refuses at run time (a precondition, DCP > 1)
  falls back to the original build for that draft loop.
* **hook** (0.33 and 0.34: ``supports_draft_decode_metadata_update`` /
  ``update_draft_decode_metadata``, called inside the new runner's captured draft loop): for
  builders vLLM leaves without the hook, a generated full refresh from the buffers the metadata
  views is installed, **only where the spec is capture-safe**; the flag is set after the
  builder's own ``__init__`` where the spec's conditions hold. Builders vLLM covers itself are
  left alone unless ``DRAFTMETA_VLLM_OVERRIDE_UPSTREAM=1``.

A builder class that cannot be imported, or whose metadata no longer matches its spec, is left
alone with its reason (``draftmeta coverage`` shows it); the others are still patched. An
unsupported vLLM release, or one whose builder API lacks a draft path's methods, is left
entirely alone with one log line. Patches act only on instances of exactly the patched class:
a subclass (vLLM's ``AMXMLAMetadataBuilder`` under ``MLACommonMetadataBuilder``) has its own
catalogue entry or keeps vLLM's behaviour.

``DRAFTMETA_VLLM_PLUGIN=0`` turns the plugin off; vLLM's ``VLLM_PLUGINS`` allow-list works as
usual. :func:`unregister` restores every patched attribute exactly.

**Shadow mode** (older proposer path): with ``DRAFTMETA_SHADOW=N`` every Nth draft loop of a
builder also rebuilds its metadata at each in-place draft index (a carried-over index 1
included) and compares it field by field with the in-place update (:mod:`draftmeta.shadow`);
on a mismatch it logs one line with the builder and the field, counts it, returns the rebuilt
metadata and switches that builder back to rebuilding for the rest of the process. Unset, it
costs nothing but one attribute test per draft loop. (The hook path runs inside a captured
graph, where a rebuild cannot run.)
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from draftmeta.codegen import SealFunction, StepFunction
from draftmeta.errors import DraftMetaError, UpdateError
from draftmeta.integrations.patching import Patches
from draftmeta.integrations.vllm.carry_over import (
    Snapshot,
    spec_refuses,
    unchanged_values,
)
from draftmeta.integrations.vllm.carry_over import enabled as carry_over_enabled
from draftmeta.integrations.vllm.common_metadata import draft_state_of, rebind
from draftmeta.integrations.vllm.log import LOGGER_NAME, announce, fallback, summary
from draftmeta.integrations.vllm.log import reset as reset_log
from draftmeta.integrations.vllm.plan import (
    FORCE_ENV,
    OVERRIDE_ENV,
    Decision,
    Plan,
    SpecOverride,
    Unsupported,
    make_plan,
    spec_for,
)
from draftmeta.shadow import Sentinel, sentinel_for
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = [
    "DISABLE_ENV",
    "FORCE_ENV",
    "OVERRIDE_ENV",
    "BuilderStats",
    "Installed",
    "installed",
    "register",
    "reset_stats",
    "stats",
    "unregister",
]

logger = logging.getLogger(LOGGER_NAME)
"""The plugin's logger, ``vllm.draftmeta``: its lines appear in vLLM's log, in vLLM's format
(:mod:`~draftmeta.integrations.vllm.log`)."""


DISABLE_ENV = "DRAFTMETA_VLLM_PLUGIN"
"""Set to ``0`` (or ``off``, ``false``, ``no``) to turn the plugin off."""

@attrs.frozen
class Installed:
    """What :func:`register` did.

    Attributes:
        vllm_version: the installed ``vllm.__version__``.
        release: the catalogue used (``"0.34"``).
        older_proposer: builders updated in place by the older proposer path.
        hook: builders given draftmeta's ``update_draft_decode_metadata``.
        skipped: ``{"NAME (path)": reason}`` for builders left alone.
        plan: the full plan (every decision with its reason).
    """

    vllm_version: str
    release: str
    older_proposer: tuple[str, ...]
    hook: tuple[str, ...]
    skipped: dict[str, str]
    plan: Plan


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


_lock = threading.Lock()
_patches = Patches()
_installed: Installed | None = None
_stats: dict[str, BuilderStats] = {}


def installed() -> Installed | None:
    """What the plugin installed in this process, or ``None`` if it is not active."""
    return _installed


def stats() -> dict[str, dict[str, int]]:
    """``{builder name: {"in_place": n, "rebuilt": n, "carried_over": n}}`` since
    :func:`register` or :func:`reset_stats`."""
    return {name: attrs.asdict(s) for name, s in sorted(_stats.items())}


def reset_stats() -> None:
    """Zero the counters of :func:`stats`."""
    for s in _stats.values():
        s.in_place = s.rebuilt = s.carried_over = 0


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "off", "false", "no")


def _installed_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def register(*, spec_overrides: Mapping[str, SpecOverride] | None = None) -> None:
    """The plugin's entry point: idempotent, per-builder, fails closed, logs one line in
    vLLM's log (on with what it covers, off, or left untouched with the reason).

    Args:
        spec_overrides: replacement spec factories by builder name (``{"CPU_MLA": factory}``),
            for tests that must show a wrong spec is caught; vLLM calls it without.
    """
    global _installed
    with _lock:
        if _installed is not None:
            return
        if _disabled():
            announce(logging.INFO, "draftmeta off (%s=0): vLLM's draft loops run unchanged",
                     DISABLE_ENV)
            return
        try:
            version = _installed_version()
            plan = make_plan(version, overrides=spec_overrides)
        except Unsupported as exc:
            announce(logging.WARNING, "draftmeta: vLLM left untouched: %s", exc)
            return
        except Exception as exc:  # vLLM itself failed to import: say so, change nothing
            announce(logging.WARNING, "draftmeta: vLLM left untouched: cannot inspect it (%s)",
                     exc)
            return
        older, hook, skipped = [], [], {}
        for decision in plan.decisions:
            if not decision.installs:
                skipped[f"{decision.entry.name} ({decision.path})"] = decision.reason
                continue
            assert decision.cls is not None
            if decision.path == "older_proposer":
                _patches.replace(decision.cls, "build_for_drafting",
                       _older_build_for_drafting(decision, spec_overrides))
                older.append(decision.entry.name)
            else:
                _patches.replace(decision.cls, "__init__", _hook_init(decision, spec_overrides))
                _patches.replace(decision.cls, "update_draft_decode_metadata",
                                 _hook_update(decision))
                hook.append(decision.entry.name)
            _stats.setdefault(decision.entry.name, BuilderStats())
        _installed = Installed(version, plan.release.version, tuple(older), tuple(hook),
                               skipped, plan)
    announce(logging.INFO, "%s", summary(plan))


def _exactly(obj: Any, cls: type) -> bool:
    """Whether ``obj`` is an instance of ``cls`` itself, not of a subclass."""
    return type(obj) is cls


def unregister() -> None:
    """Restore every attribute the plugin patched, in reverse order, and forget its state."""
    global _installed
    with _lock:
        _patches.restore()
        _installed = None
        _stats.clear()
        reset_log()


# -- the older proposer: build at index 1, update in place after ---------------------------


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
    carry: Callable[[object], str | None] | None = None  # unchanged-field check, if it carries
    checked: bool = False  # the first built object was checked for uncovered attributes
    refused: bool = False  # it carried something the spec does not cover: always rebuild
    shadowed: bool = False  # the current loop also rebuilds and compares (DRAFTMETA_SHADOW)


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


def _older_build_for_drafting(
    decision: Decision, overrides: Mapping[str, SpecOverride] | None
) -> Callable[..., Any]:
    cls, entry = decision.cls, decision.entry
    assert cls is not None
    original = cls.build_for_drafting  # type: ignore[attr-defined]
    counters = _stats.setdefault(entry.name, BuilderStats())
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
        kept = _OlderBuilder(spec, draft_state_of(cad, builder), sentinel_for(entry.name),
                             _last_draft_index(builder), spec.sealed, carry=carry)
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
    counters = _stats[kept.sentinel.builder]
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


# -- the hook (new model runner) ------------------------------------------------------------


def _hook_init(
    decision: Decision, overrides: Mapping[str, SpecOverride] | None
) -> Callable[..., None]:
    cls, entry = decision.cls, decision.entry
    assert cls is not None
    original: Callable[..., None] = getattr(cls, "__init__")  # noqa: B009

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not _exactly(self, cls):
            return
        dcp = getattr(self, "dcp_world_size", 1) > 1
        self._draftmeta_states = _StateCache()
        try:
            spec = spec_for(entry, overrides, host_bound="frozen", dcp=dcp, builder=self)
        except DraftMetaError as exc:  # fail closed: this builder keeps vLLM's behaviour
            self._draftmeta_spec = None
            fallback(entry.name, "draftmeta: %s keeps vLLM's behaviour: its spec bound to "
                     "this builder does not fit (%s)", entry.name, exc)
            return
        self._draftmeta_spec = spec
        # the spec bound to this builder (FA3's head configuration, FlashMLA's FP8 cache) is
        # decided here: vLLM captures the hook, so a bound spec must be capture-safe too
        refusal = entry.refuses_instance(self)
        if refusal is not None:
            fallback(entry.name, "draftmeta: %s keeps vLLM's behaviour: %s", entry.name, refusal)
        self.supports_draft_decode_metadata_update = (
            spec.supported and spec.capture_safe and refusal is None)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


class _StateCache:
    """Draft states over the buffers of the metadata objects one builder's hook has seen,
    held by weak reference to the metadata (never by ``id()``), at most 16 of them."""

    def __init__(self) -> None:
        self.entries: list[tuple[weakref.ref[Any], DraftState]] = []

    def get(self, metadata: Any) -> DraftState | None:
        for ref, state in self.entries:
            if ref() is metadata:
                return state
        return None

    def put(self, metadata: Any, state: DraftState) -> None:
        self.entries = [(r, s) for r, s in self.entries if r() is not None][-15:]
        self.entries.append((weakref.ref(metadata), state))


def _hook_update(decision: Decision) -> Callable[..., None]:
    cls, entry = decision.cls, decision.entry
    assert cls is not None
    original: Callable[..., None] = getattr(cls, "update_draft_decode_metadata")  # noqa: B009

    def update_draft_decode_metadata(self: Any, metadata: Any) -> None:
        spec: DraftSpec[Any] | None = self.__dict__.get("_draftmeta_spec")
        if spec is None or not _exactly(self, cls):  # not bound (a subclass, a spec refused)
            original(self, metadata)
            return
        if getattr(metadata, "num_decode_tokens", 1) == 0:
            return
        cache: _StateCache = self._draftmeta_states
        state = cache.get(metadata)
        if state is None:
            uncovered = spec.uncovered(metadata)
            if uncovered:  # the runner already chose in-place updates: stop loudly
                raise UpdateError(
                    spec.name, uncovered[0].split(" ")[0],
                    f"the metadata {entry.name} built carries {uncovered[0]}, which the spec "
                    f"has no rule for, so an in-place update would leave it stale; set "
                    f"{DISABLE_ENV}=0 to let vLLM rebuild, and report the vLLM version",
                )
            state = entry.hook_state(self, metadata)
            cache.put(metadata, state)
        spec.update(metadata, state)

    update_draft_decode_metadata.__qualname__ = f"{cls.__qualname__}.update_draft_decode_metadata"
    update_draft_decode_metadata.__doc__ = (
        "draftmeta's generated full refresh of the metadata from the buffers it views."
    )
    return update_draft_decode_metadata
