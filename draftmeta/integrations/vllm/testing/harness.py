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

Importing this module does not import vLLM. Every function that needs vLLM first calls
:func:`prepare_environment`, which sets the variables vLLM needs on the device it targets (the
CPU unless :func:`use_device` said otherwise).

>>> cfg = make_vllm_config(max_model_len=1024, block_size=16)  # doctest: +SKIP
>>> builder = make_builder("TRITON_MLA", cfg, block_size=16)  # doctest: +SKIP
>>> cad = make_common_metadata(  # doctest: +SKIP
...     seq_lens=seq_lens, positions=positions, slot_mapping=slots,
...     block_table=block_table, query_start_loc=qsl, max_seq_len=100, num_reqs=3)
>>> meta = build_metadata(builder, cad)  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import attrs
import torch

from draftmeta.integrations.vllm.plugin import common_metadata

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata

    from draftmeta.integrations.vllm.catalogue import HarnessRecipe

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

INDEXER_BLOCK_SIZE: Final = 64
"""The block size DeepSeek-V3.2 runs its indexer KV cache with (FlashMLA-sparse forces 64)."""

_ENVIRONMENTS: Final[Mapping[str, Mapping[str, str]]] = {
    # The CUDA wheel otherwise picks no usable platform ("Device string must not be empty").
    "cpu": {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    # on a GPU machine: vLLM's CUDA platform (TVM's DLPack bridge off: the H200 and H100 images'
    # torch lacks the symbol FlashInfer's TVM FFI looks for)
    "cuda": {"VLLM_TARGET_DEVICE": "cuda", "HF_HUB_OFFLINE": "1",
             "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"},
}
_target: list[str] = ["cpu"]  # the device the harness points vLLM at (use_device)

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

_MLA_LAYER_PREFIX: Final = "draftmeta_harness.layers.0.self_attn.attn"
_INDEXER_LAYER_NAME: Final = "draftmeta_harness.layers.0.self_attn.indexer.k_cache"

_model_dirs: dict[int, str] = {}
_config_cache: dict[tuple[int, int, int, int, int, str | None, str], VllmConfig] = {}


def use_device(device: str) -> None:
    """Point the harness (and vLLM, in this process) at ``device``: ``"cpu"`` (the default)
    or ``"cuda"``, then :func:`prepare_environment`. Call it before anything imports vLLM's
    platform: vLLM resolves its platform once per process.

    Raises:
        ValueError: ``device`` is neither ``"cpu"`` nor ``"cuda"``.
        RuntimeError: vLLM already resolved another platform in this process.
    """
    if device not in _ENVIRONMENTS:
        raise ValueError(f"the harness runs vLLM on 'cpu' or 'cuda', not {device!r}")
    _check_platform(device)  # before anything changes
    _target[0] = device
    prepare_environment()


def target_device() -> str:
    """The device the harness points vLLM at: ``"cpu"`` unless :func:`use_device` said
    ``"cuda"``."""
    return _target[0]


def prepare_environment() -> None:
    """Set the environment vLLM needs on the device the harness targets.

    On the CPU (the default) sets ``VLLM_TARGET_DEVICE=cpu``, ``HF_HUB_OFFLINE=1`` and
    ``CUDA_VISIBLE_DEVICES=""``; after :func:`use_device` ``("cuda")``, ``VLLM_TARGET_DEVICE=cuda``
    and ``HF_HUB_OFFLINE=1``. Call it before vLLM is imported; every function of this module
    that imports vLLM calls it first. Calling it again is cheap.

    Raises:
        RuntimeError: vLLM has already resolved a platform other than the targeted one in this
            process, so the variables come too late.
    """
    device = _target[0]
    _check_platform(device)
    for name, value in _ENVIRONMENTS[device].items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    # vLLM loads general plugins when a config is made; the harness measures vLLM's own
    # builders, so draftmeta's plugin stays off here unless asked for explicitly
    os.environ.setdefault("DRAFTMETA_VLLM_PLUGIN", "0")


def _check_platform(device: str) -> None:
    """Raise where vLLM already resolved a platform other than ``device``'s in this process."""
    platforms = sys.modules.get("vllm.platforms")
    current = None if platforms is None else vars(platforms).get("_current_platform")
    if current is not None and not (current.is_cpu() if device == "cpu" else current.is_cuda()):
        raise RuntimeError(
            f"vLLM already resolved the platform {type(current).__name__} in this process, not "
            f"the {device} one (vLLM keeps one per process): call use_device({device!r}) or "
            "prepare_environment() before anything touches vllm.platforms, or run in a fresh "
            "process."
        )


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
    made by :func:`make_builder` agree.

    The first call in a process costs seconds (importing vLLM); later calls about 10 ms. Use
    :func:`cached_vllm_config` to share one config per shape.

    Args:
        max_model_len: The model's maximum context length, L.
        block_size: The KV-cache block size.
        max_num_seqs: The scheduler's maximum batch size (sizes some builder buffers).
        tmp_dir: Where to write the model's config.json; None for a managed temp directory.
        dcp_world_size: decode context parallelism: the ranks a sequence's KV cache is dealt
            to (``parallel_config.decode_context_parallel_size``; set after the config is made,
            no process group needed: :func:`make_builder` answers for it).
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

    The shared config is mutable: :func:`make_builder` registers an MLA layer in its
    ``compilation_config.static_forward_context`` (once); do not change it otherwise.
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


def dcp_local_seq_lens(seq_lens: torch.Tensor, world_size: int, rank: int,
                       interleave: int) -> torch.Tensor:
    """One DCP rank's share of the global ``seq_lens`` by vLLM's own
    ``get_dcp_local_seq_lens``, int32 as the runner keeps it: what a rebuild is given, so that
    draftmeta's own recomputation is checked against vLLM's."""
    prepare_environment()
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    local = get_dcp_local_seq_lens(seq_lens, world_size, rank, interleave)
    return torch.as_tensor(local).to(torch.int32).contiguous()


@attrs.frozen
class _StandInGroup:
    """What vLLM's builders and MLA layers read of the DCP process group while they are
    constructed and build decode metadata: its size and this rank; a ``device_group`` that
    MLA's DCP manager binds its NCCL fallbacks to (chunked-prefill KV gather; called only in
    a forward); and a hash (vLLM caches its symmetric-memory workspaces per group). No
    ``cpu_group``: the stand-in has no peers to ask whether they share this node, so
    :func:`dcp_group` turns the symmetric-memory paths that ask (on CUDA) off."""

    world_size: int
    rank_in_group: int
    device_group: Any = None


_DIRECT_DCP_SWITCHES: Final = ("VLLM_USE_DIRECT_DCP_A2A", "VLLM_USE_DIRECT_DCP_Q_GATHER",
                               "VLLM_USE_DIRECT_DCP_KV_GATHER")
"""vLLM's switches for MLA's symmetric-memory DCP collectives (unset: on where the group's
ranks share a node, which vLLM asks the group's ``cpu_group``; ``0``: its NCCL paths)."""


@contextlib.contextmanager
def _direct_dcp_off() -> Iterator[None]:
    """Inside, vLLM's symmetric-memory DCP collectives are switched off (its own variables
    set to ``0``), as they were afterwards."""
    said = {name: os.environ.get(name) for name in _DIRECT_DCP_SWITCHES}
    os.environ.update(dict.fromkeys(_DIRECT_DCP_SWITCHES, "0"))
    try:
        yield
    finally:
        for name, value in said.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def dcp_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """Inside, vLLM's ``get_dcp_group()`` answers a stand-in group of ``world_size`` ranks
    with this process as ``rank``, in every loaded vLLM module that imported it (builders and
    MLA layers read the DCP world size from it when constructed); no ``torch.distributed``.

    With more than one rank, vLLM's symmetric-memory DCP collectives are switched off inside
    (``VLLM_USE_DIRECT_DCP_A2A``, ``VLLM_USE_DIRECT_DCP_Q_GATHER`` and
    ``VLLM_USE_DIRECT_DCP_KV_GATHER`` set to ``0``, restored afterwards): on CUDA, MLA's DCP
    manager would otherwise ask the group's peers whether they share this node, and a stand-in
    has none. Either kind of collective runs only in a forward: what the builders put in the
    metadata does not depend on which one is bound.

    Raises:
        ValueError: ``rank`` is not one of the ``world_size`` ranks.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    prepare_environment()
    from vllm.distributed import parallel_state

    original = parallel_state.get_dcp_group
    group = _StandInGroup(world_size, rank)

    def stand_in() -> _StandInGroup:
        return group

    def holding(function: object) -> list[Any]:
        return [m for name, m in list(sys.modules.items())
                if name.startswith("vllm") and getattr(m, "get_dcp_group", None) is function]

    for module in holding(original):
        module.get_dcp_group = stand_in
    try:
        with _direct_dcp_off() if world_size > 1 else contextlib.nullcontext():
            yield
    finally:  # modules imported inside took the stand-in by name: they get the original too
        for module in holding(stand_in):
            module.get_dcp_group = original


_world: list[str] = []  # the store directory of the one-rank world this module set up


def one_rank_world(config: VllmConfig) -> None:
    """Set up vLLM's distributed state for one process without parallelism, as vLLM's
    single-GPU runner has it: a world of one rank (``init_distributed_environment`` over a
    file store in a temporary directory, gloo: nothing is ever sent) and its model-parallel
    groups, all of size 1 (``ensure_model_parallel_initialized(1, 1)``, made under
    ``config``). vLLM's layers read them when constructed (a sparse MLA layer asks the tensor
    parallel group's size). :func:`make_builder` calls it for CUDA builders.

    Once per process: a second call finds the groups made and returns; so does a call where
    vLLM's groups were made by someone else with one rank each. The world is torn down at
    interpreter exit, or by :func:`release_one_rank_world`.

    Raises:
        RuntimeError: vLLM's groups, or ``torch.distributed``'s world, already exist with more
            than one rank (the harness builds for one), or ``torch.distributed`` is set up
            without vLLM's groups (make them with
            ``vllm.distributed.ensure_model_parallel_initialized(1, 1)`` first).
    """
    prepare_environment()
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        sizes = (parallel_state.get_tensor_model_parallel_world_size(),
                 parallel_state.get_pp_group().world_size)
        if sizes != (1, 1):
            raise RuntimeError(
                f"vLLM's model-parallel groups in this process have tensor x pipeline sizes "
                f"{sizes[0]} x {sizes[1]}; the harness builds for one rank: run it in a "
                "process without them")
        return
    if torch.distributed.is_initialized():
        ranks = torch.distributed.get_world_size()
        raise RuntimeError(
            f"torch.distributed is set up in this process ({ranks} rank(s)) without vLLM's "
            "model-parallel groups; make them first "
            "(vllm.distributed.ensure_model_parallel_initialized(1, 1)), or run the harness "
            "in a process without torch.distributed")
    directory = tempfile.mkdtemp(prefix="draftmeta-vllm-world-")
    try:
        with set_current_vllm_config(config):
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"file://{os.path.join(directory, 'store')}")
            parallel_state.ensure_model_parallel_initialized(1, 1)
    except BaseException:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    _world.append(directory)
    atexit.register(release_one_rank_world)


def release_one_rank_world() -> None:
    """Tear down the world :func:`one_rank_world` set up (vLLM's groups, then
    ``torch.distributed``'s), and remove its store; nothing where it set up none."""
    if not _world:
        return
    from vllm.distributed import parallel_state

    atexit.unregister(release_one_rank_world)
    directory = _world.pop()
    try:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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
    CUDA, after :func:`use_device`, its GPU recipe too), or any name with ``recipe`` given:
    for MLA builders (``CPU_MLA``, ``AMX_MLA``, ``TRITON_MLA``) an ``MLAAttention`` layer with
    the recipe's backend is created (once per config and name, under
    ``set_current_vllm_config(config)``) and its kv-cache spec taken, with ``block_size`` put
    in; ``INDEXER`` and ``KPOOL_TAIL`` use the indexer cache's spec (132 x uint8 per token).
    Each call returns a new builder: builders own buffers that ``build()`` writes.

    Args:
        name: a catalogue builder name with a harness recipe.
        config: A config from :func:`make_vllm_config` or :func:`cached_vllm_config`.
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


