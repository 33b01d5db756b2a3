"""What draftmeta would do for each builder of the installed vLLM, decided without patching.

:func:`make_plan` reads the installed release's catalogue, imports each builder class, declares
its specs and decides, per draft path, who covers it: ``draftmeta`` (the plugin installs its
generated update), ``vllm`` (vLLM's own hook) or ``none`` (rebuilt every draft step), with the
reason. The plugin installs exactly this plan; ``draftmeta coverage`` prints it.

A draft path is one declared object, a :class:`DraftPathKind`, in a module of its own under
:mod:`~draftmeta.integrations.vllm.plugin.paths` (found there by file name:
:func:`draft_paths`); the release's catalogue names the paths its vLLM has. The plan, the
plugin, its log line, ``draftmeta coverage`` and ``draftmeta audit`` ask the path's declaration
(what vLLM must have for it, how it decides, what it installs, what coverage says of it), never
its name: the name is only the key a catalogue, a decision and a report row write.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from draftmeta.advance import HostBound
from draftmeta.errors import SpecError
from draftmeta.integrations.vllm.catalogue import (
    BuilderEntry,
    DraftPath,
    Release,
    release,
    supported_range,
    with_registered,
)
from draftmeta.integrations.vllm.catalogue.classes import import_class
from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory
from draftmeta.integrations.vllm.plugin import paths as path_modules
from draftmeta.integrations.vllm.plugin.carry_over import enabled as carry_over_enabled
from draftmeta.spec import DraftSpec
from draftmeta.step_policy import StepRecord

__all__ = [
    "DISABLE_ENV",
    "FORCE_ENV",
    "OVERRIDE_ENV",
    "UNPROVEN_ENV",
    "CoveredBy",
    "Decide",
    "Decision",
    "DraftPathKind",
    "Install",
    "Plan",
    "draft_path",
    "draft_paths",
    "make_plan",
]

DISABLE_ENV = "DRAFTMETA_VLLM_PLUGIN"
"""Set to ``0`` (or ``off``, ``false``, ``no``) to turn the plugin off."""

OVERRIDE_ENV = "DRAFTMETA_VLLM_OVERRIDE_UPSTREAM"
"""Set to ``1`` to install draftmeta's hook also on builders vLLM covers itself."""

FORCE_ENV = "DRAFTMETA_VLLM_FORCE"
"""Set to ``1`` to install draftmeta's update also where it measured slower than vLLM's own
path inside a real engine (:attr:`~draftmeta.integrations.vllm.catalogue.BuilderEntry.measured`):
by default such a builder is left to vLLM on that path."""

UNPROVEN_ENV = "DRAFTMETA_VLLM_UNPROVEN"
"""Set to ``1`` to install draftmeta's update also on builders where it is declared but not yet
proven against the release's real builder
(:meth:`~draftmeta.integrations.vllm.catalogue.BuilderEntry.proof_on` is ``None``): by default
such a builder is left to vLLM."""

CoveredBy = Literal["draftmeta", "vllm", "none"]
"""Who updates a builder's metadata between draft steps: draftmeta's generated update, vLLM's own
hook, or nobody (rebuilt every step)."""


@attrs.frozen
class Decision:
    """Who covers one builder on one draft path, and why.

    Attributes:
        entry: the catalogue entry.
        path: the name of the draft path it was made on (its declaration:
            :meth:`Plan.path_of`).
        covered_by: ``draftmeta``, ``vllm`` or ``none``.
        reason: one line saying why.
        cls: the imported builder class (``None`` where it cannot be imported here).
        dcp_only: covered by vLLM's own hook where DCP is off, and by draftmeta's under
            DCP > 1, where vLLM declares none
            (:attr:`~draftmeta.integrations.vllm.catalogue.BuilderEntry.upstream_hook_without_dcp`).
    """

    entry: BuilderEntry
    path: DraftPath
    covered_by: CoveredBy
    reason: str
    cls: type | None = None
    dcp_only: bool = False

    @property
    def installs(self) -> bool:
        """Whether the plugin patches the builder on this path."""
        return self.covered_by == "draftmeta" or self.dcp_only


