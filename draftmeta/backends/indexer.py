"""The specs of the DeepSeek-V3.2 sparse-attention indexer metadata and the K-pool tail while
drafting, declared against the classes handed in (the vLLM binding resolves them:
:mod:`draftmeta.integrations.vllm.specs.indexer`).

vLLM's ``DeepseekV32IndexerMetadata`` (built by ``DeepseekV32IndexerMetadataBuilder``) in the
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

from typing import Any, ClassVar

import attrs
import torch

from draftmeta.advance import HostBound
from draftmeta.backends.common import decode_only, max_seq_len_rule
from draftmeta.backends.hooks import DeepGemmPagedMqaSchedule, PagedMqaCompute, PagedMqaKernel
from draftmeta.backends.views import FLAT
from draftmeta.conditions import Equals, IsNone, IsNotNone, Precondition, SameValue
from draftmeta.derivations import Argument, CopyFrom, Derivation, Fill, argument_problem
from draftmeta.rules import Alias, Derive, HostConstant, Recompute, Rule, Unchanged
from draftmeta.spec import DraftSpec
from draftmeta.workspace import Workspace

__all__ = ["KpoolTailSlot", "indexer_spec", "kpool_tail_spec"]


@attrs.frozen
class KpoolTailSlot(Derivation):
    """Each token's slot in its request's one circular tail block of ``kpool`` tokens.

    ``slot[t] = block_table[t, 0] * kpool + pos[t] % kpool`` for the ``num_reqs`` tokens of a
    decode batch (one per request), ``-1`` where that block id is 0; the rows past them keep
    the main cache's slot (padding, -1). Recomputed from the positions every step; vLLM's own
    hook instead rewrites the previous slot's offset in place.

    Inputs: positions ``[B]``, block_table ``[>=B, W]``, the main slot mapping ``[B]``,
    num_reqs.

    Attributes:
        kpool: the tail block's size in tokens (the cache spec's block size).
    """

    name: ClassVar[str] = "kpool_tail_slot"
    arguments: ClassVar[tuple[Argument, ...]] = ("tensor", "tensor", "tensor", "int")
    kpool: int = attrs.field(default=64, validator=attrs.validators.ge(1))

    @property
    def formula(self) -> str:  # type: ignore[override]
        return (f"block_table[r, 0] * {self.kpool} + pos % {self.kpool} (-1 where the block is "
                "0); rows past num_reqs: the main slot")

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        problem = argument_problem(inputs, self.arguments)
        if problem is not None:
            return problem
        positions, table, main, num_reqs = inputs
        assert isinstance(positions, torch.Tensor) and isinstance(table, torch.Tensor)
        assert isinstance(main, torch.Tensor) and isinstance(num_reqs, int)
        if out.shape != main.shape or positions.shape[0] < out.shape[0]:
            return (f"slot mapping {tuple(out.shape)} does not match the main one "
                    f"{tuple(main.shape)} and positions {tuple(positions.shape)}")
        if table.dim() != 2 or out.dtype != torch.int64:
            return f"needs an int64 slot mapping and a 2-D block table, got {out.dtype}"
        if not 0 <= num_reqs <= min(out.shape[0], table.shape[0]):
            return (f"num_reqs {num_reqs} exceeds the slot mapping ({out.shape[0]} rows) or "
                    f"the block table ({table.shape[0]} rows)")
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        positions, table, main, num_reqs = inputs[0], inputs[1], inputs[2], inputs[3]
        assert isinstance(positions, torch.Tensor) and isinstance(table, torch.Tensor)
        assert isinstance(main, torch.Tensor) and isinstance(num_reqs, int)
        if out.data_ptr() != main.data_ptr():
            out.copy_(main)
        head = out[:num_reqs]
        block = workspace.buffer("kpool.block", (num_reqs,), torch.int64, out.device)
        valid = workspace.buffer("kpool.valid", (num_reqs,), torch.bool, out.device)
        block.copy_(table[:num_reqs, 0])
        torch.ne(block, 0, out=valid)
        torch.remainder(positions[:num_reqs], self.kpool, out=head)
        head.add_(block, alpha=self.kpool).add_(1).mul_(valid).sub_(1)


def indexer_spec(
    metadata: type,
    decode: type,
    *,
    host_bound: HostBound = "advance",
    dcp: bool = False,
    block_kv: int = 64,
    schedule_compute: PagedMqaCompute | None = None,
    schedule_kernel: PagedMqaKernel | None = None,
    name: str = "INDEXER",
) -> DraftSpec[Any]:
    """The spec of the DeepSeek-V3.2 indexer metadata in the chain-drafting decode phase.

    Args:
        metadata: the indexer metadata class (vLLM's ``DeepseekV32IndexerMetadata``).
        decode: its decode-part class.
        name: the builder's catalogue name, first part of the spec's name.
        host_bound: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        dcp: decode context parallelism > 1: the decode lengths are the DCP-local lengths
            (``state.dcp_local_seq_lens``), recomputed every step from the global ones.
        block_kv: the indexer cache's block size, for the paged-MQA schedule.
        schedule_compute: the paged-MQA schedule function, for every buffer.
        schedule_kernel: where ``schedule_compute`` is ``None``: picks the schedule function
            for the buffer at each refill (the vLLM binding's: DeepGEMM on CUDA where
            installed). With neither the buffer is left alone, as vLLM does without DeepGEMM.
    """
    lengths = "state.dcp_local_seq_lens" if dcp else "seq_lens"
    rules: dict[str, Rule] = {
        "seq_lens": FLAT.rule("seq_lens"),
        "max_seq_len": max_seq_len_rule(host_bound, False),
        "slot_mapping": FLAT.rule("slot_mapping"),
        "num_decodes": HostConstant(),
        "num_decode_tokens": HostConstant(),
        "num_prefills": HostConstant(),
        "num_prefill_tokens": HostConstant(),
        "prefill": Unchanged(),
        "positions": Unchanged(),
        "block_table": FLAT.rule("block_table"),
        "decode.block_table": Derive(CopyFrom(), ("block_table",)),
        "decode.seq_lens": Derive(CopyFrom(flat=True), (lengths,)),
        "decode.decode_lens": Derive(Fill(1), ()),
        "decode.per_req_decode_lens": Derive(Fill(1), ()),
        "decode.requires_padding": HostConstant(),
        "decode.schedule_metadata": Recompute(
            DeepGemmPagedMqaSchedule(block_kv, schedule_compute, schedule_kernel),
            ("decode.seq_lens",),
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
        metadata,
        rules,
        name=f"{name}{'.dcp' if dcp else ''}.{host_bound}",
        preconditions=preconditions,
        nested={"decode": decode},
    )


def kpool_tail_spec(
    metadata: type, *, kpool: int = 64, host_bound: HostBound = "advance",
    name: str = "KPOOL_TAIL",
) -> DraftSpec[Any]:
    """The spec of the K-pool tail metadata (vLLM's ``KpoolTailMetadataBuilder``) while drafting.

    The builder reuses the indexer's metadata class without a decode part; only its slot
    mapping (a builder buffer) changes per step, derived from the positions (see
    :class:`KpoolTailSlot`).

    Args:
        metadata: the indexer metadata class.
        kpool: the tail cache's block size (the builder's ``kv_cache_spec.block_size``; the
            catalogue's factory takes it from the live builder).
        host_bound: how the host ``max_seq_len`` moves.
        name: the builder's catalogue name, first part of the spec's name.
    """
    rules: dict[str, Rule] = {
        "seq_lens": FLAT.rule("seq_lens"),
        "max_seq_len": max_seq_len_rule(host_bound, False),
        "slot_mapping": Derive(
            KpoolTailSlot(kpool),
            ("state.positions", "state.block_table", "state.slot_mapping", "state.num_reqs"),
        ),
        "num_decodes": HostConstant(),
        "num_decode_tokens": HostConstant(),
        "num_prefills": HostConstant(),
        "num_prefill_tokens": HostConstant(),
        "decode": Unchanged(),
        "prefill": Unchanged(),
        "positions": Alias("positions"),
        "block_table": Unchanged(),
    }
    preconditions: list[Precondition] = [
        Equals("state.dcp_world_size", 1, name="no_dcp"),
        Equals("num_prefills", 0, name="decode_only"),
        IsNone("prefill", name="no_prefill_part"),
        SameValue("num_decodes", "num_decode_tokens", name="one_token_per_request"),
        IsNotNone("positions", name="has_positions"),
    ]
    return DraftSpec(metadata, rules, name=f"{name}.{host_bound}",
                     preconditions=preconditions)

