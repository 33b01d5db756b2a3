"""The caches behind spec declaration, registered where they are made and cleared together.

Declaring a shipped spec loads vLLM's metadata classes and builds the spec once per argument
set; both are memoized. Which classes are loaded depends on the environment
(``DRAFTMETA_VLLM_CLASSES=recorded`` declares against the recorded stand-ins), so switching it
must forget every one of them: :func:`spec_cache` memoizes a function like
:func:`functools.cache` and registers it, and :func:`clear` empties every registered cache
(:func:`draftmeta.registry.clear_spec_caches`). A new cached factory is decorated once and
cleared with the others; no list is kept by hand.

This module imports nothing from draftmeta (the backends and the class loader use it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["clear", "registered", "spec_cache"]

F = TypeVar("F", bound=Callable[..., Any])

_CACHES: list[Any] = []


def spec_cache(function: F) -> F:
    """``functools.cache(function)``, registered so that :func:`clear` empties it."""
    cached = functools.cache(function)
    _CACHES.append(cached)
    return cached  # type: ignore[return-value]


def registered() -> tuple[Callable[..., Any], ...]:
    """Every cache registered so far (those of the modules imported), in registration order."""
    return tuple(_CACHES)


def clear() -> None:
    """Empty every registered cache."""
    for cached in _CACHES:
        cached.cache_clear()
