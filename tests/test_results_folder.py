"""One results folder convention for every command: ``--out`` is the folder (default
``draftmeta-results`` in the current folder) for ``bench``, ``e2e``, ``e2e --device cuda`` and
the scripts under ``benchmarks/``; a run never replaces a fuller result without ``--force``,
and it says so before it runs.

Nothing is measured here: where a command would start its run, a stand-in raises
:class:`Started`, so each test sees whether the run would have started.
"""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from draftmeta.arguments import DEFAULT_OUT, FORCE_HELP, OUT_HELP, Extent, replace_problem
from draftmeta.cli import main, parser

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


class Started(Exception):
    """The command got as far as starting its run."""


def _never(*args: object, **kwargs: object) -> object:
    raise Started


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command's run is the stand-in: reaching it raises :class:`Started`."""
    import draftmeta.bench
    from draftmeta.integrations.vllm.tools.e2e import cli

    monkeypatch.setattr(draftmeta.bench, "run_bench", _never)
    monkeypatch.setattr(cli, "_run", _never)


def _bench_result(folder: Path, **config: object) -> Path:
    full = {"device": "cpu", "batch_sizes": [1, 8, 64, 256], "steps": [2, 3, 4, 5, 6, 7, 8],
            "repeats": 12, "block_size": 64, "max_model_len": 4096,
            "backends": ["CPU_MLA", "TRITON_MLA", "INDEXER"]}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bench-cpu.json"
    path.write_text(json.dumps({"environment": {"config": {**full, **config}}}))
    return path


def test_every_command_writes_to_the_same_default_folder_with_the_same_out_and_force() -> None:
    p = parser()
    for argv in (["bench"], ["e2e"], ["e2e", "--device", "cuda"]):
        assert p.parse_args(argv).out == DEFAULT_OUT == Path("draftmeta-results"), argv
    sub = next(a for a in p._actions if a.dest == "command")
    for name in ("bench", "e2e"):
        options = {o: a for a in sub.choices[name]._actions  # type: ignore[union-attr]
                   for o in a.option_strings}
        assert (options["--out"].help or "").startswith(OUT_HELP), name
        assert options["--force"].help == FORCE_HELP, name


