"""vLLM 0.33's own builders on CUDA, through draftmeta's harness with its CPU forcing switched off.

``draftmeta.integrations.vllm.testing.harness`` forces vLLM's CPU platform
(``prepare_environment``).
On the H200 (vLLM's Python code unpacked by ``install.sh``, no compiled extensions) the same
harness builds the real ``TritonMLAMetadataBuilder`` and ``DeepseekV32IndexerMetadataBuilder``
on CUDA once its ``prepare_environment`` is replaced by :func:`use_cuda`, which sets the CUDA
variables instead. ``VLLM_CACHE_ROOT`` must point at a model-info cache written by a CPU run
(``make_carry.sh`` writes one), or vLLM's model inspection subprocess fails on missing
``torch.ops._C`` ops.
"""

from __future__ import annotations

import os
from typing import Any

_CUDA_ENV = {
    "VLLM_TARGET_DEVICE": "cuda",
    "HF_HUB_OFFLINE": "1",
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
    "DRAFTMETA_VLLM_PLUGIN": "0",  # measure vLLM's own builders
}


def use_cuda() -> Any:
    """Point draftmeta's vLLM harness at the CUDA platform; returns the harness module."""
    os.environ.update(_CUDA_ENV)
    from draftmeta.integrations.vllm.testing import harness

    def prepare_environment() -> None:
        os.environ.update(_CUDA_ENV)

    harness.prepare_environment = prepare_environment
    return harness


def vllm_version() -> str:
    """The vLLM version whose code is imported."""
    import vllm

    return str(getattr(vllm, "__version__", "?"))
