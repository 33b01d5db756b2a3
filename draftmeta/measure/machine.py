"""The machine's state while a benchmark runs: its load, recorded before and after with every
result (a ratio measured on a loaded machine says so)."""

from __future__ import annotations

import os

__all__ = ["load_average"]


def load_average() -> list[float] | None:
    """The machine's load averages over 1, 5 and 15 minutes (``uptime``'s), where the
    platform has them."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None
