"""Specs for vLLM 0.33's MLA attention metadata in the chain-drafting decode phase.

One spec per MLA builder family, declared against the metadata classes of the installed vLLM
(imported, or rebuilt from source where import needs a GPU; see
:mod:`draftmeta.backends.vllm_classes`), so a field added by a future vLLM release makes the
declaration fail with the field's name.

Most step-dependent fields are views of the runner's buffers (``seq_lens``, ``slot_mapping``,
the block table) and need no work beyond a storage check; what the specs add is the host
``max_seq_len``, DCP-local lengths (recomputed, never incremented), the sparse backends'
token-to-request map, FlashMLA's scheduler object (reset each step, or its FP8 tile schedule
refilled in place) and FlashAttention 3's scheduler metadata.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import attrs

from draftmeta.backends.common import HostBoundPolicy, decode_only, max_seq_len_rule
from draftmeta.backends.hooks import (
    FlashAttnCompute,
    FlashAttnSchedule,
    FlashMLAFp8TileSchedule,
    TileCompute,
)
from draftmeta.backends.vllm_classes import ClassRef, load_metadata_class
from draftmeta.conditions import IsNone, Precondition
from draftmeta.derivations import TokenToRequest
from draftmeta.rules import (
    Alias,
    Derive,
    HostConstant,
    HostDerive,
    Invalidate,
    Recompute,
    Reset,
    Rule,
    Unchanged,
    Unsupported,
    WrittenBy,
)
from draftmeta.spec import DraftSpec

__all__ = ["MLA_VARIANTS", "MLAVariant", "mla_spec"]

_MLA = "vllm.model_executor.layers.attention.mla_attention"
_SPARSE = "vllm.model_executor.layers.attention.sparse_mla_attention"
_BACKENDS = "vllm.v1.attention.backends.mla"

Upstream = Literal["none", "no-op", "refresh"]


@attrs.frozen
class MLAVariant:
    """One MLA builder family of vLLM 0.33 and how draftmeta declares its metadata.

    Attributes:
        name: draftmeta's name for it (``"triton"``, ``"flashmla"``, ...).
        builder: the vLLM builder class.
        metadata: the metadata class it builds.
        decode: the decode-part class (``None`` for sparse backends, which leave it unset).
        sparse: whether it is a sparse-MLA backend.
        upstream: what vLLM 0.33's own ``update_draft_decode_metadata`` does for it.
        cpu_buildable: whether its builder constructs and builds on a CPU-only machine.
    """

    name: str
    builder: ClassRef
    metadata: ClassRef
    decode: ClassRef | None
    sparse: bool = False
    upstream: Upstream = "none"
    cpu_buildable: bool = False


def _ref(path: str) -> ClassRef:
    module, _, name = path.rpartition(".")
    return ClassRef(module, name)


MLA_VARIANTS: dict[str, MLAVariant] = {
    v.name: v
    for v in (
        MLAVariant(
            "common",
            _ref(f"{_MLA}.MLACommonMetadataBuilder"),
            _ref(f"{_MLA}.MLACommonMetadata"),
            _ref(f"{_MLA}.MLACommonDecodeMetadata"),
            cpu_buildable=True,
        ),
        MLAVariant(
            "triton",
            _ref(f"{_BACKENDS}.triton_mla.TritonMLAMetadataBuilder"),
            _ref(f"{_MLA}.MLACommonMetadata"),
            _ref(f"{_MLA}.MLACommonDecodeMetadata"),
            upstream="no-op",
            cpu_buildable=True,
        ),
        MLAVariant(
            "cutlass",
            _ref(f"{_BACKENDS}.cutlass_mla.CutlassMLAMetadataBuilder"),
            _ref(f"{_MLA}.MLACommonMetadata"),
            _ref(f"{_MLA}.MLACommonDecodeMetadata"),
        ),
        MLAVariant(
            "flashmla",
            _ref(f"{_BACKENDS}.flashmla.FlashMLAMetadataBuilder"),
            _ref(f"{_BACKENDS}.flashmla.FlashMLAMetadata"),
            _ref(f"{_BACKENDS}.flashmla.FlashMLADecodeMetadata"),
        ),
        MLAVariant(
            "flashattn_mla",
            _ref(f"{_BACKENDS}.flashattn_mla.FlashAttnMLAMetadataBuilder"),
            _ref(f"{_BACKENDS}.flashattn_mla.FlashAttnMLAMetadata"),
            _ref(f"{_BACKENDS}.flashattn_mla.FlashAttnMLADecodeMetadata"),
        ),
        MLAVariant(
            "flashinfer_mla",
            _ref(f"{_BACKENDS}.flashinfer_mla.FlashInferMLAMetadataBuilder"),
            _ref(f"{_BACKENDS}.flashinfer_mla.FlashInferMLAMetadata"),
            _ref(f"{_BACKENDS}.flashinfer_mla.FlashInferMLADecodeMetadata"),
        ),
        MLAVariant(
            "flashmla_sparse",
            _ref(f"{_BACKENDS}.flashmla_sparse.FlashMLASparseMetadataBuilder"),
            _ref(f"{_BACKENDS}.flashmla_sparse.FlashMLASparseMetadata"),
            None,
            sparse=True,
        ),
        MLAVariant(
            "flashattn_mla_sparse",
            _ref(f"{_BACKENDS}.flashattn_mla_sparse.FlashAttnMLASparseMetadataBuilder"),
            _ref(f"{_BACKENDS}.flashattn_mla_sparse.FlashAttnMLASparseMetadata"),
            None,
            sparse=True,
            upstream="refresh",
        ),
        MLAVariant(
            "flashinfer_mla_sparse",
            _ref(f"{_BACKENDS}.flashinfer_mla_sparse.FlashInferMLASparseMetadataBuilder"),
            _ref(f"{_BACKENDS}.flashinfer_mla_sparse.FlashInferMLASparseMetadata"),
            None,
            sparse=True,
        ),
    )
}
"""Every MLA variant draftmeta declares, by name."""

_SCHED_META = ClassRef("vllm.third_party.flashmla.flash_mla_interface", "FlashMLASchedMeta")


def _fresh_flashmla_sched_meta() -> object:
    """A fresh, uninitialised FlashMLA scheduler object, as vLLM's builder makes one."""
    from vllm.v1.attention.ops.flashmla import get_mla_metadata

    return get_mla_metadata()[0]


