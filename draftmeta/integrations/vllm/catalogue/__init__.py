"""One catalogue per vLLM release: which builders exist, their specs, and who covers them.

Each supported release is one module here (``v0_33.py``: ``RELEASE = Release(...)``, or a
later one stated as its differences: ``v0_33.RELEASE.evolve(...)``). They are found by name, so
supporting a new vLLM release means adding one module beside the others and nothing else.

>>> from draftmeta.integrations.vllm.catalogue import release
>>> release("0.34").paths
('hook',)
>>> release("0.33").entry("TRITON_MLA").hook
'no-op'
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

from draftmeta.backends.common import HostBoundPolicy
from draftmeta.backends.vllm_classes import installed_vllm_version as installed_version
from draftmeta.integrations.vllm.catalogue.model import (
    DRAFT_PATHS,
    BuilderEntry,
    DraftPath,
    HarnessRecipe,
    Measured,
    Release,
    Upstream,
    class_ref,
)
from draftmeta.spec import DraftSpec

__all__ = [
    "DEFAULT_RELEASE",
    "DRAFT_PATHS",
    "BuilderEntry",
    "DraftPath",
    "HarnessRecipe",
    "Measured",
    "builder_spec",
    "Release",
    "Upstream",
    "class_ref",
    "current_release",
    "installed_version",
    "release",
    "releases",
    "supported_range",
]

DEFAULT_RELEASE = "0.33"
"""The release assumed where vLLM is not installed (``explain`` on a GPU box without vLLM)."""


@functools.cache
def releases() -> tuple[Release, ...]:
    """Every release with a catalogue module here, oldest first."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("v") and info.name[1:].replace("_", "").isdigit():
            module = importlib.import_module(f"{__name__}.{info.name}")
            found.append(module.RELEASE)
    if not found:
        raise RuntimeError("draftmeta's vLLM catalogue has no release modules (v0_33.py, ...)")
    return tuple(sorted(found, key=lambda r: tuple(int(p) for p in r.version.split("."))))


def supported_range() -> str:
    """The supported releases as text: ``"0.32 to 0.34"``."""
    all_ = releases()
    return all_[0].version if len(all_) == 1 else f"{all_[0].version} to {all_[-1].version}"


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
        f"{', '.join(r.version for r in releases())}); upgrade draftmeta or install one of those"
    )


def current_release() -> Release:
    """The installed release's catalogue, or :data:`DEFAULT_RELEASE`'s without vLLM.

    Raises:
        LookupError: the installed vLLM is not a supported release.
    """
    installed = installed_version()
    return release(installed if installed is not None else DEFAULT_RELEASE)


def builder_spec(
    name: str, *, policy: HostBoundPolicy = "advance", dcp: bool = False, builder: Any = None
) -> DraftSpec[Any]:
    """The spec of builder ``name`` of the installed release (see :func:`current_release`).

    Raises:
        KeyError: no such builder; the message lists the names.
    """
    return current_release().entry(name).make_spec(policy=policy, dcp=dcp, builder=builder)
