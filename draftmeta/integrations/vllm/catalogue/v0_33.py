"""vLLM 0.33: every MLA / indexer builder, with both draft paths.

The older proposer (``vllm/v1/spec_decode/llm_base_proposer.py``) calls ``build_for_drafting``
at every draft index; the new runner calls ``update_draft_decode_metadata`` between draft steps
where every group's builder sets ``supports_draft_decode_metadata_update``. Class paths and
hook bodies read from the released wheel.
"""

from __future__ import annotations

from draftmeta.backends.amx import AMX_DECODE_ATTRIBUTES
from draftmeta.backends.mla import MLAFamily
from draftmeta.integrations.vllm.catalogue.classes import ClassRef
from draftmeta.integrations.vllm.catalogue.model import (
    BuilderEntry,
    HarnessRecipe,
    Install,
    Release,
    Upstream,
    class_ref,
)
from draftmeta.integrations.vllm.catalogue.reads import CarryOver
from draftmeta.integrations.vllm.specs.amx import amx_bound_rules
from draftmeta.integrations.vllm.specs.indexer import (
    INDEXER_BUILDER,
    INDEXER_DECODE,
    INDEXER_METADATA,
    KPOOL_TAIL_BUILDER,
    IndexerSpec,
    KpoolTailSpec,
)
from draftmeta.integrations.vllm.specs.mla import FLASHMLA_SCHED_META, MLASpec

__all__ = ["RELEASE"]

MLA = "vllm.model_executor.layers.attention.mla_attention"
BACKENDS = "vllm.v1.attention.backends.mla"
COMMON = class_ref(f"{MLA}.MLACommonMetadata")
COMMON_DECODE = class_ref(f"{MLA}.MLACommonDecodeMetadata")

MLA_DECODE_READS = CarryOver(
    views=("seq_lens", "slot_mapping", "block_table_tensor", "query_start_loc",
           "dcp_local_seq_lens"),
    values=("num_reqs", "num_actual_tokens", "max_query_len", "causal"),
    contents=("query_start_loc_cpu", "is_prefilling"),
)
"""What ``MLACommonMetadataBuilder.build`` reads of a decode-only batch (besides
``max_seq_len``, which the spec refreshes): ``split_decodes_and_prefills`` reads the host
structure, ``query_start_loc_cpu`` and ``is_prefilling``; ``_build_decode`` views the buffers.
``seq_lens_cpu_upper_bound`` feeds only the prefill part. Not for ``AMX_MLA``: its spec keeps
the block-table expansion ``decode.req_to_token`` unchanged within a loop, which another loop's
block table would leave stale."""


def _mla(
    name: str,
    builder: str,
    family: MLAFamily,
    metadata: ClassRef = COMMON,
    decode: ClassRef | None = COMMON_DECODE,
    *,
    hook: Upstream = "none",
    harness: HarnessRecipe | None = None,
    spec: MLASpec | None = None,
    carry_over: CarryOver | None = None,
    gpu_harness: HarnessRecipe | None = None,
    upstream_hook_without_dcp: bool = False,
) -> BuilderEntry:
    factory = spec or MLASpec(family, metadata, decode)
    classes: tuple[ClassRef, ...] = (metadata,) if decode is None else (metadata, decode)
    if family == "flashmla":
        classes += (FLASHMLA_SCHED_META,)
    return BuilderEntry(name, class_ref(builder), factory, hook, harness, classes, carry_over,
                        gpu_harness, upstream_hook_without_dcp=upstream_hook_without_dcp,
                        checked_in_ci=harness is not None)


def _family(module: str, stem: str) -> tuple[ClassRef, ClassRef]:
    return (class_ref(f"{BACKENDS}.{module}.{stem}Metadata"),
            class_ref(f"{BACKENDS}.{module}.{stem}DecodeMetadata"))


def _sparse(module: str, stem: str) -> ClassRef:
    return class_ref(f"{BACKENDS}.{module}.{stem}Metadata")


