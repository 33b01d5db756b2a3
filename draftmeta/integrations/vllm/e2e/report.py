"""The end-to-end results as JSON, a Markdown table and a PNG.

:func:`summary` turns a :class:`~draftmeta.integrations.vllm.e2e.compare.MatrixResult` into one
JSON object. Its top level pools every configuration (identity flags are all-of, counts are
summed, host times are totals divided by totals); ``configurations`` holds one object per
backend, batch size and K with the same keys. Counts are per ``generate``; times are medians
over the measured generates.

Host time "refreshing draft metadata" is the time spent in vLLM's
``AttentionGroup.build_metadata_for_drafting`` at draft indices >= 1 (every refresh between
draft steps): with the plugin off, vLLM's rebuilds; with it on, at index 1 the previous draft
loop's metadata carried over and refreshed in place where the batch allows it (``carried_over``
counts those loops; a new batch shape builds), plus its in-place updates at indices >= 2.
``refresh_us_per_later_step`` counts indices >= 2 only: steps that are always in place.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from draftmeta.arguments import Extent
from draftmeta.integrations.vllm.e2e.acceptance import total_acceptance
from draftmeta.integrations.vllm.e2e.compare import Comparison, MatrixConfig, MatrixResult
from draftmeta.noise import Control, Ratios, Verdict, pair_ratios, verdict

__all__ = ["REFRESH_GOAL", "RESULT_NAME", "extent", "markdown", "noise_check",
           "planned_extent", "plot", "strictly_identical", "summary", "tokens_per_s_pairs",
           "write_results"]

RESULT_NAME = "e2e-cpu"
"""The stem of the CPU run's files in its results folder."""

REFRESH_GOAL = 5.0
"""Issue 11's goal: with the plugin on, refreshing draft metadata takes at least 5x less host
time than with it off."""

JSONObject = dict[str, Any]


def _median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _per_call(seconds: float, calls: int) -> float | None:
    return seconds * 1e6 / calls if calls else None


