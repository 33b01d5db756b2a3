"""The audit's two criteria beyond update == rebuild: a hook is idempotent, and it alone turns
the metadata built for capture into the first draft step's.

vLLM's next draft loop (``target_dependent_ar/speculator.py``, ``_generate_fused_drafts``) calls
each builder's ``update_draft_decode_metadata`` at the start of *every* draft step, the first
included, on the metadata object it captured: in full-graph mode that object was built once,
before capture, from the runner's dummy inputs (``InputBatch.make_dummy``: every captured row a
request of sequence length 1 at position 0, block tables zeroed, every slot ``PAD_SLOT_ID``
-1, the host ``max_seq_len`` at ``max_model_len``; under DCP each dummy request is given
``dcp_world_size * interleave`` tokens of context, ``set_dcp_capture_context``) through the
builder's ``build_for_cudagraph_capture``. At replay the runner writes the real inputs into
the same buffers and the hook must do the rest. So a hook must be

* **idempotent**: applied twice for one draft step, it leaves the metadata as once (a hook that
  increments what it should refresh fails); and
* **first step**: from the metadata built for capture, it reproduces vLLM's rebuild at the
  first draft step (a hook that leaves alone what cannot change *between* steps, the block
  table say, fails here).

This module holds what both need and that is not vLLM's: a copy of a metadata object to compare
with (:func:`snapshot`), the runner's capture inputs written into a draft state's buffers
(:func:`write_capture_inputs`), and the real inputs written back (:func:`copy_inputs`). The
audit (:mod:`draftmeta.integrations.vllm.tools.audit`) drives them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from draftmeta.fields import record_items
from draftmeta.state import DraftState

__all__ = ["INPUTS", "PAD_SLOT_ID", "copy_inputs", "snapshot", "write_capture_inputs"]

PAD_SLOT_ID = -1
"""The slot vLLM's runner gives a token that writes no KV cache (``PAD_SLOT_ID``): every slot
of its capture batch."""

INPUTS = ("positions", "seq_lens", "slot_mapping", "block_table", "query_start_loc",
          "dcp_local_seq_lens")
"""The runner's input buffers a draft state holds, which built metadata views."""


def snapshot(metadata: Any) -> Any:
    """A copy of ``metadata`` to compare with after a hook ran again: every dataclass or attrs
    record inside copied (attributes set outside its fields included), every tensor cloned,
    lists and tuples rebuilt; any other object is kept as it is, shared with the original (a
    hook that mutates such an object in place goes unseen; one that replaces it does not)."""
    if isinstance(metadata, torch.Tensor):
        return metadata.clone()
    if isinstance(metadata, (list, tuple)):
        items = [snapshot(v) for v in metadata]
        return type(metadata)(items) if type(metadata) in (list, tuple) else \
            type(metadata)(*items)  # a named tuple
    fields = record_items(metadata)
    if fields is None:
        return metadata
    copied = copy.copy(metadata)
    names = {name for name, _ in fields}
    extra = [(k, v) for k, v in getattr(metadata, "__dict__", {}).items() if k not in names]
    for name, value in [*fields, *extra]:
        object.__setattr__(copied, name, snapshot(value))  # frozen records too
    return copied


def write_capture_inputs(state: DraftState, *,
                         local_lens: Callable[[torch.Tensor], torch.Tensor] | None = None
                         ) -> None:
    """Write the inputs vLLM's runner captures its draft loop with into ``state``'s buffers,
    in place: every row a request of sequence length 1 at position 0 (with
    ``dcp_world_size * dcp_interleave`` tokens of context under DCP, at most
    ``max_model_len - 1``), block tables zeroed, every slot :data:`PAD_SLOT_ID`, query starts
    ``0, 1, 2, ...``, the host ``max_seq_len`` at ``max_model_len``. Under DCP,
    ``local_lens`` (vLLM's own ``get_dcp_local_seq_lens`` for this rank) gives the rank's
    share of the dummy lengths."""
    context = 0
    if state.dcp_world_size > 1:
        context = min(state.dcp_world_size * state.dcp_interleave, state.max_model_len - 1)
    state.seq_lens.fill_(1 + context)
    state.positions.fill_(context)
    state.slot_mapping.fill_(PAD_SLOT_ID)
    state.block_table.zero_()
    starts = state.query_start_loc
    starts.copy_(torch.arange(starts.shape[0], dtype=starts.dtype, device=starts.device))
    state.max_seq_len = state.max_model_len
    if state.dcp_local_seq_lens is not None:
        if local_lens is None:
            raise ValueError("a DCP state's capture inputs need the rank's local lengths: pass "
                             "local_lens (vLLM's get_dcp_local_seq_lens for this rank)")
        state.dcp_local_seq_lens.copy_(local_lens(state.seq_lens))


def copy_inputs(into: DraftState, source: DraftState) -> None:
    """Write ``source``'s input buffers into ``into``'s, in place (the tensors ``into``'s
    metadata views stay the same objects), with its host ``max_seq_len``: what the runner does
    before it replays a captured draft loop."""
    for name in INPUTS:
        target, value = getattr(into, name), getattr(source, name)
        if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor):
            target.copy_(value)
    into.max_seq_len = source.max_seq_len
