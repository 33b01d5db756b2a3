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
from draftmeta.protocol import SpecBuilder
from draftmeta.state import DraftState

__all__ = ["cuda_samples"]


def cuda_samples(config: BenchConfig, tick: Callable[[], None]) -> Iterator[Sample]:
    """Per batch size and K: one sample per path; ``tick`` is called after each
    configuration."""
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

    paths: dict[str, Callable[[], None]] = {
        "advance": lambda: advance_state(state, "clamp", "frozen"),
        "rebuild (reference)": rebuild_all,
        "update (eager)": update_eager,
        "advance + update (eager)": lambda: eager.refresh(1),
        "advance + update (fused)": lambda: fused.refresh(1),
    }
    for path, fn in paths.items():
        host, device = _time_cuda(fn, state, start, k, config.repeats, calls=k - 1)
        yield Sample(backend, path, batch, k, host, device, _launches(fn))
    reset_state(state, start)
    captured = fused.capture(lambda i, m: None, k)
    # 20 replays back to back: the state runs past its start, which changes no cost
    host, device = _time_cuda(captured.replay, state, start, k, config.repeats, calls=1,
                              runs=20)
    yield Sample(backend, "captured loop (replay)", batch, k, host, device,
                 _launches(captured.replay) / (k - 1))


def _time_cuda(fn: Callable[[], None], state: DraftState, start: DraftState, k: int,
               repeats: int, *, calls: int, runs: int = 1
               ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Host and device microseconds per draft step of ``calls`` calls covering ``k - 1``
    steps, over ``repeats`` runs after a warm-up run. ``runs`` > 1 repeats the whole set back
    to back between the two events, so the device queue never waits for the host (what a
    captured loop's device time per step means)."""
    host: list[float] = []
    device: list[float] = []
    for repeat in range(repeats + 1):
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
        if repeat:
            host.append((t1 - t0) / 1e3 / (k - 1) / runs)
            device.append(begin.elapsed_time(end) * 1e3 / (k - 1) / runs)
    return tuple(host), tuple(device)


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
