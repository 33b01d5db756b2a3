"""vLLM's real metadata builders, constructed for the harness's configs: by a catalogue entry's
harness recipe (or one handed in) for the MLA backends, the DeepSeek-V3.2 indexer and the K-pool
tail (:func:`make_builder`), by vLLM's backend registry for its standard attention backends
(:func:`make_attention_builder`), each with the attention layer its builder reads registered
once per config."""

from __future__ import annotations

import dataclasses
import os
import types
from typing import TYPE_CHECKING, Any, Final

import torch

from draftmeta.integrations.vllm.testing.harness.configs import cached_attention_config
from draftmeta.integrations.vllm.testing.harness.environment import prepare_environment
from draftmeta.integrations.vllm.testing.harness.world import dcp_group, one_rank_world

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionMetadataBuilder

    from draftmeta.integrations.vllm.catalogue import HarnessRecipe

__all__ = ["INDEXER_BLOCK_SIZE", "builder_names", "make_attention_builder", "make_builder",
           "say_draft_tokens"]

INDEXER_BLOCK_SIZE: Final = 64
"""The block size DeepSeek-V3.2 runs its indexer KV cache with (FlashMLA-sparse forces 64)."""

_MLA_LAYER_PREFIX: Final = "draftmeta_harness.layers.0.self_attn.attn"
_INDEXER_LAYER_NAME: Final = "draftmeta_harness.layers.0.self_attn.indexer.k_cache"


def _recipe(name: str) -> HarnessRecipe:
    from draftmeta.integrations.vllm.catalogue import current_release

    entry = current_release().entry(name)
    if entry.harness is None and entry.gpu_harness is not None and _on_cuda():
        return entry.gpu_harness
    if entry.harness is None:
        raise ValueError(
            f"{name} does not build on a machine without a GPU; builders that do: "
            f"{', '.join(builder_names())}"
        )
    return entry.harness


def _on_cuda() -> bool:
    """Whether the harness was pointed at CUDA (``VLLM_TARGET_DEVICE=cuda``: the GPU scripts
    replace :func:`prepare_environment`), where builders with a ``gpu_harness`` construct."""
    return os.environ.get("VLLM_TARGET_DEVICE") == "cuda"


def builder_names() -> tuple[str, ...]:
    """Builders of the installed release's catalogue that construct and build on a CPU."""
    from draftmeta.integrations.vllm.catalogue import current_release

    return tuple(b.name for b in current_release().builders if b.harness is not None)


def _mla_backend(name: str, recipe: HarnessRecipe) -> Any:
    import importlib

    backend = recipe.backend
    if backend is None:
        raise ValueError(f"{name}'s harness recipe names no attention backend")
    return getattr(importlib.import_module(backend.module), backend.qualname)


def _mla_layer(config: VllmConfig, name: str, backend: Any, device: torch.device) -> Any:
    """Return the config's MLA layer for backend ``name``, creating and registering it once.

    The constructor registers the layer in ``config.compilation_config.static_forward_context``
    (the builders read its MLA dims and prefill backend from there) and reads the current
    vLLM config, so the caller must hold ``set_current_vllm_config(config)``. A sparse backend
    (``is_sparse()``, DeepSeek-V3.2's) gets the shared top-k index buffer its layer reads, as
    vLLM's model makes it (``max_num_batched_tokens`` x ``index_topk``, int32, on ``device``).
    """
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    prefix = f"{_MLA_LAYER_PREFIX}.{name.lower()}"
    context = config.compilation_config.static_forward_context
    layer = context.get(prefix)
    if layer is not None:
        return layer
    hf = config.model_config.hf_text_config
    num_heads = int(hf.num_attention_heads)
    qk_nope, v_head = int(hf.qk_nope_head_dim), int(hf.v_head_dim)
    qk_rope = int(hf.qk_rope_head_dim)
    kv_lora_rank = int(hf.kv_lora_rank)
    sparse: dict[str, Any] = {}
    if backend.is_sparse():
        tokens = config.scheduler_config.max_num_batched_tokens
        sparse = {"use_sparse": True, "topk_indices_buffer": torch.empty(
            tokens, int(hf.index_topk), dtype=torch.int32, device=device)}
    # A plain Linear serves as kv_b_proj: no weights are loaded and no forward runs.
    kv_b_proj = torch.nn.Linear(kv_lora_rank, num_heads * (qk_nope + v_head), bias=False)
    return MLAAttention(
        num_heads=num_heads,
        scale=float(qk_nope + qk_rope) ** -0.5,
        qk_nope_head_dim=qk_nope,
        qk_rope_head_dim=qk_rope,
        v_head_dim=v_head,
        q_lora_rank=getattr(hf, "q_lora_rank", None),
        kv_lora_rank=kv_lora_rank,
        kv_b_proj=kv_b_proj,
        cache_config=config.cache_config,
        prefix=prefix,
        attn_backend=backend,
        **sparse,
    )