Decide = Callable[[BuilderEntry, str, type | None, str, Mapping[str, BuilderSpecFactory] | None],
                  Decision]
"""How a draft path decides who covers one builder on it (:attr:`DraftPathKind.decide`): called
with the catalogue entry, the catalogue's release (``"0.33"``), the imported builder class
(``None`` where it does not import here), why it does not import (``""`` where it does) and the
spec overrides (a :class:`~draftmeta.integrations.vllm.catalogue.BuilderSpecFactory` by builder
name, replacing the catalogue's, or ``None``); returns the
:class:`Decision`, whose :attr:`~Decision.path` is the path's name."""

Install = Callable[[Decision, Mapping[str, BuilderSpecFactory] | None, StepRecord],
                   Mapping[str, Callable[..., Any]]]
"""What the plugin sets on a builder class a draft path covers (:attr:`DraftPathKind.install`):
called with the decision (its :attr:`~Decision.installs` true, its class imported), the spec
overrides and the builder's counters (the plugin's ``BuilderStats``, one per builder name,
shared by its paths); returns ``{attribute: replacement}``, set on the class in that order and
restored exactly, in reverse, when the plugin unregisters."""


@attrs.frozen
class DraftPathKind:
    """One of vLLM's draft loops, as draftmeta serves it: declared once, as ``PATH`` in the module
    of :mod:`~draftmeta.integrations.vllm.plugin.paths` named after it, and read by the plan,
    the plugin, its log line, ``draftmeta coverage`` and ``draftmeta audit`` instead of its name.

    Everything here is read when the plan is made or installed, never at a draft step: what
    runs per step is what :attr:`install` returns.

    Attributes:
        name: its key, and its module's name: what a release's
            :attr:`~draftmeta.integrations.vllm.catalogue.Release.paths`, a
            :class:`~draftmeta.integrations.vllm.catalogue.Measured`, a :class:`Decision` and
            ``draftmeta coverage``'s rows name it by (``hook``).
        words: how the plugin's log line names it (``older proposer``).
        needs: the attributes of vLLM's ``AttentionMetadataBuilder`` it calls or replaces:
            :func:`make_plan` refuses a vLLM whose builder API lacks one.
        decide: who covers one builder on it, and why (:data:`Decide`).
        install: the replacements the plugin sets on a builder class it covers there
            (:data:`Install`); the plugin restores them exactly when it unregisters.
        without_plugin: who covers a builder on it while the plugin is inactive: ``vllm`` (its
            own update) or ``none`` (rebuilt every step); ``draftmeta coverage`` says so then.
        engines: which engines its rows covered by draftmeta apply to, where the plugin decides
            per builder instance what the class-level plan cannot see (``draftmeta coverage``'s
            text, and ``<name>_engines`` in its JSON).
        captured: vLLM runs its updates inside its captured draft loop: a builder nobody
            covers there keeps the loop out of one captured graph (``draftmeta coverage``'s
            ``blocking_full_capture``).
        audited: vLLM calls the builders' ``update_draft_decode_metadata`` on it: the hooks
            ``draftmeta audit`` drives.
    """

    name: str
    words: str
    needs: tuple[str, ...]
    decide: Decide
    install: Install
    without_plugin: Callable[[BuilderEntry], CoveredBy]
    engines: str
    captured: bool = False
    audited: bool = False


