"""Where the harness points vLLM: the CPU (the default) or CUDA, and the environment variables
vLLM needs there, set before vLLM is imported (vLLM resolves its platform once per process).

Every function of the harness that imports vLLM calls :func:`prepare_environment` first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Final

__all__ = ["prepare_environment", "target_device", "use_device"]

_ENVIRONMENTS: Final[Mapping[str, Mapping[str, str]]] = {
    # The CUDA wheel otherwise picks no usable platform ("Device string must not be empty").
    "cpu": {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    # on a GPU machine: vLLM's CUDA platform (TVM's DLPack bridge off: the H200 and H100 images'
    # torch lacks the symbol FlashInfer's TVM FFI looks for)
    "cuda": {"VLLM_TARGET_DEVICE": "cuda", "HF_HUB_OFFLINE": "1",
             "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"},
}
_target: list[str] = ["cpu"]  # the device the harness points vLLM at (use_device)


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
    and ``HF_HUB_OFFLINE=1``. Call it before vLLM is imported; every function of the harness
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
