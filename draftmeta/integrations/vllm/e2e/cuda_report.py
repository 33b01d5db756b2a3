"""The CUDA end-to-end results as JSON, a Markdown table and a PNG.

:func:`cuda_summary` gives one JSON object: the machine, and one entry per case and batch size
with both engines' tok/s (every measured generate, median, min, max), the ratio of medians, the
draft loops the last measured generate took (fused replays, fused without a graph, rebuilt),
the hook's calls and host time outside capture, the draft loops' metadata builds and their
host time, whether vLLM chose the fused loop, and which builder served each attention group and
whose hook it had.
"""

from __future__ import annotations

import json
import platform
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from draftmeta.arguments import Extent
from draftmeta.integrations.vllm.e2e.acceptance import total_acceptance
from draftmeta.integrations.vllm.e2e.best_k import best_k, step_times
from draftmeta.integrations.vllm.e2e.controls import CAUGHT_DRAFT_SHARE, CAUGHT_LENGTH_DROP, caught
from draftmeta.integrations.vllm.e2e.cuda_engine import LoopCounts
from draftmeta.integrations.vllm.e2e.cuda_matrix import (
    CudaCase,
    CudaComparison,
    CudaFailure,
    CudaMatrixConfig,
)

__all__ = ["CUDA_RESULT_NAME", "control_missed", "cuda_extent", "cuda_markdown", "cuda_plot",
           "cuda_summary", "host_us_per_loop", "planned_cuda_extent", "write_cuda_results"]

CUDA_RESULT_NAME = "e2e-cuda"
"""The stem of the CUDA run's files in its results folder."""

JSONObject = dict[str, Any]


def _case(entry: JSONObject) -> CudaCase:
    """The case of one configuration of :func:`cuda_summary`'s object (results written before
    ``eager`` existed ran with graphs)."""
    return CudaCase(entry["model"], entry["backend"], entry["k"], entry["override_upstream"],
                    entry["negative_control"], entry["kv_cache_dtype"],
                    entry.get("eager", False), entry.get("limit", False))


def cuda_extent(data: JSONObject) -> Extent:
    """What :func:`cuda_summary`'s object holds: one configuration per case and batch size, and
    the fewest measured generates of any timed one."""
    labels, repeats = [], []
    for e in data["configurations"]:
        labels.append(f"{_case(e).label} batch {e['batch_size']}")
        rates = (e.get("tokens_per_s") or {}).get("off")
        if rates:
            repeats.append(len(rates["all"]))
    return Extent.of(labels, min(repeats, default=0))


def planned_cuda_extent(config: CudaMatrixConfig) -> Extent:
    """What a run of ``config`` will hold, as :func:`cuda_extent` reads it afterwards."""
    return Extent.of((f"{case.label} batch {b}" for case in config.cases
                      for b in config.batch_sizes), config.repeats)


def _spread(values: Iterable[float]) -> JSONObject | None:
    values = list(values)
    if not values:
        return None
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "all": [round(v, 1) for v in values]}


def _loops_total(loops: Sequence[LoopCounts]) -> JSONObject:
    total: JSONObject = attrs.asdict(LoopCounts())
    for counts in loops:
        for name, value in attrs.asdict(counts).items():
            total[name] += value
    return {name: round(v, 6) if isinstance(v, float) else v for name, v in total.items()}


def _step_ms(seconds: Sequence[float], loops: Sequence[LoopCounts]) -> float | None:
    """Wall time per engine step (a verification and its draft loop): the measured generates'
    time over their draft loops."""
    steps = sum(c.fused_replays + c.fused_eager + c.rebuilt for c in loops)
    return round(sum(seconds) / steps * 1e3, 3) if steps else None


