"""The end-to-end report: what a run decides comes first (identity, acceptance, controls), the
noise rule judges its ratios against the A/A control, the GPU's limit is a column, and the cases
a command line asks for are the ones that run. Runs are made by hand (``tests/e2e_fakes.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_fakes import comparison, generated, side

from draftmeta.integrations.vllm.tools.e2e.cli import cases_for
from draftmeta.integrations.vllm.tools.e2e.compare import Case
from draftmeta.integrations.vllm.tools.e2e.models import resolve
from draftmeta.integrations.vllm.tools.e2e.platforms import CPU, CUDA
from draftmeta.integrations.vllm.tools.e2e.rendering import markdown, write_results
from draftmeta.integrations.vllm.tools.e2e.report import (
    extent,
    merge,
    noise_check,
    planned_extent,
    summary,
)
from draftmeta.integrations.vllm.tools.e2e.runner import Failure, RunConfig, RunResult
from draftmeta.measure.noise import Ratios


def _result(comparisons: list[Any], *, device: str = "cuda", failures: list[Any] | None = None
            ) -> RunResult:
    platform = CUDA if device == "cuda" else CPU
    cases = tuple(dict.fromkeys(c.case for c in comparisons))
    config = RunConfig(platform=platform, models={"tiny": resolve("tiny")}, cases=cases,
                       batch_sizes=(2,), max_tokens=4, repeats=3)
    return RunResult(config, "0.34.0", comparisons, failures or [], {}, {"tiny": "random"})


def _summary(comparisons: list[Any], **kwargs: Any) -> dict[str, Any]:
    return summary(_result(comparisons, **kwargs), command="draftmeta e2e --device cuda")


def test_a_run_identical_everywhere_says_so_first_then_acceptance_then_speed() -> None:
    data = _summary([comparison()])
    assert data["schema"] == 2
    assert data["decided"]["strictly_identical"] is True
    assert data["decided"]["draft_tokens_compared"] == 12
    lines = markdown(data).splitlines()
    bullets = [line for line in lines if line.startswith("- ")]
    assert bullets[0].startswith("- off vs on: **identical** in 1 configuration")
    assert bullets[1].startswith("- vLLM's acceptance: mean acceptance length")
    assert any(b.startswith("- tok/s on over off") for b in bullets[2:])
    assert bullets[-1].startswith("- forced in every plugin-on engine: DRAFTMETA_VLLM_FORCE=1")
    json.dumps(data)


def test_one_configuration_that_differs_makes_the_whole_run_not_identical_and_shows_where(
) -> None:
    bad = comparison(Case("tiny", "FLASHMLA", 4),
                     pairs=[(side(), side(generated(drafts=[[[5, 6, 7], [8, 9, 0]],
                                                              [[11, 12, 13], [14, 15, 16]]])))])
    data = _summary([comparison(), bad])
    assert data["decided"]["strictly_identical"] is False
    assert data["decided"]["differing_draft_tokens"] == 1
    text = markdown(data)
    assert "**NOT identical**" in text
    assert "| tiny FLASHMLA K=4 | 2 | **1 of 12 drafts DIFFER** |" in text


def test_the_a_a_case_is_the_noise_control_and_is_left_out_of_identity() -> None:
    """Both engines off: its pairs measure the machine, not the plugin; a tok/s verdict
    contradicting it is not given."""
    aa = comparison(Case("tiny", "FLASHMLA", 3, aa=True),
                    pairs=[(side(seconds=(1.0, 1.0, 1.0)), side(seconds=(2.0, 2.0, 2.0)))])
    aa_different = comparison(Case("tiny", "FLASHMLA", 3, aa=True),
                              pairs=[(side(), side(generated(tokens=[[0], [0]]),
                                                   seconds=(2.0, 2.0, 2.0)))])
    data = _summary([comparison(), aa, aa_different])
    assert data["decided"]["strictly_identical"] is True  # the A/A rows are no evidence
    check = data["noise_check"]
    assert check["control_cases"] == "A/A (both engines off)"
    assert not check["control"]["straddles_1"]
    assert check["tokens_per_s"]["verdict"] == "too noisy"


def _paired(k: int, *ratios: float, aa: bool = False) -> dict[str, Any]:
    pairs = Ratios(ratios).as_json()
    return {"k": k, "aa": aa, "generate_pairs": pairs, "host_pairs": None if k == 1 else pairs}


def test_without_an_a_a_case_the_k_1_rows_are_the_control_and_a_noisy_one_gives_no_verdict(
) -> None:
    noisy = noise_check([_paired(1, 0.5, 0.55, 0.52), _paired(1, 0.6, 0.45),
                         _paired(3, 0.77, 0.8, 0.75)])
    assert noisy is not None and noisy["control_cases"] == "K = 1"
    assert noisy["tokens_per_s"]["verdict"] == "too noisy"
    assert noisy["tokens_per_s"]["too_noisy_by"] == pytest.approx(0.48)
    assert noisy["host_metadata"]["verdict"] == "too noisy"


def test_negative_control_a_quiet_control_lets_the_same_ratio_be_called_slower() -> None:
    quiet = noise_check([_paired(1, 1.01, 0.99, 1.0), _paired(1, 0.995, 1.004),
                         _paired(3, 0.77, 0.8, 0.75)])
    assert quiet is not None and quiet["tokens_per_s"]["verdict"] == "slower"
    alone = noise_check([_paired(3, 0.77, 0.8), _paired(4, 0.9, 1.1)])
    assert alone is not None and alone["tokens_per_s"]["verdict"] == "within noise"
    assert noise_check([{"k": 1, "aa": False, "generate_pairs": None}]) is None


def test_a_negative_control_is_judged_by_the_stated_margin_and_reported_apart() -> None:
    caught = comparison(Case("tiny", "FLASH_ATTN_MLA", 3, control="stale-scheduler"),
                        pairs=[(side(seconds=()), side(generated(accepted=(1, 0, 0)),
                                                       seconds=()))])
    inert = comparison(Case("tiny", "FLASH_ATTN_MLA", 4, control="stale-scheduler"),
                       pairs=[(side(seconds=()), side(seconds=()))])
    missed = comparison(Case("tiny", "FLASH_ATTN_MLA", 5, control="stale-scheduler"),
                        pairs=[(side(seconds=()), side(generated(
                            drafts=[[[5, 6, 7], [8, 9, 0]], [[11, 12, 13], [14, 15, 16]]]),
                            seconds=()))])
    data = _summary([comparison(), caught, inert, missed])
    verdicts = [c["verdict"] for c in data["controls"]]
    assert verdicts == ["caught", "inert", "missed"]
    assert data["decided"]["controls"]["missed"] == ["tiny FLASH_ATTN_MLA K=5 control "
                                                     "stale-scheduler batch 2"]
    assert data["decided"]["strictly_identical"] is True  # controls are not configurations
    text = markdown(data)
    assert "1 caught, 1 inert (nothing reads what they leave stale), 1 missed" in text
    assert "| kernel schedule left stale by a wrong spec | tiny FLASH_ATTN_MLA K=5 | 2 |" in text


def test_on_a_gpu_every_row_gives_the_gpu_busy_time_the_idle_time_and_the_limit() -> None:
    c = comparison(pairs=[(side(seconds=(1.0, 1.0, 1.0), busy=0.8),
                           side(seconds=(0.9, 0.9, 0.9), busy=0.5))])
    data = _summary([c])
    (entry,) = data["configurations"]
    assert entry["limit"] == pytest.approx(2.0)
    assert entry["gpu_idle_ms_per_step_off"] == pytest.approx(20.0)
    assert entry["share_of_limit"] == pytest.approx((1 / 0.9 - 1) / (2.0 - 1), abs=1e-3)
    text = markdown(data)
    assert "| limit | of the limit |" in text
    assert entry["gpu_idle_ms_per_step_on"] == pytest.approx(40.0)  # 90 ms less 50 busy
    assert "| 80.00 / 50.00 | 20.00 / 40.00 | 2.00x | 11% |" in text


def test_a_failed_case_is_listed_with_its_error_and_counted_in_the_decision() -> None:
    failure = Failure(Case("tiny", "FLASHMLA", 3), "E2EError: vLLM could not create it")
    data = _summary([comparison()], failures=[failure])
    assert data["failed"] == [{"case": "tiny FLASHMLA K=3",
                               "error": "E2EError: vLLM could not create it"}]
    assert data["decided"]["failed"] == 1
    assert "| tiny FLASHMLA K=3 | - | FAILED: E2EError" in markdown(data)


def test_the_written_files_are_the_json_its_report_and_a_plot(tmp_path: Path) -> None:
    data = _summary([comparison()])
    paths = write_results(data, tmp_path, "e2e-cuda")
    assert json.loads(paths["json"].read_text()) == data
    assert paths["markdown"].read_text() == markdown(data)
    assert set(paths) <= {"json", "markdown", "png"}


def test_what_a_run_holds_is_what_its_config_planned() -> None:
    data = _summary([comparison()])
    config = _result([comparison()]).config
    assert extent(data) == planned_extent(config)


def test_cases_cover_every_model_backend_and_k_with_triton_mla_as_the_override() -> None:
    cases = cases_for("cuda", ["tiny", "large"], ["FLASH_ATTN_MLA", "TRITON_MLA"], [1, 3])
    assert [c.label for c in cases] == [
        "tiny FLASH_ATTN_MLA K=1", "tiny FLASH_ATTN_MLA K=3", "tiny TRITON_MLA K=1 override",
        "tiny TRITON_MLA K=3 override", "large FLASH_ATTN_MLA K=1", "large FLASH_ATTN_MLA K=3",
        "large TRITON_MLA K=1 override", "large TRITON_MLA K=3 override"]


def test_without_k_1_each_model_gets_an_a_a_case() -> None:
    cases = cases_for("cpu", ["trained"], ["CPU_MLA"], [2, 3])
    assert [c.label for c in cases] == ["trained CPU_MLA K=2", "trained CPU_MLA K=3",
                                        "trained CPU_MLA K=2 A/A: both off"]


def test_each_negative_control_follows_its_case_once_at_the_first_k_where_it_shows() -> None:
    cpu = cases_for("cpu", ["trained"], ["CPU_MLA"], [1, 3, 4], controls=("seq-lens",))
    assert [c.label for c in cpu] == ["trained CPU_MLA K=1", "trained CPU_MLA K=3",
                                      "trained CPU_MLA K=3 control seq-lens",
                                      "trained CPU_MLA K=4"]
    gpu = cases_for("cuda", ["tiny"], ["FLASHMLA", "TRITON_MLA"], [3],
                    controls=("stale-scheduler",))
    assert [c.control for c in gpu] == [None, "stale-scheduler", None, None]
    with pytest.raises(ValueError, match="a K of at least 3"):
        cases_for("cuda", ["tiny"], ["FLASHMLA"], [1, 2], controls=("stale-scheduler",))


def test_an_fp8_cache_is_refused_for_a_backend_or_a_device_that_takes_none() -> None:
    with pytest.raises(ValueError, match="FLASH_ATTN_MLA"):
        cases_for("cuda", ["tiny"], ["FLASHMLA", "FLASH_ATTN_MLA"], [3], kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="the CPU"):
        cases_for("cpu", ["tiny"], ["CPU_MLA"], [3], kv_cache_dtype="fp8")
    assert cases_for("cuda", ["tiny"], ["FLASHMLA"], [3], kv_cache_dtype="fp8")


def _best_k_run(aa_on: tuple[float, ...]) -> dict[str, Any]:
    """K = 2 and 3 timed, and an A/A case whose plugin-off side took 1 s per generate and
    whose other side took ``aa_on``."""
    return _summary([
        comparison(Case("tiny", "FLASHMLA", 2), pairs=[(side(seconds=(1.0, 1.0, 1.0)),
                                                        side(seconds=(0.9, 0.9, 0.9)))]),
        comparison(Case("tiny", "FLASHMLA", 3), pairs=[(side(seconds=(1.2, 1.2, 1.2)),
                                                        side(seconds=(1.0, 1.0, 1.0)))]),
        comparison(Case("tiny", "FLASHMLA", 2, aa=True),
                   pairs=[(side(seconds=(1.0, 1.0, 1.0)), side(seconds=aa_on))])])


def test_the_best_k_is_ranked_only_where_the_a_a_control_reads_little_noise() -> None:
    """Step times of K = 2 and 3 rank K only where the machine was quiet: with an A/A control
    that straddles 1.00 within 5% the table is there, with a noisy one it is withheld, saying
    why."""
    quiet = _best_k_run((0.99, 1.0, 1.01))
    assert quiet["best_k"] and quiet["best_k_withheld"] is None
    assert "| tiny | FLASHMLA | 2 | 2, 3 |" in markdown(quiet)
    noisy = _best_k_run((0.8, 0.8, 1.1))  # pairs 1.25x, 1.25x, 0.91x: straddles 1.00, 25% off it
    assert noisy["best_k"] == [] and "noise (25%)" in noisy["best_k_withheld"]
    assert "The best K from the measured step times: not given (this run's noise" in (
        markdown(noisy))


def test_a_stale_flashmla_schedule_is_judged_where_a_loop_crossed_a_tile_or_called_blind(
) -> None:
    """Two calls of two requests, K = 4: one draft in 16 differs (6%, under the 10% margin
    over every draft), and it is the one draft after a tile crossing (1 of 1): caught. A run
    where nothing changed and no loop crossed a tile could not see the control: blind."""
    drafts = [[[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 6, 7, 8]]]
    moved = [[[1, 2, 3, 9], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 6, 7, 8]]]
    case = Case("tiny", "FLASHMLA", 4, control="stale-scheduler")
    crossed = comparison(case, pairs=[(side(generated(drafts=drafts,
                                                      loop_lengths=[[63, 10], [70, 11]]),
                                           seconds=()),
                                      side(generated(drafts=moved), seconds=()))])
    never = comparison(Case("tiny", "FLASHMLA", 3, control="stale-scheduler"),
                       pairs=[(side(generated(drafts=drafts, loop_lengths=[[10, 20], [11, 21]]),
                                    seconds=()), side(generated(drafts=drafts), seconds=()))])
    data = _summary([comparison(), crossed, never])
    first, second = data["controls"]
    assert first["tile_crossings"] == {"tile": 64, "drafts": 1, "differing": 1}
    assert first["differing_draft_tokens"] == 1 and first["draft_tokens_compared"] == 16
    assert first["verdict"] == "caught"
    assert second["verdict"] == "blind" and data["decided"]["controls"]["blind"]
    text = markdown(data)
    assert "1 blind (no draft loop crossed a scheduler tile" in text
    assert "1 of 16; after a tile crossing 1 of 1 | caught |" in text
    # the same control where it changed drafts elsewhere is judged over every draft
    elsewhere = comparison(case, pairs=[(side(generated(drafts=drafts,
                                                        loop_lengths=[[10, 20], [11, 21]]),
                                              seconds=()),
                                         side(generated(drafts=[[[0, 0, 0, 0], [0, 0, 0, 0]],
                                                                drafts[1]]), seconds=()))])
    (judged,) = _summary([comparison(), elsewhere])["controls"]
    assert judged["tile_crossings"]["drafts"] == 0 and judged["verdict"] == "caught"


def test_the_k_2_configurations_are_the_ones_judged_against_the_k_1_control() -> None:
    check = noise_check([_paired(1, 1.01, 0.99, 1.0), _paired(1, 0.995, 1.004),
                         _paired(2, 1.3, 1.4)])
    assert check is not None and check["control_cases"] == "K = 1"
    assert check["tokens_per_s"]["ratio"]["pairs"] == 2  # K = 2's pairs, not the control's
    assert check["tokens_per_s"]["verdict"] == "faster"


def test_a_run_of_k_1_rows_only_is_judged_against_them_and_names_its_rule() -> None:
    check = noise_check([_paired(1, 1.01, 0.99, 1.0), _paired(1, 0.995, 1.004)])
    assert check is not None and check["rule"] == "draftmeta.measure.noise"
    assert check["tokens_per_s"]["ratio"]["pairs"] == 5
    assert check["tokens_per_s"]["verdict"] == "within noise"


def test_host_time_is_judged_by_its_own_pairs_where_tok_s_is_judged_by_the_controls_noise(
) -> None:
    """The K = 1 control measures tok/s, not host time on draft metadata (the plugin has none
    to update there): the same pair ratios are faster for tok/s, beyond the control's noise,
    and within noise for host time, whose pairs fall on both sides of 1.00 (rule 4)."""
    pairs = Ratios((1.2, 0.99, 1.3)).as_json()
    check = noise_check([_paired(1, 1.01, 0.99, 1.0), _paired(1, 0.995, 1.004),
                         {"k": 3, "aa": False, "generate_pairs": pairs, "host_pairs": pairs}])
    assert check is not None and check["tokens_per_s"]["verdict"] == "faster"
    assert check["host_metadata"]["verdict"] == "within noise"
    assert check["host_metadata"]["noise"] is None


def test_the_best_k_is_withheld_where_the_a_a_control_leans_one_way_saying_so() -> None:
    leaning = _best_k_run((0.5, 0.5, 0.5))  # the same code read 2.00x in every pair
    assert leaning["best_k"] == []
    assert leaning["best_k_withheld"] == (
        "no A/A control that straddles 1.00: the step times rank the machine's load")


def test_merged_results_rank_the_best_k_again_by_their_own_control() -> None:
    quiet = _best_k_run((0.99, 1.0, 1.01))
    merged = merge(quiet)
    assert merged["best_k"] == quiet["best_k"] != [] and merged["best_k_withheld"] is None
