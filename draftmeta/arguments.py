"""What the ``draftmeta`` sub-commands share: argument types (integers in a range, one
message), the results folder every command writes to, and stdout kept for ``--json``.

Each type returns a function for ``argparse``'s ``type=``; a value out of range ends the
command with exit 2 and one line naming the option and the allowed range, before the command
imports or runs anything else (so no third-party validation message reaches the user).

Results, the same for ``draftmeta bench``, ``draftmeta e2e`` (CPU and ``--device cuda``) and
the scripts under ``benchmarks/``: ``--out FOLDER`` is the folder the results go in (created
if missing; a relative path is relative to the current folder), :data:`DEFAULT_OUT` unless
given. The folder is created and test-written before the run measures anything
(:func:`folder_problem`). Each command writes files of a fixed name there (``bench-cpu.json``,
``e2e-cpu.json``, ...). A run replaces a result already there only when it covers every
configuration that result holds with at least as many measured repeats
(:func:`replace_problem`, checked before the run starts); otherwise it stops with exit 2 and
says what would be lost, and ``--force`` replaces it anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

__all__ = ["DEFAULT_OUT", "FORCE_HELP", "OUT_HELP", "SEED_LIMIT", "Extent", "IntegerIn",
           "folder_problem", "integer_in", "no_plot", "non_negative", "positive",
           "replace_problem", "seed", "stdout_to_stderr"]

DEFAULT_OUT = Path("draftmeta-results")
"""The results folder unless ``--out`` says otherwise: ``draftmeta-results`` in the current
folder, for every command."""

OUT_HELP = ("folder for the results, created if missing (a relative path starts at the current "
            "folder), as for every command")
"""``--out``'s help, the same words for every command."""

FORCE_HELP = ("replace a fuller result already in --out (one with configurations this run "
              "leaves out, or more repeats); without it such a run stops before it starts")
"""``--force``'s help, the same words for every command."""

SEED_LIMIT = 2**63
"""Seeds must be below this (torch's generators take 64-bit signed seeds)."""


@attrs.frozen
class IntegerIn:
    """An ``argparse`` type accepting integers from ``low`` to ``high`` (inclusive; no upper
    bound when ``None``); ``what`` names the value in the message."""

    low: int
    high: int | None = None
    what: str = ""
    __name__ = "integer"  # what argparse calls the type in its messages

    @property
    def allowed(self) -> str:
        """The allowed values, in words."""
        if self.high is None:
            return "a positive integer" if self.low == 1 else f"an integer >= {self.low}"
        if self.high == SEED_LIMIT - 1:
            return f"an integer from {self.low} to 2**63 - 1"
        return f"an integer from {self.low} to {self.high}"

    def __call__(self, text: str) -> int:
        """Parse ``text``, or raise ``ArgumentTypeError`` naming the allowed range."""
        prefix = f"{self.what} must be" if self.what else "must be"
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{prefix} {self.allowed}, got {text!r}") from None
        if value < self.low or (self.high is not None and value > self.high):
            raise argparse.ArgumentTypeError(f"{prefix} {self.allowed}, got {text}")
        return value


def integer_in(low: int, high: int | None = None, *, what: str = "") -> IntegerIn:
    """An ``argparse`` type accepting integers from ``low`` to ``high`` (inclusive; no upper
    bound when ``None``); ``what`` names the value in the message."""
    return IntegerIn(low, high, what)


def folder_problem(option: str, out: Path) -> str | None:
    """Why ``out`` cannot hold a run's results, or ``None``; checked before a run measures
    anything, not after it.

    ``out`` is created (with the folders above it) and test-written: a file is written into it
    and removed. A folder that is a file, or that cannot be created or written (a read-only
    place, no permission, a full disk), is refused in one line that says why and what to do.
    """
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                return (f"{option} {out}: {folder} is a file, not a folder; name a folder for "
                        "the results")
            break
    advice = "name a folder you can write to"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{option} {out}: cannot create that folder ({exc.strerror or exc}); {advice}"
    try:
        with tempfile.NamedTemporaryFile(dir=out, prefix=".draftmeta-write-test-"):
            pass
    except OSError as exc:
        return f"{option} {out}: cannot write into that folder ({exc.strerror or exc}); {advice}"
    return None


def no_plot() -> str | None:
    """Why a run here writes no PNG plot (matplotlib is not installed), with the command that
    adds it; ``None`` where it can plot. Said before the run, in one line."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return ("matplotlib is not installed here, so no plot is written (JSON and Markdown are); "
            "pip install matplotlib adds it")


@attrs.frozen
class Extent:
    """What a result holds: one label per measured configuration, and the measured repeats
    per configuration (the fewest, where they differ)."""

    configurations: frozenset[str]
    repeats: int

    @classmethod
    def of(cls, labels: Iterable[str], repeats: int) -> Extent:
        """The extent of ``labels`` measured ``repeats`` times each."""
        return cls(frozenset(labels), repeats)


def _natural(label: str) -> list[tuple[int, str]]:
    """A sort key that puts ``batch 8`` before ``batch 64``."""
    return [(int(part), "") if part.isdigit() else (0, part)
            for part in re.split(r"(\d+)", label)]


def replace_problem(path: Path, planned: Extent, read: Callable[[Any], Extent]) -> str | None:
    """Why a run that will measure ``planned`` must not replace the result at ``path``, or
    ``None`` (no file there, or the run covers all it holds with as many repeats).

    ``read`` gives the extent of the JSON document at ``path``; a file it cannot read is not
    replaced either (it may be a result of another kind or another version).
    """
    if not path.exists():
        return None
    advice = "name another --out, or pass --force to replace it"
    try:
        existing = read(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        why = f" ({exc})" if type(exc) is ValueError else ""
        return f"{path} holds a result this run cannot compare itself with{why}; {advice}"
    missing = sorted(existing.configurations - planned.configurations, key=_natural)
    lost = []
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        lost.append(f"{len(missing)} configuration{'s' if len(missing) > 1 else ''} this run "
                    f"leaves out ({shown})")
    if planned.repeats < existing.repeats:
        lost.append(f"{existing.repeats} repeats per configuration (this run: "
                    f"{planned.repeats})")
    if not lost:
        return None
    return f"{path} holds a fuller result: {'; '.join(lost)}; {advice}"


positive = integer_in(1)
"""An integer >= 1."""
non_negative = integer_in(0)
"""An integer >= 0."""
seed = integer_in(0, SEED_LIMIT - 1, what="a seed")
"""A seed from 0 to 2**63 - 1."""


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Inside, everything written to file descriptor 1 goes to stderr: third-party log lines
    (vLLM logs to stdout), C++ output and ``print`` alike. A ``--json`` command runs its work
    inside and prints its one JSON document after, so stdout carries that document alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