def _entry(c: CudaComparison) -> JSONObject:
    speedup = c.speedup
    return {
        "model": c.case.model,
        "backend": c.case.backend,
        "k": c.case.k,
        "kv_cache_dtype": c.case.kv_cache_dtype,
        "eager": c.case.eager,
        "override_upstream": c.case.override_upstream,
        "negative_control": c.case.negative_control,
        "limit": c.case.limit,
        "batch_size": c.batch_size,
        "output_tokens_identical": c.output_tokens_identical,
        "draft_tokens_identical": c.draft_tokens_identical,
        "differing_draft_tokens": c.differing_draft_tokens,
        "draft_tokens_compared": c.draft_tokens_compared,
        "hidden_max_abs_difference": (None if c.hidden_max_abs_difference == float("inf")
                                      else c.hidden_max_abs_difference),
        "acceptance_identical": c.acceptance_identical,
        "caught": _caught(c) if c.case.negative_control else None,
        "fused_loop": {"off": c.off_fused, "on": c.on_fused},
        "tokens_per_s": {"off": _spread(c.off_tokens_per_s), "on": _spread(c.on_tokens_per_s)},
        "speedup": None if speedup is None else round(speedup, 3),
        "pair_speedups": [round(r, 3) for r in c.pair_speedups],
        "step_ms": {"off": _step_ms(c.off_seconds, c.off_loops),
                    "on": _step_ms(c.on_seconds, c.on_loops)},
        "draft_loops": {"off": _loops_total(c.off_loops), "on": _loops_total(c.on_loops)},
        "draft_loops_per_generate": {"off": [attrs.asdict(x) for x in c.off_loops],
                                     "on": [attrs.asdict(x) for x in c.on_loops]},
        "acceptance": {"off": total_acceptance(c.off_acceptance).as_json(),
                       "on": total_acceptance(c.on_acceptance).as_json(),
                       "recorded": {"off": c.recorded_acceptance[0].as_json(),
                                    "on": c.recorded_acceptance[1].as_json()}},
        "acceptance_per_generate": {
            "off": [[a.drafts, a.accepted] for a in c.off_acceptance],
            "on": [[a.drafts, a.accepted] for a in c.on_acceptance]},
        "groups": {"off": [attrs.asdict(g) for g in c.off_groups],
                   "on": [attrs.asdict(g) for g in c.on_groups]},
        "startup_seconds": [[round(s, 1) for s in pair] for pair in c.startup_seconds],
    }


def control_missed(data: JSONObject) -> str | None:
    """What to say when a negative control of :func:`cuda_summary`'s object was not caught: each
    missed case with how many drafts differed, and the margin it fell under; ``None`` when every
    control was caught or none ran."""
    missed = [f"{_case(e).label} batch {e['batch_size']} ({e['differing_draft_tokens']} of "
              f"{e['draft_tokens_compared']} drafts differ)"
              for e in data["configurations"] if e.get("caught") is False]
    if not missed:
        return None
    return ("the negative control's wrong spec was not caught: it differs from plugin off by "
            f"less than the margin ({CAUGHT_DRAFT_SHARE:.0%} of the drafts, or an acceptance "
            f"length {CAUGHT_LENGTH_DROP:.0%} lower) in {'; '.join(missed)}")


def _strict(c: CudaComparison) -> bool:
    """Off and on agree in everything compared, and something was compared."""
    return (c.output_tokens_identical and c.draft_tokens_identical
            and c.draft_tokens_compared > 0 and c.hidden_max_abs_difference == 0.0
            and c.acceptance_identical)


def _caught(c: CudaComparison) -> bool:
    """A negative control's run differs from plugin off's by the stated margin
    (:func:`~draftmeta.integrations.vllm.e2e.controls.caught`)."""
    off, on = c.recorded_acceptance
    return caught(off.mean_acceptance_length, on.mean_acceptance_length,
                  c.differing_draft_tokens, c.draft_tokens_compared)


def cuda_summary(comparisons: Sequence[CudaComparison],
                 failures: Sequence[CudaFailure] = (), *, command: str = "") -> JSONObject:
    """The JSON object of a CUDA run (``failed``: the cases that could not run, with why)."""
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    try:
        import vllm

        vllm_version = str(vllm.__version__)
    except ImportError:
        vllm_version = "not installed"
    # the limit row's metadata goes stale on purpose: timed, but no evidence of identity
    timed = [c for c in comparisons if not c.case.negative_control and not c.case.limit]
    configurations = [_entry(c) for c in comparisons]
    controls = [c for c in comparisons if c.case.negative_control]
    return {
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm_version,
        "command": command,
        "output_tokens_identical": all(c.output_tokens_identical for c in timed),
        "draft_tokens_identical": all(c.draft_tokens_identical for c in timed),
        "strictly_identical": all(_strict(c) for c in timed),
        "negative_control_caught": (all(_caught(c) for c in controls) if controls else None),
        "configurations": configurations,
        "best_k": best_k_table(configurations),
        "failed": [{"case": f.case.label, "error": f.error} for f in failures],
    }


