"""Draft-state validation: a :class:`~draftmeta.state.DraftState` is well formed before a loop
runs on it.

:func:`validate_state` reads host metadata only (dtypes, devices, shapes, host ints), never a
tensor's contents, so it does not synchronise with the device. :class:`~draftmeta.loop.DraftLoop`
runs it once, when it is constructed.
"""

from __future__ import annotations

import torch

from draftmeta.state import DraftState

__all__ = ["validate_state"]

_INT = (torch.int32, torch.int64)


def validate_state(state: DraftState) -> None:
    """Check a draft state's dtypes, devices and shapes (host metadata only, no device sync).

    Raises:
        ValueError: naming the field, what it is and what it must be.
    """
    for name in ("num_reqs", "max_seq_len", "max_model_len", "block_size", "dcp_world_size",
                 "dcp_rank", "dcp_interleave", "step"):
        value = getattr(state, name)
        if type(value) is not int:
            raise ValueError(
                f"state.{name} is {value!r} ({type(value).__qualname__}); it must be a Python "
                f"int (convert with int(...))"
            )
    for name in ("max_model_len", "block_size", "dcp_world_size", "dcp_interleave"):
        if getattr(state, name) < 1:
            raise ValueError(f"state.{name} is {getattr(state, name)}; it must be >= 1")
    if not 0 <= state.dcp_rank < state.dcp_world_size:
        raise ValueError(
            f"state.dcp_rank {state.dcp_rank} is not in 0..{state.dcp_world_size - 1}"
        )
    rows = state.batch_size
    expect = {
        "positions": ((rows,), _INT),
        "seq_lens": ((rows,), _INT),
        "slot_mapping": ((rows,), _INT),
        "query_start_loc": ((rows + 1,), _INT),
    }
    for name, (shape, dtypes) in expect.items():
        t = getattr(state, name)
        if t.dtype not in dtypes:
            raise ValueError(f"state.{name} is {t.dtype}; it must be int32 or int64")
        if t.dim() != 1 or t.shape[0] < shape[0]:
            raise ValueError(f"state.{name} has shape {tuple(t.shape)}; it must be [>= {shape[0]}]")
    bt = state.block_table
    if bt.dim() != 2 or bt.shape[0] < rows or bt.dtype not in _INT:
        raise ValueError(f"state.block_table is {bt.dtype} {tuple(bt.shape)}; it must be an "
                         f"int32 [>= {rows}, W] tensor")
    for name in ("positions", "slot_mapping", "block_table", "query_start_loc",
                 "dcp_local_seq_lens"):
        t = getattr(state, name)
        if isinstance(t, torch.Tensor) and t.device != state.device:
            raise ValueError(
                f"state.{name} is on {t.device} but state.seq_lens on {state.device}; "
                "put every buffer on one device"
            )
    if not 0 < state.num_reqs <= rows:
        raise ValueError(f"state.num_reqs is {state.num_reqs}; it must be in 1..{rows}")
    if state.max_seq_len > state.max_model_len:
        raise ValueError(
            f"state.max_seq_len {state.max_seq_len} exceeds max_model_len {state.max_model_len}"
        )
    if state.dcp_world_size > 1 and state.dcp_local_seq_lens is None:
        raise ValueError("DCP is on (dcp_world_size > 1) but state.dcp_local_seq_lens is None; "
                         "allocate it (the loop recomputes it every step)")
