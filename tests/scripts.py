"""The repository's scripts (``tools/``, ``docs/``, ``benchmarks/``, the noxfile), loaded as
modules for their tests: they are files, not part of an installed package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str, name: str | None = None) -> ModuleType:
    """The script at ``path`` (relative to the repository's root) as a fresh module named
    ``name`` (default: the file's stem). It is in ``sys.modules`` while it runs, as
    dataclasses look their module up there, and not after."""
    name = name or Path(path).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module
