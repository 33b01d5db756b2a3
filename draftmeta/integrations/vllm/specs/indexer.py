"""The spec factories of vLLM's DeepSeek-V3.2 indexer and K-pool tail builders: the installed
release's classes, the live builder's block size and DeepGEMM's kernel handed to
:mod:`draftmeta.backends.indexer`."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from draftmeta.advance import HostBound
from draftmeta.backends import indexer
from draftmeta.backends.hooks import PagedMqaCompute
from draftmeta.integrations.vllm.catalogue.classes import ClassRef, load_metadata_class
from draftmeta.spec import DraftSpec
from draftmeta.spec_cache import spec_cache

__all__ = [
    "INDEXER_BUILDER",
    "INDEXER_DECODE",
    "INDEXER_METADATA",
    "KPOOL_TAIL_BUILDER",
    "IndexerSpec",
    "KpoolTailSpec",
    "deep_gemm_kernel",
    "installed_indexer_spec",
    "installed_kpool_tail_spec",
]

_MODULE = "vllm.v1.attention.backends.mla.indexer"
INDEXER_BUILDER = ClassRef(_MODULE, "DeepseekV32IndexerMetadataBuilder")
"""vLLM's indexer metadata builder."""
INDEXER_METADATA = ClassRef(_MODULE, "DeepseekV32IndexerMetadata")
"""The indexer metadata class."""
INDEXER_DECODE = ClassRef(_MODULE, "DeepSeekV32IndexerDecodeMetadata")
"""Its decode part."""
KPOOL_TAIL_BUILDER = ClassRef(_MODULE, "KpoolTailMetadataBuilder")
"""vLLM's builder of the storage-only K-pool tail cache's metadata (GLM-5.3-Flash)."""


def _deep_gemm_schedule(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata

    result = get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)
    assert isinstance(result, torch.Tensor)
    return result


def deep_gemm_kernel(buffer: torch.Tensor) -> PagedMqaCompute | None:
    """DeepGEMM's paged-MQA schedule for a buffer on CUDA where DeepGEMM is installed, else
    ``None`` (the buffer is left as it is), exactly as vLLM's builder decides
    (``is_cuda() and has_deep_gemm()``)."""
    if buffer.is_cuda:
        try:
            from vllm.utils.deep_gemm import has_deep_gemm

            if has_deep_gemm():
                return _deep_gemm_schedule
        except ImportError:
            pass
    return None


@spec_cache
def installed_indexer_spec(
    *,
    host_bound: HostBound = "advance",
    dcp: bool = False,
    block_kv: int = 64,
    schedule_compute: PagedMqaCompute | None = None,
    name: str = "INDEXER",
) -> DraftSpec[Any]:
    """The indexer's spec (:func:`draftmeta.backends.indexer.indexer_spec`) against the
    installed vLLM's classes.

    Args:
        host_bound: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        dcp: decode context parallelism > 1.
        block_kv: the indexer cache's block size, for the DeepGEMM schedule.
        schedule_compute: the paged-MQA schedule function (default: DeepGEMM on CUDA where
            installed, :func:`deep_gemm_kernel`; elsewhere the buffer is left alone, as vLLM
            does).
        name: the builder's catalogue name, first part of the spec's name.
    """
    metadata, _ = load_metadata_class(INDEXER_METADATA.module, INDEXER_METADATA.qualname)
    decode, _ = load_metadata_class(INDEXER_DECODE.module, INDEXER_DECODE.qualname)
    return indexer.indexer_spec(metadata, decode, host_bound=host_bound, dcp=dcp,
                                block_kv=block_kv, schedule_compute=schedule_compute,
                                schedule_kernel=deep_gemm_kernel, name=name)


@spec_cache
def installed_kpool_tail_spec(
    *, kpool: int = 64, host_bound: HostBound = "advance", name: str = "KPOOL_TAIL"
) -> DraftSpec[Any]:
    """The K-pool tail's spec (:func:`draftmeta.backends.indexer.kpool_tail_spec`) against the
    installed vLLM's indexer metadata class."""
    metadata, _ = load_metadata_class(INDEXER_METADATA.module, INDEXER_METADATA.qualname)
    return indexer.kpool_tail_spec(metadata, kpool=kpool, host_bound=host_bound, name=name)


@attrs.frozen
class IndexerSpec:
    """The catalogue's spec factory for the DeepSeek-V3.2 indexer builder."""

    def __call__(
        self, *, name: str, host_bound: HostBound = "advance", dcp: bool = False,
        builder: Any = None,
    ) -> DraftSpec[Any]:
        """Declare :func:`installed_indexer_spec` (the indexer cache's block size from
        ``builder``)."""
        block_kv = builder.kv_cache_spec.block_size if builder is not None else 64
        return installed_indexer_spec(host_bound=host_bound, dcp=dcp, block_kv=block_kv,
                                      name=name)


@attrs.frozen
class KpoolTailSpec:
    """The catalogue's spec factory for the K-pool tail builder: the pool size is the builder's.

    Without a builder (``draftmeta explain``) the pool size is 64; with one it is always the
    builder's ``kv_cache_spec.block_size``, so a spec can never disagree with the builder it
    updates.
    """

    def __call__(
        self, *, name: str, host_bound: HostBound = "advance", dcp: bool = False,
        builder: Any = None,
    ) -> DraftSpec[Any]:
        """Declare :func:`installed_kpool_tail_spec` for ``builder``'s pool size (its
        ``no_dcp`` precondition refuses DCP > 1 at run time)."""
        kpool = builder.kv_cache_spec.block_size if builder is not None else 64
        return installed_kpool_tail_spec(kpool=kpool, host_bound=host_bound, name=name)
