"""What an end-to-end run decides, as one JSON object, on the CPU and a GPU alike.

:func:`summary` turns a :class:`~draftmeta.integrations.vllm.tools.e2e.runner.RunResult` into one
JSON
object (``"schema": 2``). It leads with what the run decides (``decided``: identity off vs on,
vLLM's acceptance, the negative controls), then the noise rule's verdicts on its ratios, then
one entry per case and batch size (``configurations``; the negative controls apart in
``controls``), each with the same keys on both devices:

* identity: output tokens, draft tokens (how many differ of how many compared), draft hidden
  states (the largest absolute difference), accepted drafts per position, off vs on over every
  engine pair;
* vLLM's acceptance counts off and on (mean acceptance length, per position);
* tok/s of the measured generates (median, min, max, all), each engine pair's ratio of medians,
  and the per-generate pairs the noise rule judges;
* per engine step (a verification and its draft loop): the wall time ``T``, the host time on
  draft metadata ``s`` and its share ``s / T``; on a GPU the GPU's busy time, the time it stood
  idle with the plugin off, and the *limit* ``T off / busy on`` (module
  :mod:`~draftmeta.integrations.vllm.tools.e2e.gpu_time`) with how much of it the plugin took;
* the draft loop's own record (``draft_loops``: in-place updates, carry-overs and rebuilds with
  their host time on the CPU; loops replayed from a graph, run eagerly or rebuilt on a GPU),
  vLLM's choice of loop and which builder served each attention group.

:func:`merge` makes several runs' objects one and decides again over the merged entries;
:func:`extent` and :func:`planned_extent` say what a result holds and what a run will hold. The
object's Markdown report and PNG, and the files written, are
:mod:`~draftmeta.integrations.vllm.tools.e2e.rendering`'s.
"""

from __future__ import annotations

import os
import platform as _platform
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from draftmeta.arguments import Extent
from draftmeta.integrations.vllm.tools.e2e.acceptance import total_acceptance
from draftmeta.integrations.vllm.tools.e2e.compare import Case, Comparison
from draftmeta.integrations.vllm.tools.e2e.controls import CONTROLS, judged, tile_of
from draftmeta.integrations.vllm.tools.e2e.engine import FORCED
from draftmeta.integrations.vllm.tools.e2e.runner import RunConfig, RunResult
from draftmeta.measure.noise import Control, Ratios, pair_ratios, verdict

__all__ = ["SCHEMA", "case_of", "extent", "merge", "noise_check", "planned_extent", "summary"]

SCHEMA = 2
"""The layout of :func:`summary`'s object (``"schema"``); results of the earlier layouts (the
CPU and CUDA runs had one each) stay as they were written."""

JSONObject = dict[str, Any]


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _spread(values: Iterable[float]) -> JSONObject | None:
    values = list(values)
    if not values:
        return None
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "all": [round(v, 1) for v in values]}


def _finite(value: float) -> float | None:
    """``value``, or ``None`` where it is infinite (draft steps that cannot be compared)."""
    return None if value == float("inf") else value


def _loop_totals(records: Sequence[Any]) -> JSONObject:
    """The draft loop's records of several generates, as one JSON object: counts summed, and
    for the CPU's refresh record the host time per refresh (median over generates)."""
    from draftmeta.integrations.vllm.tools.e2e.cpu_recorder import RefreshRecord

    if not records:
        return {}
    if isinstance(records[0], RefreshRecord):
        first: RefreshRecord = records[0]

        def per_call(first_index: int) -> float | None:
            values = [r.refresh(first_index).seconds * 1e6 / r.refresh(first_index).calls
                      for r in records if r.refresh(first_index).calls]
            return round(statistics.median(values), 2) if values else None

        return {**first.as_json(), "refresh_us_per_step": per_call(1),
                "later_refresh_us_per_step": per_call(2)}
    total: JSONObject = {}
    for record in records:
        for name, value in record.as_json().items():
            total[name] = round(total.get(name, 0) + value, 6)
    return total


def _case_keys(case: Case) -> JSONObject:
    return {"model": case.model, "backend": case.backend, "k": case.k,
            "override_upstream": case.override_upstream, "kv_cache_dtype": case.kv_cache_dtype,
            "eager": case.eager, "aa": case.aa, "control": case.control}


