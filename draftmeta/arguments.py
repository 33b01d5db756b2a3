"""Argument types shared by the ``draftmeta`` sub-commands: integers in a range, one message.

Each returns a function for ``argparse``'s ``type=``; a value out of range ends the command
with exit 2 and one line naming the option and the allowed range, before the command imports
or runs anything else (so no third-party validation message reaches the user).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

__all__ = ["SEED_LIMIT", "IntegerIn", "folder_problem", "integer_in", "non_negative",
           "positive", "seed"]

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
    """Why ``out`` cannot become a results folder (it, or a folder above it, is a file), or
    ``None``; checked before a run, not after it."""
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                return (f"{option} {out}: {folder} is a file, not a folder; name a folder for "
                        "the results")
            break
    return None


positive = integer_in(1)
"""An integer >= 1."""
non_negative = integer_in(0)
"""An integer >= 0."""
seed = integer_in(0, SEED_LIMIT - 1, what="a seed")
"""A seed from 0 to 2**63 - 1."""