def _merge(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for name, n in counts.items():
        into[name] = into.get(name, 0) + n


def _pairs(off: list[float], on: list[float]) -> JSONObject | None:
    """The pair ratios (off time / on time: above 1.00 plugin on is faster) of generates ``i``
    of both engines, which ran in turn; ``None`` where a side measured no time (K = 1 has no
    refresh)."""
    if not off or len(off) != len(on) or min(off + on) <= 0.0:
        return None
    return pair_ratios(off, on).as_json()


def _configuration(c: Comparison) -> JSONObject:
    refresh_calls = {m: r.first.refresh(1).calls for m, r in (("off", c.off), ("on", c.on))}
    later_calls = {m: r.first.refresh(2).calls for m, r in (("off", c.off), ("on", c.on))}
    refresh = {m: _median(r.refresh_seconds) for m, r in (("off", c.off), ("on", c.on))}
    later = {m: _median(r.later_refresh_seconds) for m, r in (("off", c.off), ("on", c.on))}
    tps = {m: r.generated_tokens / _median(r.seconds) for m, r in (("off", c.off), ("on", c.on))}
    per_step = {m: _per_call(refresh[m], refresh_calls[m]) for m in refresh}
    per_later = {m: _per_call(later[m], later_calls[m]) for m in later}
    return {
        "backend": c.backend,
        "batch_size": c.batch_size,
        "k": c.k,
        "output_tokens_identical": c.output_tokens_identical,
        "draft_tokens_identical": c.draft_tokens_identical,
        "draft_hidden_states_identical": c.hidden_states_identical,
        "differing_draft_tokens": c.differing_draft_tokens,
        "draft_tokens_compared": c.draft_tokens_compared,
        "hidden_max_abs_difference": _finite(c.hidden_max_abs_difference),
        "acceptance": {"off": c.off.first.acceptance.as_json(),
                       "on": c.on.first.acceptance.as_json()},
        "acceptance_identical": c.acceptance_identical,
        "deterministic": {"off": c.off.deterministic, "on": c.on.deterministic},
        "propose_calls": len(c.off.first.draft_tokens),
        "generated_tokens": c.off.generated_tokens,
        "in_place_updates": {"off": dict(c.off.first.in_place), "on": dict(c.on.first.in_place)},
        "rebuilds": {"off": dict(c.off.first.rebuilt), "on": dict(c.on.first.rebuilt)},
        "carried_over": {"off": dict(c.off.first.carried_over),
                         "on": dict(c.on.first.carried_over)},
        "plugin_stats": c.on.plugin_stats,
        "refresh_calls": refresh_calls,
        "later_refresh_calls": later_calls,
        "refresh_us_per_generate": {m: v * 1e6 for m, v in refresh.items()},
        "later_refresh_us_per_generate": {m: v * 1e6 for m, v in later.items()},
        "refresh_us_per_step": per_step,
        "refresh_us_per_step_all": {
            m: [round(v * 1e6 / refresh_calls[m], 2) for v in r.refresh_seconds]
            if refresh_calls[m] else [] for m, r in (("off", c.off), ("on", c.on))},
        "refresh_us_per_later_step": per_later,
        "refresh_ratio": _ratio(per_step["off"], per_step["on"]),
        "later_refresh_ratio": _ratio(per_later["off"], per_later["on"]),
        "refresh_us_by_draft_index": {
            m: {str(i): v * 1e6 for i, v in r.index_seconds.items()}
            for m, r in (("off", c.off), ("on", c.on))
        },
        "tokens_per_s": tps,
        "tokens_per_s_ratio": _ratio(tps["on"], tps["off"]),
        "seconds_per_generate": {"off": c.off.seconds, "on": c.on.seconds},
        # generate i of both engines ran in turn (off, on, on, off, ...): pair i
        "tokens_per_s_pairs": _pairs(c.off.seconds, c.on.seconds),
        "refresh_pairs": _pairs(c.off.refresh_seconds, c.on.refresh_seconds),
        "later_refresh_pairs": _pairs(c.off.later_refresh_seconds, c.on.later_refresh_seconds),
    }


def _control(c: Comparison) -> JSONObject:
    """One negative control's run against the plugin-off run of the same batch."""
    from draftmeta.integrations.vllm.e2e.controls import CONTROLS, verdict

    assert c.control is not None
    off, on = c.off.first.acceptance, c.on.first.acceptance
    return {
        "control": c.control,
        "wrong": CONTROLS[c.control].wrong,
        "backend": c.backend,
        "batch_size": c.batch_size,
        "k": c.k,
        "output_tokens_identical": c.output_tokens_identical,
        "differing_draft_tokens": c.differing_draft_tokens,
        "draft_tokens_compared": c.draft_tokens_compared,
        "hidden_max_abs_difference": _finite(c.hidden_max_abs_difference),
        "acceptance": {"off": off.as_json(), "on": on.as_json()},
        "verdict": verdict(off.mean_acceptance_length, on.mean_acceptance_length,
                           c.differing_draft_tokens, c.draft_tokens_compared,
                           _finite(c.hidden_max_abs_difference)),
    }


PAIRED = {"tokens_per_s": "tokens_per_s_pairs", "refresh": "refresh_pairs",
          "later_refresh": "later_refresh_pairs"}
"""The ratios :func:`noise_check` judges, and the key of each configuration's pairs."""


def tokens_per_s_pairs(config: Mapping[str, Any]) -> JSONObject | None:
    """One configuration's tokens/s pairs: as :func:`summary` records them, or for a result
    written before it did, from the seconds of its generates (which took turns the same way:
    off, on, then on, off, ...)."""
    if config.get("tokens_per_s_pairs"):
        return dict(config["tokens_per_s_pairs"])
    seconds = config.get("seconds_per_generate")
    return None if not seconds else _pairs(list(seconds["off"]), list(seconds["on"]))


def noise_check(configs: Sequence[Mapping[str, Any]]) -> JSONObject | None:
    """The run's ratios judged by the rule of :mod:`draftmeta.noise`.

    The A/A control is the K = 1 configurations, where the plugin has no draft step to update
    and both engines run vLLM's own code: their tokens/s pairs. Tokens/s over the configurations
    where the plugin acts (K >= 2; every configuration where none does) is faster or slower only
    beyond the control's noise, and no ratio of a run whose control leans one way gets a
    verdict. Refresh time (K >= 2 only, so the control cannot measure it) is faster or slower
    only where every pair agrees. ``None`` for configurations without pairs (results written
    before generates were paired)."""
    configs = [{**c, "tokens_per_s_pairs": tokens_per_s_pairs(c)} for c in configs]
    if not any(c["tokens_per_s_pairs"] for c in configs):
        return None
    control = Control(tuple(Ratios.from_json(c["tokens_per_s_pairs"]) for c in configs
                            if c["k"] == 1 and c["tokens_per_s_pairs"]))
    acting = [c for c in configs if c["k"] > 1]
    out: JSONObject = {"rule": "draftmeta.noise", "control": control.as_json(),
                       "control_sentence": control.sentence(),
                       "compared": "K >= 2" if acting else "every configuration"}
    acting = acting or configs
    for name, key in PAIRED.items():
        ratios = [Ratios.from_json(c[key]) for c in acting if c.get(key)]
        if not ratios:
            out[name] = None
            continue
        judged = verdict(Ratios.pooled(ratios), control,
                         measures_the_same=name == "tokens_per_s")
        out[name] = judged.as_json()
    return out


def _finite(value: float) -> float | None:
    """``value``, or ``None`` where it is infinite (draft steps that cannot be compared)."""
    return None if value == float("inf") else value


def strictly_identical(config: Mapping[str, Any]) -> bool:
    """One configuration of :func:`summary` agrees off and on in everything it compared:
    output tokens, draft tokens (and some were compared), the draft hidden states to the bit,
    and vLLM's accepted count at every draft position."""
    return bool(config["output_tokens_identical"] and config["draft_tokens_identical"]
                and config["draft_tokens_compared"] > 0
                and config["hidden_max_abs_difference"] == 0.0
                and config["acceptance_identical"])


def _pooled(configs: list[JSONObject], key_total: str, key_calls: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for mode in ("off", "on"):
        total = sum(c[key_total][mode] for c in configs)
        calls = sum(c[key_calls][mode] for c in configs)
        out[mode] = total / calls if calls else None
    return out


def summary(result: MatrixResult) -> JSONObject:
    """The JSON object ``draftmeta e2e --json`` prints; see the module docs for its layout."""
    plain = [c for c in result.comparisons if c.control is None]
    configs = [_configuration(c) for c in plain]
    controls = [_control(c) for c in result.comparisons if c.control is not None]
    in_place: dict[str, dict[str, int]] = {"off": {}, "on": {}}
    rebuilds: dict[str, dict[str, int]] = {"off": {}, "on": {}}
    carried: dict[str, dict[str, int]] = {"off": {}, "on": {}}
    for c in configs:
        for mode in ("off", "on"):
            _merge(in_place[mode], c["in_place_updates"][mode])
            _merge(rebuilds[mode], c["rebuilds"][mode])
            _merge(carried[mode], c["carried_over"][mode])
    refresh_per_step = _pooled(configs, "refresh_us_per_generate", "refresh_calls")
    later_per_step = _pooled(configs, "later_refresh_us_per_generate", "later_refresh_calls")
    tokens = {m: sum(c["generated_tokens"] for c in configs) for m in ("off", "on")}
    seconds = {m: sum(c["generated_tokens"] / c["tokens_per_s"][m] for c in configs)
               for m in ("off", "on")}
    tps = {m: tokens[m] / seconds[m] for m in ("off", "on")}
    refresh_ratio = _ratio(refresh_per_step["off"], refresh_per_step["on"])
    tps_ratio = _ratio(tps["on"], tps["off"])
    identical = all(c["output_tokens_identical"] for c in configs)
    drafts = all(c["draft_tokens_identical"] for c in configs)
    hidden = all(c["draft_hidden_states_identical"] for c in configs)
    acceptance = {"off": total_acceptance([c.off.first.acceptance for c in plain]).as_json(),
                  "on": total_acceptance([c.on.first.acceptance for c in plain]).as_json()}
    backends = list(dict.fromkeys(c["backend"] for c in configs))
    settings = result.config
    return {
        "vllm_version": result.vllm_version,
        "backend": ",".join(backends),
        "backends": backends,
        "skipped": dict(result.skipped),
        "output_tokens_identical": identical,
        "draft_tokens_identical": drafts,
        "draft_hidden_states_identical": hidden,
        "strictly_identical": all(strictly_identical(c) for c in configs),
        "acceptance": acceptance,
        "in_place_updates": in_place,
        "rebuilds": rebuilds,
        "carried_over": carried,
        "refresh_us_per_step": refresh_per_step,
        "refresh_us_per_later_step": later_per_step,
        "tokens_per_s": tps,
        "goals": {
            "tokens_identical_everywhere": identical and drafts,
            "refresh_ratio": refresh_ratio,
            "refresh_5x_lower": refresh_ratio is not None and refresh_ratio >= REFRESH_GOAL,
            "later_refresh_ratio": _ratio(later_per_step["off"], later_per_step["on"]),
            "tokens_per_s_ratio": tps_ratio,
            "tokens_per_s_not_lower": tps_ratio is not None and tps_ratio >= 1.0,
        },
        "noise_check": noise_check(configs),
        "settings": {
            "batch_sizes": list(settings.batch_sizes),
            "ks": list(settings.ks),
            "max_tokens": settings.max_tokens,
            "warmups": settings.warmups,
            "repeats": settings.repeats,
            "seed": settings.seed,
            "model": settings.model,
            "negative_control": bool(settings.spec_overrides),
            "controls": list(settings.controls),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
        "plugin_builders": list(result.plugin_builders),
        "engine_startup_seconds": [round(t, 3) for t in result.startup_seconds],
        "wall_seconds": result.wall_seconds,
        "configurations": configs,
        "negative_controls": controls,
        "negative_controls_missed": [c["control"] for c in controls
                                     if c["verdict"] == "missed"],
    }


def _label(model: str, backend: str, batch_size: int, k: int, max_tokens: int) -> str:
    return f"{model} {backend} batch {batch_size} K {k} ({max_tokens} tokens)"


def extent(data: Mapping[str, Any]) -> Extent:
    """What :func:`summary`'s object holds: its configurations (backend, batch size, K and
    tokens per prompt) and the measured generates of each."""
    settings = data["settings"]
    model = settings.get("model", "tiny")  # runs before the trained model had the tiny one
    return Extent.of((_label(model, c["backend"], c["batch_size"], c["k"],
                             settings["max_tokens"])
                      for c in data["configurations"]), int(settings["repeats"]))


def planned_extent(config: MatrixConfig) -> Extent:
    """What a run of ``config`` on this machine will hold, as :func:`extent` reads it
    afterwards: a backend this CPU cannot run (``AMX_MLA`` without AMX) is skipped by the run,
    so it is left out here too."""
    from draftmeta.integrations.vllm.e2e.environment import backend_unavailable_reason

    backends = [b for b in config.backends if backend_unavailable_reason(b) is None]
    return Extent.of((_label(config.model, b, n, k, config.max_tokens) for b in backends
                      for n in config.batch_sizes for k in config.ks), config.repeats)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "0"


_VERDICTS = {"caught": "caught", "missed": "**missed**",
             "inert": "no effect (bitwise equal: nothing here reads it)"}


def _judged(check: Mapping[str, Any] | None, name: str) -> str:
    """``: per pair 0.99x (0.90-1.08), within noise (...)`` for one ratio of the noise check;
    ``""`` where the run has none."""
    entry = (check or {}).get(name)
    if not entry:
        return ""
    judged = Verdict(entry["verdict"], Ratios.from_json(entry["ratio"]), entry["noise"],
                     entry["too_noisy_by"])
    return f"; per pair {judged.ratio.span()}: {judged.sentence()}"


def _pair_cell(config: Mapping[str, Any]) -> str:
    pairs = tokens_per_s_pairs(config)
    return "-" if not pairs else Ratios.from_json(pairs).span()


def _acceptance_lengths(config: Mapping[str, Any]) -> str:
    """Mean acceptance length off / on (vLLM's count); ``-`` for results without it."""
    if "acceptance" not in config:
        return "-"
    return " / ".join(_fmt(config["acceptance"][m]["mean_acceptance_length"], 2)
                      for m in ("off", "on"))


def markdown(data: Mapping[str, Any]) -> str:
    """A Markdown report of :func:`summary`'s object: headline ratios (plugin off over on), one row
    per configuration."""
    goals = data["goals"]
    check = data.get("noise_check")
    if check is None or "rule" not in check:  # a result written before it was judged so
        check = noise_check(list(data["configurations"]))
    lines = [
        f"vLLM {data['vllm_version']} (CPU build), backend(s) {data['backend']}; "
        + (f"skipped: {'; '.join(f'{k}: {v}' for k, v in data['skipped'].items())}; "
           if data["skipped"] else "")
        + f"{data['settings']['max_tokens']} tokens per prompt, median of "
        f"{data['settings']['repeats']} generates after {data['settings']['warmups']} warm-up.",
        "",
        f"- output tokens identical: **{data['output_tokens_identical']}**, draft tokens "
        f"identical: **{data['draft_tokens_identical']}**, draft hidden states identical: "
        f"**{data['draft_hidden_states_identical']}**",
        f"- refresh between draft steps (indices >= 1): {_fmt(data['refresh_us_per_step']['off'])}"
        f" us off, {_fmt(data['refresh_us_per_step']['on'])} us on per step "
        f"({_fmt(goals['refresh_ratio'], 2)}x)" + _judged(check, "refresh"),
        f"- steps the plugin updates in place (indices >= 2): "
        f"{_fmt(data['refresh_us_per_later_step']['off'])} us rebuild, "
        f"{_fmt(data['refresh_us_per_later_step']['on'])} us update "
        f"({_fmt(goals['later_refresh_ratio'], 2)}x)" + _judged(check, "later_refresh"),
        f"- tokens/s: {_fmt(data['tokens_per_s']['off'])} off, "
        f"{_fmt(data['tokens_per_s']['on'])} on (" + ("over the medians " if check else "")
        + f"{_fmt(goals['tokens_per_s_ratio'], 3)}x)"
        + _judged(check, "tokens_per_s").replace(
            "; per pair", f"; per pair of generates, {(check or {}).get('compared')},", 1),
        *([f"- noise: {check['control_sentence']}; ratios are off time / on time per pair of "
           "generates (above 1.00 the plugin is faster), judged by draftmeta.noise's rule"]
          if check else []),
        "",
        "| backend | batch | K | tokens same | drafts same | acceptance length off / on "
        "| in place (on) | carried over (on) "
        "| rebuilds off / on | refresh us/step off / on | later step us off / on "
        "| tok/s off / on | tok/s on/off per pair |",
        "|---|---:|---:|---|---|---|---:|---:|---|---|---|---|---|",
    ]
    for c in data["configurations"]:
        drafts = ("yes" if c["draft_tokens_identical"]
                  else f"**no** ({c['differing_draft_tokens']} differ)")
        lines.append(
            f"| {c['backend']} | {c['batch_size']} | {c['k']} | "
            f"{'yes' if c['output_tokens_identical'] else '**no**'} | "
            f"{drafts} | {_acceptance_lengths(c)} | {_counts(c['in_place_updates']['on'])} | "
            f"{_counts(c['carried_over']['on'])} | {_counts(c['rebuilds']['off'])} / "
            f"{_counts(c['rebuilds']['on'])} | {_fmt(c['refresh_us_per_step']['off'])} / "
            f"{_fmt(c['refresh_us_per_step']['on'])} | "
            f"{_fmt(c['refresh_us_per_later_step']['off'])} / "
            f"{_fmt(c['refresh_us_per_later_step']['on'])} | {_fmt(c['tokens_per_s']['off'])} / "
            f"{_fmt(c['tokens_per_s']['on'])} | {_pair_cell(c)} |"
        )
    lines.append("")
    lines.append("Counts are per generate; refreshes are calls of vLLM's "
                 "`build_metadata_for_drafting` at draft indices >= 1.")
    controls = data.get("negative_controls") or []
    if controls:
        from draftmeta.integrations.vllm.e2e.controls import (
            CAUGHT_DRAFT_SHARE,
            CAUGHT_LENGTH_DROP,
        )

        lines += [
            "",
            f"Negative controls (plugin on, one part of the draft state left stale from draft "
            f"index 2; caught when the mean acceptance length falls by "
            f"{CAUGHT_LENGTH_DROP:.0%} or {CAUGHT_DRAFT_SHARE:.0%} of the draft tokens differ):",
            "",
            "| control | backend | batch | K | acceptance length off / control | accepted by "
            "draft position (control) | draft tokens differing | verdict |",
            "|---|---|---:|---:|---|---|---:|---|",
        ]
        for c in controls:
            lengths = " / ".join(_fmt(c["acceptance"][m]["mean_acceptance_length"], 2)
                                 for m in ("off", "on"))
            positions = ", ".join(f"{r:.2f}" for r in c["acceptance"]["on"]["per_position"])
            lines.append(
                f"| {c['wrong']} | {c['backend']} | {c['batch_size']} | {c['k']} | {lengths} | "
                f"{positions} | {c['differing_draft_tokens']} of {c['draft_tokens_compared']} | "
                f"{_VERDICTS[c['verdict']]} |")
    return "\n".join(lines) + "\n"


def plot(data: Mapping[str, Any], path: Path) -> Path:
    """A PNG of :func:`summary`'s object, one group per configuration: host time per refresh
    step off and on (bars: the median; error bars: the min-max over the measured generates),
    and tokens/s on over off per pair of generates (the median with the min-max as error bars,
    1.00 as a line, this run's noise around it shaded), drawn to be read at the site's page
    width (as :func:`draftmeta.bench.report.figure`: its width, its fonts, the legend below the
    panels). Results written before generates were paired get the median ratio alone.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from draftmeta.bench.report import PLOT_FONT_PT, PLOT_WIDTH_IN

    configs = list(data["configurations"])
    several = len({c["backend"] for c in configs}) > 1
    labels = [(f"{c['backend']}\n" if several else "") + f"b{c['batch_size']}\nK{c['k']}"
              for c in configs]
    xs = list(range(len(configs)))
    width = 0.38
    with plt.rc_context({"font.size": PLOT_FONT_PT}):
        fig, axes = plt.subplots(2, 1, sharex=True, layout="constrained",
                                 figsize=(PLOT_WIDTH_IN, 6.6))
        top = axes[0]
        for shift, mode, colour in ((-width / 2, "off", "#b0b0b0"),
                                    (width / 2, "on", "#2b7bba")):
            values = [c["refresh_us_per_step"][mode] or 0.0 for c in configs]
            spread = [c.get("refresh_us_per_step_all", {}).get(mode) or [v]
                      for c, v in zip(configs, values)]
            errors = ([[v - min(a) for v, a in zip(values, spread)],
                       [max(a) - v for v, a in zip(values, spread)]]
                      if any(len(a) > 1 for a in spread) else None)  # older results: none
            top.bar([x + shift for x in xs], values, width, yerr=errors, capsize=2,
                    label=f"plugin {mode}", color=colour)
        top.set_ylabel("host µs per refresh step\n(draft indices >= 1)")
        top.grid(axis="y", alpha=0.3)
        _ratio_panel(axes[1], configs, data.get("noise_check"))
        axes[1].set_xticks(xs, labels)
        axes[1].set_xlabel("batch size b, draft tokens per step K (K = 1 refreshes nothing: "
                           "the A/A control)")
        handles, names = top.get_legend_handles_labels()
        more, other = axes[1].get_legend_handles_labels()
        fig.legend(handles + more, names + other, loc="outside lower center", ncols=2,
                   frameon=False)
        fig.suptitle(f"vLLM {data['vllm_version']} MTP on CPU ({data['backend']}): "
                     "plugin off vs on")
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def _ratio_panel(ax: Any, configs: list[Mapping[str, Any]],
                 check: Mapping[str, Any] | None) -> None:
    """Tokens/s on over off per configuration: pair ratios (median, min-max) where paired,
    else the ratio of the medians; the A/A control's noise band around 1.00."""
    ax.axhline(1.0, color="black", linewidth=0.8)
    if check is None or "rule" not in check:
        check = noise_check(list(configs))
    control = (check or {}).get("control") or {}
    if control.get("usable") and control.get("straddles_1"):
        noise = control["noise"]
        ax.axhspan(1.0 - noise, 1.0 + noise, color="#e0e0e0",
                   label=f"noise: the K = 1 rows' ±{noise:.0%}")
    for aa, colour, name in ((False, "#2b7bba", "on / off per pair (median, min-max)"),
                             (True, "#808080", "A/A control: K = 1, on / off per pair")):
        points = [(x, c) for x, c in enumerate(configs) if (c["k"] == 1) == aa]
        paired = [(x, p) for x, c in points if (p := tokens_per_s_pairs(c)) is not None]
        if paired:
            medians = [p["median"] for _, p in paired]
            ax.errorbar([x for x, _ in paired], medians,
                        yerr=[[m - p["min"] for m, (_, p) in zip(medians, paired)],
                              [p["max"] - m for m, (_, p) in zip(medians, paired)]],
                        fmt="s" if aa else "o", capsize=3, color=colour, label=name)
        else:
            values = [(x, c["tokens_per_s_ratio"]) for x, c in points
                      if c.get("tokens_per_s_ratio") is not None]
            if values:
                ax.plot([x for x, _ in values], [v for _, v in values], "s" if aa else "o",
                        color=colour, label=name.replace(" per pair (median, min-max)", ""))
    ax.set_ylabel("tokens/s, on / off")
    ax.grid(axis="y", alpha=0.3)


def write_results(data: Mapping[str, Any], out: Path, stem: str = RESULT_NAME
                  ) -> dict[str, Path]:
    """Write ``{stem}.json``, ``{stem}.md`` and ``{stem}.png`` into ``out`` (created).

    The PNG is left out (with no error) where matplotlib is not installed.
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(data), encoding="utf-8")
    try:
        paths["png"] = plot(data, out / f"{stem}.png")
    except ImportError:
        pass
    return paths