def case_of(entry: Mapping[str, Any]) -> Case:
    """The case of one entry of :func:`summary`'s object."""
    return Case(entry["model"], entry["backend"], entry["k"], entry["override_upstream"],
                entry["kv_cache_dtype"], entry["eager"], entry["aa"], entry.get("control"))


def _identity(c: Comparison) -> JSONObject:
    differing, compared = c.draft_tokens_counted
    return {
        "output_tokens_identical": c.output_tokens_identical,
        "draft_tokens_identical": c.draft_tokens_identical,
        "differing_draft_tokens": differing,
        "draft_tokens_compared": compared,
        "hidden_max_abs_difference": _finite(c.hidden_max_abs_difference),
        "acceptance_identical": c.acceptance_identical,
        "strictly_identical": c.strictly_identical,
        "acceptance": {"off": c.acceptance("off").as_json(), "on": c.acceptance("on").as_json()},
    }


def _entry(c: Comparison) -> JSONObject:
    """One timed configuration (module docs)."""
    off_s, on_s = c.generate_seconds
    t_off, t_on = c.step_ms("off"), c.step_ms("on")
    s_off = c.host_us_per_step("off")
    limit, speedup = c.limit, c.speedup
    return {
        **_case_keys(c.case),
        "batch_size": c.batch_size,
        "pairs": len(c.pairs),
        **_identity(c),
        "deterministic": dict(zip(("off", "on"), c.deterministic)),
        "generated_tokens": c.reference.tokens,
        "propose_calls": c.reference.observed.loops,
        "tokens_per_s": {"off": _spread(g.tokens_per_s for g in c.measured("off")),
                         "on": _spread(g.tokens_per_s for g in c.measured("on"))},
        "pair_speedups": [round(r, 4) for r in c.pair_speedups],
        "speedup": _round(speedup, 4),
        # generate i of both engines ran in turn: off time / on time per pair
        # (draftmeta.measure.noise)
        "generate_pairs": (pair_ratios(off_s, on_s).as_json()
                           if off_s and len(off_s) == len(on_s) else None),
        "host_pairs": _host_pairs(c),
        "step_ms": {"off": _round(t_off), "on": _round(t_on)},
        "host_us_per_step": {"off": _round(s_off, 1),
                             "on": _round(c.host_us_per_step("on"), 1)},
        "host_us_per_loop": {"off": _round(c.host_us_per_loop("off"), 1),
                             "on": _round(c.host_us_per_loop("on"), 1)},
        "host_share_off": (None if s_off is None or not t_off
                           else round(s_off / (t_off * 1e3), 4)),
        "gpu_busy_ms_per_step": {"off": _round(c.gpu_busy_ms_per_step("off")),
                                 "on": _round(c.gpu_busy_ms_per_step("on"))},
        "gpu_idle_ms_per_step_off": _round(c.gpu_idle_ms_off),
        "gpu_idle_ms_per_step_on": _round(c.gpu_idle_ms("on")),
        "limit": _round(limit, 4),
        "share_of_limit": (None if limit is None or speedup is None or limit <= 1.0
                           else round((speedup - 1.0) / (limit - 1.0), 3)),
        "draft_loops": {"off": _loop_totals([g.observed.record for g in c.measured("off")]),
                        "on": _loop_totals([g.observed.record for g in c.measured("on")])},
        "recorded_loops": {"off": c.reference.observed.record.as_json(),
                           "on": c.pairs[0].on.recorded.observed.record.as_json()},
        "plugin_stats": c.pairs[0].on.recorded.plugin_stats,
        # with tensor parallelism, each rank's worker: its pid, the plugin there, its counts
        "ranks": {"off": [r.as_json() for r in c.reference.ranks],
                  "on": [r.as_json() for r in c.pairs[0].on.recorded.ranks]},
        "fused_loop": {"off": c.shapes[0].fused, "on": c.shapes[1].fused},
        "groups": {"off": [attrs.asdict(g) for g in c.shapes[0].groups],
                   "on": [attrs.asdict(g) for g in c.shapes[1].groups]},
        "startup_seconds": [[round(p.off.startup_seconds, 1), round(p.on.startup_seconds, 1)]
                            for p in c.pairs],
    }


