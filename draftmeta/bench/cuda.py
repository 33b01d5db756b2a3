"""The CUDA benchmark: the Triton-MLA and DeepSeek-V3.2 indexer specs as two groups over one
draft state (no vLLM needed).

Metadata is made by :mod:`draftmeta.testing.reference_builds`; paths: the plain-torch rebuild,
the eager generated updates, the fused one-launch step, and the captured whole loop (graph
replay), with CUDA events for device time and the profiler's count of kernel launches per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from draftmeta.advance import advance_state
from draftmeta.bench.config import BenchConfig, Sample
from draftmeta.bench.states import bench_state, reset_state
from draftmeta.measure.noise import alternating
from draftmeta.protocol import SpecBuilder
from draftmeta.state import DraftState

__all__ = ["cuda_samples"]


def cuda_samples(config: BenchConfig, tick: Callable[[], None]) -> Iterator[Sample]:
    """Per batch size and K: one sample per path, their runs alternating (the rebuild twice:
    the A/A control); ``tick`` is called after each configuration."""
    from draftmeta.integrations.vllm.catalogue import builder_spec

    mla = builder_spec("TRITON_MLA", host_bound="frozen")
    idx = builder_spec("INDEXER", host_bound="frozen")
    for batch in config.batch_sizes:
        for k in config.steps:
            yield from _cuda_config(config, mla, idx, batch, k)
            tick()


def _cuda_config(config: BenchConfig, mla: Any, idx: Any, batch: int, k: int
                 ) -> Iterator[Sample]:
    from draftmeta.loop import AttentionGroup, DraftLoop
    from draftmeta.testing.reference_builds import (
        IndexerBuffers,
        build_indexer_metadata,
        build_mla_metadata,
    )

    backend = "TRITON_MLA+INDEXER"
    slots = torch.cuda.get_device_properties(0).multi_processor_count
    state = bench_state(batch, k, 64, config.max_model_len, seed=batch * 100 + k, device="cuda")
    start = state.clone()
    buffers = IndexerBuffers(max(config.batch_sizes), slots, "cuda")
    mla_meta = build_mla_metadata(mla.cls, mla.nested["decode"], state)
    idx_meta = build_indexer_metadata(idx.cls, idx.nested["decode"], state, buffers)
    groups = [
        AttentionGroup("mla", SpecBuilder(mla), mla_meta, lambda s, i: None),
        AttentionGroup("indexer", SpecBuilder(idx), idx_meta, lambda s, i: None),
    ]
    eager = DraftLoop(groups, state, host_bound="frozen", fused=False)
    fused = DraftLoop(groups, state, host_bound="frozen", fused=True)

    def rebuild_all() -> None:
        build_mla_metadata(mla.cls, mla.nested["decode"], state)
        build_indexer_metadata(idx.cls, idx.nested["decode"], state, buffers)

    def update_eager() -> None:
        mla.update(mla_meta, state)
        idx.update(idx_meta, state)

    reset_state(state, start)
    captured = fused.capture(lambda i, m: None, k)
    # name: (function, calls per run, runs back to back between the two events)
    paths: dict[str, tuple[Callable[[], None], int, int]] = {
        "advance": (lambda: advance_state(state, "clamp", "frozen"), k - 1, 1),
        "rebuild (reference)": (rebuild_all, k - 1, 1),
        "update (eager)": (update_eager, k - 1, 1),
        "advance + update (eager)": (lambda: eager.refresh(1), k - 1, 1),
        "advance + update (fused)": (lambda: fused.refresh(1), k - 1, 1),
        # 20 replays back to back: the state runs past its start, which changes no cost
        "captured loop (replay)": (captured.replay, 1, 20),
        "rebuild (A/A)": (rebuild_all, k - 1, 1),
    }
    host: dict[str, list[float]] = {name: [] for name in paths}
    device: dict[str, list[float]] = {name: [] for name in paths}
    # one warm-up run, then every path in turn (rule 1 of draftmeta.measure.noise)
    for repeat, name in alternating(list(paths), config.repeats + 1):
        fn, calls, runs = paths[name]
        h, d = _time_cuda(fn, state, start, k, calls=calls, runs=runs)
        if repeat:
            host[name].append(h)
            device[name].append(d)
    for name, (fn, calls, _) in paths.items():
        launches = _launches(fn) / (k - 1 if calls == 1 else 1)
        yield Sample(backend, name, batch, k, tuple(host[name]), tuple(device[name]), launches,
                     run_us=tuple(device[name]))


def _time_cuda(fn: Callable[[], None], state: DraftState, start: DraftState, k: int, *,
               calls: int, runs: int = 1) -> tuple[float, float]:
    """Host and device microseconds per draft step of one run: ``calls`` calls covering
    ``k - 1`` steps, from ``start``. ``runs`` > 1 repeats the whole set back to back between
    the two events, so the device queue never waits for the host (what a captured loop's
    device time per step means)."""
    reset_state(state, start)
    torch.cuda.synchronize()
    begin, end = _event(), _event()
    t0 = time.perf_counter_ns()
    begin.record()
    for _ in range(calls * runs):
        fn()
    end.record()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    return ((t1 - t0) / 1e3 / (k - 1) / runs,
            float(begin.elapsed_time(end)) * 1e3 / (k - 1) / runs)


def _event() -> Any:
    return getattr(torch.cuda, "Event")(enable_timing=True)  # noqa: B009 - loosely typed


def _launches(fn: Callable[[], None]) -> float:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = getattr(torch.autograd, "DeviceType").CUDA  # noqa: B009 - not re-exported
    return float(len([e for e in prof.events() if e.device_type == cuda]))
