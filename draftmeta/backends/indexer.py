"""Spec for vLLM 0.33's DeepSeek-V3.2 sparse-attention indexer metadata while drafting.

``DeepseekV32IndexerMetadata`` (built by ``DeepseekV32IndexerMetadataBuilder``) in the
chain-drafting decode phase: one query token per request, so every decode path of the builder
(native, flattened, SM100 varlen) yields per-token lengths equal to the sequence lengths, one
block-table row per request and decode lengths of 1.

Like vLLM's own hook, the update is a full refresh from the source buffers (it does not rely on
the previous step), so it also serves metadata captured from a dummy batch: the decode block
table and per-token lengths are copied from the top-level views (a no-op where they alias them),
the decode lengths filled with 1, and the DeepGEMM paged-MQA schedule recomputed into its
persistent buffer. Unlike vLLM's hook, DCP > 1 is supported: the top-level ``seq_lens`` stay the
global lengths and the decode lengths are the DCP-local ones the loop recomputes each step.
"""

from __future__ import annotations

import functools
from typing import Any

from draftmeta.backends.common import HostBoundPolicy, decode_only, max_seq_len_rule
from draftmeta.backends.hooks import DeepGemmPagedMqaSchedule, PagedMqaCompute
from draftmeta.backends.vllm_classes import ClassRef, load_metadata_class
from draftmeta.conditions import IsNone, Precondition
from draftmeta.derivations import CopyFrom, Fill
from draftmeta.rules import Alias, Derive, HostConstant, Recompute, Rule, Unchanged
from draftmeta.spec import DraftSpec

__all__ = ["INDEXER_BUILDER", "INDEXER_METADATA", "indexer_spec"]

_MODULE = "vllm.v1.attention.backends.mla.indexer"
INDEXER_BUILDER = ClassRef(_MODULE, "DeepseekV32IndexerMetadataBuilder")
"""vLLM's indexer metadata builder."""
INDEXER_METADATA = ClassRef(_MODULE, "DeepseekV32IndexerMetadata")
"""The indexer metadata class."""
INDEXER_DECODE = ClassRef(_MODULE, "DeepSeekV32IndexerDecodeMetadata")
"""Its decode part."""


@functools.cache
def indexer_spec(
    *,
    policy: HostBoundPolicy = "advance",
    dcp: bool = False,
    block_kv: int = 64,
    schedule_compute: PagedMqaCompute | None = None,
) -> DraftSpec[Any]:
    """The spec of the DeepSeek-V3.2 indexer metadata in the chain-drafting decode phase.

    Args:
        policy: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        dcp: decode context parallelism > 1: the decode lengths are the DCP-local lengths
            (``state.dcp_local_seq_lens``), recomputed every step from the global ones.
        block_kv: the indexer cache's block size, for the DeepGEMM schedule.
        schedule_compute: the paged-MQA schedule function (default: DeepGEMM on CUDA where
            installed; elsewhere the buffer is left alone, as vLLM does).
    """
    metadata_cls, _ = load_metadata_class(INDEXER_METADATA.module, INDEXER_METADATA.qualname)
    decode_cls, _ = load_metadata_class(INDEXER_DECODE.module, INDEXER_DECODE.qualname)
    lengths = "state.dcp_local_seq_lens" if dcp else "seq_lens"
    rules: dict[str, Rule] = {
        "seq_lens": Alias("seq_lens"),
        "max_seq_len": max_seq_len_rule(policy, False),
        "slot_mapping": Alias("slot_mapping"),
        "num_decodes": HostConstant(),
        "num_decode_tokens": HostConstant(),
        "num_prefills": HostConstant(),
        "num_prefill_tokens": HostConstant(),
        "prefill": Unchanged(),
        "positions": Unchanged(),
        "block_table": Alias("block_table"),
        "decode.block_table": Derive(CopyFrom(), ("block_table",)),
        "decode.seq_lens": Derive(CopyFrom(flat=True), (lengths,)),
        "decode.decode_lens": Derive(Fill(1), ()),
        "decode.per_req_decode_lens": Derive(Fill(1), ()),
        "decode.requires_padding": HostConstant(),
        "decode.schedule_metadata": Recompute(
            DeepGemmPagedMqaSchedule(block_kv, schedule_compute), ("decode.seq_lens",)
        ),
        "decode.global_seq_lens": Alias("seq_lens") if dcp else Unchanged(),
        "decode.decode_is_uniform": HostConstant(),
        "decode.write_max_decode_len": HostConstant(),
        "decode.indices": Unchanged(),
    }
    preconditions: list[Precondition] = [
        *decode_only(dcp=dcp, max_query_len=False),
        IsNone("positions", name="not_kpool_tail"),
        IsNone("decode.indices", name="no_sm100_varlen_indices"),
    ]
    if not dcp:
        preconditions.append(IsNone("decode.global_seq_lens", name="no_global_seq_lens"))
    return DraftSpec(
        metadata_cls,
        rules,
        name=f"indexer.deepseek_v32{'.dcp' if dcp else ''}.{policy}",
        preconditions=preconditions,
        nested={"decode": decode_cls},
    )
