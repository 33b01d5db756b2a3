"""``draftmeta explain``'s texts for the default vLLM release, shipped with the package.

``draftmeta explain NAME`` prints the generated source of a shipped spec. Generating it needs
the core, and the core needs torch, whose import alone takes seconds; so the texts for
:data:`RELEASE` (the release README's set-up installs, and the one used where vLLM is not
installed) are checked in here and printed as they are. ``tests/test_golden.py`` regenerates
every one of them and fails on any difference (``python -m tests.golden.regenerate`` rewrites
them), so a shipped text is always what the generator makes. For another installed release, or
another host bound, ``explain`` generates the text.

This module imports nothing heavy: from draftmeta only
:mod:`draftmeta.integrations.vllm.versions`, which owns the default release and reads the
installed one.
"""

from __future__ import annotations

from pathlib import Path

from draftmeta.integrations.vllm.versions import DEFAULT_RELEASE, release_in_use

__all__ = ["FOLDER", "RELEASE", "names", "release_in_use", "shipped"]

RELEASE = DEFAULT_RELEASE
"""The vLLM release whose catalogue the shipped texts describe: the default release
(:data:`draftmeta.integrations.vllm.versions.DEFAULT_RELEASE`)."""

FOLDER = Path(__file__).parent / f"vllm-{RELEASE}"
"""Where the shipped texts are: one ``NAME.txt`` per spec name."""


def names() -> list[str] | None:
    """Every shipped spec name, sorted, or ``None`` where the release in use is another."""
    if release_in_use() != RELEASE:
        return None
    return sorted(path.name[: -len(".txt")] for path in FOLDER.glob("*.txt"))


def shipped(name: str) -> str | None:
    """The ``explain`` text of spec ``name``, or ``None`` where it is not shipped for the
    release in use (then the caller generates it)."""
    known = names()
    if known is None or name not in known:
        return None
    return (FOLDER / f"{name}.txt").read_text(encoding="utf-8")