RELEASE = Release(
    version="0.33",
    distributions=("vllm",),
    paths=("older_proposer", "hook"),
    install=Install(
        venv=".venv",
        about="The CUDA build of vLLM, whose Python code also imports on a machine without a GPU.",
    ),
    builders=(
        _mla("CPU_MLA", f"{MLA}.MLACommonMetadataBuilder", "dense",
             harness=HarnessRecipe("mla", class_ref(f"{BACKENDS}.cpu_mla.CPUMLABackend")),
             carry_over=MLA_DECODE_READS),
        _mla("AMX_MLA", f"{BACKENDS}.amx_mla.AMXMLAMetadataBuilder", "dense",
             spec=MLASpec("dense", COMMON, COMMON_DECODE, attributes=AMX_DECODE_ATTRIBUTES,
                          bound_rules=amx_bound_rules),
             harness=HarnessRecipe("mla", class_ref(f"{BACKENDS}.amx_mla.AMXMLABackend"),
                                   block_size=32)),
        _mla("TRITON_MLA", f"{BACKENDS}.triton_mla.TritonMLAMetadataBuilder", "dense",
             hook="no-op", upstream_hook_without_dcp=True,
             harness=HarnessRecipe("mla", class_ref(f"{BACKENDS}.triton_mla.TritonMLABackend")),
             carry_over=MLA_DECODE_READS),
        _mla("CUTLASS_MLA", f"{BACKENDS}.cutlass_mla.CutlassMLAMetadataBuilder", "dense"),
        _mla("TOKENSPEED_MLA", f"{BACKENDS}.tokenspeed_mla.TokenspeedMLAMetadataBuilder",
             "dense"),
        _mla("FLASHMLA", f"{BACKENDS}.flashmla.FlashMLAMetadataBuilder", "flashmla",
             *_family("flashmla", "FlashMLA"),
             gpu_harness=HarnessRecipe("mla", class_ref(f"{BACKENDS}.flashmla.FlashMLABackend"),
                                       block_size=64)),
        _mla("FLASH_ATTN_MLA", f"{BACKENDS}.flashattn_mla.FlashAttnMLAMetadataBuilder",
             "flashattn_mla", *_family("flashattn_mla", "FlashAttnMLA"),
             gpu_harness=HarnessRecipe(
                 "mla", class_ref(f"{BACKENDS}.flashattn_mla.FlashAttnMLABackend"))),
        _mla("FLASHINFER_MLA", f"{BACKENDS}.flashinfer_mla.FlashInferMLAMetadataBuilder",
             "flashinfer_mla", *_family("flashinfer_mla", "FlashInferMLA")),
        _mla("FLASHMLA_SPARSE", f"{BACKENDS}.flashmla_sparse.FlashMLASparseMetadataBuilder",
             "flashmla_sparse", _sparse("flashmla_sparse", "FlashMLASparse"), None),
        _mla("FLASH_ATTN_MLA_SPARSE",
             f"{BACKENDS}.flashattn_mla_sparse.FlashAttnMLASparseMetadataBuilder",
             "sparse", _sparse("flashattn_mla_sparse", "FlashAttnMLASparse"), None,
             hook="refresh"),
        _mla("FLASHINFER_MLA_SPARSE",
             f"{BACKENDS}.flashinfer_mla_sparse.FlashInferMLASparseTRTLLMMetadataBuilder",
             "sparse", _sparse("flashinfer_mla_sparse", "FlashInferMLASparse"), None,
             hook="refresh"),
        _mla("FLASHINFER_MLA_SPARSE_SM120",
             f"{BACKENDS}.flashinfer_mla_sparse.FlashInferMLASparseMetadataBuilder",
             "sparse", _sparse("flashinfer_mla_sparse", "FlashInferMLASparse"), None),
        BuilderEntry("INDEXER", INDEXER_BUILDER, IndexerSpec(), "refresh",
                     HarnessRecipe("indexer", block_size=64), (INDEXER_METADATA, INDEXER_DECODE),
                     checked_in_ci=True),
        BuilderEntry("KPOOL_TAIL", KPOOL_TAIL_BUILDER, KpoolTailSpec(), "refresh",
                     HarnessRecipe("kpool_tail", block_size=64), (INDEXER_METADATA,),
                     hook_declined="its metadata does not reference the block table "
                     "draftmeta's spec derives the slot from; vLLM's own hook serves it",
                     checked_in_ci=True),
    ),
)
"""vLLM 0.33's builders."""