def _host_pairs(c: Comparison) -> JSONObject | None:
    """Per pair of generates, host time on draft metadata off over on (only where both spent
    some: a replayed graph spends none)."""
    off = [g.observed.host_seconds for g in c.measured("off")]
    on = [g.observed.host_seconds for g in c.measured("on")]
    if not off or len(off) != len(on) or min(off + on) <= 0.0:
        return None
    return pair_ratios(off, on).as_json()


def _control(c: Comparison) -> JSONObject:
    """One negative control's run against its case's plugin-off run: judged over every draft,
    and for a control that may act only where a draft loop crosses a scheduler tile, over the
    drafts after such a crossing too (``tile_crossings``; :func:`~draftmeta.integrations.vllm.
    e2e.controls.judged`)."""
    assert c.case.control is not None
    tile = tile_of(c.case.control, c.case.backend)
    crossings = None
    if tile is not None:
        differing, compared = c.tile_crossings(tile)
        crossings = {"tile": tile, "drafts": compared, "differing": differing}
    entry: JSONObject = {
        **_case_keys(c.case),
        "batch_size": c.batch_size,
        "wrong": CONTROLS[c.case.control].wrong,
        **_identity(c),
        "tile_crossings": crossings,
    }
    entry["verdict"] = _control_verdict(entry)
    return entry


def _control_verdict(entry: Mapping[str, Any]) -> str:
    """A control entry's verdict from its own figures (so a merged result judges them again)."""
    crossed = entry.get("tile_crossings")
    return str(judged(entry["acceptance"]["off"]["mean_acceptance_length"],
                  entry["acceptance"]["on"]["mean_acceptance_length"],
                  entry["differing_draft_tokens"], entry["draft_tokens_compared"],
                  entry["hidden_max_abs_difference"],
                  None if crossed is None else (crossed["differing"], crossed["drafts"])))


def noise_check(configs: Sequence[Mapping[str, Any]]) -> JSONObject | None:
    """The run's ratios judged by the rule of :mod:`draftmeta.measure.noise`.

    The A/A control is the A/A cases (both engines plugin off) where the run has them, else the
    K = 1 configurations (the plugin has no draft step to update, so both engines run vLLM's
    own code): their per-generate tok/s pairs. The tok/s of the configurations where the plugin
    acts is faster or slower only beyond the control's noise, and no ratio of a run whose
    control leans one way gets a verdict. Host time on draft metadata (where the plugin acts
    only, so the control cannot measure it) is faster or slower only where every pair agrees.
    ``None`` for a run without timed pairs."""
    timed = [c for c in configs if c.get("generate_pairs")]
    if not timed:
        return None
    aa = [c for c in timed if c["aa"]]
    controls = aa or [c for c in timed if c["k"] == 1]
    control = Control(tuple(Ratios.from_json(c["generate_pairs"]) for c in controls))
    acting = [c for c in timed if not c["aa"] and c["k"] > 1] or [c for c in timed
                                                                   if not c["aa"]]
    out: JSONObject = {"rule": "draftmeta.measure.noise", "control": control.as_json(),
                       "control_cases": "A/A (both engines off)" if aa else "K = 1",
                       "control_sentence": control.sentence(),
                       "compared": "the plugin's configurations (K >= 2)"}
    for name, key in (("tokens_per_s", "generate_pairs"), ("host_metadata", "host_pairs")):
        ratios = [Ratios.from_json(c[key]) for c in acting if c.get(key)]
        out[name] = (verdict(Ratios.pooled(ratios), control,
                             measures_the_same=name == "tokens_per_s").as_json()
                     if ratios else None)
    return out


