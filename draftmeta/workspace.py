"""Scratch buffers for derivations, allocated on first use and reused every step after.

Derivations run in place with ``out=`` ops; where a formula needs an intermediate result it asks
the workspace for a buffer of a fixed shape. The first draft step allocates it; every later step
gets the same tensor back, so the steady state allocates nothing and buffer addresses stay put
(what CUDA-graph capture needs).
"""

from __future__ import annotations

import torch

__all__ = ["Workspace"]


class Workspace:
    """A keyed pool of persistent scratch tensors.

    >>> ws = Workspace()
    >>> a = ws.buffer("idx", (4,), torch.int64, torch.device("cpu"))
    >>> a is ws.buffer("idx", (4,), torch.int64, torch.device("cpu"))
    True
    """

    __slots__ = ("_buffers",)

    def __init__(self) -> None:
        self._buffers: dict[tuple[object, ...], torch.Tensor] = {}

    def buffer(
        self, key: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The scratch tensor for ``key`` of this shape, dtype and device (contents undefined)."""
        k = (key, shape, dtype, device)
        t = self._buffers.get(k)
        if t is None:
            t = self._buffers[k] = torch.empty(shape, dtype=dtype, device=device)
        return t

    def arange(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A persistent ``arange(n)`` (filled once, never written by callers)."""
        k = ("arange", (n,), dtype, device)
        t = self._buffers.get(k)
        if t is None:
            t = self._buffers[k] = torch.arange(n, dtype=dtype, device=device)
        return t

    def __len__(self) -> int:
        return len(self._buffers)

    def clear(self) -> None:
        """Drop every buffer (the next step allocates again)."""
        self._buffers.clear()
