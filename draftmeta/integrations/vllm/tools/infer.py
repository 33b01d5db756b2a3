"""The vLLM adaptor: infer the spec of a catalogue builder through its harness recipe."""

from __future__ import annotations

import importlib
import time
from typing import Any

from draftmeta.infer.core import Inference, infer_spec
from draftmeta.infer.probe import default_cases
from draftmeta.infer.verify import Verification
from draftmeta.integrations.vllm.specs.amx import compute_units
from draftmeta.integrations.vllm.specs.indexer import deep_gemm_kernel
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = ["infer_vllm", "resolve", "verify_vllm"]


def resolve(target: str) -> str:
    """The catalogue name of ``target``: a name (``CPU_MLA``) or ``module:Class`` of a builder.

    Raises:
        LookupError: no catalogue entry with a harness recipe matches.
    """
    from draftmeta.integrations.vllm.catalogue import current_release

    release = current_release()
    names = [b.name for b in release.builders if b.harness is not None]
    if target in names:
        return target
    module, sep, qualname = target.partition(":")
    if sep:
        try:
            cls = getattr(importlib.import_module(module), qualname)
        except (ImportError, AttributeError) as exc:
            raise LookupError(f"cannot import {target}: {exc}") from None
        from draftmeta.integrations.vllm.testing import harness

        harness.prepare_environment()
        matches = [b.name for b in release.builders if b.harness is not None
                   and (b.builder.module, b.builder.qualname) == (module, qualname)]
        if len(matches) > 1:  # one class, several backends (CPU_MLA): the first is taken
            return matches[0]
        if matches:
            return matches[0]
        raise LookupError(f"{target} ({cls!r}) has no harness recipe in vLLM "
                          f"{release.version}'s catalogue; pass a build function to infer_spec")
    raise LookupError(f"unknown builder {target!r}; choose one of {', '.join(names)} "
                      "or give module:Class")


def _compute_units() -> int | None:
    try:
        return compute_units()
    except Exception:  # no vLLM platform here: the split count reads it when it runs
        return None


def infer_vllm(target: str) -> Inference:
    """Infer the spec of a vLLM builder that builds on this machine (see :func:`resolve`)."""
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.testing import harness

    name = resolve(target)
    recipe = current_release().entry(name).harness
    assert recipe is not None
    block_size = recipe.block_size
    builders: dict[tuple[int, int], Any] = {}

    def build(state: DraftState) -> Any:
        key = (state.max_model_len, block_size)
        if key not in builders:
            config = harness.cached_vllm_config(max_model_len=key[0], block_size=block_size)
            kwargs: dict[str, Any] = {"block_size": block_size}
            if recipe.kind == "indexer":
                kwargs["block_table_width"] = -(-key[0] // block_size)
            builders[key] = harness.make_builder(name, config, **kwargs)
        return harness.build_metadata(builders[key], harness.common_metadata_for(state),
                                      draft_index=max(1, state.step + 1))

    lengths = (256, 4096)
    first = build_first_type(build, block_size, lengths[0])
    units = _compute_units() if name == "AMX_MLA" else None
    return infer_spec(first, build, block_size=block_size, name=f"{name}.inferred",
                      cases=default_cases(lengths), compute_units=units,
                      paged_mqa_kernel=deep_gemm_kernel)


def build_first_type(build: Any, block_size: int, max_model_len: int) -> type:
    """The class ``build`` returns for a small batch."""
    import torch

    from draftmeta.testing import random_state

    state = random_state(torch.Generator().manual_seed(0), batch_size=2, block_size=block_size,
                         max_model_len=max_model_len, steps=2)
    return type(build(state))


def verify_vllm(
    name: str, spec: DraftSpec[Any], *, batches: int = 200, seed: int = 0, max_steps: int = 8
) -> Verification:
    """``check_batch`` over ``random_case(name, seed + i)`` for ``i < batches`` with ``spec``."""
    from draftmeta.integrations.vllm.testing.equivalence import check_batch, random_case

    start = time.perf_counter()
    failures: list[tuple[str, str]] = []
    for i in range(batches):
        case = random_case(name, seed + i, max_steps=max_steps)
        try:
            result = check_batch(case, spec=spec)
        except Exception as exc:
            failures.append((str(case), f"{type(exc).__name__}: {exc}"))
            continue
        if not result.ok:
            step, mismatch = result.mismatches[0]
            failures.append((str(case), f"step {step}: {mismatch}"))
    return Verification(batches, tuple(failures), time.perf_counter() - start)
