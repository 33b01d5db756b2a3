"""``draftmeta bench``'s report: pair ratios with their spread and the noise rule's verdict in
the table, the JSON and the plot; units in the table, and no column that is empty on CPU.

Nothing is measured: the samples are made up, one run per repeat as the benchmark makes them
(:attr:`draftmeta.bench.Sample.run_us`). The negative control of the noise check is a fake noisy
run whose A/A control (the rebuild against itself) leans one way: the same comparison that a
quiet run calls faster gets no verdict there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftmeta.bench import BenchConfig, Sample, markdown_table, summarize, table, write_results
from draftmeta.bench.report import pair_summary

RUNS = 6


def _samples(aa_factor: float = 1.0, backends: tuple[str, ...] = ("CPU_MLA",)) -> list[Sample]:
    """CPU samples where the update takes a fifth of the rebuild, and the rebuild timed again
    (the A/A control) takes ``aa_factor`` times the first (alternately a bit more and less,
    as on a quiet machine, when 1.0)."""
    out = []
    for backend in backends:
        for batch in (1, 8):
            for k in (2, 3):
                wobble = [1.0 + (0.03 if i % 2 else -0.03) for i in range(RUNS)]
                rebuild = [20.0 + i for i in range(RUNS)]
                runs = {"rebuild": rebuild,
                        "rebuild (A/A)": [r * aa_factor * w for r, w in zip(rebuild, wobble)],
                        "update": [r / 5 * w for r, w in zip(rebuild, wobble)],
                        "advance": [10.0] * RUNS}
                for path, values in runs.items():
                    out.append(Sample(backend, path, batch, k, tuple(values),
                                      run_us=tuple(values)))
    return out


def test_the_cpu_table_names_its_units_and_leaves_out_the_columns_only_cuda_fills() -> None:
    text = table(summarize(_samples()), pair_summary(_samples(), "cpu"))
    header = text.splitlines()[0]
    assert "host median us" in header and "host p90 us" in header, header
    assert "device" not in header and "launch" not in header, header
    assert "-" not in " ".join(text.splitlines()[1].split()[3:]), text  # no empty cells


def test_negative_control_the_cuda_table_keeps_device_time_and_launches() -> None:
    rows = summarize([Sample("TRITON_MLA+INDEXER", "update (eager)", 1, 2, (5.0,), (3.0,), 4.0,
                             (3.0,))])
    header = table(rows).splitlines()[0]
    assert "device median us" in header and "launches/step" in header


def test_a_quiet_run_gives_each_comparison_its_pair_ratio_spread_and_verdict() -> None:
    pairs = pair_summary(_samples(), "cpu")
    assert pairs is not None and pairs["control"]["straddles_1"]
    (first, *_) = pairs["comparisons"]
    assert first["verdict"] == "faster"
    assert first["ratio"]["pairs"] == 2 * RUNS  # every pair of both K
    assert first["ratio"]["min"] <= first["ratio"]["median"] <= first["ratio"]["max"]
    text = table(summarize(_samples()), pairs)
    assert "5.00x (4.85-5.15) faster" in text, text
    assert "ratios within" in text and "this run's noise" in text
    markdown = markdown_table(summarize(_samples()), "cpu", pairs)
    assert "| 5.0x (4.9-5.2) | faster |" in markdown, markdown


def test_a_fake_noisy_bench_run_says_the_machine_was_too_noisy_instead_of_faster() -> None:
    """The A/A control read 1.3x every time: the machine changed under the run."""
    noisy = _samples(aa_factor=1 / 1.3)
    pairs = pair_summary(noisy, "cpu")
    assert pairs is not None and not pairs["control"]["straddles_1"]
    assert {c["verdict"] for c in pairs["comparisons"]} == {"too noisy"}
    text = table(summarize(noisy), pairs)
    updates = [line for line in text.splitlines() if " update " in line]
    assert updates and all(line.endswith("too noisy") for line in updates), text
    assert "30% off 1.00" in text, text
    markdown = markdown_table(summarize(noisy), "cpu", pairs)
    assert "| too noisy |" in markdown and "faster" not in markdown


def test_write_results_keeps_the_pairs_the_load_and_draws_the_ratios_with_error_bars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure

    figures: list[Any] = []
    original = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    samples = _samples(backends=("CPU_MLA", "TRITON_MLA"))
    run = {"wall_seconds": 12.5, "load_average": {"before": [1.0, 1.0, 1.0],
                                                  "after": [2.0, 1.5, 1.0]}}
    paths = write_results(samples, BenchConfig(batch_sizes=(1, 8), steps=(2, 3),
                                               repeats=RUNS), tmp_path, run=run)
    data = json.loads(paths["json"].read_text())
    assert data["environment"]["load_average"] == run["load_average"]
    assert data["environment"]["wall_seconds"] == 12.5
    assert data["pairs"]["rule"] == "draftmeta.measure.noise"
    assert len(data["pairs"]["comparisons"]) == 4
    assert all(len(s["run_us"]) == RUNS for s in data["samples"])
    (figure,) = figures
    bars = [c for ax in figure.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 4  # per backend: rebuild / update, and the A/A control
    labels = {t.get_text() for legend in figure.legends for t in legend.get_texts()}
    assert {"rebuild / update", "A/A control: rebuild / rebuild"} <= labels
    assert "rebuild (A/A)" not in labels  # the control is a ratio, not a line of its own


def test_a_result_written_before_runs_were_paired_still_makes_its_table_and_plot(
    tmp_path: Path,
) -> None:
    unpaired = [Sample(s.backend, s.path, s.batch_size, s.steps, s.host_us)
                for s in _samples()]
    assert pair_summary(unpaired, "cpu") is None
    rows = summarize(unpaired)
    assert "| 5.0x | - |" in markdown_table(rows, "cpu")
    assert table(rows).count("\n") == len(rows)