def _machine(result: RunResult) -> JSONObject:
    import torch

    machine: JSONObject = {"platform": _platform.platform(),
                           "processor": _platform.processor() or _platform.machine(),
                           "cpus": os.cpu_count(), "python": _platform.python_version(),
                           "torch": torch.__version__,
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    if result.config.platform.device == "cuda" and torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name()
        machine["gpus"] = torch.cuda.device_count()
    return machine


def _decided(configs: list[JSONObject], controls: list[JSONObject], failed: int) -> JSONObject:
    plugin = [c for c in configs if not c["aa"]]
    return {
        "configurations": len(plugin),
        "strictly_identical": all(c["strictly_identical"] for c in plugin),
        "output_tokens_identical": all(c["output_tokens_identical"] for c in plugin),
        "draft_tokens_identical": all(c["draft_tokens_identical"] for c in plugin),
        "differing_draft_tokens": sum(c["differing_draft_tokens"] for c in plugin),
        "draft_tokens_compared": sum(c["draft_tokens_compared"] for c in plugin),
        "hidden_states_identical": all(c["hidden_max_abs_difference"] == 0.0 for c in plugin),
        "acceptance_identical": all(c["acceptance_identical"] for c in plugin),
        "controls": {v: [_label(c) for c in controls if c["verdict"] == v]
                     for v in ("caught", "inert", "missed", "blind")},
        "failed": failed,
    }


def summary(result: RunResult, *, command: str = "", wall_seconds: float | None = None,
            load_average: Mapping[str, Any] | None = None) -> JSONObject:
    """The JSON object ``draftmeta e2e --json`` prints (module docs)."""
    config = result.config
    timed = [c for c in result.comparisons if c.case.control is None]
    configs = [_entry(c) for c in timed]
    controls = [_control(c) for c in result.comparisons if c.case.control is not None]
    acceptance = {side: total_acceptance([c.acceptance(side) for c in timed
                                          if not c.case.aa]).as_json()
                  for side in ("off", "on")}
    check = noise_check(configs)
    best, withheld = _best_k(configs, check)
    return {
        "schema": SCHEMA,
        "device": config.platform.device,
        "command": command,
        "vllm": result.vllm_version,
        "decided": {**_decided(configs, controls, len(result.failures)),
                    "acceptance": acceptance},
        "noise_check": check,
        "forced": dict(FORCED),
        "models": {name: {"description": m.describe(),
                          "source": m.shortcut or str(m.folder),
                          "dummy_weights": m.dummy_weights, "draft": m.draft.describe(),
                          "max_model_len": m.max_model_len,
                          "weights_gib": round(m.weights_gib, 3),
                          "prompts": result.prompts.get(name)}
                   for name, m in config.models.items()},
        "settings": _settings(config),
        "machine": {**_machine(result), "load_average": dict(load_average or {})},
        "skipped": dict(result.skipped),
        "wall_seconds": None if wall_seconds is None else round(wall_seconds, 1),
        "configurations": configs,
        "controls": controls,
        "best_k": best,
        "best_k_withheld": withheld,
        "failed": [{"case": f.case.label, "error": f.error} for f in result.failures],
    }


def _key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (case_of(entry), entry["batch_size"])


def merge(first: Mapping[str, Any], *later: Mapping[str, Any]) -> JSONObject:
    """Results of several runs of one device as one: each later run's configurations and
    controls replace those of the same case and batch size and are added otherwise (in the order
    they come), failures and commands are kept from all, and what the merged result decides
    (``decided``, ``noise_check``, ``best_k``) is computed again over the merged entries; the
    rest (settings, machine, models) is the first run's, with later runs' models added.

    Raises:
        ValueError: a result of another layout, or of another device.
    """
    results = [first, *later]
    for data in results:
        if data.get("schema") != SCHEMA or data["device"] != first["device"]:
            raise ValueError(f"merge takes schema-{SCHEMA} results of one device; got schema "
                             f"{data.get('schema')} on {data.get('device')}")
    entries: dict[str, dict[tuple[Any, ...], JSONObject]] = {"configurations": {},
                                                             "controls": {}}
    for data in results:
        for kind, table in entries.items():
            for entry in data[kind]:
                table[_key(entry)] = dict(entry)
    configs = [_rederived(c) for c in entries["configurations"].values()]
    controls = [{**c, "verdict": _control_verdict(c)} for c in entries["controls"].values()]
    failed = [f for data in results for f in data["failed"]]
    merged: JSONObject = {**first}
    merged["commands"] = list(dict.fromkeys(
        c for data in results for c in [*data.get("commands", []), data["command"]] if c))
    merged["models"] = {name: m for data in results for name, m in data["models"].items()}
    merged["configurations"], merged["controls"], merged["failed"] = configs, controls, failed
    merged["decided"] = {**_decided(configs, controls, len(failed)),
                         "acceptance": _acceptance_of(configs)}
    merged["noise_check"] = noise_check(configs)
    merged["best_k"], merged["best_k_withheld"] = _best_k(configs, merged["noise_check"])
    return merged


def _rederived(entry: Mapping[str, Any]) -> JSONObject:
    """A configuration entry with what its own figures give and a result written before it had
    the key lacks: the plugin-on engine's GPU idle time per step."""
    out = dict(entry)
    if "gpu_idle_ms_per_step_on" not in out:
        step, busy = out["step_ms"]["on"], out["gpu_busy_ms_per_step"]["on"]
        out["gpu_idle_ms_per_step_on"] = (None if step is None or busy is None
                                          else round(step - busy, 3))
    return out


def _acceptance_of(configs: Sequence[Mapping[str, Any]]) -> JSONObject:
    """The plugin configurations' acceptance counts added up, off and on."""
    from draftmeta.integrations.vllm.tools.e2e.acceptance import Acceptance

    out: JSONObject = {}
    for side in ("off", "on"):
        total = Acceptance()
        for c in configs:
            if c["aa"]:
                continue
            a = c["acceptance"][side]
            total = total + Acceptance(a["drafts"], a["draft_tokens"], a["accepted"],
                                       tuple(a["accepted_per_position"]),
                                       tuple(a["draft_tokens_per_position"]))
        out[side] = total.as_json()
    return out


BEST_K_NOISE = 0.05
"""The most noise (:mod:`draftmeta.measure.noise`: the A/A control's distance from 1.00) under
which a
run ranks its Ks by their step times: noisier step times would rank the machine's load."""


def _best_k(configs: Sequence[Mapping[str, Any]], check: Mapping[str, Any] | None
            ) -> tuple[list[JSONObject], str | None]:
    """The best-K table, or why it is withheld: a run whose A/A control is unusable, leans one
    way, or reads more noise than :data:`BEST_K_NOISE` ranks the machine's load, not K."""
    from draftmeta.integrations.vllm.tools.e2e.best_k import best_k_table

    rows = best_k_table(configs)
    if not rows:
        return [], None
    control = (check or {}).get("control") or {}
    if not control.get("usable") or not control.get("straddles_1"):
        return [], "no A/A control that straddles 1.00: the step times rank the machine's load"
    if control["noise"] > BEST_K_NOISE:
        return [], (f"this run's noise ({control['noise']:.0%}) is larger than "
                    f"{BEST_K_NOISE:.0%}: the step times rank the machine's load")
    return rows, None


def _settings(config: RunConfig) -> JSONObject:
    return {"batch_sizes": list(config.batch_sizes), "max_tokens": config.max_tokens,
            "warmups": config.warmups, "repeats": config.repeats, "seed": config.seed,
            "pairs": config.pairs,
            "prompts_file": None if config.prompts_file is None else str(config.prompts_file),
            "tensor_parallel_size": config.tensor_parallel_size,
            "decode_context_parallel_size": config.decode_context_parallel_size,
            "spec_overrides": sorted(config.spec_overrides or {})}


def _label(entry: Mapping[str, Any]) -> str:
    return f"{case_of(entry).label} batch {entry['batch_size']}"


def extent(data: Mapping[str, Any]) -> Extent:
    """What :func:`summary`'s object holds: its configurations (case, batch size, tokens per
    prompt) and the measured generates of each (the fewest of any)."""
    if data.get("schema") != SCHEMA:
        raise ValueError(f"a result of an earlier layout (schema {data.get('schema', 1)}; "
                         f"this run writes schema {SCHEMA})")
    tokens = data["settings"]["max_tokens"]
    labels = [f"{_label(e)} ({tokens} tokens)" for e in [*data["configurations"],
                                                         *data["controls"]]]
    return Extent.of(labels, int(data["settings"]["repeats"]))


def planned_extent(config: RunConfig) -> Extent:
    """What a run of ``config`` on this machine will hold, as :func:`extent` reads it: a
    backend this machine cannot run is skipped by the run, so it is left out here too."""
    labels = [f"{c.label} batch {b} ({config.max_tokens} tokens)" for c in config.cases
              if config.platform.unavailable_reason(c.backend) is None
              for b in config.batch_sizes]
    return Extent.of(labels, config.repeats)
