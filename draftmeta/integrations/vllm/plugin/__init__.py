"""The vLLM general plugin: draftmeta's generated updates inside vLLM's draft loops.

Installed with draftmeta, the entry point ``draftmeta`` in group ``vllm.general_plugins`` makes
vLLM call :func:`register` once per process (in every process of a multiprocess engine), before
any metadata builder exists. It reads the installed release's catalogue
(:mod:`~draftmeta.integrations.vllm.catalogue`: one module per supported release) and installs
the plan :func:`~draftmeta.integrations.vllm.plugin.plan.make_plan` makes, **per builder**:

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
  :mod:`~draftmeta.integrations.vllm.plugin.carry_over`), the last loop's object is carried over and
  refreshed in place instead of built; a new batch shape builds. The first time a builder's
  metadata is seen, the spec must cover every attribute of the built object (subclass fields,
  attributes set after construction); otherwise that builder keeps rebuilding, with one log
  line naming the attribute. Anything the spec refuses at run time (a precondition, DCP > 1)
  falls back to the original build for that draft loop.
* **hook** (0.33 on: ``supports_draft_decode_metadata_update`` /
  ``update_draft_decode_metadata``, called inside the new runner's captured draft loop): for
  builders vLLM leaves without the hook, a generated full refresh from the buffers the metadata
  views is installed, **only where the spec is capture-safe**; after the builder's own
  ``__init__``, where the spec's conditions hold, the spec is bound to the builder
  (:func:`~draftmeta.integrations.vllm.plugin.hook.bind`): the builder then satisfies
  :class:`~draftmeta.protocol.SupportsDraftUpdate`, :func:`~draftmeta.protocol.spec_of`
  returns the spec, and the flag is set from that same fact. Builders vLLM covers itself are
  left alone unless ``DRAFTMETA_VLLM_OVERRIDE_UPSTREAM=1``.

Each draft path is declared once, in its module of
:mod:`~draftmeta.integrations.vllm.plugin.paths`
(:class:`~draftmeta.integrations.vllm.plugin.plan.DraftPathKind`): the plugin installs, per
decision of the plan that installs, what that path's declaration returns (the replacements made
by :mod:`~draftmeta.integrations.vllm.plugin.older_proposer` and
:mod:`~draftmeta.integrations.vllm.plugin.hook`). :class:`Plugin` keeps one :class:`BuilderPatch`
per builder class and path it patched, with its counters (:func:`stats`).

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

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from draftmeta.integrations.patching import Patches
from draftmeta.integrations.vllm.catalogue import DraftPath
from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory
from draftmeta.integrations.vllm.plugin.log import LOGGER_NAME, announce, summary
from draftmeta.integrations.vllm.plugin.log import reset as reset_log
from draftmeta.integrations.vllm.plugin.older_proposer import BuilderStats
from draftmeta.integrations.vllm.plugin.plan import (
    DISABLE_ENV,
    FORCE_ENV,
    OVERRIDE_ENV,
    Decision,
    DraftPathKind,
    Plan,
    Unsupported,
    make_plan,
)

__all__ = [
    "DISABLE_ENV",
    "FORCE_ENV",
    "OVERRIDE_ENV",
    "BuilderPatch",
    "BuilderStats",
    "Installed",
    "Plugin",
    "enabled_by_environment",
    "fallback_reasons",
    "installed",
    "register",
    "reset_stats",
    "stats",
    "unregister",
]

logger = logging.getLogger(LOGGER_NAME)
"""The plugin's logger, ``vllm.draftmeta``: its lines appear in vLLM's log, in vLLM's format
(:mod:`~draftmeta.integrations.vllm.plugin.log`)."""


@attrs.frozen
class Installed:
    """What :func:`register` did.

    Attributes:
        vllm_version: the installed ``vllm.__version__``.
        release: the catalogue used (``"0.34"``).
        patched: ``{path name: builders}``: per draft path of the release, in its order, the
            builders the plugin patched on it (on the hook path, those whose vLLM hook is
            declared only without DCP too: for their instances with DCP > 1).
        skipped: ``{"NAME (path)": reason}`` for builders left alone.
        plan: the full plan (every decision with its reason).
    """

    vllm_version: str
    release: str
    patched: Mapping[DraftPath, tuple[str, ...]]
    skipped: dict[str, str]
    plan: Plan

    def on(self, path: DraftPath) -> tuple[str, ...]:
        """The builders patched on the draft path called ``path`` (none where the release has
        no such path)."""
        return tuple(self.patched.get(path, ()))

    @property
    def older_proposer(self) -> tuple[str, ...]:
        """The builders updated in place on the older proposer path (``on("older_proposer")``).
        """
        return self.on("older_proposer")

    @property
    def hook(self) -> tuple[str, ...]:
        """The builders given draftmeta's ``update_draft_decode_metadata`` (``on("hook")``)."""
        return self.on("hook")


@attrs.frozen
class BuilderPatch:
    """One builder class patched for one draft path: what the plugin replaced on it.

    Attributes:
        decision: the plan's decision for the builder and draft path.
        replacements: ``{attribute: replacement}`` set on the builder class.
        stats: the builder's counters (:func:`stats`), shared by its draft paths; only the older
            proposer path counts.
        path: the declared draft path the decision was made on.
    """

    decision: Decision
    replacements: Mapping[str, Callable[..., Any]]
    stats: BuilderStats
    path: DraftPathKind

    @classmethod
    def make(cls, path: DraftPathKind, decision: Decision,
             overrides: Mapping[str, BuilderSpecFactory] | None, counters: BuilderStats
             ) -> BuilderPatch:
        """The replacements ``path`` declares for ``decision`` (its
        :attr:`~draftmeta.integrations.vllm.plugin.plan.DraftPathKind.install`):
        ``build_for_drafting`` on the older proposer path; ``__init__`` and
        ``update_draft_decode_metadata`` on the hook path."""
        return cls(decision, path.install(decision, overrides, counters), counters, path)


