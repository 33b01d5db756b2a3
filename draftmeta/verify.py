"""``draftmeta verify``: the update-versus-rebuild invariant for every registered backend.

On CPU each vLLM builder that runs there (``CPU_MLA``, ``TRITON_MLA``, the DeepSeek-V3.2
indexer) is checked against draftmeta's spec over random batches, with vLLM's own ``build`` as
the rebuild. On CUDA, where vLLM need not be installed, the Triton-MLA and indexer specs are
checked through the draft loop (eager and fused) against the plain-torch reference builders
(:mod:`draftmeta.testing.reference_builds`, themselves proven equal to vLLM's on CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from draftmeta.protocol import SpecBuilder
from draftmeta.state import DraftState
from draftmeta.testing import Mismatch, compare_metadata, random_state

__all__ = ["verify"]

Failure = tuple[str, int, int, Mismatch]
"""(what was checked, seed, draft step, the mismatch)."""


def _cpu_rows(
    batches: int, steps: int, seed: int
) -> Iterator[tuple[str, int, int, list[Failure]]]:
    from draftmeta.integrations.vllm.testing.equivalence import BUILDERS, check_batch, random_case

    for builder in BUILDERS:
        failures: list[Failure] = []
        checked = 0
        for s in range(seed, seed + batches):
            result = check_batch(random_case(builder, s, max_steps=steps))
            checked += result.steps_checked
            failures += [(builder, s, step, m) for step, m in result.mismatches]
        yield builder, batches, checked, failures


def _cuda_rows(
    batches: int, steps: int, seed: int
) -> Iterator[tuple[str, int, int, list[Failure]]]:
    for fused in (False, True):
        label = f"TRITON_MLA+INDEXER on CUDA ({'fused' if fused else 'eager'})"
        failures: list[Failure] = []
        checked = 0
        for s in range(seed, seed + batches):
            checked += _check_cuda(label, s, steps, fused, failures)
        yield label, batches, checked, failures


def _check_cuda(label: str, seed: int, steps: int, fused: bool, failures: list[Failure]) -> int:
    """One random batch through the draft loop on CUDA; returns the steps checked."""
    from draftmeta.integrations.vllm.catalogue import builder_spec
    from draftmeta.loop import AttentionGroup, DraftLoop
    from draftmeta.testing.reference_builds import (
        IndexerBuffers,
        build_indexer_metadata,
        build_mla_metadata,
    )

    mla, idx = builder_spec("TRITON_MLA"), builder_spec("INDEXER")
    slots = torch.cuda.get_device_properties(0).multi_processor_count

    def build(name: str, state: DraftState) -> Any:
        if name == "mla":
            return build_mla_metadata(mla.cls, mla.nested["decode"], state)
        return build_indexer_metadata(idx.cls, idx.nested["decode"], state,
                                      IndexerBuffers(512, slots, "cuda"))

    g = torch.Generator().manual_seed(seed)
    k = int(torch.randint(2, steps + 1, (1,), generator=g))
    batch = int(torch.randint(1, 257, (1,), generator=g))
    state = random_state(g, batch_size=batch, block_size=64, max_model_len=1024, steps=k,
                         num_padded=3 if seed % 5 == 0 else 0).to("cuda")
    groups = [AttentionGroup(n, SpecBuilder(sp), build(n, state), lambda st, i: None)
              for n, sp in (("mla", mla), ("indexer", idx))]
    loop = DraftLoop(groups, state, policy="wrap" if seed % 2 else "clamp", fused=fused)
    checked = 0

    def step(index: int, metadata: Any) -> None:
        nonlocal checked
        if not index:
            return
        fresh = state.clone()
        for name, meta in metadata.items():
            for m in compare_metadata(meta, build(name, fresh)):
                failures.append((label, seed, index, Mismatch(f"{name}.{m.path}", m.detail)))
        checked += 1

    loop.run(step, k)
    if loop.stats.fallbacks():
        failures.append((label, seed, 0, Mismatch("<loop>", str(loop.stats.fallbacks()))))
    return checked


def verify(*, device: str = "cpu", batches: int = 50, steps: int = 8, seed: int = 0,
           echo: Callable[[str], None] = print) -> int:
    """Run the check and print a table; returns 0 if everything matched, else 1."""
    if device == "cuda" and not torch.cuda.is_available():
        echo("draftmeta verify: --device cuda needs a CUDA device")
        return 2
    rows = _cpu_rows(batches, steps, seed) if device == "cpu" else _cuda_rows(batches, steps, seed)
    echo(f"{'backend':<40} {'batches':>7} {'steps':>6} {'mismatches':>10}")
    failed: list[Failure] = []
    for name, count, checked, failures in rows:
        echo(f"{name:<40} {count:>7} {checked:>6} {len(failures):>10}")
        failed += failures
    for what, s, step, m in failed[:20]:
        echo(f"FAIL {what} seed={s} step={step} field={m.path}: {m.detail}")
    if failed:
        echo(f"{len(failed)} mismatch(es); rerun one with --seed SEED --batches 1")
        return 1
    echo("all updated metadata equals the rebuilt metadata")
    return 0
