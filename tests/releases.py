"""The supported vLLM releases as the tests see them: derived from the catalogue, never pinned.

A test that needs "a release draftmeta does not support" takes :func:`unsupported_version` (the
release after the newest catalogued one), and :func:`stand_in_release` registers one more
release module at run time, to show that the release-derived checks accept a new release with
nothing else changed. :func:`page_text` is a docs page as the site shows it (its release texts
generated from the catalogue) and :func:`extras` the package's extras as its build writes them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from draftmeta.integrations.vllm import catalogue
from draftmeta.integrations.vllm.versions import (
    module_name,
    release_key,
    supported,
    vllm_extra,
)
from tests.scripts import load_script

__all__ = ["extras", "next_release", "page_text", "release_pages", "stand_in_release",
           "unsupported_version"]

ROOT = Path(__file__).resolve().parents[1]


def next_release() -> str:
    """The release after the newest supported one (``"0.34"`` -> ``"0.35"``)."""
    *major, minor = release_key(supported()[-1])
    return ".".join(str(p) for p in (*major, minor + 1))


def unsupported_version() -> str:
    """An installed version no catalogue module covers: the next release's first patch."""
    return f"{next_release()}.0"


STAND_IN_SOURCE = '''"""A stand-in release for the tests: the newest one, under the next number."""

from draftmeta.integrations.vllm.catalogue import {base}

RELEASE = {base}.RELEASE.evolve(version={version!r}{paths})
'''


@contextlib.contextmanager
def stand_in_release(folder: Path, paths: tuple[str, ...] | None = None) -> Iterator[str]:
    """One more catalogue module, ``v<next>.py`` in ``folder``, on the catalogue's package path
    for the duration (the newest release again, under the next number, with the draft
    ``paths`` named where given); yields its release. The catalogue's cache is cleared on entry
    and on exit."""
    version = next_release()
    name = module_name(version)
    base = module_name(supported()[-1])
    named = "" if paths is None else f", paths={paths!r}"
    (folder / f"{name}.py").write_text(STAND_IN_SOURCE.format(base=base, version=version,
                                                              paths=named))
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


@functools.cache
def release_pages() -> ModuleType:
    """``docs/release_pages.py``, the site's hook that generates the release texts."""
    return load_script("docs/release_pages.py")


def page_text(path: Path) -> str:
    """A Markdown page as the site shows it: its release markers replaced by the texts
    generated from the catalogue as it is now (a stand-in release included)."""
    expanded: str = release_pages().expand(path.read_text(), path.name)
    return expanded


def extras() -> dict[str, list[str]]:
    """draftmeta's extras as its build writes them (``hatch_build.py``): those of
    ``[tool.hatch.metadata.hooks.custom.extras]`` and ``vllm``, from the catalogue."""
    import pytest

    tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11's tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    written = pyproject["tool"]["hatch"]["metadata"]["hooks"]["custom"]["extras"]
    return {"vllm": [vllm_extra()], **written}