def _attention_config(max_model_len: int, block_size: int, cudagraph_mode: str | None
                      ) -> VllmConfig:
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
    config = _attention_config(max_model_len, block_size, cudagraph_mode)
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


_F = TypeVar("_F", bound=Callable[..., Any])


def _after_prepare_environment(fn: _F) -> _F:
    """``fn`` (which imports vLLM on first use) run after :func:`prepare_environment`."""

    @functools.wraps(fn)
    def prepared(*args: Any, **kwargs: Any) -> Any:
        prepare_environment()
        return fn(*args, **kwargs)

    return cast("_F", prepared)


make_common_metadata = _after_prepare_environment(common_metadata.make_common_metadata)
"""Describe a decode-only batch to vLLM: the one adapter's
:func:`~draftmeta.integrations.vllm.plugin.common_metadata.make_common_metadata`, after
:func:`prepare_environment`."""

common_metadata_for = _after_prepare_environment(common_metadata.common_metadata_of)
"""vLLM's common metadata over a draft state's buffers (aliased): the one adapter's
:func:`~draftmeta.integrations.vllm.plugin.common_metadata.common_metadata_of`, after
:func:`prepare_environment`."""


def build_for_capture(builder: AttentionMetadataBuilder[Any], cad: CommonAttentionMetadata
                      ) -> Any:
    """Build metadata for ``cad`` as vLLM's runner does before it captures a full CUDA graph
    (``build_for_cudagraph_capture``: a builder may set up what a captured kernel reads, or
    fill the lengths with dummies); ``build()`` where the release has no such method."""
    capture = getattr(builder, "build_for_cudagraph_capture", None)
    if capture is None:
        return builder.build(common_prefix_len=0, common_attn_metadata=cad)
    return capture(cad)


def build_metadata(
    builder: AttentionMetadataBuilder[Any],
    cad: CommonAttentionMetadata,
    *,
    draft_index: int | None = None,
) -> Any:
    """Build attention metadata for ``cad`` with vLLM's own code.

    Calls ``builder.build(common_prefix_len=0, common_attn_metadata=cad)``, or, when
    ``draft_index`` is given, ``builder.build_for_drafting(cad, draft_index)`` (what vLLM's V1
    proposer calls on every draft step; the base implementation is ``build(...,
    fast_build=True)``). No vLLM config needs to be current.
    """
    if draft_index is None:
        return builder.build(common_prefix_len=0, common_attn_metadata=cad)
    build_for_drafting = getattr(builder, "build_for_drafting", None)
    if build_for_drafting is None:  # vLLM 0.34 removed it with the older proposer
        return builder.build(common_prefix_len=0, common_attn_metadata=cad, fast_build=True)
    return build_for_drafting(cad, draft_index)