def _false() -> bool:
    return False


def _none() -> None:
    return None


def _common_rules(policy: HostBoundPolicy, dcp: bool) -> dict[str, Rule]:
    """``MLACommonMetadata``'s own top-level fields (the ``decode`` part aside)."""
    return {
        "num_reqs": HostConstant(),
        "max_query_len": HostConstant(),
        "max_seq_len": max_seq_len_rule(policy, dcp),
        "num_actual_tokens": HostConstant(),
        "query_start_loc": Alias("query_start_loc"),
        "slot_mapping": Alias("slot_mapping"),
        "num_decodes": HostConstant(),
        "num_decode_tokens": HostConstant(),
        "num_prefills": HostConstant(),
        "causal": HostConstant(),
        "head_dim": HostConstant(),
        "prefill": Unchanged(),
    }


def _dense_rules(policy: HostBoundPolicy, dcp: bool) -> dict[str, Rule]:
    return {
        **_common_rules(policy, dcp),
        "decode.block_table": Alias("block_table"),
        "decode.seq_lens": Alias("dcp_local_seq_lens" if dcp else "seq_lens"),
        "decode.dcp_tot_seq_lens": Alias("seq_lens") if dcp else Unchanged(),
    }


def _sparse_rules(policy: HostBoundPolicy) -> dict[str, Rule]:
    return {
        **_common_rules(policy, False),
        "decode": Unchanged(),
        "block_table": Alias("block_table"),
        "req_id_per_token": Derive(TokenToRequest(), ("state.query_start_loc", "state.num_reqs")),
        "seq_lens": Alias("seq_lens"),
        "block_size": HostConstant(),
        "topk_tokens": HostConstant(),
        "decode_max_query_len": HostConstant(),
        "prefill_max_seq_len": HostConstant(),
        "cp_kv_cache_interleave_size": HostConstant(),
    }


