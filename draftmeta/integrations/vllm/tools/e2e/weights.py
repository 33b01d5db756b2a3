"""Dummy weights that matter: vLLM's dummy loader's weights replaced as the model is loaded.

vLLM's dummy weights are uniform in +-1e-3 with one seed for every tensor: attention hardly
changes the output and a broken metadata update would go unseen. :func:`reinitialized_weights`
replaces them, right after vLLM's dummy loader fills a model and before vLLM post-processes the
weights into kernel layouts: norms 1, biases 0, matrices N(0, 1/fan_in), each tensor with a seed
of its own derived from the run's seed, the model class and the tensor's name.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from draftmeta.integrations.patching import Patches

__all__ = ["reinitialize", "reinitialized_weights"]


def _tensor_seed(seed: int, owner: str, name: str) -> int:
    return (zlib.crc32(f"{owner}/{name}".encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF


@torch.no_grad()
def reinitialize(model: torch.nn.Module, seed: int) -> int:
    """Give every floating-point parameter of ``model`` a fresh value; returns how many changed.

    The weight of a norm layer (a module whose class or name contains ``norm``) becomes 1,
    other 1-D tensors (biases, routing corrections) 0, and matrices N(0, 1/fan_in) with
    ``fan_in`` the last dimension, drawn in float32 from a generator seeded per tensor (on the
    tensor's device: a GPU fills a large model in milliseconds), then cast to the tensor's
    dtype.
    """
    owner = type(model).__qualname__
    changed = 0
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        is_norm = "norm" in type(module).__name__.lower() or "norm" in module_name.lower()
        for param_name, param in module.named_parameters(recurse=False):
            if not param.is_floating_point() or id(param) in seen:
                continue
            seen.add(id(param))
            if param.dim() <= 1:
                param.fill_(1.0 if is_norm and param_name == "weight" else 0.0)
            else:
                name = f"{module_name}.{param_name}"
                generator = torch.Generator(param.device).manual_seed(
                    _tensor_seed(seed, owner, name))
                values = torch.randn(param.shape, generator=generator, dtype=torch.float32,
                                     device=param.device)
                param.copy_(values.mul_(param.shape[-1] ** -0.5))
            changed += 1
    return changed


@contextlib.contextmanager
def reinitialized_weights(seed: int) -> Iterator[None]:
    """While active, every model vLLM's dummy loader fills gets :func:`reinitialize`'s weights.

    Target and draft model are both loaded by the dummy loader, so both get the new weights;
    vLLM's post-processing (MLA's absorbed projections, AMX packing) runs afterwards on them.

    Raises:
        E2EUnavailable: vLLM's dummy loader cannot be imported.
    """
    from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable

    try:
        from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader
    except ImportError as exc:
        raise E2EUnavailable(f"cannot import vLLM's dummy model loader ({exc})") from exc
    original: Callable[..., None] = DummyModelLoader.load_weights

    def load_weights(self: Any, model: torch.nn.Module, model_config: Any) -> None:
        original(self, model, model_config)
        reinitialize(model, seed)

    with Patches() as patches:
        patches.replace(DummyModelLoader, "load_weights", load_weights)
        yield
