"""The specs of MLA attention metadata in the chain-drafting decode phase, one rule family per
builder kind.

Engine-neutral: :func:`mla_spec` is declared against the metadata classes handed in (a binding
resolves them for its release: :mod:`draftmeta.integrations.vllm.specs.mla` for vLLM, from the
installed package or its recorded field lists), so a field added by a future release makes the
declaration fail with the field's name; the kernels a family's hooks call are handed in too.

Most step-dependent fields are views of the runner's buffers (``seq_lens``, ``slot_mapping``,
the block table; :mod:`draftmeta.backends.views`) and need no work beyond a storage check; what
the specs add is the host ``max_seq_len``, DCP-local lengths (recomputed, never incremented), the
sparse backends' token-to-request map, FlashMLA's scheduler object (reset each step, or its FP8
tile schedule refilled in place) and FlashAttention 3's scheduler metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from draftmeta.advance import HostBound
from draftmeta.backends.common import decode_only, max_seq_len_rule
from draftmeta.backends.hooks import (
    FlashAttnCompute,
    FlashAttnSchedule,
    FlashMLAFp8TileSchedule,
    TileCompute,
)
from draftmeta.backends.views import FLAT, mla_views
from draftmeta.conditions import IsNone, Precondition
from draftmeta.derivations import TokenToRequest
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

__all__ = ["FAMILIES", "FamilyInputs", "MLAFamily", "MLAFamilyRules", "is_sparse", "mla_spec"]

MLAFamily = str
"""The name of an MLA rule family (a key of :data:`FAMILIES`): which fields a builder's metadata
adds to the common MLA layout, and how each moves between draft steps."""


@attrs.frozen
class FamilyInputs:
    """What a family's rules may need, handed in by the binding (see :func:`mla_spec`'s
    arguments of the same names).

    Attributes:
        name: the builder's name, for messages.
        host_bound: how the host ``max_seq_len`` moves.
        dcp: decode context parallelism > 1.
        fp8_kv_cache: an FP8 KV cache.
        num_q_tokens_per_head_k: FlashMLA FP8: ``max_query_len * num_q_heads``.
        scheduler: FlashMLA FP8: the scheduler object's class.
        new_scheduler: FlashMLA: makes a fresh, unfilled scheduler object.
        tile_compute: FlashMLA FP8: the tile-schedule kernel.
        flash_attn_compute: FlashAttn-MLA: the FA3 scheduler.
    """

    name: str
    host_bound: HostBound = "advance"
    dcp: bool = False
    fp8_kv_cache: bool = False
    num_q_tokens_per_head_k: int | None = None
    scheduler: type | None = None
    new_scheduler: Callable[[], object] | None = None
    tile_compute: TileCompute | None = None
    flash_attn_compute: FlashAttnCompute | None = None


def _nothing(inputs: FamilyInputs, nested: dict[str, type]) -> dict[str, Rule]:
    return {}


def _no_preconditions(inputs: FamilyInputs) -> list[Precondition]:
    return []


@attrs.frozen
class MLAFamilyRules:
    """One MLA rule family, declared: what its builders' metadata adds and how it moves.

    Attributes:
        sparse: sparse MLA (no decode part; a per-token request map and flat lengths at the top
            level) rather than dense (a ``decode`` part with its block table and lengths).
        rules: the family's own rules beside the common layout's (for a dense family, its
            ``decode.*`` extras), from what the binding handed in; it may declare nested classes
            in the dict it is given; it raises ``ValueError`` naming a missing piece.
        preconditions: what the family's rules need while drafting.
    """

    sparse: bool = False
    rules: Callable[[FamilyInputs, dict[str, type]], dict[str, Rule]] = _nothing
    preconditions: Callable[[FamilyInputs], list[Precondition]] = _no_preconditions


def _common_rules(host_bound: HostBound, dcp: bool) -> dict[str, Rule]:
    """``MLACommonMetadata``'s own top-level fields (the ``decode`` part aside)."""
    views = mla_views(dcp)  # the top-level views are the same in every MLA layout
    return {
        "num_reqs": HostConstant(),
        "max_query_len": HostConstant(),
        "max_seq_len": max_seq_len_rule(host_bound, dcp),
        "num_actual_tokens": HostConstant(),
        "query_start_loc": views.rule("query_start_loc"),
        "slot_mapping": views.rule("slot_mapping"),
        "num_decodes": HostConstant(),
        "num_decode_tokens": HostConstant(),
        "num_prefills": HostConstant(),
        "causal": HostConstant(),
        "head_dim": HostConstant(),
        "prefill": Unchanged(),
    }


def _dense_rules(host_bound: HostBound, dcp: bool) -> dict[str, Rule]:
    views = mla_views(dcp)
    return {
        **_common_rules(host_bound, dcp),
        "decode.block_table": views.rule("decode.block_table"),
        "decode.seq_lens": views.rule("decode.seq_lens"),
        "decode.dcp_tot_seq_lens": views.rule("decode.dcp_tot_seq_lens"),
    }