def _out_defaults(script: Path) -> list[str]:
    """The source of each ``--out`` option's default in a script."""
    found = []
    for node in ast.walk(ast.parse(script.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "--out"):
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            found.append("" if default is None else ast.unparse(default))
    return found


def test_every_benchmarks_script_with_an_out_option_defaults_to_the_same_folder() -> None:
    scripts = [s for s in sorted((ROOT / "benchmarks").rglob("*.py")) if _out_defaults(s)]
    assert {s.name for s in scripts} >= {"e2e_floor.py", "run_h200.py", "hook_equivalence.py"}
    for script in scripts:
        assert _out_defaults(script) == ["DEFAULT_OUT"], script
        assert '"--force"' in script.read_text(), script


@pytest.mark.usefixtures("no_runs")
def test_a_bench_run_over_fewer_batch_sizes_stops_before_it_runs_where_a_fuller_result_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = _bench_result(tmp_path)
    before = path.read_text()
    assert main(["bench", "--batch-sizes", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a fuller result" in err and "--force" in err, err
    assert "configurations this run leaves out" in err and "batch 8" in err
    assert path.read_text() == before


@pytest.mark.usefixtures("no_runs")
def test_a_bench_run_with_fewer_repeats_stops_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    _bench_result(tmp_path)
    assert main(["bench", "--repeats", "2", "--out", str(tmp_path)]) == 2
    assert "12 repeats per configuration (this run: 2)" in capsys.readouterr().err


@pytest.mark.usefixtures("no_runs")
def test_a_bench_run_that_covers_the_result_or_is_forced_replaces_it(tmp_path: Path) -> None:
    _bench_result(tmp_path, batch_sizes=[1], repeats=3)
    with pytest.raises(Started):
        main(["bench", "--out", str(tmp_path)])
    _bench_result(tmp_path)
    with pytest.raises(Started):
        main(["bench", "--batch-sizes", "1", "--out", str(tmp_path), "--force"])
    with pytest.raises(Started):  # another folder: nothing there to lose
        main(["bench", "--batch-sizes", "1", "--out", str(tmp_path / "quick")])


@pytest.mark.usefixtures("no_runs")
def test_a_partial_e2e_run_does_not_replace_the_full_matrix_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copy(RESULTS / "e2e-cpu.json", tmp_path)
    assert main(["e2e", "--ks", "2", "--batch-sizes", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "e2e-cpu.json holds a fuller result: 15 configurations this run leaves out" in err
    assert "--force" in err
    with pytest.raises(Started):  # the committed run's command covers it
        main(["e2e", "--negative-control", "--out", str(tmp_path)])
    with pytest.raises(Started):
        main(["e2e", "--ks", "2", "--out", str(tmp_path), "--force"])


@pytest.mark.usefixtures("no_runs")
def test_a_result_of_the_earlier_layout_is_not_replaced_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copy(RESULTS / "e2e-cuda.json", tmp_path)  # written before schema 2
    argv = ["e2e", "--device", "cuda", "--backends", "FLASHMLA", "--ks", "3", "--out",
            str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot compare" in err and "earlier layout" in err and "--force" in err, err
    with pytest.raises(Started):
        main([*argv, "--force"])


def test_a_result_that_cannot_be_read_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "bench-cpu.json").write_text("not JSON")
    problem = replace_problem(tmp_path / "bench-cpu.json", Extent.of(["a"], 1),
                              lambda data: Extent.of(data["x"], 1))
    assert problem is not None and "cannot compare" in problem and "--force" in problem


@pytest.mark.parametrize(("argv", "said"), [
    (["--modes", "off,on"],
     "holds a fuller result: 1 configuration this run leaves out (floor CPU_MLA batch 4"),
    (["--backend", "AMX_MLA"], "3 configurations this run leaves out (floor CPU_MLA batch 4"),
], ids=["fewer-modes", "another-backend"])
def test_e2e_floor_refuses_to_replace_a_fuller_result_before_it_needs_vllm(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    e2e_floor: ModuleType,
) -> None:
    shutil.copy(RESULTS / "e2e-floor.json", tmp_path)
    with pytest.raises(SystemExit) as exit_:
        e2e_floor.main([*argv, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


def test_e2e_floor_says_why_amx_mla_cannot_run_on_a_cpu_without_amx_before_it_needs_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    e2e_floor: ModuleType,
) -> None:
    from draftmeta.integrations.vllm.tools.e2e import environment

    monkeypatch.setattr(environment, "cpu_has_amx", lambda *args: False)
    with pytest.raises(SystemExit) as exit_:
        e2e_floor.main(["--backend", "AMX_MLA", "--out", str(tmp_path)])
    assert exit_.value.code == 1
    assert "AMX_MLA cannot run here: this CPU has no AMX" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_page_states_the_results_convention() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    for words in ("draftmeta-results", "--out", "--force", "bench-cpu", "e2e-cpu", "e2e-cuda",
                  "e2e-floor", "draft-loop-h200", "hook-equivalence"):
        assert words in page, words


@pytest.mark.usefixtures("no_runs")
def test_an_e2e_run_that_will_skip_amx_mla_here_does_not_replace_a_result_that_has_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta.integrations.vllm.tools.e2e import environment

    data = json.loads((RESULTS / "e2e-cpu.json").read_text())
    data["configurations"] += [{**c, "backend": "AMX_MLA"} for c in data["configurations"]]
    (tmp_path / "e2e-cpu.json").write_text(json.dumps(data))
    monkeypatch.setattr(environment, "cpu_has_amx", lambda *args: False)
    assert main(["e2e", "--negative-control", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "8 configurations this run leaves out (trained AMX_MLA K=1 batch 1 (32 tokens)" in err
    monkeypatch.setattr(environment, "cpu_has_amx", lambda *args: True)
    with pytest.raises(Started):  # where AMX_MLA runs, the same command covers it all
        main(["e2e", "--negative-control", "--out", str(tmp_path)])


def test_a_run_whose_case_failed_writes_beside_a_fuller_result_not_over_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    import attrs
    from e2e_fakes import comparison

    from draftmeta.integrations.vllm.tools.e2e import platforms, rendering, report, runner
    from draftmeta.integrations.vllm.tools.e2e.compare import Case
    from draftmeta.integrations.vllm.tools.e2e.models import resolve

    full = [comparison(Case("tiny", "FLASHMLA", 3), batch_size=b) for b in (1, 8)]

    def result(config: runner.RunConfig, comparisons: list[object],
               failures: list[runner.Failure]) -> runner.RunResult:
        return runner.RunResult(config, "0.34.0", comparisons, failures, {}, {})  # type: ignore[arg-type]

    cuda = attrs.evolve(platforms.CUDA, prepare=lambda: "0.34.0", gpus=lambda: (1, 80.0))
    monkeypatch.setitem(platforms.PLATFORMS, "cuda", cuda)
    config = runner.RunConfig(platform=cuda, models={"tiny": resolve("tiny")},
                              cases=(Case("tiny", "FLASHMLA", 3),), batch_sizes=(1, 8),
                              max_tokens=256)
    (tmp_path / "e2e-cuda.json").write_text(json.dumps(report.summary(result(config, full, []))))
    failed = runner.Failure(Case("tiny", "FLASHMLA", 3), "the engine did not start")
    monkeypatch.setattr(runner, "run", lambda config, **kwargs: result(config, [], [failed]))
    written: list[str] = []
    monkeypatch.setattr(rendering, "write_results",
                        lambda data, out, stem, **kwargs: written.append(stem) or {})
    argv = ["e2e", "--device", "cuda", "--backends", "FLASHMLA", "--ks", "3", "--json",
            "--out", str(tmp_path)]
    assert main(argv) == 1
    assert written == ["e2e-cuda-partial"]
    assert "its results go to e2e-cuda-partial.* beside it" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 1
    assert written[-1] == "e2e-cuda"


def _writable(folder: Path) -> bool:
    try:
        (folder / ".probe").write_text("")
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A results folder that cannot be created: under a read-only folder (its permissions
    bind where the tests do not run as root), else under ``/sys``, read-only to root too."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not _writable(locked):
            yield locked / "results"
            return
        for parent in (Path("/sys"), Path("/proc")):
            if parent.is_dir() and not _writable(parent):
                yield parent / "draftmeta-results"
                return
        pytest.skip("no folder here that this user cannot write")
    finally:
        locked.chmod(0o700)


UNWRITABLE_RUNS = {
    "bench": ["bench", "--quiet"],
    "e2e": ["e2e", "--quiet"],
    "e2e-cuda": ["e2e", "--device", "cuda", "--quiet"],
}


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize("command", list(UNWRITABLE_RUNS))
def test_an_unwritable_results_folder_is_refused_in_one_line_before_anything_is_measured(
    command: str, unwritable: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Exit 2 and one line naming the folder and why, where the run would have started
    (``Started``) and measured for nothing."""
    assert main([*UNWRITABLE_RUNS[command], "--out", str(unwritable)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {unwritable}: cannot create that folder" in err, err
    assert "name a folder you can write to" in err


def test_e2e_floor_refuses_an_unwritable_results_folder_before_it_needs_vllm(
    unwritable: Path, capsys: pytest.CaptureFixture[str], e2e_floor: ModuleType,
) -> None:
    with pytest.raises(SystemExit) as exit_:
        e2e_floor.main(["--out", str(unwritable)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create that folder" in err, err


def test_a_folder_that_can_be_created_but_not_written_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test-write: a folder that exists but takes no file (simulated: root writes through
    permissions) is refused, and a writable one is left as it was found."""
    import tempfile

    from draftmeta.arguments import folder_problem

    assert folder_problem("--out", tmp_path / "new" / "deeper") is None
    assert list((tmp_path / "new" / "deeper").iterdir()) == []  # the test file is gone

    def refuse(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    problem = folder_problem("--out", tmp_path)
    assert problem == (f"--out {tmp_path}: cannot write into that folder (Permission denied); "
                       "name a folder you can write to")


@pytest.mark.usefixtures("no_runs")
def test_negative_control_a_writable_folder_lets_every_command_reach_its_run(
    tmp_path: Path,
) -> None:
    """The same calls with a folder that can be written get as far as the run."""
    for command, argv in UNWRITABLE_RUNS.items():
        with pytest.raises(Started):
            main([*argv, "--out", str(tmp_path / command)])
