"""How long the GPU was busy during a piece of work: the limit of what a host-side saving buys.

A captured draft loop removes host work; it can shorten an engine step only where the GPU was
waiting for that host work. The GPU's *busy* time over a ``generate`` (the union of the
intervals in which any kernel, copy or memset ran on it, read from the CUDA profiler) bounds a
step from below: with the plugin on, a step cannot take less than the GPU's busy time per step.
So the *limit* of the plugin's gain on a configuration is ``T off / busy on`` (the plugin-off
step time over the plugin-on engine's GPU busy time per step), and ``T off - busy off`` is the
time the plugin-off engine's GPU stood idle per step, waiting for the host.

:func:`busy_seconds` runs a callable under ``torch.profiler`` (CUDA activity only) and returns
the union of the device intervals it recorded; :func:`union_length` is that union. The
profiler's own host overhead slows the profiled call, which is why it is a separate,
unmeasured ``generate``: its GPU work is the same, only the gaps between kernels grow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["busy_seconds", "union_length"]

T = TypeVar("T")


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """The total length covered by ``intervals`` (``(start, end)`` pairs, any order), each
    point counted once however many intervals cover it; an interval with ``end <= start``
    covers nothing."""
    total = 0.0
    current_start: float | None = None
    current_end = 0.0
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if current_start is None or start > current_end:
            if current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_start is not None:
        total += current_end - current_start
    return total


def _device_intervals(profile: object) -> list[tuple[float, float]]:
    """The device activities' ``(start, end)`` in nanoseconds from a finished
    ``torch.profiler.profile``."""
    from torch._C._autograd import DeviceType

    results = getattr(getattr(profile, "profiler", None), "kineto_results", None)
    if results is not None:
        try:
            return [(float(e.start_ns()), float(e.start_ns() + e.duration_ns()))
                    for e in results.events() if e.device_type() == DeviceType.CUDA]
        except AttributeError:  # a torch whose kineto events lack these: the slower reading
            pass
    events = profile.events()  # type: ignore[attr-defined]
    return [(1e3 * e.time_range.start, 1e3 * e.time_range.end) for e in events
            if e.device_type == DeviceType.CUDA]


def busy_seconds(work: Callable[[], T]) -> tuple[T, float]:
    """Run ``work`` under the CUDA profiler; returns its result and the seconds the GPU was
    busy meanwhile (:func:`union_length` of every kernel, copy and memset it recorded).

    Raises:
        RuntimeError: no CUDA device.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise RuntimeError("the GPU's busy time needs a CUDA device")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = work()
        torch.cuda.synchronize()
    return result, union_length(_device_intervals(prof)) / 1e9
