"""The draft states a benchmark run starts from, and their reset between runs (shared by the CPU
and the CUDA benchmark)."""

from __future__ import annotations

import torch

from draftmeta.state import DraftState
from draftmeta.testing import random_state

__all__ = ["bench_state", "reset_state"]


def bench_state(batch: int, steps: int, block_size: int, max_model_len: int, seed: int,
                device: str = "cpu") -> DraftState:
    """A random draft state of ``batch`` requests with mixed lengths up to ``max_model_len``,
    drawn from ``seed``, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    state = random_state(g, batch_size=batch, block_size=block_size,
                         max_model_len=max_model_len, steps=steps)
    return state.to(device) if device != "cpu" else state


def reset_state(state: DraftState, start: DraftState) -> None:
    """Put ``state`` back where ``start`` is (the buffers the advance moves, and the host ints)."""
    for name in ("positions", "seq_lens", "slot_mapping"):
        getattr(state, name).copy_(getattr(start, name))
    state.max_seq_len, state.step = start.max_seq_len, start.step
