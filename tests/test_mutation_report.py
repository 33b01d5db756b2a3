"""The mutation report (``tools/mutation_report.py``) tallies mutmut's results as the page says:
from a tiny fake ``mutants/`` folder, with nothing run by mutmut."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_report",
                                                  ROOT / "tools" / "mutation_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_report"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["mutation_report"]
    return module


def _fake(tmp_path: Path) -> Path:
    """mutants/ with draftmeta/advance.py.meta: 6 killed, 1 timed out, 2 survived, 1 with no
    test, 1 not run yet; no other module run."""
    codes = {**{f"draftmeta.advance.x_f__mutmut_{i}": 1 for i in range(1, 7)},
             "draftmeta.advance.x_f__mutmut_7": 36,
             "draftmeta.advance.x_g__mutmut_1": 0, "draftmeta.advance.x_g__mutmut_2": 0,
             "draftmeta.advance.x_h__mutmut_1": 33, "draftmeta.advance.x_h__mutmut_2": None}
    meta = tmp_path / "mutants" / "draftmeta" / "advance.py.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes, "durations_by_key": {}}))
    return tmp_path / "mutants"


def test_statuses_come_from_mutmuts_exit_codes(report: ModuleType, tmp_path: Path) -> None:
    statuses = report.read_meta(_fake(tmp_path), "draftmeta/advance.py")
    assert sorted(statuses.values()).count("killed") == 6
    assert statuses["draftmeta.advance.x_f__mutmut_7"] == "timeout"
    assert statuses["draftmeta.advance.x_h__mutmut_1"] == "no tests"
    assert statuses["draftmeta.advance.x_h__mutmut_2"] == "not run"
    assert report.read_meta(tmp_path / "mutants", "draftmeta/spec.py") == {}


def test_the_score_leaves_out_equivalent_and_unrun_mutants_and_counts_new_tests(
    report: ModuleType, tmp_path: Path,
) -> None:
    equivalent = {"draftmeta.advance.x_g__mutmut_1": "the default it spells out"}
    killed_by = {"draftmeta.advance.x_h__mutmut_1": "tests/test_advance.py::test_h"}
    runs = {"draftmeta/advance.py": {"seconds": 600, "run_with": ["draftmeta/advance.py"]}}
    results = report.collect(_fake(tmp_path), equivalent, killed_by, runs,
                             ("draftmeta/advance.py", "draftmeta/spec.py"))
    advance, spec = results
    summary = advance.summary()
    assert (summary["run"], summary["killed"], summary["timeout"], summary["survived"],
            summary["no_tests"], summary["equivalent"], summary["killed_by_new_tests"],
            summary["open"]) == (10, 6, 1, 2, 1, 1, 1, 1)
    assert advance.open == ["draftmeta.advance.x_g__mutmut_2"]
    # (6 killed + 1 timed out + 1 killed by a new test) / (10 run - 1 equivalent)
    assert advance.score == pytest.approx(8 / 9)
    assert advance.score_at_run == pytest.approx(7 / 9)  # before the new test
    assert report.total_score(results, at_run=True) == pytest.approx(7 / 9)
    assert spec.run == 0 and spec.score is None
    assert report.total_score(results) == pytest.approx(8 / 9)
    # without the equivalence reason and the new test: 7 / 10
    bare = report.collect(_fake(tmp_path), {}, {}, runs, ("draftmeta/advance.py",))
    assert bare[0].score == pytest.approx(7 / 10)


def test_the_page_lists_each_equivalent_with_its_reason_and_each_open_survivor_with_its_diff(
    report: ModuleType, tmp_path: Path,
) -> None:
    equivalent = {"draftmeta.advance.x_g__mutmut_1": "the default it spells out"}
    results = report.collect(_fake(tmp_path), equivalent, {}, {},
                             ("draftmeta/advance.py", "draftmeta/spec.py"))
    page = report.render(results, {"draftmeta.advance.x_g__mutmut_2": "-a < b\n+a <= b",
                                   "draftmeta.advance.x_h__mutmut_1": "-f(x)\n+f(None)"},
                         "nox -s mutation")
    assert "**Score over the modules run: 77.8%** (77.8% at the run" in page  # 7 / 9
    assert ("| `draftmeta/advance.py` | 11 (10 run) | 6 | 1 | 2 | 1 | 1 | 0 | 2 | 77.8% | 77.8% "
            "| - |" in page)
    assert "| `draftmeta/spec.py` | - | not run |" in page
    assert "Not run yet: `draftmeta/spec.py`." in page
    assert "Partly run (the run was stopped): `draftmeta/advance.py` (1 of 11 left)." in page
    assert "- `draftmeta.advance.x_g__mutmut_1`: the default it spells out" in page
    assert "  +a <= b" in page and "  +f(None)" in page


def test_a_module_not_run_this_time_keeps_its_committed_results(
    report: ModuleType, tmp_path: Path,
) -> None:
    """``results.json`` keeps the statuses of the mutants run (not those never run); a report
    written without that module's mutmut data (a fresh clone) still gives its committed tally."""
    mutants = _fake(tmp_path)
    folder, page = tmp_path / "mutation", tmp_path / "mutation.md"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"diffs": {
        "draftmeta.advance.x_g__mutmut_1": "-a\n+b", "draftmeta.advance.x_g__mutmut_2": "-a\n+c",
        "draftmeta.advance.x_h__mutmut_1": "-a\n+d"}}))
    args = ["--folder", str(folder), "--page", str(page)]
    assert report.main(["--mutants", str(mutants), *args]) == 0
    written = json.loads((folder / "results.json").read_text())
    advance = written["modules"]["draftmeta/advance.py"]
    assert (advance["mutants"], advance["run"]) == (11, 10)
    assert "draftmeta.advance.x_h__mutmut_2" not in advance["statuses"]  # never run
    first = page.read_text()
    assert report.main(["--mutants", str(tmp_path / "elsewhere"), *args]) == 0
    assert page.read_text() == first
    assert json.loads((folder / "results.json").read_text())["modules"] == written["modules"]