@attrs.frozen
class Plan:
    """The decisions for one vLLM installation.

    Attributes:
        version: the installed ``vllm.__version__``.
        release: its catalogue.
        decisions: one per builder and draft path of the release.
        paths: the release's draft paths, declared (:class:`DraftPathKind`), in its order.
    """

    version: str
    release: Release
    decisions: tuple[Decision, ...]
    paths: tuple[DraftPathKind, ...]

    def on(self, path: DraftPath | DraftPathKind) -> tuple[Decision, ...]:
        """The decisions of one draft path (the path, or its name)."""
        name = path if isinstance(path, str) else path.name
        return tuple(d for d in self.decisions if d.path == name)

    def path_of(self, decision: Decision) -> DraftPathKind:
        """The declared draft path ``decision`` was made on.

        Raises:
            LookupError: no path of this plan has the decision's path name.
        """
        for path in self.paths:
            if path.name == decision.path:
                return path
        raise LookupError(f"the plan for vLLM {self.version} has no draft path "
                          f"{decision.path!r}")


class Unsupported(Exception):
    """The installed vLLM cannot be planned for at all (the message says why)."""


_ON = frozenset(("1", "true", "yes", "on"))


def _switched_on(env: str) -> bool:
    """Whether the environment variable ``env`` (one of the plan's opt-ins) is on: ``1``,
    ``true``, ``yes`` or ``on``, in any case, spaces around ignored; unset, it is off."""
    return os.environ.get(env, "0").strip().lower() in _ON


def _not_yet_proven(entry: BuilderEntry, release: str, path: DraftPath, cls: type | None,
                    fallback: CoveredBy) -> Decision | None:
    """The decision to leave ``entry`` to vLLM on ``path`` where nothing has run draftmeta's
    update against ``release``'s real builder (:meth:`BuilderEntry.proof_on`) and
    :data:`UNPROVEN_ENV` does not opt in."""
    if entry.proof_on(release) is not None or _switched_on(UNPROVEN_ENV):
        return None
    return Decision(entry, path, fallback,
                    f"declared, not yet proven: its spec matches the installed classes' fields, "
                    f"but no recorded run has checked it against vLLM {release}'s builder; left "
                    f"to vLLM; {UNPROVEN_ENV}=1 installs it",
                    cls)


def _measured_slower(entry: BuilderEntry, path: DraftPath, cls: type | None,
                     fallback: CoveredBy) -> Decision | None:
    """The decision to leave ``entry`` to vLLM on ``path``, where its in-place path measured
    slower than vLLM's inside a real engine and :data:`FORCE_ENV` does not force it."""
    slower = entry.slower_on(path)
    if slower is None or _switched_on(FORCE_ENV):
        return None
    return Decision(entry, path, fallback,
                    f"left to vLLM: draftmeta's in-place path measured slower inside the "
                    f"engine ({slower.figure}); {FORCE_ENV}=1 installs it anyway", cls)


def _import_class(entry: BuilderEntry) -> tuple[type | None, str]:
    """The builder class, or ``None`` with why it does not import on this machine."""
    try:
        return import_class(entry.builder), ""
    except Exception as exc:  # any failure to import means "not on this machine", said in the plan
        said = (str(exc).splitlines() or [""])[0].split(". ")[0]  # its first sentence
        if len(said) > 100:  # cut between words, never inside a path
            said = said[:97].rsplit(" ", 1)[0] + " ..."
        return None, f"{type(exc).__name__}: {said}"


def spec_for(
    entry: BuilderEntry,
    overrides: Mapping[str, BuilderSpecFactory] | None,
    *,
    host_bound: HostBound,
    dcp: bool = False,
    builder: Any = None,
) -> DraftSpec[Any]:
    """The spec the plugin uses for ``entry``: an override where one is given, else the
    catalogue's."""
    factory = (overrides or {}).get(entry.name, entry.spec)
    return factory(name=entry.name, host_bound=host_bound, dcp=dcp, builder=builder)


