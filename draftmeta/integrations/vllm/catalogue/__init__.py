"""One catalogue per vLLM release: which builders exist, their specs, and who covers them.

Each supported release is one module here (``v0_33.py``: ``RELEASE = Release(...)``, or a
later one stated as its differences: ``v0_33.RELEASE.evolve(...)``). They are found by file name
(:func:`draftmeta.integrations.vllm.release.supported`), so supporting a new vLLM release means
adding one module beside the others; which release is assumed without vLLM, and how an installed
version is read, are :mod:`draftmeta.integrations.vllm.release`'s.

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
    DRAFT_PATHS,
    BuilderEntry,
    DraftPath,
    HarnessRecipe,
    Measured,
    Proof,
    Release,
    Upstream,
    class_ref,
)
from draftmeta.integrations.vllm.release import (
    DEFAULT_RELEASE,
    installed_version,
    module_name,
    supported,
    supported_range,
)
from draftmeta.spec import DraftSpec

__all__ = [
    "DEFAULT_RELEASE",
    "DRAFT_PATHS",
    "BuilderEntry",
    "DraftPath",
    "HarnessRecipe",
    "Measured",
    "Proof",
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
    """The installed release's catalogue, or :data:`DEFAULT_RELEASE`'s without vLLM.

    Raises:
        LookupError: the installed vLLM is not a supported release.
    """
    installed = installed_version()
    return release(installed if installed is not None else DEFAULT_RELEASE)


def builder_spec(
    name: str, *, host_bound: HostBound = "advance", dcp: bool = False, builder: Any = None
) -> DraftSpec[Any]:
    """The spec of builder ``name`` of the installed release (see :func:`current_release`).

    Raises:
        KeyError: no such builder; the message lists the names.
    """
    return current_release().entry(name).make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
