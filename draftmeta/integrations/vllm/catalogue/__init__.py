"""One catalogue per vLLM release: which builders exist, their specs, and who covers them.

Each supported release is one module here (``v0_33.py``: ``RELEASE = Release(...)``, or a
later one stated as its differences: ``v0_33.RELEASE.evolve(...)``). They are found by file name
(:func:`draftmeta.integrations.vllm.versions.supported`), so supporting a new vLLM release
means
adding one module beside the others; which release is assumed without vLLM, and how an installed
version is read, are :mod:`draftmeta.integrations.vllm.versions`'s.

>>> from draftmeta.integrations.vllm.catalogue import release
>>> release("0.34").paths
('hook',)
>>> release("0.33").entry("TRITON_MLA").hook
'no-op'
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from draftmeta.advance import HostBound
from draftmeta.integrations.vllm.catalogue.model import (
    BuilderEntry,
    DraftPath,
    HarnessRecipe,
    Install,
    Measured,
    Proof,
    RecordedRun,
    Release,
    Upstream,
    class_ref,
    recorded_audits,
)
from draftmeta.integrations.vllm.versions import (
    DEFAULT_RELEASE,
    installed_version,
    module_name,
    supported,
    supported_range,
)
from draftmeta.spec import DraftSpec

__all__ = [
    "DEFAULT_RELEASE",
    "ENTRY_POINT_GROUP",
    "BuilderEntry",
    "DraftPath",
    "HarnessRecipe",
    "Install",
    "Measured",
    "Proof",
    "builder_spec",
    "RecordedRun",
    "Release",
    "Upstream",
    "class_ref",
    "current_release",
    "installed_version",
    "recorded_audits",
    "register_builder",
    "registered_builders",
    "release",
    "releases",
    "supported_range",
    "unregister_builder",
    "with_registered",
]


@functools.cache
def releases() -> tuple[Release, ...]:
    """Every release with a catalogue module here, oldest first (cached; a test that adds a
    module at run time clears it with ``releases.cache_clear()``).

    Raises:
        RuntimeError: there is no release module, or one declares another release than its
            file name says (``v0_35.py`` must declare ``version="0.35"``).
    """
    found = []
    for version in supported():
        module = importlib.import_module(f"{__name__}.{module_name(version)}")
        declared: Release = module.RELEASE
        if declared.version != version:
            raise RuntimeError(f"{module.__name__} declares vLLM {declared.version}, not "
                               f"{version}: a release module is named after its release")
        found.append(declared)
    if not found:
        raise RuntimeError("draftmeta's vLLM catalogue has no release modules (v0_33.py, ...)")
    return tuple(found)


def release(version: str) -> Release:
    """The catalogue of the release ``version`` belongs to (``"0.34.0"`` or ``"0.34"``).

    Raises:
        LookupError: no catalogue for it; the message lists the supported releases.
    """
    for r in releases():
        if r.matches(version):
            return r
    raise LookupError(
        f"vLLM {version} is not a supported release (draftmeta supports "
        f"{', '.join(supported())}); upgrade draftmeta or install one of those"
    )


def current_release() -> Release:
    """The installed release's catalogue, or :data:`DEFAULT_RELEASE`'s without vLLM, with the
    out-of-tree builders registered in this process (:func:`with_registered`).

    Raises:
        LookupError: the installed vLLM is not a supported release.
        RuntimeError: an out-of-tree registration does not load or clashes with a name.
    """
    installed = installed_version()
    return with_registered(release(installed if installed is not None else DEFAULT_RELEASE))


ENTRY_POINT_GROUP = "draftmeta.vllm_builders"
"""The entry-point group through which a package declares specs for its own vLLM metadata
builders: each entry point names a :class:`BuilderEntry`, or a function returning one or an
iterable of them. The plugin, ``coverage``, ``audit``, the harness and the equivalence checks
then treat each as they treat the catalogue's builders."""

