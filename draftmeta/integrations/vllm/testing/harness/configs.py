"""The tiny models the harness builds for, and vLLM's configs of them, made offline.

A DeepSeek-V3.2-style model (MLA, the V3.2 indexer fields: :func:`make_vllm_config`,
:func:`cached_vllm_config`) for the MLA and indexer builders, and a tiny Llama (grouped-query
attention: :func:`cached_attention_config`) for the builders of vLLM's standard attention
backends. Each model's directory holds only a ``config.json``; no weights are loaded.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from draftmeta.integrations.vllm.testing.harness.environment import prepare_environment

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["cached_attention_config", "cached_vllm_config", "make_vllm_config"]

# The tiny model: MLA head size kv_lora_rank + qk_rope_head_dim = 576 (the only size the CPU MLA
# backend accepts); the V3.2 index_* fields make vLLM treat it as a sparse (indexer) model.
_NUM_HEADS: Final = 4
_KV_LORA_RANK: Final = 512
_Q_LORA_RANK: Final = 64
_QK_ROPE_HEAD_DIM: Final = 64
_QK_NOPE_HEAD_DIM: Final = 128
_V_HEAD_DIM: Final = 128
_INDEX_HEAD_DIM: Final = 128
_MIN_MAX_POSITION_EMBEDDINGS: Final = 163840  # DeepSeek-V3's own value

_model_dirs: dict[int, str] = {}
_config_cache: dict[tuple[int, int, int, int, int, str | None, str], VllmConfig] = {}


def _model_config_json(max_position_embeddings: int) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 1024,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": _NUM_HEADS,
        "num_key_value_heads": _NUM_HEADS,
        "q_lora_rank": _Q_LORA_RANK,
        "kv_lora_rank": _KV_LORA_RANK,
        "qk_rope_head_dim": _QK_ROPE_HEAD_DIM,
        "qk_nope_head_dim": _QK_NOPE_HEAD_DIM,
        "v_head_dim": _V_HEAD_DIM,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 2,
        "n_group": 1,
        "topk_group": 1,
        "index_topk": 64,
        "index_n_heads": 4,
        "index_head_dim": _INDEX_HEAD_DIM,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


def _write_model_dir(directory: str | None, max_position_embeddings: int) -> str:
    """Write the tiny config.json; without a directory, reuse one temp dir per content."""
    if directory is None:
        cached = _model_dirs.get(max_position_embeddings)
        if cached is not None and os.path.isfile(os.path.join(cached, "config.json")):
            return cached
        directory = tempfile.mkdtemp(prefix="draftmeta-vllm-model-")
        atexit.register(shutil.rmtree, directory, True)
        _model_dirs[max_position_embeddings] = directory
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(_model_config_json(max_position_embeddings), f, indent=1)
    return directory


def make_vllm_config(
    *,
    max_model_len: int,
    block_size: int,
    max_num_seqs: int = 256,
    tmp_dir: str | None = None,
    dcp_world_size: int = 1,
    dcp_interleave: int = 1,
    cudagraph_mode: str | None = None,
    kv_cache_dtype: str = "auto",
) -> VllmConfig:
    """Create a fresh ``VllmConfig`` for a tiny DeepSeek-V3.2-style model, offline.

    The model directory holds only a ``config.json`` (2 layers, 4 heads, MLA head size 576,
    V3.2 indexer fields). It is written to ``tmp_dir`` when given, else to a temporary directory
    shared by all calls and removed at interpreter exit.

    vLLM's CPU platform forces ``cache_config.block_size`` to 16 for MLA models (with a warning);
    this function sets it back to ``block_size`` afterwards so the config and the kv-cache specs
    made by :func:`~draftmeta.integrations.vllm.testing.harness.builders.make_builder` agree.

    The first call in a process costs seconds (importing vLLM); later calls about 10 ms. Use
    :func:`cached_vllm_config` to share one config per shape.

    Args:
        max_model_len: The model's maximum context length, L.
        block_size: The KV-cache block size.
        max_num_seqs: The scheduler's maximum batch size (sizes some builder buffers).
        tmp_dir: Where to write the model's config.json; None for a managed temp directory.
        dcp_world_size: decode context parallelism: the ranks a sequence's KV cache is dealt
            to (``parallel_config.decode_context_parallel_size``; set after the config is made,
            no process group needed:
            :func:`~draftmeta.integrations.vllm.testing.harness.builders.make_builder` answers
            for it).
        dcp_interleave: tokens dealt to a rank at a time
            (``parallel_config.cp_kv_cache_interleave_size``).
        cudagraph_mode: a ``CUDAGraphMode`` name for ``compilation_config.cudagraph_mode``,
            set after the config is made (vLLM's CPU platform forces ``NONE``):
            ``"FULL_DECODE_ONLY"`` configures builders as vLLM's GPU runner does when it
            captures its draft loop, where the plugin offers its hook (the largest captured
            batch is then ``max_num_seqs``, as FlashAttention's builders read it); ``None``
            keeps ``NONE``.
        kv_cache_dtype: ``cache_config.cache_dtype`` (``"fp8"``: FlashMLA's FP8 KV cache), set
            after the config is made.
    """
    if min(max_model_len, block_size, max_num_seqs, dcp_world_size, dcp_interleave) <= 0:
        raise ValueError(
            "max_model_len, block_size, max_num_seqs, dcp_world_size and dcp_interleave must "
            f"be positive, got {max_model_len}, {block_size}, {max_num_seqs}, "
            f"{dcp_world_size}, {dcp_interleave}"
        )
    prepare_environment()
    from vllm.engine.arg_utils import EngineArgs

    model_dir = _write_model_dir(tmp_dir, max(max_model_len, _MIN_MAX_POSITION_EMBEDDINGS))
    config = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        max_model_len=max_model_len,
        enforce_eager=True,
        dtype="bfloat16",
        block_size=block_size,
        max_num_seqs=max_num_seqs,
    ).create_engine_config()
    if config.cache_config.block_size != block_size:
        config.cache_config.block_size = block_size
    config.parallel_config.decode_context_parallel_size = dcp_world_size
    config.parallel_config.cp_kv_cache_interleave_size = dcp_interleave
    if cudagraph_mode is not None:
        _set_cudagraph_mode(config, cudagraph_mode, max_num_seqs)
    config.cache_config.cache_dtype = kv_cache_dtype
    return config


def _set_cudagraph_mode(config: VllmConfig, mode: str, largest: int) -> None:
    """``mode`` as the config's CUDA graph mode, with the batch sizes captured as vLLM's
    defaults space them (1, 2, 4, then every 8) up to ``largest``: what its builders read
    where graphs are on (Triton attention picks its kernel's threshold among them, FlashAttention
    sizes its schedule buffer by the largest)."""
    from vllm.config.compilation import CUDAGraphMode

    config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    sizes = [s for s in (1, 2, 4, *range(8, largest + 1, 8)) if s <= largest]
    config.compilation_config.cudagraph_capture_sizes = sizes
    config.compilation_config.max_cudagraph_capture_size = sizes[-1]


def cached_vllm_config(
    *, max_model_len: int, block_size: int, max_num_seqs: int = 256, dcp_world_size: int = 1,
    dcp_interleave: int = 1, cudagraph_mode: str | None = None, kv_cache_dtype: str = "auto",
) -> VllmConfig:
    """Like :func:`make_vllm_config`, but return one shared config per argument tuple.

    The shared config is mutable:
    :func:`~draftmeta.integrations.vllm.testing.harness.builders.make_builder` registers an MLA
    layer in its ``compilation_config.static_forward_context`` (once); do not change it
    otherwise.
    """
    key = (max_model_len, block_size, max_num_seqs, dcp_world_size, dcp_interleave,
           cudagraph_mode, kv_cache_dtype)
    config = _config_cache.get(key)
    if config is None:
        config = make_vllm_config(
            max_model_len=max_model_len, block_size=block_size, max_num_seqs=max_num_seqs,
            dcp_world_size=dcp_world_size, dcp_interleave=dcp_interleave,
            cudagraph_mode=cudagraph_mode, kv_cache_dtype=kv_cache_dtype,
        )
        _config_cache[key] = config
    return config


_ATTENTION_MODEL: Final[Mapping[str, Any]] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
}
"""A tiny Llama: grouped-query attention (4 query heads over 2 KV heads of size 64), for the
builders of standard (non-MLA) attention backends."""

_attention_configs: dict[tuple[int, int, str | None], VllmConfig] = {}


def cached_attention_config(max_model_len: int, block_size: int, cudagraph_mode: str | None
                            ) -> VllmConfig:
    """A ``VllmConfig`` for the tiny Llama (its ``config.json`` in a temporary directory removed
    at interpreter exit), one shared config per argument tuple: what
    :func:`~draftmeta.integrations.vllm.testing.harness.builders.make_attention_builder` builds
    for. ``cudagraph_mode`` as in :func:`make_vllm_config`. The caller has called
    :func:`~draftmeta.integrations.vllm.testing.harness.environment.prepare_environment`."""
    key = (max_model_len, block_size, cudagraph_mode)
    config = _attention_configs.get(key)
    if config is not None:
        return config
    from vllm.engine.arg_utils import EngineArgs

    directory = tempfile.mkdtemp(prefix="draftmeta-vllm-attention-")
    atexit.register(shutil.rmtree, directory, True)
    model = {**_ATTENTION_MODEL, "max_position_embeddings": max(max_model_len, 4096)}
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(model, f, indent=1)
    config = EngineArgs(model=directory, skip_tokenizer_init=True, load_format="dummy",
                        max_model_len=max_model_len, enforce_eager=True, dtype="bfloat16",
                        block_size=block_size, max_num_seqs=256).create_engine_config()
    if config.cache_config.block_size != block_size:
        config.cache_config.block_size = block_size
    if cudagraph_mode is not None:
        _set_cudagraph_mode(config, cudagraph_mode, 256)
    _attention_configs[key] = config
    return config
