"""References and generated names: how a rule names what it reads, and how generated code names
what it binds. Shared by the spec (validation), the code generator and the fused kernel, and
importing nothing of them."""

from __future__ import annotations

import re

__all__ = ["STATE_PREFIX", "identifier", "is_state_ref"]

STATE_PREFIX = "state."
"""References starting with this prefix read the draft state, not the metadata."""


def is_state_ref(ref: str) -> bool:
    """Whether a reference reads the draft state (``state.X``) rather than the metadata."""
    return ref.startswith(STATE_PREFIX)


def identifier(text: str) -> str:
    """``text`` made into a Python identifier (for generated names)."""
    return re.sub(r"\W", "_", text).strip("_") or "spec"
