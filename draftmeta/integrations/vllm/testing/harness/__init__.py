"""Construct vLLM's real attention metadata builders on a CPU-only machine, or on a GPU.

Tests and benchmarks use this module to run vLLM's own ``build()`` code, not imitations
of it. It creates a tiny DeepSeek-V3-style :class:`~vllm.config.VllmConfig` offline, constructs
the builders that work without a GPU (``CPU_MLA``, ``AMX_MLA``, ``TRITON_MLA``, the DeepSeek-V3.2
indexer), describes a decode-only batch (query length 1 per request) as a vLLM
``CommonAttentionMetadata`` that aliases the caller's tensors, and builds metadata from it.
After :func:`use_device` ``("cuda")`` the same functions run vLLM on its CUDA platform, where the
builders that need a GPU construct too (``FLASHMLA``, ``FLASH_ATTN_MLA``; any MLA backend of
vLLM's registry through a :class:`~draftmeta.integrations.vllm.catalogue.HarnessRecipe`), inside
vLLM's distributed state for one rank as vLLM's GPU runner has it (:func:`one_rank_world`).

Importing this package does not import vLLM. Every function that needs vLLM first calls
:func:`prepare_environment`, which sets the variables vLLM needs on the device it targets (the
CPU unless :func:`use_device` said otherwise).

Its names are used through the package (``harness.make_builder(...)``); each is defined in the
module of its part:

* :mod:`~draftmeta.integrations.vllm.testing.harness.environment`: where vLLM runs, and its
  environment variables (:func:`use_device`, :func:`prepare_environment`);
* :mod:`~draftmeta.integrations.vllm.testing.harness.configs`: the tiny models and vLLM's
  configs of them (:func:`make_vllm_config`, :func:`cached_vllm_config`);
* :mod:`~draftmeta.integrations.vllm.testing.harness.world`: vLLM's distributed state stood in
  for: the DCP group (:func:`dcp_group`), the one-rank world (:func:`one_rank_world`);
* :mod:`~draftmeta.integrations.vllm.testing.harness.builders`: vLLM's builders constructed
  (:func:`make_builder`, :func:`make_attention_builder`);
* :mod:`~draftmeta.integrations.vllm.testing.harness.metadata`: a batch described to vLLM and
  built (:func:`make_common_metadata`, :func:`build_metadata`).

>>> cfg = make_vllm_config(max_model_len=1024, block_size=16)  # doctest: +SKIP
>>> builder = make_builder("TRITON_MLA", cfg, block_size=16)  # doctest: +SKIP
>>> cad = make_common_metadata(  # doctest: +SKIP
...     seq_lens=seq_lens, positions=positions, slot_mapping=slots,
...     block_table=block_table, query_start_loc=qsl, max_seq_len=100, num_reqs=3)
>>> meta = build_metadata(builder, cad)  # doctest: +SKIP
"""

from __future__ import annotations

from draftmeta.integrations.vllm.testing.harness.builders import (
    INDEXER_BLOCK_SIZE,
    builder_names,
    make_attention_builder,
    make_builder,
    say_draft_tokens,
)
from draftmeta.integrations.vllm.testing.harness.configs import (
    cached_vllm_config,
    make_vllm_config,
)
from draftmeta.integrations.vllm.testing.harness.environment import (
    prepare_environment,
    target_device,
    use_device,
)
from draftmeta.integrations.vllm.testing.harness.metadata import (
    build_for_capture,
    build_metadata,
    common_metadata_for,
    make_common_metadata,
)
from draftmeta.integrations.vllm.testing.harness.world import (
    dcp_group,
    dcp_local_seq_lens,
    one_rank_world,
    release_one_rank_world,
)

__all__ = [
    "INDEXER_BLOCK_SIZE",
    "build_for_capture",
    "build_metadata",
    "builder_names",
    "cached_vllm_config",
    "common_metadata_for",
    "dcp_group",
    "dcp_local_seq_lens",
    "make_attention_builder",
    "make_builder",
    "make_common_metadata",
    "make_vllm_config",
    "one_rank_world",
    "prepare_environment",
    "release_one_rank_world",
    "say_draft_tokens",
    "target_device",
    "use_device",
]