def _older_proposer(entry: BuilderEntry, release: str, cls: type | None, why: str,
                    overrides: Mapping[str, BuilderSpecFactory] | None) -> Decision:
    if cls is None:
        return Decision(entry, "older_proposer", "none",
                        f"{entry.builder.qualname} does not import here ({why}): rebuilt")
    try:
        spec = spec_for(entry, overrides, host_bound="advance")
    except SpecError as exc:
        return Decision(entry, "older_proposer", "none",
                        f"draftmeta's spec does not fit this vLLM: {exc}", cls)
    if not spec.supported:
        reasons = "; ".join(r for _, r in spec.unsupported_reasons)
        return Decision(entry, "older_proposer", "none", f"rebuilt: {reasons}", cls)
    unproven = _not_yet_proven(entry, release, "older_proposer", cls, "none")
    if unproven is not None:
        return unproven
    slower = _measured_slower(entry, "older_proposer", cls, "none")
    if slower is not None:
        return slower
    carries = entry.carry_over is not None and carry_over_enabled()
    where = ("in place at every draft index; index 1 carried over between loops of one batch "
             "shape" if carries else "in place after draft index 1")
    return Decision(entry, "older_proposer", "draftmeta",
                    f"{where} (spec {spec.name}){_measured_faster(entry, 'older_proposer')}", cls)


def _hook(entry: BuilderEntry, release: str, cls: type | None, why: str,
          overrides: Mapping[str, BuilderSpecFactory] | None) -> Decision:
    upstream = entry.hook
    vllms: CoveredBy = "vllm" if upstream != "none" else "none"  # who covers it without us
    if upstream != "none" and not _switched_on(OVERRIDE_ENV):
        if entry.upstream_hook_without_dcp and cls is not None:
            return _hook_under_dcp(entry, cls, overrides)
        return Decision(entry, "hook", "vllm", f"vLLM's own hook ({upstream})", cls)
    if cls is None:
        return Decision(entry, "hook", vllms,
                        f"{entry.builder.qualname} does not import here ({why})", cls)
    if entry.hook_declined is not None:
        return Decision(entry, "hook", vllms, entry.hook_declined, cls)
    try:
        spec = spec_for(entry, overrides, host_bound="frozen")
    except SpecError as exc:
        return Decision(entry, "hook", "none", f"draftmeta's spec does not fit: {exc}", cls)
    refused = _why_no_hook(spec)
    if refused is not None:
        return Decision(entry, "hook", "none", f"no hook: {refused}", cls)
    unproven = _not_yet_proven(entry, release, "hook", cls, vllms)
    if unproven is not None:
        return unproven
    slower = _measured_slower(entry, "hook", cls, vllms)
    if slower is not None:
        return slower
    also = _measured_faster(entry, "hook")
    return Decision(entry, "hook", "draftmeta",
                    f"draftmeta's generated hook (spec {spec.name}){also}", cls)


def _measured_faster(entry: BuilderEntry, path: DraftPath) -> str:
    """``"; measured inside the engine: <figure>"`` where ``entry``'s in-place path on ``path``
    measured no slower than vLLM's own inside a real engine, else ``""``."""
    measured = [m.figure for m in entry.measured if m.path == path and not m.slower]
    return f"; measured inside the engine: {measured[0]}" if measured else ""


def _why_no_hook(spec: DraftSpec[Any]) -> str | None:
    """Why ``spec`` cannot serve as a hook inside vLLM's captured draft loop, or ``None``."""
    if not spec.supported:
        return "; ".join(r for _, r in spec.unsupported_reasons)
    unsafe = spec.capture_unsafe_reason
    return None if unsafe is None else f"not capture-safe: {unsafe}"


def _hook_under_dcp(entry: BuilderEntry, cls: type,
                    overrides: Mapping[str, BuilderSpecFactory] | None) -> Decision:
    """vLLM's own hook where DCP is off; draftmeta's under DCP > 1 where its DCP spec fits and
    is capture-safe."""
    own = f"vLLM's own hook ({entry.hook}) where DCP is off"
    try:
        spec = spec_for(entry, overrides, host_bound="frozen", dcp=True)
    except SpecError as exc:
        return Decision(entry, "hook", "vllm", f"{own}; none under DCP > 1: draftmeta's DCP "
                        f"spec does not fit: {exc}", cls)
    refused = _why_no_hook(spec)
    if refused is not None:
        return Decision(entry, "hook", "vllm", f"{own}; none under DCP > 1: {refused}", cls)
    return Decision(entry, "hook", "vllm", f"{own}; under DCP > 1, where vLLM declares none, "
                    f"draftmeta's generated hook (spec {spec.name})", cls, dcp_only=True)


