"""The supported vLLM releases as the tests see them: derived from the catalogue, never pinned.

A test that needs "a release draftmeta does not support" takes :func:`unsupported_version` (the
release after the newest catalogued one), and :func:`stand_in_release` registers one more
release module at run time, to show that the release-derived checks accept a new release with
nothing else changed.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

from draftmeta.integrations.vllm import catalogue
from draftmeta.integrations.vllm.release import module_name, release_key, supported

__all__ = ["next_release", "stand_in_release", "unsupported_version"]


def next_release() -> str:
    """The release after the newest supported one (``"0.34"`` -> ``"0.35"``)."""
    *major, minor = release_key(supported()[-1])
    return ".".join(str(p) for p in (*major, minor + 1))


def unsupported_version() -> str:
    """An installed version no catalogue module covers: the next release's first patch."""
    return f"{next_release()}.0"


STAND_IN_SOURCE = '''"""A stand-in release for the tests: the newest one, under the next number."""

from draftmeta.integrations.vllm.catalogue import {base}

RELEASE = {base}.RELEASE.evolve(version={version!r})
'''


@contextlib.contextmanager
def stand_in_release(folder: Path) -> Iterator[str]:
    """One more catalogue module, ``v<next>.py`` in ``folder``, on the catalogue's package path
    for the duration (the newest release again, under the next number); yields its release.
    The catalogue's cache is cleared on entry and on exit."""
    version = next_release()
    name = module_name(version)
    base = module_name(supported()[-1])
    (folder / f"{name}.py").write_text(STAND_IN_SOURCE.format(base=base, version=version))
    path = catalogue.__path__
    original = list(path)
    path.append(str(folder))
    importlib.invalidate_caches()
    catalogue.releases.cache_clear()
    try:
        yield version
    finally:
        path[:] = original
        sys.modules.pop(f"{catalogue.__name__}.{name}", None)
        catalogue.releases.cache_clear()
