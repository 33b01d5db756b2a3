"""The mutation report (``tools/mutation_report.py``) tallies mutmut's results as the page says:
from a tiny fake ``mutants/`` folder, with nothing run by mutmut; and the committed results name
each mutant where its function lives now."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def report_module() -> ModuleType:
    """``tools/mutation_report.py``, loaded as a module."""
    return load_script("tools/mutation_report.py")


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return report_module()


def _fake(tmp_path: Path, durations: dict[str, float] | None = None,
          hashes: dict[str, str] | None = None) -> Path:
    """mutants/ with draftmeta/advance.py.meta: 6 killed, 1 timed out, 2 survived, 1 with no
    test, 1 not run yet; no other module run."""
    codes = {**{f"draftmeta.advance.x_f__mutmut_{i}": 1 for i in range(1, 7)},
             "draftmeta.advance.x_f__mutmut_7": 36,
             "draftmeta.advance.x_g__mutmut_1": 0, "draftmeta.advance.x_g__mutmut_2": 0,
             "draftmeta.advance.x_h__mutmut_1": 33, "draftmeta.advance.x_h__mutmut_2": None}
    meta = tmp_path / "mutants" / "draftmeta" / "advance.py.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes, "durations_by_key": durations or {},
                                "hash_by_function_name": hashes or {}}))
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
    runs: dict[str, object] = {}
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


def test_an_equivalent_mutant_not_run_here_leaves_the_denominator_alone(
    report: ModuleType, tmp_path: Path,
) -> None:
    """A reason recorded for a mutant another run judged (here the one not run yet) does not
    take a mutant off the ones run: the score stays within 0..1."""
    equivalent = {"draftmeta.advance.x_h__mutmut_2": "judged in another checkout's run"}
    (advance,) = report.collect(_fake(tmp_path), equivalent, {}, {}, ("draftmeta/advance.py",))
    assert advance.judged == 10 and advance.score == pytest.approx(7 / 10)
    assert advance.summary()["equivalent"] == 0  # nor is it counted among the equivalent run


def test_a_fresh_check_is_scored_at_the_run_and_after_its_tests_with_its_interval(
    report: ModuleType,
) -> None:
    """``mutation/check.json``: a sample run again on the suite as it stands; the page gives
    its score at the run over every module (95% Wilson interval) and after its survivors'
    tests, and a row per module."""
    check = {"command": "python tools/mutation_run.py --sample 2 --seed 39 --rerun",
             "commit": "abc1234", "started": "2026-12-05 23:43 UTC", "seconds": 120,
             "note": "a test", "statuses": {
                 "draftmeta/advance.py": {"draftmeta.advance.x_f__mutmut_1": "killed",
                                          "draftmeta.advance.x_f__mutmut_2": "survived"},
                 "draftmeta/spec.py": {"draftmeta.spec.x_g__mutmut_1": "killed",
                                       "draftmeta.spec.x_g__mutmut_2": "survived"}}}
    equivalent = {"draftmeta.spec.x_g__mutmut_2": "the default it spells out"}
    killed_by = {"draftmeta.advance.x_f__mutmut_2": "tests/test_advance.py::test_f"}
    results = report.check_results(check, equivalent, killed_by)
    lines = report.render_check(check, results)
    low, high = report.wilson(2, 3)
    assert (f"**At the run: 2 of 3 non-equivalent mutants killed, 66.7% (95%: "
            f"{100 * low:.1f}%-{100 * high:.1f}%)**; 100.0% after the tests written for its "
            "survivors.") in lines
    assert "| `draftmeta/advance.py` | 2 | 1 | 1 | 0 | 1 | 0 |" in lines
    assert "| `draftmeta/spec.py` | 2 | 1 | 1 | 1 | 0 | 0 |" in lines
    bare = report.render_check(check, report.check_results(check, {}, {}))
    assert any(line.startswith("**At the run: 2 of 4 non-equivalent") for line in bare)


def test_the_page_lists_a_checks_equivalents_and_its_survivors_tests_with_the_runs(
    report: ModuleType,
) -> None:
    """A mutant only a fresh check decided (its module's run never drew it) is listed on the
    page all the same: an equivalent with its reason, a survivor with the test written for it."""
    check = {"command": "python tools/mutation_run.py --sample 2 --seed 46 --rerun",
             "commit": "abc1234", "started": "2026-12-07 04:00 UTC", "seconds": 60,
             "note": "a test", "statuses": {
                 "draftmeta/advance.py": {"draftmeta.advance.x_f__mutmut_7": "survived",
                                          "draftmeta.advance.x_f__mutmut_8": "survived"}}}
    equivalent = {"draftmeta.advance.x_f__mutmut_7": "the same infinity"}
    killed_by = {"draftmeta.advance.x_f__mutmut_8": "tests/test_advance.py::test_f"}
    checked = report.check_results(check, equivalent, killed_by)
    page = report.render([], {}, "nox -s mutation", checked=checked)
    assert "- `draftmeta.advance.x_f__mutmut_7`: the same infinity" in page
    assert "- `draftmeta.advance.x_f__mutmut_8`: `tests/test_advance.py::test_f`" in page
    assert "- `draftmeta.advance.x_f__mutmut_7`" not in report.render([], {}, "nox -s mutation")


def test_the_page_lists_each_equivalent_with_its_reason_and_each_open_survivor_with_its_diff(
    report: ModuleType, tmp_path: Path,
) -> None:
    equivalent = {"draftmeta.advance.x_g__mutmut_1": "the default it spells out"}
    results = report.collect(_fake(tmp_path), equivalent, {}, {},
                             ("draftmeta/advance.py", "draftmeta/spec.py"))
    page = report.render(results, {"draftmeta.advance.x_g__mutmut_2": "-a < b\n+a <= b",
                                   "draftmeta.advance.x_h__mutmut_1": "-f(x)\n+f(None)"},
                         "nox -s mutation")
    assert "**Score over the mutants run: 77.8%** (77.8% at the run" in page  # 7 / 9
    assert ("| `draftmeta/advance.py` | 11 (10 run) | 6 | 1 | 2 | 1 | 1 | 0 | 2 | 77.8% | 77.8% "
            "| - |" in page)
    assert "| `draftmeta/spec.py` | - | not run |" in page
    assert "Not run yet: `draftmeta/spec.py`." in page
    assert ("Partly run (a run was stopped, or functions changed since their run): "
            "`draftmeta/advance.py` (1 of 11 left).") in page
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


def test_the_wilson_interval_matches_the_published_values(report: ModuleType) -> None:
    """95% Wilson intervals as tabulated (Newcombe 1998, Table I: 81/263 and 15/148; and the
    textbook 8/10), the ends of the range, and no interval without a trial."""
    assert report.wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert report.wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert report.wilson(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    assert report.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert report.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert report.wilson(0, 0) is None
    with pytest.raises(ValueError, match=r"successes must lie in 0\.\.trials, got 11 of 10"):
        report.wilson(11, 10)


def test_a_sampled_module_shows_its_sample_and_its_score_with_the_95_percent_interval(
    report: ModuleType, tmp_path: Path,
) -> None:
    durations = {"draftmeta.advance.x_f__mutmut_1": 4.0, "draftmeta.advance.x_g__mutmut_1": 20.0}
    runs = {"samples": {"draftmeta/advance.py": {"size": 10, "seed": 38}},
            "runs": [{"modules": ["draftmeta/advance.py"], "mutants": 10, "seconds": 600,
                      "max_children": 1, "sample": 10, "seed": 38, "started": "today"}]}
    advance, = report.collect(_fake(tmp_path, durations), {}, {}, runs, ("draftmeta/advance.py",))
    assert advance.interval == pytest.approx(report.wilson(7, 10))  # 6 killed + 1 timed out
    page = report.render([advance], {}, "nox -s mutation", runs)
    low, high = (f"{100 * x:.1f}%" for x in report.wilson(7, 10))
    assert (f"| `draftmeta/advance.py` | 11 (sample of 10, seed 38) | 6 | 1 | 2 | 1 | 0 | 0 | 3 "
            f"| 70.0% | 70.0% (95%: {low}-{high}) | 12 s (0 min, 2) |") in page
    assert "Sampled (" in page and "`draftmeta/advance.py` (10 of 11)" in page
    assert "Partly run" not in page and "Where a sample was not finished" not in page
    runs["samples"]["draftmeta/advance.py"]["size"] = 11  # one of the sample not run yet
    page = report.render(report.collect(_fake(tmp_path), {}, {}, runs, ("draftmeta/advance.py",)),
                         {}, "nox -s mutation", runs)
    assert "11 (sample of 11, seed 38: 10 run)" in page
    assert ("Where a sample was not finished, the mutants left are those mutmut runs last (the "
            "slowest to test), so the interval describes the mutants run, not the whole "
            "module.") in page
    assert ("- today: `draftmeta/advance.py`: 10 mutants in 10 min, 1 at a time, a sample of 10 "
            "per module (seed 38)") in page
    # the same mutants, not declared a sample: no interval, and the page says the run stopped
    whole, = report.collect(_fake(tmp_path), {}, {}, {}, ("draftmeta/advance.py",))
    assert whole.interval is None
    assert "Partly run (a run was stopped" in report.render([whole], {}, "nox -s mutation")


def test_a_committed_status_stands_only_while_its_function_is_unchanged(
    report: ModuleType, tmp_path: Path,
) -> None:
    """The committed results fill in the mutants not run here: those of a function whose source
    hash is the same now, or that were committed without hashes (a run before hashes were
    kept); a changed function's mutants are not run yet."""
    committed = {"modules": {"draftmeta/advance.py": {
        "mutants": 11, "statuses": {"draftmeta.advance.x_h__mutmut_2": "killed"},
        "durations": {"draftmeta.advance.x_h__mutmut_2": 3.0},
        "function_hashes": {"x_h": "same"}}}}
    here = _fake(tmp_path, hashes={"x_h": "same"})
    advance, = report.collect(here, {}, {}, {}, ("draftmeta/advance.py",), committed)
    assert advance.statuses["draftmeta.advance.x_h__mutmut_2"] == "killed"
    assert advance.run == 11 and advance.durations == {"draftmeta.advance.x_h__mutmut_2": 3.0}
    changed = _fake(tmp_path, hashes={"x_h": "edited"})
    advance, = report.collect(changed, {}, {}, {}, ("draftmeta/advance.py",), committed)
    assert advance.statuses["draftmeta.advance.x_h__mutmut_2"] == "not run"
    del committed["modules"]["draftmeta/advance.py"]["function_hashes"]
    advance, = report.collect(changed, {}, {}, {}, ("draftmeta/advance.py",), committed)
    assert advance.statuses["draftmeta.advance.x_h__mutmut_2"] == "killed"
    # a status decided here is never replaced by a committed one
    committed["modules"]["draftmeta/advance.py"]["statuses"] = {
        "draftmeta.advance.x_g__mutmut_1": "killed"}
    advance, = report.collect(changed, {}, {}, {}, ("draftmeta/advance.py",), committed)
    assert advance.statuses["draftmeta.advance.x_g__mutmut_1"] == "survived"


def test_committed_results_of_a_module_no_longer_mutated_are_kept_and_marked(
    report: ModuleType, tmp_path: Path,
) -> None:
    """A module moved or renamed (out of ``only_mutate``) keeps its committed tally, marked."""
    committed = {"modules": {"draftmeta/old_place.py": {
        "mutants": 2, "statuses": {"draftmeta.old_place.x_f__mutmut_1": "killed",
                                   "draftmeta.old_place.x_f__mutmut_2": "survived"}}}}
    advance, old = report.collect(tmp_path / "mutants", {}, {}, {}, ("draftmeta/advance.py",),
                                  committed)
    assert (old.module, old.mutated, old.run, old.score) == ("draftmeta/old_place.py", False, 2,
                                                               0.5)
    page = report.render([advance, old], {}, "nox -s mutation")
    assert "| `draftmeta/old_place.py` (no longer mutated) | 2 | 1 | 0 | 1 |" in page
    assert "Not run yet: `draftmeta/advance.py`." in page


# -- the committed results name mutants of functions that exist -----------------------------------


def _functions(path: Path) -> set[str]:
    """mutmut's keys of the functions and methods in the module at ``path`` (``x_f``,
    ``xǁClassǁmethod``)."""
    import ast

    keys: set[str] = set()

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                keys.add(f"xǁ{owner}ǁ{node.name}" if owner else f"x_{node.name}")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{owner}.{node.name}" if owner else node.name)

    visit(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return keys


@pytest.fixture(scope="module")
def run() -> ModuleType:
    return load_script("tools/mutation_run.py")


def misplaced_mutants(run: ModuleType, folder: Path, root: Path = ROOT) -> list[str]:
    """The mutants the committed results (``folder``: results, the fresh check, the equivalent
    mutants and the tests written for survivors) name that belong to no mutated module, or to
    a function their module no longer has; a module the results keep as no longer mutated (a
    module moved or renamed earlier) is left as it was recorded."""
    mutated = run.mutated_modules(root)
    results = json.loads((folder / "results.json").read_text())
    kept = [m for m in results["modules"] if m not in mutated]
    names = {n for entry in results["modules"].values() for n in entry["statuses"]}
    names |= {n for check in report_module().checks_of(json.loads(
        (folder / "check.json").read_text())) for statuses in check["statuses"].values()
        for n in statuses}
    for name in ("equivalent.json", "killed_by.json"):
        names |= set(json.loads((folder / name).read_text()))
    functions = {m: _functions(root / m) for m in mutated}
    wrong = []
    for name in sorted(names):
        module = run.module_of(name, mutated)
        if module is None:
            if run.module_of(name, kept) is None:
                wrong.append(name)
            continue
        key = name[len(run.dotted(module)) + 1:].rpartition("__mutmut_")[0]
        if key not in functions[module]:
            wrong.append(name)
    return wrong


def test_every_recorded_mutant_belongs_to_a_function_of_a_mutated_module(run: ModuleType) -> None:
    assert misplaced_mutants(run, ROOT / "mutation") == []


def test_a_mutant_recorded_under_a_module_or_function_that_moved_is_reported(
    run: ModuleType, tmp_path: Path,
) -> None:
    # negative control: the results as they were before spec.py and codegen.py were split (a
    # validator of the spec was a DraftSpec method; codegen a module), and a method gone
    for name in ("results.json", "check.json", "equivalent.json", "killed_by.json"):
        (tmp_path / name).write_text((ROOT / "mutation" / name).read_text())
    killed_by = json.loads((tmp_path / "killed_by.json").read_text())
    killed_by |= {"draftmeta.spec.xǁDraftSpecǁ_check_order__mutmut_54": "t::a",
                  "draftmeta.codegen.x_describe_bound__mutmut_26": "t::b",
                  "draftmeta.spec.xǁDraftSpecǁ_validate__mutmut_1": "t::c"}
    (tmp_path / "killed_by.json").write_text(json.dumps(killed_by))
    assert misplaced_mutants(run, tmp_path) == [
        "draftmeta.codegen.x_describe_bound__mutmut_26",
        "draftmeta.spec.xǁDraftSpecǁ_check_order__mutmut_54",
        "draftmeta.spec.xǁDraftSpecǁ_validate__mutmut_1"]


def test_check_json_holds_one_fresh_check_or_several_each_under_its_own_heading(
    report: ModuleType,
) -> None:
    one = {"command": "c1", "commit": "abc1234", "started": "s", "seconds": 60, "note": "n",
           "statuses": {"draftmeta/advance.py": {"draftmeta.advance.x_f__mutmut_1": "killed"}}}
    two = {**one, "command": "c2", "title": "A fresh check of the end-to-end verdict"}
    assert report.checks_of({"checks": [one, two]}) == [one, two]
    assert report.checks_of(one) == [one] and report.checks_of({}) == []
    assert report.render_check(one, report.check_results(one, {}, {}))[0] == (
        "## A fresh check: the suite as it stands")
    assert report.render_check(two, report.check_results(two, {}, {}))[0] == (
        "## A fresh check of the end-to-end verdict")
