"""The errors ``draftmeta e2e`` raises."""

from __future__ import annotations

__all__ = ["E2EError", "E2EUnavailable"]


class E2EError(Exception):
    """An end-to-end run could not be completed; the message says what failed and what to do."""


class E2EUnavailable(E2EError):
    """This environment cannot run a vLLM engine (wrong vLLM build, backend not on this CPU)."""
