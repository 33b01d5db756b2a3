"""The out-of-tree backend: vLLM's CPU MLA backend with one more step-dependent field.

The builder fills ``seq_lens_i64`` (the sequence lengths as int64) into a buffer of its own at
every build, and the decode reads the lengths from it. Rebuilt at every draft step, that is
correct; updated in place, the field must be refreshed too, or the kernel reads the first step's
lengths. The spec in ``spec.py`` says so in one rule.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonDecodeMetadata,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
)
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend, CPUMLAImpl


@dataclasses.dataclass
class OotMLAMetadata(MLACommonMetadata[MLACommonDecodeMetadata]):
    """CPU MLA metadata with the decode requests' lengths as int64, in the builder's own
    buffer."""

    seq_lens_i64: torch.Tensor | None = None


class OotMLAMetadataBuilder(MLACommonMetadataBuilder[OotMLAMetadata]):
    """Builds :class:`OotMLAMetadata`: the common MLA build, then ``seq_lens_i64``."""

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: torch.device, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device,
                         metadata_cls=OotMLAMetadata, **kwargs)
        rows = vllm_config.scheduler_config.max_num_seqs
        self.seq_lens_i64 = torch.zeros(rows, dtype=torch.int64, device=device)

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> OotMLAMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        if metadata.decode is not None:  # the decode requests' lengths, in the own buffer
            lengths = metadata.decode.seq_lens
            metadata.seq_lens_i64 = self.seq_lens_i64[: lengths.shape[0]]
            metadata.seq_lens_i64.copy_(lengths)
        return metadata


class OotCPUMLAImpl(CPUMLAImpl):
    """CPU MLA's decode, reading the lengths from ``seq_lens_i64``."""

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: torch.Tensor,
                    attn_metadata: Any, layer: Any) -> Any:
        decode = attn_metadata.decode
        assert decode is not None and attn_metadata.seq_lens_i64 is not None
        reading = copy.copy(attn_metadata)
        reading.decode = dataclasses.replace(decode, seq_lens=attn_metadata.seq_lens_i64)
        return super().forward_mqa(q, kv_c_and_k_pe_cache, reading, layer)


class OotCPUMLABackend(CPUMLABackend):
    """The backend vLLM's registry holds in ``CPU_MLA``'s place."""

    @staticmethod
    def get_builder_cls() -> type[OotMLAMetadataBuilder]:
        return OotMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type[OotCPUMLAImpl]:
        return OotCPUMLAImpl