def _sparse_rules(host_bound: HostBound) -> dict[str, Rule]:
    return {
        **_common_rules(host_bound, False),
        "decode": Unchanged(),
        "block_table": FLAT.rule("block_table"),
        "req_id_per_token": Derive(TokenToRequest(), ("state.query_start_loc", "state.num_reqs")),
        "seq_lens": FLAT.rule("seq_lens"),
        "block_size": HostConstant(),
        "topk_tokens": HostConstant(),
        "decode_max_query_len": HostConstant(),
        "prefill_max_seq_len": HostConstant(),
        "cp_kv_cache_interleave_size": HostConstant(),
    }


def mla_spec(
    family: MLAFamily,
    metadata: type,
    decode: type | None,
    *,
    name: str,
    host_bound: HostBound = "advance",
    dcp: bool = False,
    fp8_kv_cache: bool = False,
    num_q_tokens_per_head_k: int | None = None,
    scheduler: type | None = None,
    new_scheduler: Callable[[], object] | None = None,
    tile_compute: TileCompute | None = None,
    flash_attn_compute: FlashAttnCompute | None = None,
    extra_rules: tuple[tuple[str, Rule], ...] = (),
    extra_preconditions: tuple[Precondition, ...] = (),
    attributes: tuple[tuple[str, object], ...] = (),
    bound: tuple[tuple[str, Rule], ...] = (),
) -> DraftSpec[Any]:
    """The spec of one MLA builder's decode metadata, against the classes handed in.

    Args:
        family: which rules its decode part needs.
        metadata: the metadata class it builds.
        decode: the decode-part class (``None`` for sparse families, which leave it unset).
        name: the builder's name (vLLM's attention-backend name, ``"TRITON_MLA"``), first part
            of the spec's name.
        host_bound: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        dcp: decode context parallelism > 1: ``decode.seq_lens`` are the DCP-local lengths,
            recomputed by the loop from the global ones every step, and ``max_seq_len`` is the
            per-rank bound.
        fp8_kv_cache: FlashMLA with an FP8 KV cache: the tile schedule and ``num_splits`` are
            refilled in place (needs ``num_q_tokens_per_head_k`` and ``scheduler``).
        num_q_tokens_per_head_k: FlashMLA FP8 only: ``max_query_len * num_q_heads``.
        scheduler: FlashMLA FP8 only: the scheduler object's class (its fields are declared).
        new_scheduler: FlashMLA without FP8: makes a fresh, unfilled scheduler object (the
            decode's first kernel call fills it on the device).
        tile_compute: FlashMLA FP8 only: the tile-schedule kernel; without it every update
            refuses in its checks (nothing written).
        flash_attn_compute: FlashAttn-MLA only: the FA3 scheduler bound to the builder's head
            configuration; without it every update refuses in its checks (nothing written).
        extra_rules: rules for fields a release adds (``(path, rule)`` pairs).
        extra_preconditions: conditions those fields need while drafting.
        attributes: attributes a builder sets on the built object outside its class's fields
            (``(path, annotation)`` pairs; see :class:`~draftmeta.spec.DraftSpec`).
        bound: rules bound to a live builder, applied last.

    Raises:
        ValueError: a family's handed-in piece is missing (the message names it).
        draftmeta.SpecError: the classes do not match the declaration.
    """
    try:
        family_rules = FAMILIES[family]
    except KeyError:
        raise ValueError(f"{name}: no MLA rule family {family!r}; the families: "
                         f"{', '.join(FAMILIES)}") from None
    inputs = FamilyInputs(name, host_bound, dcp, fp8_kv_cache, num_q_tokens_per_head_k,
                          scheduler, new_scheduler, tile_compute, flash_attn_compute)
    nested: dict[str, type] = {}
    preconditions: list[Precondition]
    if family_rules.sparse:
        rules = _sparse_rules(host_bound)
        preconditions = [IsNone("decode", name="no_dense_decode_part"),
                         *decode_only(dcp=False, decode_part=False)]
        if dcp:
            rules["seq_lens"] = Unsupported("sparse MLA under DCP is not declared by draftmeta")
    else:
        if decode is None:
            raise ValueError(f"{name}: a dense MLA spec needs its decode class")
        nested["decode"] = decode
        rules = _dense_rules(host_bound, dcp)
        preconditions = decode_only(dcp=dcp)
    rules.update(family_rules.rules(inputs, nested))
    preconditions.extend(family_rules.preconditions(inputs))
    rules.update(extra_rules)
    rules.update(bound)
    preconditions.extend(extra_preconditions)
    suffix = (".dcp" if dcp else "") + (".fp8" if fp8_kv_cache else "") + f".{host_bound}"
    return DraftSpec(
        metadata,
        rules,
        name=f"{name}{suffix}",
        preconditions=preconditions,
        nested=nested,
        attributes=dict(attributes),
    )


def is_sparse(family: MLAFamily) -> bool:
    """Whether a family is sparse MLA (no decode part; a per-token request map)."""
    return FAMILIES[family].sparse


