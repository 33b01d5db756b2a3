"""Plain-torch models of what vLLM 0.33's builders build for a decode-only draft batch.

Where vLLM itself cannot run (the GPU benchmark machine has no vLLM), these functions build the
same metadata objects (real classes or recorded stand-ins) from a draft state, field by field,
as ``MLACommonMetadataBuilder.build`` and ``DeepseekV32IndexerMetadataBuilder.build`` do on
the decode-only path. The test suite proves them equal to the real builders on CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from draftmeta.state import DraftState

__all__ = ["IndexerBuffers", "build_indexer_metadata", "build_mla_metadata"]


def build_mla_metadata(cls: type, decode_cls: type, state: DraftState, *,
                       head_dim: int = 576, **extra: Any) -> Any:
    """``MLACommonMetadata`` (or a subclass) for a decode-only batch; ``extra`` goes to the
    decode part (a FlashMLA scheduler object, ...)."""
    n = state.num_reqs
    return cls(
        num_reqs=n,
        max_query_len=1,
        max_seq_len=state.max_seq_len,
        num_actual_tokens=n,
        query_start_loc=state.query_start_loc,
        slot_mapping=state.slot_mapping,
        num_decodes=n,
        num_decode_tokens=n,
        num_prefills=0,
        causal=True,
        head_dim=head_dim,
        prefill=None,
        decode=decode_cls(
            block_table=state.block_table[:n],
            seq_lens=state.seq_lens[:n],
            dcp_tot_seq_lens=None,
            **extra,
        ),
    )


class IndexerBuffers:
    """The indexer builder's persistent buffers (decode lengths and the schedule).

    Args:
        rows: capacity in tokens (vLLM: ``max_num_batched_tokens``).
        slots: schedule rows minus one (the SM count the DeepGEMM schedule is made for).
        device: where they live.
    """

    def __init__(self, rows: int, slots: int, device: torch.device | str = "cpu") -> None:
        self.decode_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.per_req_decode_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.schedule = torch.zeros(slots + 1, 2, dtype=torch.int32, device=device)


def build_indexer_metadata(cls: type, decode_cls: type, state: DraftState,
                           buffers: IndexerBuffers) -> Any:
    """``DeepseekV32IndexerMetadata`` for a decode-only batch (native path, next_n = 1)."""
    n = state.num_reqs
    decode_lens = buffers.decode_lens[:n]
    decode_lens.fill_(1)
    per_req = buffers.per_req_decode_lens[:n]
    per_req.fill_(1)
    return cls(
        seq_lens=state.seq_lens,
        max_seq_len=state.max_seq_len,
        slot_mapping=state.slot_mapping,
        num_decodes=n,
        num_decode_tokens=n,
        num_prefills=0,
        num_prefill_tokens=0,
        decode=decode_cls(
            block_table=state.block_table[:n],
            seq_lens=state.seq_lens[:n].unsqueeze(-1),
            decode_lens=decode_lens,
            requires_padding=False,
            schedule_metadata=buffers.schedule,
            global_seq_lens=None,
            per_req_decode_lens=per_req,
            decode_is_uniform=True,
            write_max_decode_len=1,
            indices=None,
        ),
        prefill=None,
        positions=None,
        block_table=state.block_table,
    )