def make_plan(
    version: str, *, overrides: Mapping[str, BuilderSpecFactory] | None = None
) -> Plan:
    """Decide, for vLLM ``version`` as installed in this process, who covers each builder.

    Raises:
        Unsupported: no catalogue for ``version``, the catalogue names a draft path no module
            of :mod:`~draftmeta.integrations.vllm.plugin.paths` declares, or vLLM's builder
            API lacks what the release's draft paths need.
    """
    try:
        catalogue = with_registered(release(version))
    except LookupError as exc:
        raise Unsupported(
            f"vLLM {version} is not a supported release ({supported_range()})"
        ) from exc
    try:
        paths = tuple(draft_path(name) for name in catalogue.paths)
    except LookupError as exc:
        raise Unsupported(f"the {catalogue.version} catalogue names {exc}") from exc
    try:
        from vllm.v1.attention.backend import AttentionMetadataBuilder
    except Exception as exc:
        raise Unsupported(f"cannot import vLLM's attention backend API ({exc})") from exc
    for path in paths:
        for name in path.needs:
            if not hasattr(AttentionMetadataBuilder, name):
                raise Unsupported(
                    f"vLLM {version}'s AttentionMetadataBuilder has no {name}, which the "
                    f"{path.name} path of the {catalogue.version} catalogue relies on"
                )
    decisions = []
    for entry in catalogue.builders:
        cls, why = _import_class(entry)
        for path in paths:
            decisions.append(path.decide(entry, catalogue.version, cls, why, overrides))
    return Plan(version, catalogue, tuple(decisions), paths)


@functools.cache
def draft_paths() -> tuple[DraftPathKind, ...]:
    """Every declared draft path, by name: one per module of
    :mod:`~draftmeta.integrations.vllm.plugin.paths` (``hook.py`` declares ``hook`` as its
    ``PATH``), found by file name as the catalogue finds its release modules (cached; a test
    that adds a module at run time clears it with ``draft_paths.cache_clear()``).

    Raises:
        RuntimeError: a module there declares no :class:`DraftPathKind` as ``PATH``, or one
            named otherwise than its file.
    """
    names = sorted({module.stem for folder in path_modules.__path__
                    for module in Path(folder).glob("*.py") if not module.stem.startswith("_")})
    found = []
    for name in names:
        module = importlib.import_module(f"{path_modules.__name__}.{name}")
        declared = getattr(module, "PATH", None)
        if not isinstance(declared, DraftPathKind):
            raise RuntimeError(f"{module.__name__} declares no draft path: a module of "
                               f"{path_modules.__name__} declares its path as PATH, a "
                               "DraftPathKind")
        if declared.name != name:
            raise RuntimeError(f"{module.__name__} declares the draft path {declared.name!r}: "
                               "a path module is named after its path")
        found.append(declared)
    return tuple(found)


def draft_path(name: DraftPath) -> DraftPathKind:
    """The declared draft path called ``name`` (a release's
    :attr:`~draftmeta.integrations.vllm.catalogue.Release.paths` entry).

    Raises:
        LookupError: no module of :mod:`~draftmeta.integrations.vllm.plugin.paths` declares
            it; the message lists those that do.
    """
    declared = draft_paths()
    for path in declared:
        if path.name == name:
            return path
    raise LookupError(f"draft path {name!r}, which no module of {path_modules.__name__} "
                      f"declares (declared: {', '.join(p.name for p in declared) or 'none'})")