_registered: dict[str, BuilderEntry] = {}


def register_builder(entry: BuilderEntry) -> None:
    """Declare the spec of an out-of-tree builder in this process (what an entry point of
    :data:`ENTRY_POINT_GROUP` does for every process): from then on it is a builder of the
    installed release's catalogue, covered by the plugin where its spec fits and a recorded run
    proves it on that release (:attr:`BuilderEntry.proven_by`, from :func:`recorded_audits`;
    the guide's "Proving your builder" says how to make one). Register before vLLM loads its
    plugins.

    Raises:
        ValueError: another entry is registered under ``entry.name``.
    """
    held = _registered.get(entry.name)
    if held is not None and held != entry:
        raise ValueError(f"a different builder is already registered as {entry.name!r}; "
                         "give yours another name (or unregister_builder it first)")
    _registered[entry.name] = entry


def unregister_builder(name: str) -> None:
    """Forget the builder :func:`register_builder` registered as ``name`` (if any)."""
    _registered.pop(name, None)


@functools.cache
def _entry_point_builders() -> tuple[BuilderEntry, ...]:
    from importlib.metadata import entry_points

    found: list[BuilderEntry] = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            declared: Any = point.load()
            if callable(declared) and not isinstance(declared, BuilderEntry):
                declared = declared()
            entries = [declared] if isinstance(declared, BuilderEntry) else list(declared)
        except Exception as exc:  # said with the entry point's name: the package to fix
            raise RuntimeError(f"the {ENTRY_POINT_GROUP} entry point {point.name!r} "
                               f"({point.value}) does not load: {exc}") from exc
        wrong = [e for e in entries if not isinstance(e, BuilderEntry)]
        if wrong:
            raise RuntimeError(f"the {ENTRY_POINT_GROUP} entry point {point.name!r} "
                               f"({point.value}) gave {wrong[0]!r}, not a BuilderEntry")
        found.extend(entries)
    return tuple(found)


def registered_builders() -> tuple[BuilderEntry, ...]:
    """The out-of-tree builders: those of :data:`ENTRY_POINT_GROUP`'s entry points (loaded once
    per process), then those :func:`register_builder` added.

    Raises:
        RuntimeError: an entry point does not load or gives something else than entries.
    """
    return (*_entry_point_builders(), *_registered.values())


def with_registered(catalogue: Release) -> Release:
    """``catalogue`` with the out-of-tree builders added after its own.

    Raises:
        RuntimeError: a registered builder takes a name the catalogue already has (or two take
            the same name), or claims :attr:`BuilderEntry.checked_in_ci`, which only the
            catalogue's own builders can (draftmeta's CI runs those, not yours).
    """
    extra = registered_builders()
    if not extra:
        return catalogue
    claiming = [e.name for e in extra if e.checked_in_ci]
    if claiming:
        raise RuntimeError(f"out-of-tree builders registered with checked_in_ci=True: "
                           f"{', '.join(claiming)}; draftmeta's CI checks only the catalogue's "
                           "own builders: drop it and prove yours with a recorded run "
                           "(proven_by=recorded_audits(...), docs/guide.md)")
    names = [e.name for e in extra]
    taken = sorted({n for n in names if n in catalogue.names or names.count(n) > 1})
    if taken:
        raise RuntimeError(f"out-of-tree builders registered under names that vLLM "
                           f"{catalogue.version}'s catalogue or another registration already has: "
                           f"{', '.join(taken)}; register them under names of their own")
    return catalogue.evolve(version=catalogue.version, add=extra, install=catalogue.install)


def builder_spec(
    name: str, *, host_bound: HostBound = "advance", dcp: bool = False, builder: Any = None
) -> DraftSpec[Any]:
    """The spec of builder ``name`` of the installed release (see :func:`current_release`).

    Raises:
        KeyError: no such builder; the message lists the names.
    """
    return current_release().entry(name).make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
