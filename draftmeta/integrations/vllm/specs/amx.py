"""``AMX_MLA``'s extra decode state bound to this machine: vLLM's compute units handed to
:mod:`draftmeta.backends.amx`."""

from __future__ import annotations

from typing import Any

from draftmeta.backends.amx import amx_decode_rules
from draftmeta.rules import Rule

__all__ = ["amx_bound_rules", "compute_units"]


def compute_units() -> int:
    """The compute units vLLM's AMX split count is bounded by on this machine
    (``current_platform.num_compute_units()``: on vLLM's CPU platform, torch's thread count)."""
    from vllm.platforms import current_platform

    return int(current_platform.num_compute_units())


def amx_bound_rules(builder: Any) -> tuple[tuple[str, Rule], ...]:
    """The rules of AMX's decode attributes (:func:`draftmeta.backends.amx.amx_decode_rules`):
    the split count bounded by this machine's compute units, read once for a live builder, and
    at each call for a spec declared without one (``draftmeta explain`` imports no vLLM)."""
    return amx_decode_rules(compute_units() if builder is not None else compute_units)