@functools.cache
def mla_spec(
    variant: str,
    *,
    policy: HostBoundPolicy = "advance",
    dcp: bool = False,
    fp8_kv_cache: bool = False,
    num_q_tokens_per_head_k: int | None = None,
    tile_compute: TileCompute | None = None,
    flash_attn_compute: FlashAttnCompute | None = None,
) -> DraftSpec[Any]:
    """The spec of one MLA variant's decode metadata, against the installed vLLM classes.

    Args:
        variant: a key of :data:`MLA_VARIANTS`.
        policy: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        dcp: decode context parallelism > 1: ``decode.seq_lens`` are the DCP-local lengths,
            recomputed by the loop from the global ones every step, and ``max_seq_len`` is the
            per-rank bound.
        fp8_kv_cache: FlashMLA with an FP8 KV cache: the tile schedule and ``num_splits`` are
            refilled in place (needs ``num_q_tokens_per_head_k``).
        num_q_tokens_per_head_k: FlashMLA FP8 only: ``max_query_len * num_q_heads``.
        tile_compute: FlashMLA FP8 only: the schedule function (default: FlashMLA's kernel).
        flash_attn_compute: FlashAttn-MLA only: the FA3 scheduler bound to the builder's head
            configuration; without it the spec is unsupported (the loop rebuilds).

    Raises:
        KeyError: unknown variant.
        draftmeta.SpecError: the installed vLLM's classes do not match the declaration.
    """
    v = MLA_VARIANTS[variant]
    metadata_cls, _ = load_metadata_class(v.metadata.module, v.metadata.qualname)
    nested: dict[str, type] = {}
    preconditions: list[Precondition]
    if v.sparse:
        rules = _sparse_rules(policy)
        preconditions = [IsNone("decode", name="no_dense_decode_part"),
                         *decode_only(dcp=False, decode_part=False)]
        if dcp:
            rules["seq_lens"] = Unsupported("sparse MLA under DCP is not declared by draftmeta")
        if variant == "flashmla_sparse":
            rules["fp8_use_mixed_batch"] = HostConstant()
            if fp8_kv_cache:
                rules["fp8_extra_metadata"] = Unsupported(
                    "FP8 sparse FlashMLA keeps a scheduler object inside a union-typed field"
                )
            else:
                rules["fp8_extra_metadata"] = Unchanged()
                preconditions.append(IsNone("fp8_extra_metadata", name="bf16_kv_cache"))
    else:
        assert v.decode is not None
        nested["decode"], _ = load_metadata_class(v.decode.module, v.decode.qualname)
        rules = _dense_rules(policy, dcp)
        preconditions = decode_only(dcp=dcp)
        rules.update(_decode_extras(variant, policy, dcp, fp8_kv_cache, num_q_tokens_per_head_k,
                                    tile_compute, flash_attn_compute, nested))
    suffix = (".dcp" if dcp else "") + (".fp8" if fp8_kv_cache else "") + f".{policy}"
    return DraftSpec(
        metadata_cls,
        rules,
        name=f"mla.{variant}{suffix}",
        preconditions=preconditions,
        nested=nested,
    )


def _decode_extras(
    variant: str,
    policy: HostBoundPolicy,
    dcp: bool,
    fp8: bool,
    q_tokens: int | None,
    tile_compute: TileCompute | None,
    flash_attn_compute: FlashAttnCompute | None,
    nested: dict[str, type],
) -> dict[str, Rule]:
    if variant == "flashmla":
        if not fp8:
            return {"decode.scheduler_metadata": Reset(_fresh_flashmla_sched_meta,
                                                       label="FlashMLASchedMeta")}
        if q_tokens is None:
            raise ValueError("FlashMLA with an FP8 KV cache needs num_q_tokens_per_head_k")
        nested["decode.scheduler_metadata"], _ = load_metadata_class(
            _SCHED_META.module, _SCHED_META.qualname
        )
        tiles = "decode.scheduler_metadata.tile_scheduler_metadata"
        splits = "decode.scheduler_metadata.num_splits"
        return {
            "decode.scheduler_metadata.have_initialized": HostDerive(_false, (), formula="False"),
            "decode.scheduler_metadata.config": HostDerive(_none, (), formula="None"),
            tiles: Recompute(
                FlashMLAFp8TileSchedule(q_tokens, tile_compute), ("decode.seq_lens",),
                also=(splits,),
            ),
            splits: WrittenBy(tiles),
        }
    if variant == "flashattn_mla":
        schedule: Rule = (
            Recompute(
                FlashAttnSchedule(flash_attn_compute),
                ("decode.seq_lens", "decode.query_start_loc", "decode.max_seq_len"),
            )
            if flash_attn_compute is not None
            else Unsupported(
                "FA3 scheduler metadata needs the builder's head configuration: "
                "pass flash_attn_compute (the vLLM plugin binds it per builder)"
            )
        )
        return {
            "decode.query_start_loc": Alias("query_start_loc"),
            "decode.max_query_len": HostConstant(),
            "decode.max_seq_len": max_seq_len_rule(policy, dcp),
            "decode.scheduler_metadata": schedule,
            "decode.max_num_splits": HostConstant(),
        }
    if variant == "flashinfer_mla":
        return {
            "decode.flattened_block_table": Invalidate(),
            "decode.flattened_seq_lens": Invalidate(),
            "decode.flattened_row_req": Invalidate(),
            "decode.query_len": HostConstant(),
            "decode.query_start_loc": Alias("query_start_loc"),
            "decode.max_query_len": HostConstant(),
        }
    return {}
