"""An end-to-end run's result rendered: the Markdown report and the PNG of
:func:`~draftmeta.integrations.vllm.tools.e2e.report.summary`'s object, and the three files
written side by side (:func:`write_results`).

What the result decides (identity, acceptance, the controls' verdicts, the noise rule's, the
best K) is :mod:`~draftmeta.integrations.vllm.tools.e2e.report`'s; this module only shows it,
reading nothing but that JSON object (so a merged result or one written by an earlier run
renders the same way).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftmeta.integrations.vllm.tools.e2e.controls import CAUGHT_DRAFT_SHARE, CAUGHT_LENGTH_DROP
from draftmeta.integrations.vllm.tools.e2e.report import case_of
from draftmeta.measure.noise import Ratios, Verdict

__all__ = ["markdown", "plot", "write_results"]


# -- Markdown ----------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _percent(share: float | None, digits: int = 1) -> str:
    return _fmt(None if share is None else 100 * share, digits, "%")


def _lengths(entry: Mapping[str, Any]) -> str:
    return " / ".join(_fmt(entry["acceptance"][s]["mean_acceptance_length"], 2)
                      for s in ("off", "on"))


def _rate(spread: Mapping[str, Any] | None) -> str:
    if not spread:
        return "-"
    return f"{spread['median']:.0f} ({spread['min']:.0f}-{spread['max']:.0f})"


def _ratio(entry: Mapping[str, Any]) -> str:
    if entry["speedup"] is None:
        return "-"
    pairs = entry["pair_speedups"]
    text = f"{entry['speedup']:.2f}x"
    if len(pairs) > 1:
        text += f" ({min(pairs):.2f}-{max(pairs):.2f}, {len(pairs)} pairs)"
    elif entry.get("generate_pairs"):
        text += f" (per generate {Ratios.from_json(entry['generate_pairs']).span()})"
    return text


def _same(entry: Mapping[str, Any]) -> str:
    if entry["strictly_identical"]:
        return "identical"
    parts = []
    if not entry["output_tokens_identical"]:
        parts.append("tokens DIFFER")
    if not entry["draft_tokens_identical"]:
        parts.append(f"{entry['differing_draft_tokens']} of {entry['draft_tokens_compared']} "
                     "drafts DIFFER")
    elif not entry["draft_tokens_compared"]:
        parts.append("no drafts compared")
    if entry["hidden_max_abs_difference"] != 0.0:
        parts.append("hidden states differ")
    if not entry["acceptance_identical"]:
        parts.append("acceptance differs")
    return "**" + ", ".join(parts) + "**"


def _judged(check: Mapping[str, Any] | None, name: str) -> str:
    entry = (check or {}).get(name)
    if not entry:
        return "no timed pairs"
    judged = Verdict(entry["verdict"], Ratios.from_json(entry["ratio"]), entry["noise"],
                     entry["too_noisy_by"])
    return f"per pair {judged.ratio.span()}: {judged.sentence()}"


def _headline(data: Mapping[str, Any]) -> list[str]:
    decided = data["decided"]
    controls = decided["controls"]
    acceptance = decided["acceptance"]
    n = decided["configurations"]
    identical = ("**identical**" if decided["strictly_identical"] else "**NOT identical**")
    lines = [
        f"- off vs on: {identical} in {n} configuration{'s' if n != 1 else ''}: output tokens "
        f"{_yes(decided['output_tokens_identical'])}, draft tokens "
        f"{_yes(decided['draft_tokens_identical'])} ({decided['differing_draft_tokens']} of "
        f"{decided['draft_tokens_compared']} differ), draft hidden states to the bit "
        f"{_yes(decided['hidden_states_identical'])}, accepted drafts per position "
        f"{_yes(decided['acceptance_identical'])}",
        f"- vLLM's acceptance: mean acceptance length "
        f"{_fmt(acceptance['off']['mean_acceptance_length'], 2)} off, "
        f"{_fmt(acceptance['on']['mean_acceptance_length'], 2)} on (per position on: "
        + ", ".join(f"{r:.2f}" for r in acceptance["on"]["per_position"]) + ")",
    ]
    if any(controls.values()):
        blind = controls.get("blind") or []
        lines.append(
            f"- negative controls: {len(controls['caught'])} caught, {len(controls['inert'])} "
            f"inert (nothing reads what they leave stale), {len(controls['missed'])} missed"
            + (f" (**{'; '.join(controls['missed'])}**)" if controls["missed"] else "")
            + (f", {len(blind)} blind (no draft loop crossed a scheduler tile, so the stale "
               f"schedule could not act: {'; '.join(blind)}; its proof is the hook-level one, "
               "`draftmeta audit` on a GPU)" if blind else ""))
    if decided["failed"]:
        lines.append(f"- **{decided['failed']} case(s) failed** (below)")
    check = data.get("noise_check")
    if check:
        lines.append(f"- tok/s on over off, the plugin's configurations: "
                     f"{_judged(check, 'tokens_per_s')}; {check['control_sentence']} "
                     f"(control: {check['control_cases']})")
        if check.get("host_metadata"):
            lines.append(f"- host time on draft metadata, off over on: "
                         f"{_judged(check, 'host_metadata')}")
    ranked = [row for row in data["configurations"]
              if row.get("ranks", {}).get("on") and not row["aa"]]
    if ranked:
        lines.append(f"- ranks in vLLM's worker processes: {_ranks(ranked)}")
    forced = ", ".join(f"{k}={v}" for k, v in data["forced"].items())
    lines.append(f"- forced in every plugin-on engine: {forced} (draftmeta's in-place path is "
                 "measured also where the plugin would leave a builder to vLLM by default)")
    return lines


def _ranks(rows: list[dict[str, Any]]) -> str:
    """Where the draft loop ran in vLLM's workers: in how many configurations (A/A controls
    aside) the plugin was active in every worker of the plugin-on engine and in none of the
    plugin-off one."""
    right = [row for row in rows
             if all(r["plugin_active"] for r in row["ranks"]["on"])
             and not any(r["plugin_active"] for r in row["ranks"]["off"])]
    sizes = sorted({len(row["ranks"]["on"]) for row in rows})
    return (f"{len(right)} of {len(rows)} configuration(s) had draftmeta's plugin active in "
            f"every worker of the plugin-on engine and in none of the plugin-off one "
            f"({'/'.join(map(str, sizes))} ranks, one process each)")


def _yes(value: bool) -> str:
    return "yes" if value else "**no**"


def markdown(data: Mapping[str, Any]) -> str:
    """The report of :func:`~draftmeta.integrations.vllm.tools.e2e.report.summary`'s object:
    what it decides first, then one row per case and batch size, the draft loops, the negative
    controls and the best K."""
    settings = data["settings"]
    models = "; ".join(f"{name}: {m['description']}" for name, m in data["models"].items())
    gpu = data["machine"].get("gpu")
    lines = [
        f"vLLM {data['vllm']} on {gpu or 'the CPU'} ({data['device']}); {models}. "
        f"{settings['max_tokens']} tokens per prompt; per engine and batch size one recorded "
        f"generate, {settings['warmups']} warm-up and {settings['repeats']} measured ones "
        f"taking turns; {settings['pairs']} engine pair(s) per case"
        + (f"; TP {settings['tensor_parallel_size']}" if settings["tensor_parallel_size"] > 1
           else "")
        + (f", DCP {settings['decode_context_parallel_size']}"
           if settings["decode_context_parallel_size"] > 1 else "") + ".",
        "",
        *_headline(data),
    ]
    if data["skipped"]:
        lines.append("- skipped: " + "; ".join(f"{k}: {v}" for k, v in data["skipped"].items()))
    profiled = any(e["limit"] is not None for e in data["configurations"])
    lines += [
        "",
        "| case | batch | off vs on | acceptance length off / on | tok/s off | tok/s on "
        "| on/off | T off / on, ms | s / T |" + (" GPU busy off / on, ms | GPU idle off / on, "
                                                "ms | limit | of the limit |" if profiled else ""),
        "|---|---:|---|---|---:|---:|---:|---|---:|" + ("---|---|---:|---:|" if profiled
                                                        else ""),
    ]
    for e in data["configurations"]:
        row = (f"| {case_of(e).label} | {e['batch_size']} | {_same(e)} | {_lengths(e)} | "
               f"{_rate(e['tokens_per_s']['off'])} | {_rate(e['tokens_per_s']['on'])} | "
               f"{_ratio(e)} | {_fmt(e['step_ms']['off'], 2)} / {_fmt(e['step_ms']['on'], 2)} | "
               f"{_percent(e['host_share_off'])} |")
        if profiled:
            busy = e["gpu_busy_ms_per_step"]
            row += (f" {_fmt(busy['off'], 2)} / {_fmt(busy['on'], 2)} | "
                    f"{_fmt(e['gpu_idle_ms_per_step_off'], 2)} / "
                    f"{_fmt(e.get('gpu_idle_ms_per_step_on'), 2)} | {_fmt(e['limit'], 2, 'x')} | "
                    f"{_percent(e['share_of_limit'], 0)} |")
        lines.append(row)
    for failed in data["failed"]:
        lines.append(f"| {failed['case']} | - | FAILED: {failed['error'][:200]} |")
    lines += ["", "*T*: wall time per engine step (a verification and its draft loop); *s*: host "
              "time on draft metadata per step with the plugin off (vLLM's rebuilds)"
              + ("; *GPU busy*: the union of the GPU's kernels per step (a profiled generate); "
                 "*GPU idle*: T less GPU busy, the time per step the GPU waited for the host; "
                 "*limit*: T off over GPU busy on, the most a step can gain when the host costs "
                 "nothing; *of the limit*: (on/off - 1) over (limit - 1). What the plugin can "
                 "remove is the part of the idle time its draft loop caused: the idle time left "
                 "with it on is host work outside the draft loop." if profiled else ".")]
    lines += _loops_table(data)
    lines += _controls_table(data)
    lines += _best_k_table(data)
    return "\n".join(lines) + "\n"


def _counts(counts: Mapping[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((counts or {}).items())) or "0"


def _loops_table(data: Mapping[str, Any]) -> list[str]:
    configs = data["configurations"]
    if not configs:
        return []
    if data["device"] == "cpu":
        lines = ["", "Draft loops (CPU: every step on the host; counts of the recorded generate, "
                 "host us per refresh the median over measured generates):", "",
                 "| case | batch | in place (on) | carried over (on) | rebuilds off / on "
                 "| refresh us/step off / on | later step us off / on |",
                 "|---|---:|---:|---:|---|---|---|"]
        for e in configs:
            off, on = e["recorded_loops"]["off"], e["recorded_loops"]["on"]
            t_off, t_on = e["draft_loops"]["off"], e["draft_loops"]["on"]
            lines.append(
                f"| {case_of(e).label} | {e['batch_size']} | {_counts(on['in_place_updates'])} "
                f"| {_counts(on['carried_over'])} | {_counts(off['rebuilds'])} / "
                f"{_counts(on['rebuilds'])} | {_fmt(t_off.get('refresh_us_per_step'))} / "
                f"{_fmt(t_on.get('refresh_us_per_step'))} | "
                f"{_fmt(t_off.get('later_refresh_us_per_step'))} / "
                f"{_fmt(t_on.get('later_refresh_us_per_step'))} |")
        return lines
    lines = ["", "Draft loops over the measured generates (graph: one captured graph replayed; "
             "eager: the fused loop on the host; rebuilt: metadata rebuilt before every step), "
             "and the host time on draft metadata per loop run on the host:", "",
             "| case | batch | fused loop off / on | loops off | loops on | host us/loop off "
             "/ on |", "|---|---:|---|---|---|---|"]
    for e in configs:
        lines.append(
            f"| {case_of(e).label} | {e['batch_size']} | {_yes(e['fused_loop']['off'])} / "
            f"{_yes(e['fused_loop']['on'])} | {_paths(e['draft_loops']['off'])} | "
            f"{_paths(e['draft_loops']['on'])} | {_fmt(e['host_us_per_loop']['off'], 0)} / "
            f"{_fmt(e['host_us_per_loop']['on'], 0)} |")
    return lines


def _paths(loops: Mapping[str, Any]) -> str:
    parts = [f"{loops.get(key, 0)} {what}" for what, key in (
        ("graph", "fused_replays"), ("eager", "fused_eager"), ("rebuilt", "rebuilt"))
        if loops.get(key)]
    return ", ".join(parts) or "-"


def _controls_table(data: Mapping[str, Any]) -> list[str]:
    controls = data["controls"]
    if not controls:
        return []
    verdicts = {"caught": "caught", "missed": "**missed**",
                "inert": "no effect (bitwise equal: nothing here reads it)",
                "blind": "blind: no loop crossed a tile"}
    lines = ["", f"Negative controls (plugin on with a deliberately wrong update; caught when "
             f"the mean acceptance length falls by {CAUGHT_LENGTH_DROP:.0%} or "
             f"{CAUGHT_DRAFT_SHARE:.0%} of the draft tokens differ, margins fixed before the "
             "first run):", "",
             "| control | case | batch | acceptance length off / control | accepted by draft "
             "position (control) | draft tokens differing | verdict |",
             "|---|---|---:|---|---|---:|---|"]
    for c in controls:
        positions = ", ".join(f"{r:.2f}" for r in c["acceptance"]["on"]["per_position"])
        crossed = c.get("tile_crossings")
        counted = (f"{c['differing_draft_tokens']} of {c['draft_tokens_compared']}"
                   + (f"; after a tile crossing {crossed['differing']} of {crossed['drafts']}"
                      if crossed else ""))
        lines.append(f"| {c['wrong']} | {case_of({**c, 'control': None}).label} | "
                     f"{c['batch_size']} | {_lengths(c)} | {positions or '-'} | {counted} | "
                     f"{verdicts[c['verdict']]} |")
    if any(c.get("tile_crossings") for c in controls):
        lines += ["", "A stale FlashMLA schedule can act only where a request's sequence enters "
                  "a new 64-token tile after a draft loop's first step; such a control is judged "
                  "over those drafts, by the same 10% margin, and is *blind* where the run held "
                  "none."]
    return lines


def _best_k_table(data: Mapping[str, Any]) -> list[str]:
    best = data.get("best_k") or []
    if data.get("best_k_withheld"):
        return ["", f"The best K from the measured step times: not given ("
                f"{data['best_k_withheld']})."]
    if not best:
        return []
    return ["", "The best K from the measured step times, each draft token accepted with "
            "probability alpha (expected tok/s = batch x (1 + alpha + ... + alpha^K) / T(K)):",
            "", "| model | backend | batch | K measured | alpha | best K off: tok/s | best K "
            "on: tok/s | on / off |", "|---|---|---:|---|---:|---|---|---:|",
            *[f"| {r['model']} | {r['backend']} | {r['batch_size']} | "
              f"{', '.join(map(str, r['ks']))} | {r['alpha']} | {r['k_off']}: "
              f"{r['tokens_per_s_off']:.0f} | {r['k_on']}: {r['tokens_per_s_on']:.0f} | "
              f"{r['gain']:.2f}x |" for r in best]]


# -- the plot ------------------------------------------------------------------------------------


def plot(data: Mapping[str, Any], path: Path) -> Path | None:
    """A PNG of :func:`~draftmeta.integrations.vllm.tools.e2e.report.summary`'s object, one
    group per timed configuration, drawn to be read at the site's page width
    (:func:`draftmeta.bench.report.figure`'s width and fonts, the legend below the panels): host
    time on draft metadata per draft loop off and on (bars), and tok/s on over off per engine
    pair (the median with the min-max as error bars, 1.00 as a line, the A/A control's noise
    shaded, and on a GPU the limit of each configuration as a mark); ``None`` without matplotlib
    or without a timed configuration."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from draftmeta.measure.plots import PLOT_FONT_PT, PLOT_WIDTH_IN

    configs = [e for e in data["configurations"] if e["speedup"] is not None]
    if not configs:
        return None
    several = len({(e["model"], e["backend"]) for e in configs}) > 1
    labels = [(f"{e['model']} {e['backend']}\n" if several else "")
              + f"b{e['batch_size']} K{e['k']}" + (" A/A" if e["aa"] else "") for e in configs]
    xs = list(range(len(configs)))
    width = 0.38
    with plt.rc_context({"font.size": PLOT_FONT_PT}):
        fig, (top, bottom) = plt.subplots(2, 1, sharex=True, layout="constrained",
                                          figsize=(PLOT_WIDTH_IN, 6.6))
        for shift, side, colour in ((-width / 2, "off", "#b0b0b0"), (width / 2, "on", "#2b7bba")):
            values = [e["host_us_per_step"][side] or 0.0 for e in configs]
            top.bar([x + shift for x in xs], values, width, label=f"plugin {side}",
                    color=colour)
        top.set_ylabel("host µs on draft metadata\nper engine step")
        top.grid(axis="y", alpha=0.3)
        bottom.axhline(1.0, color="black", linewidth=0.8)
        control = ((data.get("noise_check") or {}).get("control") or {})
        if control.get("usable") and control.get("straddles_1"):
            noise = control["noise"]
            bottom.axhspan(1.0 - noise, 1.0 + noise, color="#e0e0e0",
                           label=f"noise: the A/A control's ±{noise:.0%}")
        medians = [e["speedup"] for e in configs]
        spans = [[m - min(e["pair_speedups"]) for m, e in zip(medians, configs)],
                 [max(e["pair_speedups"]) - m for m, e in zip(medians, configs)]]
        bottom.errorbar(xs, medians, yerr=spans, fmt="o", capsize=3, color="#2b7bba",
                        label="tok/s on / off (median of engine pairs, min-max)")
        limits = [(x, e["limit"]) for x, e in zip(xs, configs) if e["limit"] is not None]
        if limits:
            bottom.plot([x for x, _ in limits], [v for _, v in limits], "_", markersize=14,
                        color="#c44", label="limit: T off / GPU busy on")
        bottom.set_ylabel("tok/s, on / off")
        bottom.grid(axis="y", alpha=0.3)
        bottom.set_xticks(xs, labels)
        handles, names = top.get_legend_handles_labels()
        more, other = bottom.get_legend_handles_labels()
        fig.legend(handles + more, names + other, loc="outside lower center", ncols=2,
                   frameon=False)
        fig.suptitle(f"vLLM {data['vllm']} ({data['device']}): draftmeta's plugin off vs on")
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def write_results(data: Mapping[str, Any], out: Path, stem: str, *, with_plot: bool = True
                  ) -> dict[str, Path]:
    """Write ``{stem}.json``, ``.md`` and (with ``with_plot``, where matplotlib is installed)
    ``.png`` into ``out`` (created); returns the paths by kind."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(data), encoding="utf-8")
    png = plot(data, out / f"{stem}.png") if with_plot else None
    if png is not None:
        paths["png"] = png
    return paths
