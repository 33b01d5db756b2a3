"""Shadow mode: a production sentinel for stale metadata, off by default.

Stale attention metadata is silent: the kernels read whatever the buffers hold. Shadow mode
catches it where it happens, in production: with ``DRAFTMETA_SHADOW=N`` every Nth draft loop
of a builder also rebuilds its metadata after each in-place update and compares the two field
by field (:func:`draftmeta.compare.compare_metadata`). On the first mismatch the sentinel logs
one line naming the builder and the field, counts it, and switches that builder back to
rebuilding for the rest of the process.

Cost: unset or ``0``, nothing runs (callers test one attribute per draft loop). Set, a shadowed
loop costs one rebuild and one comparison (which reads tensors back to the host) per step; the
other N-1 loops cost one counter increment each.

The engine-neutral API, used by :class:`~draftmeta.loop.DraftLoop` and meant for an engine's
plugin::

    sentinel = sentinel_for("FlashMLA")          # one per builder name, process-wide
    if sentinel.enabled and sentinel.should_check():   # once per draft loop
        ...                                      # after each in-place update of this loop:
        mismatch = sentinel.compare(updated, rebuilt)
        if mismatch is not None:                 # logged and counted already;
            ...                                  # sentinel.switched_off is now True: rebuild

A builder whose sentinel is switched off must rebuild from then on; check
``sentinel.switched_off`` before choosing the in-place path.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping

from draftmeta.compare import Mismatch, compare_metadata

__all__ = [
    "ENV",
    "Sentinel",
    "reset_sentinels",
    "sentinel_for",
    "shadow_interval",
]

ENV = "DRAFTMETA_SHADOW"
"""The environment variable: ``N`` (a positive int) shadows every Nth draft loop; unset or
``0`` turns shadow mode off."""

logger = logging.getLogger("draftmeta.shadow")


def shadow_interval(environ: Mapping[str, str] | None = None) -> int:
    """The shadow interval from ``DRAFTMETA_SHADOW`` (0 when unset or empty: off).

    Raises:
        ValueError: the variable is set to something other than a non-negative int (a typo
            must not silently leave the sentinel off).
    """
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"{ENV}={raw!r}: expected a non-negative int N (shadow every Nth draft loop; 0 or "
            "unset: off)"
        )
    return value


class Sentinel:
    """The shadow-mode state of one builder: when to check, what was found, whether it is off.

    Args:
        builder: the builder's name, for the log line.
        interval: shadow every ``interval``-th draft loop (0: never).
        ignore: field paths not to compare (fields a consumer fills lazily).
        opaque: objects compared by type only (a lazily filled scheduler object).

    Attributes:
        builder: the builder's name.
        interval: the shadow interval.
        loops: draft loops seen by :meth:`should_check`.
        checks: comparisons made.
        mismatches: comparisons that found a stale field.
        first_mismatch: the first stale field found, if any.
        switched_off: the builder must rebuild for the rest of the process.
    """

    def __init__(
        self,
        builder: str,
        interval: int,
        *,
        ignore: Callable[[str], bool] = lambda _: False,
        opaque: Callable[[object], bool] = lambda _: False,
    ) -> None:
        if type(interval) is not int or interval < 0:
            raise ValueError(f"shadow interval must be a non-negative int, got {interval!r}")
        self.builder = builder
        self.interval = interval
        self.ignore = ignore
        self.opaque = opaque
        self.loops = 0
        self.checks = 0
        self.mismatches = 0
        self.first_mismatch: Mismatch | None = None
        self.switched_off = False
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether shadow mode is on for this builder (a non-zero interval)."""
        return self.interval > 0

    def should_check(self) -> bool:
        """Call once per draft loop: whether this loop is shadowed (every ``interval``-th one,
        the first included; never once switched off or with interval 0)."""
        if not self.interval or self.switched_off:
            return False
        with self._lock:
            self.loops += 1
            return (self.loops - 1) % self.interval == 0

    def compare(self, updated: object, rebuilt: object) -> Mismatch | None:
        """Compare metadata updated in place with metadata rebuilt for the same state.

        Returns ``None`` when they agree; otherwise the first differing field, after logging
        one line (the first time only) with the builder and the field, counting the mismatch
        and switching the builder off.
        """
        found = compare_metadata(updated, rebuilt, ignore=self.ignore, opaque=self.opaque)
        with self._lock:
            self.checks += 1
            if not found:
                return None
            self.mismatches += 1
            first = self.first_mismatch is None
            if first:
                self.first_mismatch = found[0]
            self.switched_off = True
        if first:
            logger.warning(
                "draftmeta shadow: builder %s: field %s is stale after an in-place update (%s); "
                "rebuilding this builder's metadata for the rest of the process",
                self.builder, found[0].path, found[0].detail,
            )
        return found[0]


_SENTINELS: dict[str, Sentinel] = {}
_REGISTRY_LOCK = threading.Lock()


def sentinel_for(builder: str, interval: int | None = None) -> Sentinel:
    """The process-wide sentinel of the builder named ``builder``, with ``interval`` (default
    :func:`shadow_interval`). A switched-off builder stays off whatever the interval."""
    wanted = shadow_interval() if interval is None else interval
    with _REGISTRY_LOCK:
        sentinel = _SENTINELS.get(builder)
        if sentinel is None:
            sentinel = Sentinel(builder, wanted)
            _SENTINELS[builder] = sentinel
        elif sentinel.interval != wanted:
            if type(wanted) is not int or wanted < 0:
                raise ValueError(f"shadow interval must be a non-negative int, got {wanted!r}")
            sentinel.interval = wanted
        return sentinel


def reset_sentinels() -> None:
    """Forget every sentinel (tests; a process that reloads its configuration)."""
    with _REGISTRY_LOCK:
        _SENTINELS.clear()
