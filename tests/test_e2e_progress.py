"""``draftmeta e2e``'s progress: a line (or the bar) for each engine start and each generate,
with the time elapsed and an estimate of what is left, and never a long silence while one unit
runs. No engine runs here: the units are stand-ins, timed by a fake clock or by short sleeps.
"""

from __future__ import annotations

import io
import itertools
import time

import pytest

from draftmeta.integrations.vllm.tools.e2e import progress as progress_module
from draftmeta.integrations.vllm.tools.e2e.progress import RunProgress, clock


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    now = _Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", now)
    return now


def test_each_unit_prints_its_line_with_the_time_elapsed_and_an_estimate_of_what_is_left(
    fake_clock: _Clock,
) -> None:
    out = io.StringIO()
    plan = ["engine", "engine", "generate b1", "generate b1", "generate b1", "generate b1"]
    steps = RunProgress(plan, stream=out)
    steps.step("engine", "CPU_MLA K=1: starting a fresh engine, plugin off")
    fake_clock.now += 20
    steps.step("engine", "CPU_MLA K=1: starting a fresh engine, plugin on")
    fake_clock.now += 20
    steps.step("generate b1", "CPU_MLA K=1 batch 1: generate 1/2, plugin off")
    fake_clock.now += 2
    steps.step("generate b1", "CPU_MLA K=1 batch 1: generate 1/2, plugin on")
    lines = out.getvalue().splitlines()
    assert lines[0] == ("draftmeta e2e: [1/6, 0:00 elapsed, estimating what is left] "
                        "CPU_MLA K=1: starting a fresh engine, plugin off")
    # an engine start tells nothing of how long a generate takes: no guess yet
    assert lines[1].startswith("draftmeta e2e: [2/6, 0:20 elapsed, estimating what is left]")
    # the generate measured: the remaining ones count as 2 s each, not as an engine start
    assert lines[3] == ("draftmeta e2e: [4/6, 0:42 elapsed, ~0:06 left] "
                        "CPU_MLA K=1 batch 1: generate 1/2, plugin on")


def test_an_unmeasured_batch_size_is_estimated_from_the_other_generates(
    fake_clock: _Clock,
) -> None:
    steps = RunProgress(["engine", "generate b1", "generate b4", "generate b4"],
                        stream=io.StringIO())
    steps.step("engine", "start")
    fake_clock.now += 30
    steps.step("generate b1", "b1")
    fake_clock.now += 3
    steps.step("generate b4", "b4")
    assert steps.left() == pytest.approx(3 + 3)  # generate b1's time, not the engine's


def test_a_long_unit_prints_its_line_again_so_no_silence_outlasts_the_heartbeat() -> None:
    out = io.StringIO()
    with RunProgress(["engine", "generate b1"], stream=out, heartbeat=0.2) as steps:
        steps.step("engine", "starting a fresh engine, plugin off")
        time.sleep(0.9)
        steps.step("generate b1", "generate 1/1, plugin off")
        steps.finish()
    lines = out.getvalue().splitlines()
    again = [line for line in lines if "starting a fresh engine" in line]
    assert len(again) >= 3, lines
    assert all("still running" in line for line in again[1:]), lines


def test_negative_control_a_unit_shorter_than_the_heartbeat_prints_one_line() -> None:
    out = io.StringIO()
    with RunProgress(["engine"], stream=out, heartbeat=5.0) as steps:
        steps.step("engine", "starting a fresh engine, plugin off")
        time.sleep(0.3)
        steps.finish()
    assert len(out.getvalue().splitlines()) == 1


def test_the_heartbeat_is_under_a_minute() -> None:
    assert progress_module.HEARTBEAT_SECONDS < 60


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_it_is_one_tqdm_bar_with_what_runs_and_what_is_left(
    fake_clock: _Clock,
) -> None:
    pytest.importorskip("tqdm")
    out = _Terminal()
    steps = RunProgress(["engine", "generate b1", "generate b1"], stream=out)
    steps.step("engine", "CPU_MLA K=3: starting a fresh engine, plugin off")
    fake_clock.now += 10
    steps.step("generate b1", "CPU_MLA K=3 batch 1: generate 1/1, plugin off")
    steps.line("a line of its own")
    steps.__exit__(None, None, None)
    shown = out.getvalue()
    assert "CPU_MLA K=3 batch 1: generate 1/1, plugin off" in shown
    assert "1/3" in shown and "left" in shown, shown
    assert "draftmeta e2e: a line of its own\n" in shown


def test_quiet_prints_nothing(fake_clock: _Clock) -> None:
    out = _Terminal()
    with RunProgress(["engine"], stream=out, enabled=False) as steps:
        steps.step("engine", "starting")
        steps.line("a line")
    assert out.getvalue() == ""


@pytest.mark.parametrize(("seconds", "shown"), [(5, "0:05"), (65.4, "1:05"), (3725, "1:02:05")])
def test_times_are_written_as_tqdm_writes_them(seconds: float, shown: str) -> None:
    assert clock(seconds) == shown


def _elapsed(line: str) -> int | None:
    import re

    found = re.search(r"\[\d+/\d+, (?:(\d+):)?(\d+):(\d+) elapsed", line)
    if found is None:
        return None
    hours, minutes, seconds = (int(g) if g else 0 for g in found.groups())
    return hours * 3600 + minutes * 60 + seconds


def test_the_committed_default_run_never_went_a_minute_without_a_line() -> None:
    """The e2e page quotes this log (the default matrix, timed by benchmarks/time_main_jobs.sh):
    its figures are read from the log, so a re-timed log with a stale page fails here."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    log = (root / "benchmarks" / "results" / "main-jobs-e2e-progress.log").read_text()
    stamps = [t for t in map(_elapsed, log.splitlines()) if t is not None]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len(stamps) > 50 and max(gaps) < 60, (len(stamps), max(gaps))
    page = " ".join((root / "docs" / "e2e.md").read_text().split())
    quoted = f"{len(stamps)} lines in {stamps[-1]} s, never more than {max(gaps)} s apart"
    assert quoted in page, quoted