@attrs.define
class Plugin:
    """draftmeta's plugin in one process: the patches it made, one record per builder.

    The module's :func:`register`, :func:`unregister`, :func:`installed`, :func:`stats` and
    :func:`reset_stats` act on the process's one instance, under a lock.

    Attributes:
        patches: every class attribute replaced, restored exactly by :meth:`unregister`.
        builders: one patch per builder class and draft path, in the plan's order.
        counters: ``{builder name: its counters}``, one per builder, shared by its patches.
        installed: what :meth:`register` did, or ``None`` while the plugin is not active.
    """

    patches: Patches = attrs.field(factory=Patches)
    builders: list[BuilderPatch] = attrs.field(factory=list)
    counters: dict[str, BuilderStats] = attrs.field(factory=dict)
    installed: Installed | None = None

    def register(self, overrides: Mapping[str, BuilderSpecFactory] | None = None) -> None:
        """Install the plan for the installed vLLM (see :func:`register`)."""
        if self.installed is not None:
            return
        if _disabled():
            announce(logging.INFO, "draftmeta off (%s=0): vLLM's draft loops run unchanged",
                     DISABLE_ENV)
            return
        try:
            version = _installed_version()
            plan = make_plan(version, overrides=overrides)
        except Unsupported as exc:
            announce(logging.WARNING, "draftmeta: vLLM left untouched: %s", exc)
            return
        except Exception as exc:  # vLLM itself failed to import: say so, change nothing
            announce(logging.WARNING, "draftmeta: vLLM left untouched: cannot inspect it (%s)",
                     exc)
            return
        skipped: dict[str, str] = {}
        for decision in plan.decisions:
            if not decision.installs:
                skipped[f"{decision.entry.name} ({decision.path})"] = decision.reason
                continue
            assert decision.cls is not None
            counters = self.counters.setdefault(decision.entry.name, BuilderStats())
            patch = BuilderPatch.make(plan.path_of(decision), decision, overrides, counters)
            for attribute, replacement in patch.replacements.items():
                self.patches.replace(decision.cls, attribute, replacement)
            self.builders.append(patch)
        patched = {path.name: tuple(p.decision.entry.name for p in self.builders
                                    if p.path is path) for path in plan.paths}
        self.installed = Installed(version, plan.release.version, patched, skipped, plan)
        announce(logging.INFO, "%s", summary(plan))

    def unregister(self) -> None:
        """Restore every patched attribute, in reverse order, and forget the builders."""
        self.patches.restore()
        self.builders.clear()
        self.counters.clear()
        self.installed = None
        reset_log()

    def stats(self) -> dict[str, dict[str, int]]:
        """``{builder name: {"in_place": n, "rebuilt": n, "carried_over": n}}``."""
        return {name: c.counts() for name, c in sorted(self.counters.items())}

    def fallback_reasons(self) -> dict[str, str]:
        """``{builder name: why an instance last fell back to vLLM's build}`` (see
        :func:`fallback_reasons`)."""
        return {name: c.reason for name, c in sorted(self.counters.items())
                if c.reason is not None}

    def reset_stats(self) -> None:
        """Zero the counters of :meth:`stats`."""
        for c in self.counters.values():
            c.reset()


_lock = threading.Lock()
_plugin = Plugin()


def installed() -> Installed | None:
    """What the plugin installed in this process, or ``None`` if it is not active."""
    return _plugin.installed


def stats() -> dict[str, dict[str, int]]:
    """``{builder name: {"in_place": n, "rebuilt": n, "carried_over": n}}`` since
    :func:`register` or :func:`reset_stats`."""
    return _plugin.stats()


def fallback_reasons() -> dict[str, str]:
    """``{builder name: why an instance last fell back to vLLM's build}`` on the older
    proposer path since :func:`register`, in the words of its
    :class:`~draftmeta.step_policy.StepPolicy` (the words :class:`~draftmeta.loop.DraftLoop`
    records for the same failure); builders that never fell back are not listed."""
    return _plugin.fallback_reasons()


def reset_stats() -> None:
    """Zero the counters of :func:`stats`."""
    _plugin.reset_stats()


def register(*, spec_overrides: Mapping[str, BuilderSpecFactory] | None = None) -> None:
    """The plugin's entry point: idempotent, per-builder, fails closed, logs one line in
    vLLM's log (on with what it covers, off, or left untouched with the reason).

    Args:
        spec_overrides: spec factories replacing the catalogue's, by builder name
            (``{"CPU_MLA": factory}``), each called as the catalogue's
            (:class:`~draftmeta.integrations.vllm.catalogue.model.BuilderSpecFactory`): for
            tests that must show a wrong spec is caught; vLLM calls it without.
    """
    with _lock:
        _plugin.register(spec_overrides)


def unregister() -> None:
    """Restore every attribute the plugin patched, in reverse order, and forget its state."""
    with _lock:
        _plugin.unregister()


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "off", "false", "no")


def enabled_by_environment() -> bool:
    """Whether ``DRAFTMETA_VLLM_PLUGIN`` leaves the plugin on (it is, unless set to ``0``,
    ``off``, ``false`` or ``no``)."""
    return not _disabled()


def _installed_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))