def best_k_table(configurations: Sequence[JSONObject]) -> list[JSONObject]:
    """Per model, backend and batch size measured at two or more K: the best K and its
    expected tok/s, plugin off and on, at each acceptance rate of
    :data:`~draftmeta.integrations.vllm.e2e.best_k.ALPHAS`
    (:func:`~draftmeta.integrations.vllm.e2e.best_k.best_k` from the measured step times)."""
    rows = []
    for (model, backend, batch), times in step_times(configurations).items():
        if len(times) < 2:
            continue
        for b in best_k(times, batch):
            rows.append({"model": model, "backend": backend, "batch_size": batch,
                         "ks": sorted(times), "alpha": b.alpha, "k_off": b.k_off,
                         "tokens_per_s_off": round(b.tokens_per_s_off, 1), "k_on": b.k_on,
                         "tokens_per_s_on": round(b.tokens_per_s_on, 1),
                         "gain": round(b.gain, 3)})
    return rows


def _fmt_rate(spread: JSONObject | None) -> str:
    if spread is None:
        return "-"
    return f"{spread['median']:.0f} ({spread['min']:.0f}-{spread['max']:.0f})"


def _loop_path(entry: JSONObject, side: str) -> str:
    loops = entry["draft_loops"][side]
    parts = [f"{n} {what}" for what, n in (("graph", loops["fused_replays"]),
                                            ("fused eager", loops["fused_eager"]),
                                            ("rebuilt", loops["rebuilt"])) if n]
    return ", ".join(parts) or "-"


def cuda_markdown(data: JSONObject) -> str:
    """The table: one row per case and batch size."""
    lines = [
        f"vLLM {data['vllm']} on {data['device']} (torch {data['torch']}); tok/s: median "
        "(min-max) of the measured generates; "
        + ("on/off: the median of the engine pairs' ratios (their range where there were "
           "several); draft loops of every measured generate."
           if any("step_ms" in e for e in data["configurations"])
           else "draft loops of the last measured generate."),
        "",
        "| case | batch | tokens, drafts | off tok/s | on tok/s | on/off | loops off | "
        "loops on |",
        "|---|---:|---|---:|---:|---:|---|---|",
    ]
    for e in data["configurations"]:
        case = _case(e).label
        same = ("same" if e["output_tokens_identical"] and e["draft_tokens_identical"]
                else f"DIFFER ({e['differing_draft_tokens']}"
                     + (f" of {e['draft_tokens_compared']}" if "draft_tokens_compared" in e
                        else "") + " drafts)")
        if e.get("caught") is not None:  # a negative control: judged by the margin, not identity
            same += ", caught" if e["caught"] else ", missed: under the margin"
        ratio = "-" if e["speedup"] is None else f"{e['speedup']:.2f}x"
        pairs = e.get("pair_speedups") or []
        if len(pairs) > 1:
            ratio += f" ({min(pairs):.2f}-{max(pairs):.2f}, {len(pairs)} pairs)"
        lines.append(
            f"| {case} | {e['batch_size']} | {same} | {_fmt_rate(e['tokens_per_s']['off'])} | "
            f"{_fmt_rate(e['tokens_per_s']['on'])} | {ratio} | {_loop_path(e, 'off')} | "
            f"{_loop_path(e, 'on')} |")
    for failed in data.get("failed", []):
        lines.append(f"| {failed['case']} | - | FAILED: {failed['error'][:200]} | | | | | |")
    stepped = [e for e in data["configurations"] if e.get("step_ms")
               and e["step_ms"]["off"] is not None]
    if stepped:
        lines += [
            "",
            "Per engine step (a verification and its draft loop) over every measured generate: "
            "wall time T; host time on draft metadata per draft loop with the plugin off (s, "
            "vLLM's rebuilds: what the captured loop removes); vLLM's mean acceptance length:",
            "",
            "| case | batch | T off / on, ms | s (off), us | s / T | acceptance length off / on |",
            "|---|---:|---|---:|---:|---|",
        ]
        for e in stepped:
            off_s = host_us_per_loop(e, "off")
            t_off, t_on = e["step_ms"]["off"], e["step_ms"]["on"]
            share = "-" if off_s is None else f"{off_s / (t_off * 1e3):.1%}"
            lengths = " / ".join(
                "-" if (v := e["acceptance"][m]["mean_acceptance_length"]) is None
                else f"{v:.2f}" for m in ("off", "on"))
            lines.append(f"| {_case(e).label} | {e['batch_size']} | {t_off:.2f} / "
                         f"{'-' if t_on is None else f'{t_on:.2f}'} | "
                         f"{'-' if off_s is None else f'{off_s:.0f}'} | {share} | {lengths} |")
    best = data.get("best_k") or []
    if best:
        lines += [
            "",
            "The best K from the measured step times, each draft token accepted with "
            "probability alpha (expected tok/s = batch x (1 + alpha + ... + alpha^K) / T(K)):",
            "",
            "| model | backend | batch | K measured | alpha | best K off: tok/s | best K on: "
            "tok/s | on / off |",
            "|---|---|---:|---|---:|---|---|---:|",
        ]
        lines += [f"| {r['model']} | {r['backend']} | {r['batch_size']} | "
                  f"{', '.join(map(str, r['ks']))} | {r['alpha']} | {r['k_off']}: "
                  f"{r['tokens_per_s_off']:.0f} | {r['k_on']}: {r['tokens_per_s_on']:.0f} | "
                  f"{r['gain']:.2f}x |" for r in best]
    host = [(e, off, on) for e in data["configurations"]
            if (off := host_us_per_loop(e, "off")) is not None
            and (on := host_us_per_loop(e, "on")) is not None]
    if host:
        lines += [
            "",
            "Host time on draft metadata per draft loop run on the host (the last measured "
            "generate's metadata builds and hook calls over its loops), us:",
            "",
            "| case | batch | off | on | off/on |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [f"| {_case(e).label} | {e['batch_size']} | {off:.0f} | {on:.0f} | "
                  f"{off / on:.2f}x |" for e, off, on in host]
    return "\n".join(lines) + "\n"