def _flashmla(inputs: FamilyInputs, nested: dict[str, type]) -> dict[str, Rule]:
    """FlashMLA's scheduler object: reset each step (filled on the device by the decode's
    first kernel call), or with an FP8 cache its tile schedule refilled in place."""
    if not inputs.fp8_kv_cache:
        if inputs.new_scheduler is None:
            raise ValueError(f"{inputs.name}: FlashMLA's spec resets its scheduler object each "
                             "step; hand in new_scheduler (the binding's maker of a fresh one)")
        return {"decode.scheduler_metadata": Reset(inputs.new_scheduler,
                                                   label="FlashMLASchedMeta",
                                                   filled_on_device=True)}
    if inputs.num_q_tokens_per_head_k is None:
        raise ValueError("FlashMLA with an FP8 KV cache needs num_q_tokens_per_head_k")
    if inputs.scheduler is None:
        raise ValueError(f"{inputs.name}: FlashMLA with an FP8 KV cache declares its scheduler "
                         "object's fields; hand in scheduler (FlashMLASchedMeta's class)")
    nested["decode.scheduler_metadata"] = inputs.scheduler
    tiles = "decode.scheduler_metadata.tile_scheduler_metadata"
    splits = "decode.scheduler_metadata.num_splits"
    return {
        "decode.scheduler_metadata.have_initialized": HostSet(False),
        "decode.scheduler_metadata.config": Unchanged(),
        tiles: Recompute(
            FlashMLAFp8TileSchedule(inputs.num_q_tokens_per_head_k, inputs.tile_compute),
            ("decode.seq_lens",), also=(splits,),
        ),
        splits: WrittenBy(tiles),
    }


def _flashmla_preconditions(inputs: FamilyInputs) -> list[Precondition]:
    # FlashMLA's FP8 decode reads only the two tile tensors; nothing configures the object
    # (vLLM builds it with config None), so config stays None between steps
    if inputs.fp8_kv_cache:
        return [IsNone("decode.scheduler_metadata.config", name="fp8_schedule_not_configured")]
    return []


def _flashattn_mla(inputs: FamilyInputs, nested: dict[str, type]) -> dict[str, Rule]:
    """FlashAttention 3's ahead-of-time scheduler metadata, recomputed every step."""
    schedule = Recompute(
        FlashAttnSchedule(inputs.flash_attn_compute),
        ("decode.seq_lens", "decode.query_start_loc", "decode.max_seq_len",
         "decode.max_num_splits"),
    )
    return {
        "decode.query_start_loc": Alias("query_start_loc"),
        "decode.max_query_len": HostConstant(),
        "decode.max_seq_len": max_seq_len_rule(inputs.host_bound, inputs.dcp),
        "decode.scheduler_metadata": schedule,
        "decode.max_num_splits": HostConstant(),
    }


def _flashinfer_mla(inputs: FamilyInputs, nested: dict[str, type]) -> dict[str, Rule]:
    """FlashInfer's flattened tables, filled lazily by its kernel: invalidated every step."""
    return {
        "decode.flattened_block_table": Invalidate(),
        "decode.flattened_seq_lens": Invalidate(),
        "decode.flattened_row_req": Invalidate(),
        "decode.query_len": HostConstant(),
        "decode.query_start_loc": Alias("query_start_loc"),
        "decode.max_query_len": HostConstant(),
    }


def _flashmla_sparse(inputs: FamilyInputs, nested: dict[str, type]) -> dict[str, Rule]:
    """Sparse FlashMLA's FP8 switch and extra metadata (a bf16 cache only)."""
    if inputs.fp8_kv_cache:
        return {"fp8_use_mixed_batch": HostConstant(), "fp8_extra_metadata": Unsupported(
            "FP8 sparse FlashMLA keeps a scheduler object inside a union-typed field")}
    return {"fp8_use_mixed_batch": HostConstant(), "fp8_extra_metadata": Unchanged()}


def _flashmla_sparse_preconditions(inputs: FamilyInputs) -> list[Precondition]:
    if inputs.fp8_kv_cache:
        return []
    return [IsNone("fp8_extra_metadata", name="bf16_kv_cache")]


FAMILIES: dict[MLAFamily, MLAFamilyRules] = {
    "dense": MLAFamilyRules(),
    "flashmla": MLAFamilyRules(rules=_flashmla, preconditions=_flashmla_preconditions),
    "flashattn_mla": MLAFamilyRules(rules=_flashattn_mla),
    "flashinfer_mla": MLAFamilyRules(rules=_flashinfer_mla),
    "sparse": MLAFamilyRules(sparse=True),
    "flashmla_sparse": MLAFamilyRules(sparse=True, rules=_flashmla_sparse,
                                      preconditions=_flashmla_sparse_preconditions),
}
"""The MLA rule families by name: a builder kind's fields beyond the common layout, one
declaration each. A new family is one entry (:class:`MLAFamilyRules`), from any module."""
