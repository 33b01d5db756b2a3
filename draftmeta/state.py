"""The draft state: the source buffers that the draft loop advances once per step.

Every attention group's metadata is derived from the same few buffers (positions, sequence
lengths, slot mapping, block table) and host scalars (``max_seq_len``, ``max_model_len``, ...).
The loop advances them once per draft step, for all groups together; each group's generated
update then refreshes the metadata that is not a plain view of these buffers.

Tensors may be longer than ``num_reqs``: rows past it are padding (a CUDA-graph batch padded to a
captured size) and always get slot -1.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from draftmeta.workspace import Workspace

__all__ = ["DraftState"]


@attrs.define(eq=False)
class DraftState:
    """Source buffers and host scalars of one draft batch, advanced in place each step.

    Attributes:
        positions: int64 ``[B]``, the position of each request's current draft token.
        seq_lens: int32 ``[B]``, the context length including the current token.
        slot_mapping: int64 ``[B]``, the KV-cache slot of each token, -1 for padded rows.
        block_table: int32 ``[B, W]``, each request's KV-cache block ids.
        query_start_loc: int32 ``[B + 1]``, cumulative query starts (``arange`` in drafting).
        num_reqs: real requests; rows past it are padding.
        max_seq_len: host upper bound of ``seq_lens``.
        max_model_len: the model's context limit that overflow policies use.
        block_size: the KV-cache block size.
        dcp_world_size: decode-context-parallel ranks (1 when DCP is off).
        dcp_rank: this rank's index among them.
        dcp_interleave: tokens dealt to a rank at a time (vLLM's ``cp_kv_cache_interleave_size``).
        dcp_local_seq_lens: int32 ``[B]``, this rank's share of ``seq_lens`` (DCP only).
        step: the draft step the state describes (0 is the first pass).
        workspace: scratch buffers for derivations.
    """

    positions: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    num_reqs: int
    max_seq_len: int
    max_model_len: int
    block_size: int
    dcp_world_size: int = 1
    dcp_rank: int = 0
    dcp_interleave: int = 1
    dcp_local_seq_lens: torch.Tensor | None = None
    step: int = 0
    workspace: Workspace = attrs.field(factory=Workspace)

    @property
    def batch_size(self) -> int:
        """Rows in the buffers, padding included."""
        return int(self.seq_lens.shape[0])

    @property
    def device(self) -> torch.device:
        """The device the buffers live on."""
        return self.seq_lens.device

    def clone(self) -> DraftState:
        """A deep copy with fresh tensors (and an empty workspace)."""
        return self._map(torch.Tensor.clone)

    def to(self, device: torch.device | str) -> DraftState:
        """A copy with every tensor on ``device`` (and an empty workspace)."""
        return self._map(lambda t: t.to(device, copy=True))

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> DraftState:
        local = self.dcp_local_seq_lens
        return attrs.evolve(
            self,
            positions=fn(self.positions),
            seq_lens=fn(self.seq_lens),
            slot_mapping=fn(self.slot_mapping),
            block_table=fn(self.block_table),
            query_start_loc=fn(self.query_start_loc),
            dcp_local_seq_lens=None if local is None else fn(local),
            workspace=Workspace(),
        )