def host_us_per_loop(entry: JSONObject, side: str) -> float | None:
    """Microseconds of host time on draft metadata (builds and hook calls) per draft loop that
    ran on the host, for one side (``off`` or ``on``) of one configuration; ``None`` where
    none ran there (every loop replayed a graph) or the result predates the build timing."""
    loops = entry["draft_loops"][side]
    on_host: int = loops["fused_eager"] + loops["rebuilt"]
    if not on_host or "build_seconds" not in loops:
        return None
    seconds: float = loops["build_seconds"] + loops["hook_seconds"]
    return seconds / on_host * 1e6


def cuda_plot(data: JSONObject, path: Path) -> Path | None:
    """A bar chart of on/off tok/s ratios (one bar per timed case and batch size), with the
    1.0 line, drawn to be read at the site's page width (as
    :func:`draftmeta.bench.report.figure`); ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        from matplotlib.patches import Patch
    except ImportError:
        return None
    from draftmeta.bench.report import PLOT_FONT_PT, PLOT_WIDTH_IN

    entries = [e for e in data["configurations"] if e["speedup"] is not None]
    if not entries:
        return None

    def label(e: JSONObject) -> str:
        extra = (" override" if e["override_upstream"] else "") + (
            f" {e['kv_cache_dtype']}" if e["kv_cache_dtype"] != "auto" else "")
        return f"{e['model']} {e['backend']}{extra} K={e['k']} b={e['batch_size']}"

    labels = [label(e) for e in entries]
    ratios = [e["speedup"] for e in entries]
    kinds = {"#2a7": "faster with the plugin", "#c44": "slower with the plugin",
             "#999": "K = 1 (no draft loop)"}
    colors = ["#999" if e["k"] == 1 else "#2a7" if r >= 1.0 else "#c44"
              for e, r in zip(entries, ratios)]
    with plt.rc_context({"font.size": PLOT_FONT_PT}):
        fig, ax = plt.subplots(figsize=(PLOT_WIDTH_IN, 0.3 * len(entries) + 1.6),
                               layout="constrained")
        ax.barh(range(len(entries)), ratios, color=colors)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_yticks(range(len(entries)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("tok/s, plugin on over off (medians)")
        for i, r in enumerate(ratios):
            ax.text(r, i, f" {r:.2f}x", va="center")
        ax.set_xlim(0, max(ratios) * 1.25)
        ax.xaxis.set_major_locator(matplotlib.ticker.MultipleLocator(0.5))
        shown = [c for c in kinds if c in colors]
        fig.legend([Patch(color=c) for c in shown], [kinds[c] for c in shown],
                   loc="outside lower center", ncols=len(shown), frameon=False)
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def write_cuda_results(data: JSONObject, out: Path, stem: str = CUDA_RESULT_NAME, *,
                       plot: bool = True) -> dict[str, Path]:
    """Write ``{stem}.json``, ``.md`` and (with ``plot``) ``.png`` into ``out``; returns the
    paths by kind."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(cuda_markdown(data), encoding="utf-8")
    png = cuda_plot(data, out / f"{stem}.png") if plot else None
    if png is not None:
        paths["png"] = png
    return paths
