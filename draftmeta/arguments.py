"""Argument types shared by the ``draftmeta`` sub-commands: integers in a range, one message.

Each returns a function for ``argparse``'s ``type=``; a value out of range ends the command
with exit 2 and one line naming the allowed range.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["SEED_LIMIT", "integer_in", "non_negative", "positive", "seed"]

SEED_LIMIT = 2**63
"""Seeds must be below this (torch's generators take 64-bit signed seeds)."""


def integer_in(low: int, high: int | None = None, *, what: str = "") -> Callable[[str], int]:
    """An ``argparse`` type accepting integers from ``low`` to ``high`` (inclusive; no upper
    bound when ``None``); ``what`` names the value in the message."""
    if high is None:
        allowed = "a positive integer" if low == 1 else f"an integer >= {low}"
    elif high == SEED_LIMIT - 1:
        allowed = f"an integer from {low} to 2**63 - 1"
    else:
        allowed = f"an integer from {low} to {high}"
    prefix = f"{what} must be" if what else "must be"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{prefix} {allowed}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{prefix} {allowed}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


positive = integer_in(1)
"""An integer >= 1."""
non_negative = integer_in(0)
"""An integer >= 0."""
seed = integer_in(0, SEED_LIMIT - 1, what="a seed")
"""A seed from 0 to 2**63 - 1."""