def _indexer_kv_cache_spec(config: VllmConfig, block_size: int) -> Any:
    """The indexer cache's spec, as ``DeepseekV32IndexerCache.get_kv_cache_spec`` makes it.

    The cache stores per token ``index_head_dim`` fp8 bytes plus one fp32 scale per 128 of them
    (128 + 4 = 132 bytes), typed uint8 (``vllm/model_executor/models/deepseek_v2.py``).
    """
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole

    index_head_dim = int(getattr(config.model_config.hf_text_config, "index_head_dim", 128))
    return MLAAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=index_head_dim + index_head_dim // 128 * 4,
        dtype=torch.uint8,
        cache_role=SparseCacheRole.INDEXER,
    )


class _ConfigWithDraftTokens:
    """A vLLM config that says K, the draft tokens per step; everything else is the wrapped
    config's."""

    def __init__(self, config: Any, k: int) -> None:
        self._config = config
        self.speculative_config = types.SimpleNamespace(num_speculative_tokens=k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def say_draft_tokens(builder: Any, k: int) -> None:
    """Make a harness builder's config say that its engine drafts ``k`` tokens per step, as an
    engine's config does (the harness's configs have no speculative config): where the older
    proposer path reads K (the last draft index of a loop, and whether any index follows the
    first)."""
    builder.vllm_config = _ConfigWithDraftTokens(builder.vllm_config, k)


def make_builder(
    name: str,
    config: VllmConfig,
    *,
    block_size: int,
    block_table_width: int | None = None,
    device: torch.device | str = "cpu",
    dcp_rank: int = 0,
    recipe: HarnessRecipe | None = None,
) -> AttentionMetadataBuilder[Any]:
    """Construct vLLM's real metadata builder ``name`` for ``config``.

    ``name`` is a catalogue name whose entry has a harness recipe (:func:`builder_names`; on
    CUDA, after
    :func:`~draftmeta.integrations.vllm.testing.harness.environment.use_device`, its GPU
    recipe too), or any name with ``recipe`` given: for MLA builders (``CPU_MLA``,
    ``AMX_MLA``, ``TRITON_MLA``) an ``MLAAttention`` layer with the recipe's backend is created
    (once per config and name, under ``set_current_vllm_config(config)``) and its kv-cache spec
    taken, with ``block_size`` put in; ``INDEXER`` and ``KPOOL_TAIL`` use the indexer cache's
    spec (132 x uint8 per token). Each call returns a new builder: builders own buffers that
    ``build()`` writes.

    Args:
        name: a catalogue builder name with a harness recipe.
        config: A config from
            :func:`~draftmeta.integrations.vllm.testing.harness.configs.make_vllm_config` or
            :func:`~draftmeta.integrations.vllm.testing.harness.configs.cached_vllm_config`.
        block_size: The kv-cache spec's block size (for INDEXER, usually
            :data:`INDEXER_BLOCK_SIZE`; AMX_MLA needs a multiple of 32).
        block_table_width: INDEXER only: the block-table width W its buffers are sized for;
            defaults to ``ceil(max_model_len / block_size)``.
        device: The builders' device; only the CPU works without a GPU. On CUDA the
            builder (and its layer) is made inside vLLM's distributed state for one rank, as
            vLLM's GPU runner makes it (:func:`one_rank_world`, once per process).
        dcp_rank: this builder's rank among the config's
            ``parallel_config.decode_context_parallel_size`` DCP ranks (:func:`dcp_group`
            answers for the group while the builder is constructed).
        recipe: how to build it, in place of its catalogue entry's (a backend of vLLM's
            registry outside the catalogue, or without a recipe there).

    Raises:
        ValueError: an unknown name, one that needs a GPU, a non-positive block size, or a
            rank outside the DCP group.
    """
    recipe = recipe if recipe is not None else _recipe(name)
    kind = recipe.kind
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    prepare_environment()
    from vllm.config import set_current_vllm_config

    dev = torch.device(device)
    if dev.type == "cuda":  # vLLM's GPU runner builds inside a distributed world
        one_rank_world(config)
    world = config.parallel_config.decode_context_parallel_size
    with set_current_vllm_config(config), dcp_group(world, dcp_rank):
        if kind == "kpool_tail":  # the GLM-5.3-Flash K-pool tail: block_size is the pool size
            from vllm.v1.attention.backends.mla.indexer import KpoolTailMetadataBuilder

            return KpoolTailMetadataBuilder(
                _indexer_kv_cache_spec(config, block_size), [_INDEXER_LAYER_NAME], config, dev
            )
        if kind == "indexer":
            from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

            if block_table_width is None:
                block_table_width = -(-config.model_config.max_model_len // block_size)
            return DeepseekV32IndexerMetadataBuilder(
                _indexer_kv_cache_spec(config, block_size),
                [_INDEXER_LAYER_NAME],
                config,
                dev,
                block_table_width=block_table_width,
            )
        layer = _mla_layer(config, name, _mla_backend(name, recipe), dev)
        spec = layer.get_kv_cache_spec(config)
        if spec.block_size != block_size:
            spec = dataclasses.replace(spec, block_size=block_size)
        builder_cls = layer.attn_backend.get_builder_cls()
        return builder_cls(spec, [layer.layer_name], config, dev)


def make_attention_builder(
    backend: str,
    *,
    max_model_len: int,
    block_size: int,
    cudagraph_mode: str | None = None,
    device: torch.device | str = "cpu",
) -> AttentionMetadataBuilder[Any]:
    """Construct the metadata builder of vLLM's standard (non-MLA) attention backend
    ``backend`` (a name of vLLM's backend registry, ``TRITON_ATTN``) for a tiny Llama, with a
    full-attention KV-cache spec of ``block_size``, on ``device``; configs are shared per
    argument tuple.

    Raises:
        ValueError: ``backend`` is an MLA backend, or not in vLLM's registry.
        Exception: whatever vLLM raises where the builder needs a GPU or a library this
            machine lacks (the caller says so).
    """
    prepare_environment()
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    try:
        backend_cls = AttentionBackendEnum[backend].get_class()
    except KeyError as exc:
        raise ValueError(f"{backend} is not in vLLM's backend registry") from exc
    if backend_cls.is_mla():
        raise ValueError(f"{backend} is an MLA backend: make_builder builds those")
    config = cached_attention_config(max_model_len, block_size, cudagraph_mode)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=64,
                             dtype=torch.bfloat16)
    with set_current_vllm_config(config):
        name, problem = _attention_layer(config, backend, backend_cls)
        try:
            builder: AttentionMetadataBuilder[Any] = backend_cls.get_builder_cls()(
                spec, [name], config, torch.device(device))
        except Exception as exc:
            if problem is None:
                raise
            raise RuntimeError(f"its attention layer does not construct here ({problem})"
                               ) from exc
    return builder


def _attention_layer(config: VllmConfig, backend: str, backend_cls: Any
                     ) -> tuple[str, str | None]:
    """The name of the tiny Llama's attention layer for ``backend`` in ``config``, created and
    registered once (builders that read their layers' parameters, FlashInfer's, find it), and
    ``None``; where the layer does not construct here, a bare name and why (the builder may
    not need it)."""
    from vllm.model_executor.layers.attention.attention import Attention

    name = f"draftmeta_harness.layers.0.self_attn.attn.{backend.lower()}"
    if name in config.compilation_config.static_forward_context:
        return name, None
    try:
        Attention(num_heads=4, head_size=64, scale=64 ** -0.5, num_kv_heads=2,
                  cache_config=config.cache_config, prefix=name, attn_backend=backend_cls)
    except Exception as exc:  # its impl needs what this machine lacks: the builder may not
        said = (str(exc).splitlines() or [""])[0]
        return "draftmeta_harness.layers.0.self_attn.attn", f"{type(exc).__name__}: {said}"
    return name, None
