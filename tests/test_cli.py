"""The draftmeta command: arguments, explain, verify (including a deliberately broken spec),
coverage and a small bench run."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from draftmeta import DraftSpec, HostConstant
from draftmeta.cli import main
from draftmeta.commands.inspection import _default_host_bound
from draftmeta.integrations.vllm.catalogue import current_release
from draftmeta.integrations.vllm.testing import equivalence

RELEASE = current_release()

DEFAULT_VARIANT = _default_host_bound("TRITON_MLA", RELEASE) or "advance"
"""The variant ``explain TRITON_MLA`` shows by default with the vLLM installed here: the hook's
``frozen`` where the hook is the release's only draft path (0.34), else ``advance``."""

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="builds metadata with vLLM's real builders (pip install -e '.[vllm]')",
)


def test_explain_prints_the_generated_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "TRITON_MLA"]) == 0
    out = capsys.readouterr().out
    assert f"\ndef draft_update_TRITON_MLA_{DEFAULT_VARIANT}(metadata, state):\n" in out
    assert "metadata.max_seq_len = _new_max_seq_len" in out


def test_explain_unknown_backend_exits_2_with_a_did_you_mean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "TRITON_MLAX"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'TRITON_MLAX'; did you mean 'TRITON_MLA'" in err
    assert "draftmeta explain --list" in err and err.count("\n") == 1


def test_a_backend_nothing_resembles_gets_no_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "zzz"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'zzz'" in err and "did you mean" not in err


def test_explain_list_prints_every_spec_name_one_per_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from draftmeta.registry import SPECS

    assert main(["explain", "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == list(SPECS)


def test_explain_without_a_name_or_list_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain"]) == 2
    assert "--list" in capsys.readouterr().err


_FRESH_EXPLAIN = """
import io, contextlib, sys, time
start = time.perf_counter()
import draftmeta.cli
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = draftmeta.cli.main(["explain", "TRITON_MLA"])
wall = time.perf_counter() - start
assert code == 0 and "def draft_update_TRITON_MLA_" + sys.argv[1] in out.getvalue()
print(sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm.")), f"{wall:.2f}")
"""


def test_explain_in_a_fresh_process_never_imports_vllm() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DRAFTMETA_VLLM_CLASSES"}
    done = subprocess.run([sys.executable, "-c", _FRESH_EXPLAIN, DEFAULT_VARIANT],
                          capture_output=True, text=True, env=env, check=True)
    modules, wall = done.stdout.strip().rsplit(" ", 1)
    print(f"explain TRITON_MLA in a fresh process: {wall} s (torch import included)")
    assert modules == "[]", done.stdout


_EXPLAIN_THEN_VLLM = """
import io, contextlib
import draftmeta.cli
from draftmeta.registry import get_spec
with contextlib.redirect_stdout(io.StringIO()):
    assert draftmeta.cli.main(["explain", "TRITON_MLA"]) == 0
spec = get_spec("TRITON_MLA")
print(spec.cls.__module__, hasattr(spec.cls, "__dataclass_fields__"), spec.cls.__init__.__module__)
"""


@needs_vllm
def test_specs_declared_after_explain_use_vllms_own_classes_again() -> None:
    # explain declares against recorded stand-ins; a later caller that imports vLLM must not
    # be handed those cached stand-ins (whose __init__ is made by dataclasses.make_dataclass)
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DRAFTMETA_VLLM_CLASSES"}
    done = subprocess.run([sys.executable, "-c", _EXPLAIN_THEN_VLLM], capture_output=True,
                          text=True, env=env, check=True)
    module, _, init_module = done.stdout.split()
    assert module.startswith("vllm.") and init_module.startswith("vllm."), done.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "--batches", "0"], "must be a positive integer, got 0"),
        (["verify", "--steps", "1"], "must be an integer from 2 to 16, got 1"),
        (["verify", "--device", "tpu"], "invalid choice: 'tpu'"),
        (["bench", "--batch-sizes", "-4"], "a batch size must be an integer from 1 to 2048, got -4"
         ),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_argument_errors_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@needs_vllm
def test_verify_passes_shows_progress_and_names_the_backends_it_skips(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from draftmeta.integrations.vllm.testing.equivalence import BUILDERS

    assert main(["verify", "--batches", "3", "--steps", "4", "--seed", "7"]) == 0
    out, err = capsys.readouterr()
    for builder in ("CPU_MLA", "TRITON_MLA", "INDEXER"):
        assert builder in out
    assert "all updated metadata equals the rebuilt metadata" in out
    # every checked backend is announced on stderr, in order, with its count
    stages = [line for line in err.splitlines() if line.startswith("draftmeta verify: checking")]
    assert [line.split()[3] for line in stages] == list(BUILDERS)
    assert stages[-1].startswith(f"draftmeta verify: checking KPOOL_TAIL ({len(BUILDERS)}/")
    # the catalogued builders that do not construct on a CPU are named, with the reason
    skipped = out.split("backend ")[0]
    assert "skipped (they construct only on a CUDA GPU" in skipped
    for name in ("FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA_SPARSE_SM120"):
        assert name in skipped
    assert all(name not in skipped.split("):", 1)[1].split() for name in BUILDERS)
    assert max(len(line) for line in out.splitlines()) <= 100


@needs_vllm
def test_verify_fails_on_a_broken_spec(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = equivalence.BUILDERS["TRITON_MLA"]
    good = entry.make_spec()
    broken = DraftSpec(good.cls, {**good.rules, "max_seq_len": HostConstant()},
                       nested=good.nested, preconditions=good.preconditions, name="broken")
    monkeypatch.setitem(equivalence.BUILDERS, "TRITON_MLA",
                        attrs.evolve(entry, spec=lambda **kwargs: broken))
    assert main(["verify", "--batches", "2", "--seed", "11"]) == 1
    out = capsys.readouterr().out
    assert "FAIL TRITON_MLA seed=11" in out and "field=max_seq_len" in out


@needs_vllm
def test_coverage_says_which_vllm_it_found_and_who_covers_each_builder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "1")
    assert main(["coverage"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    from draftmeta.integrations.vllm.versions import supported

    assert lines[0].startswith("vLLM 0.") and f"supported: {', '.join(supported())}" in lines[0]
    assert lines[1].startswith("plugin: active")
    assert any(line.split()[:3] == ["TRITON_MLA", "hook", "vllm"] for line in lines)
    proven = "draftmeta" if RELEASE.entry("FLASHMLA").proof_on(RELEASE.version) == "GPU" else "none"
    assert any(line.split()[:3] == ["FLASHMLA", "hook", proven] for line in lines)
    assert any(line.split()[:3] == ["FLASHINFER_MLA", "hook", "none"] for line in lines)
    assert max(len(line) for line in lines) <= 100
    reasons = " ".join(line[63:].strip() for line in lines[4:])  # the reason column, joined
    assert "DRAFTMETA_VLLM_UNPROVEN=1 installs it" in reasons  # names whole


@needs_vllm
def test_coverage_with_the_plugin_off_says_nothing_is_covered_by_draftmeta(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "0")
    assert main(["coverage", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plugin"]["active"] is False
    rows = report["builders"]
    assert not [r for r in rows if r["covered_by"] == "draftmeta"]
    would = [r for r in rows if r["with_plugin"] == "draftmeta"]
    assert would and all(r["reason"].startswith("plugin inactive (turned off by "
                                                 "DRAFTMETA_VLLM_PLUGIN); with it active: ")
                         for r in would)
    assert main(["coverage"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("covered: ") and "draftmeta 0" in lines[2]
    table = [line for line in lines[4:] if line[:1].strip()]  # not a reason's wrapped lines
    assert table and not any(line.split()[2:3] == ["draftmeta"] for line in table)


@needs_vllm
def test_coverage_sums_up_each_path_and_says_how_each_builder_is_proven(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "1")
    assert main(["coverage", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["coverage"]) == 0
    summary = capsys.readouterr().out.splitlines()[2]
    for path in {r["path"] for r in report["builders"]}:
        rows = [r for r in report["builders"] if r["path"] == path]
        counts = ", ".join(f"{who} {sum(r['covered_by'] == who for r in rows)}"
                           for who in ("draftmeta", "vllm", "none"))
        assert f"{path}: {counts}" in summary
    proven = {r["backend"]: r["proven"] for r in report["builders"]}
    assert proven["CPU_MLA"] == "CI" and proven["CUTLASS_MLA"] == "no"
    unimported = [r for r in report["builders"] if "does not import here" in r["reason"]]
    assert all(re.search(r"does not import here \(\w+(Error|Exception)?: .+\)", r["reason"])
               for r in unimported)


@needs_vllm
def test_coverage_json_is_one_object_with_the_documented_fields(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "1")
    assert main(["coverage", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["plugin"]) == {"installed", "enabled", "active", "reason"}
    assert report["plugin"]["active"] is True
    rows = {(r["backend"], r["path"]): r for r in report["builders"]}
    assert rows[("TRITON_MLA", "hook")]["covered_by"] == "vllm"
    assert rows[("CPU_MLA", "hook")]["covered_by"] == "draftmeta"
    assert rows[("CPU_MLA", "hook")]["builder"] == "MLACommonMetadataBuilder"
    # proven by a recorded GPU run on this release (0.34)
    flashmla_proven = RELEASE.entry("FLASHMLA").proof_on(RELEASE.version) == "GPU"
    assert rows[("FLASHMLA", "hook")]["covered_by"] == ("draftmeta" if flashmla_proven
                                                       else "none")
    assert "FLASHINFER_MLA" in report["blocking_full_capture"]
    assert ("FLASHMLA" not in report["blocking_full_capture"]) == flashmla_proven


@needs_vllm
def test_coverage_says_the_older_proposer_update_serves_only_engines_drafting_3_tokens_or_more(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The class-level plan cannot see an engine's K, so the report says, in JSON and as
    text, which engines its older-proposer rows apply to (at K <= 2 a builder keeps vLLM's
    build: tests/test_vllm_plugin.py checks that decision); a release without that path
    says nothing of it."""
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.plugin.plan import draft_path

    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "1")
    older = "older_proposer" in current_release().paths
    assert main(["coverage", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["older_proposer_engines"]
    assert said == (draft_path("older_proposer").engines if older else None)
    assert main(["coverage"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    sentence = ("The older_proposer rows covered by draftmeta apply to engines that draft K >= 3 "
                "tokens per step (num_speculative_tokens); at K <= 2 no draft step follows "
                "index 1, so each builder keeps vLLM's build_for_drafting")
    assert (sentence in text) == older


@needs_vllm
def test_coverage_says_the_hook_serves_only_engines_that_capture_full_cuda_graphs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The class-level plan cannot see an engine's cudagraph_mode, so the report says, in
    JSON and as text, which engines its hook rows apply to (an eager engine keeps vLLM's
    behaviour: tests/test_vllm_plugin.py checks that decision)."""
    from draftmeta.integrations.vllm.plugin.plan import draft_path

    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "1")
    assert main(["coverage", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hook_engines"] == draft_path("hook").engines
    assert main(["coverage"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("Hook rows covered by draftmeta apply to engines that capture full CUDA graphs "
            "(vLLM's default on a GPU); in an engine without them (enforce_eager=True, "
            "cudagraph_mode NONE or PIECEWISE) every builder keeps vLLM's behaviour") in text


@needs_vllm
def test_coverage_says_when_the_plugin_is_turned_off(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTMETA_VLLM_PLUGIN", "0")
    assert main(["coverage", "--json"]) == 0
    plugin = json.loads(capsys.readouterr().out)["plugin"]
    assert plugin["active"] is False and plugin["enabled"] is False
    assert plugin["reason"] == "turned off by DRAFTMETA_VLLM_PLUGIN"


@needs_vllm
def test_bench_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--batch-sizes", "1", "4", "--max-steps", "3", "--repeats", "2",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "rebuild" in out and "update" in out and "advance" in out
    data = json.loads((tmp_path / "bench-cpu.json").read_text())
    assert data["environment"]["vllm"].startswith("0.3")
    assert data["environment"]["torch"]
    paths = {(r["backend"], r["path"]) for r in data["summary"]}
    assert ("INDEXER", "rebuild") in paths and ("CPU_MLA", "update") in paths
    assert all(r["host_median_us"] > 0 for r in data["summary"])
    assert (tmp_path / "bench-cpu.png").stat().st_size > 10_000


def test_a_seed_beyond_63_bits_is_refused_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["verify", "--seed", str(2**64)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "a seed must be an integer from 0 to 2**63 - 1" in err and "Traceback" not in err


def test_bench_output_under_a_regular_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "results"
    blocker.write_text("not a folder")
    assert main(["bench", "--out", str(blocker), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"draftmeta bench: --out {blocker}: {blocker} is a file, not a folder; name a folder "
        "for the results\n"
    )
    nested = blocker / "deeper"
    assert main(["bench", "--out", str(nested), "--quiet"]) == 2
    assert capsys.readouterr().err.endswith(f"{blocker} is a file, not a folder; name a "
                                            "folder for the results\n")


def test_ctrl_c_during_verify_exits_130_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import draftmeta.verify

    def interrupted(**_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(draftmeta.verify, "verify", interrupted)
    # --device cuda: nothing is imported before the (interrupted) check, vLLM or not
    assert main(["verify", "--device", "cuda", "--batches", "1", "--quiet"]) == 130
    assert capsys.readouterr().err == "draftmeta verify: interrupted\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["e2e", "--ks", "9"], "K (draft tokens per step) must be an integer from 1 to 8, got 9"),
    (["e2e", "--warmups", "-1"], "must be an integer >= 0, got -1"),
    (["infer", "TRITON_MLA", "--batches", "x"], "must be a positive integer, got 'x'"),
    (["infer", "TRITON_MLA", "--seed", "-3"], "a seed must be an integer from 0 to 2**63 - 1"),
])
def test_every_sub_command_refuses_an_out_of_range_integer_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"draftmeta {version('draftmeta')}\n"


def _sub_parsers() -> dict[str, argparse.ArgumentParser]:
    from draftmeta.cli import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_has_a_description_and_every_option_says_its_default() -> None:
    commands = _sub_parsers()
    assert set(commands) == {"explain", "verify", "coverage", "audit", "bench", "e2e", "infer"}
    for name, p in commands.items():
        assert p.description and len(p.description) > 40, name
        text = p.format_help()
        for action in p._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, (name, action.option_strings)
            shown = p._get_formatter()._expand_help(action)
            # "(default: X)", or a default that depends on something stated in its own words
            # ("cpu default: 1 4; cuda: 1 8")
            assert "default: " in shown, (name, action.option_strings, shown)
            assert action.option_strings[-1] in text


def test_every_command_takes_verbose_and_the_long_ones_quiet() -> None:
    for name, p in _sub_parsers().items():
        options = {o for a in p._actions for o in a.option_strings}
        assert {"-v", "--verbose"} <= options, name
        if name != "explain":  # explain takes under a second
            assert "--quiet" in options, name


def test_a_mistyped_command_exits_2_with_one_line_and_a_did_you_mean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["verfy"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'verify'?" in err
    assert err.startswith("draftmeta: argument COMMAND: invalid choice: 'verfy'")


def test_an_argument_error_is_one_line_naming_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--repeats", "0"])
    err = capsys.readouterr().err
    assert err == ("draftmeta bench: argument --repeats: must be a positive integer, got 0 "
                   "(see draftmeta bench --help)\n")


def test_explain_host_bound_frozen_prints_the_frozen_update(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "TRITON_MLA", "--host-bound", "frozen"]) == 0
    out = capsys.readouterr().out
    assert "def draft_update_TRITON_MLA_frozen(metadata, state):" in out
    assert "# max_seq_len: host upper bound: frozen at state.max_model_len" in out
    assert main(["explain", "TRITON_MLA.dcp", "--host-bound", "frozen"]) == 0
    out = capsys.readouterr().out
    assert "def draft_update_TRITON_MLA_dcp_frozen(metadata, state):" in out
    assert "_dcp_max_seq_len(state.max_model_len, " in out
    assert main(["explain", "state.wrap", "--host-bound", "frozen"]) == 0
    assert "_SPEC = 'draft_state.wrap.frozen'" in capsys.readouterr().out
    assert main(["explain", "FLASHMLA.fp8", "--host-bound", "frozen"]) == 0
    assert "def draft_update_FLASHMLA_fp8_frozen(" in capsys.readouterr().out


def test_explain_without_host_bound_prints_the_registered_spec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "state.clamp.frozen"]) == 0
    frozen = capsys.readouterr().out
    assert main(["explain", "state.clamp", "--host-bound", "frozen"]) == 0
    assert capsys.readouterr().out == frozen


def test_explain_a_frozen_name_with_the_advancing_bound_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "state.clamp.frozen", "--host-bound", "advance"]) == 2
    assert capsys.readouterr().err == (
        "draftmeta explain: state.clamp.frozen is the frozen host bound; for host bound "
        "advance name state.clamp\n")


def test_results_go_outside_the_committed_folder_unless_out_says_so() -> None:
    committed = (Path(__file__).resolve().parent.parent / "benchmarks" / "results").resolve()
    for name in ("bench", "e2e"):
        out = Path(_sub_parsers()[name].get_default("out")).resolve()
        assert out != committed and committed not in out.parents, (name, out)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_redraws_one_line_and_clears_it_before_results() -> None:
    from draftmeta.commands.terminal import Progress

    err, out = _Terminal(), io.StringIO()
    with Progress("verify", stream=err, out=out) as progress:
        progress.update("checking CPU_MLA (1/5)")
        progress.write("CPU_MLA 3 10 0")
        with progress.stdout():
            print("printed by the command itself")
    assert out.getvalue() == "CPU_MLA 3 10 0\nprinted by the command itself\n"
    shown = err.getvalue()
    assert "\r\x1b[Kdraftmeta verify: checking CPU_MLA (1/5) [0 s]" in shown
    assert shown.endswith("\r\x1b[K") and "\n" not in shown  # one line, cleared at the end


def test_progress_in_a_log_is_one_plain_line_per_stage_and_nothing_when_quiet() -> None:
    from draftmeta.commands.terminal import Progress

    err, out = io.StringIO(), io.StringIO()
    with Progress("coverage", stream=err, out=out) as progress:
        progress.update("importing vLLM")
        progress.write("a result")
    assert err.getvalue() == "draftmeta coverage: importing vLLM\n"
    quiet = _Terminal()
    with Progress("coverage", enabled=False, stream=quiet, out=out) as progress:
        progress.update("importing vLLM")
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("verbose", [False, True])
def test_torch_and_vllm_warnings_and_logs_show_only_with_verbose(
    verbose: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging
    import warnings

    from draftmeta.commands.terminal import quiet_imports

    before = logging.getLogger("torch").level
    handler = logging.StreamHandler(__import__("sys").stderr)
    noisy = logging.getLogger("torch.utils.cpp_extension")
    noisy.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            with quiet_imports(verbose):
                warnings.warn_explicit("vLLM deprecation", FutureWarning, "x.py", 1,
                                       module="vllm.config")
                warnings.warn_explicit("ours", UserWarning, "y.py", 1, module="draftmeta.loop")
                noisy.warning("No CUDA runtime is found")
    finally:
        noisy.removeHandler(handler)
    shown = [str(w.message) for w in caught]
    err = capsys.readouterr().err
    if verbose:
        assert shown == ["vLLM deprecation", "ours"] and "No CUDA runtime" in err
    else:
        assert shown == ["ours"] and "No CUDA runtime" not in err
    assert logging.getLogger("torch").level == before  # restored


_NOISE = """
import sys
from draftmeta.cli import main
from draftmeta.integrations.vllm.catalogue import current_release
sys.exit(main(sys.argv[1:]))
"""


@needs_vllm
def test_verify_in_a_fresh_process_prints_nothing_on_stderr_but_its_own_lines() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    done = subprocess.run([sys.executable, "-c", _NOISE, "verify", "--batches", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    foreign = [line for line in done.stderr.splitlines()
               if not line.startswith("draftmeta verify: ")]
    assert foreign == [], done.stderr


def test_the_command_line_reference_lists_every_command_option_and_default() -> None:
    from draftmeta.cli import markdown_reference

    page = markdown_reference()
    for name, p in _sub_parsers().items():
        assert f"## draftmeta {name}\n" in page
        assert p.description is not None and p.description in page
        for action in p._actions:
            for option in action.option_strings:
                assert f"`{option}" in page or f", {option}" in page, (name, option)
    assert "(default: 1 8 64 256)" in page and "(default: 50)" in page
    for name in _sub_parsers():  # the command table links to each command's section
        assert f"| [`{name}`](#draftmeta-{name}) |" in page
    docs = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
    assert "markdown_reference()" in docs.read_text(encoding="utf-8")


def test_verify_on_cuda_announces_each_loop_and_says_what_it_skips(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import draftmeta.verify

    labels = [f"TRITON_MLA+INDEXER on CUDA ({mode})" for mode in ("eager", "fused")]

    def rows(*, echo: Callable[[str], None], **_: object) -> int:  # verify's CUDA table
        echo(f"{'backend':<40} {'batches':>7} {'steps':>6} {'mismatches':>10}")
        for label in labels:
            echo(f"{label:<40} {2:>7} {5:>6} {0:>10}")
        return 0

    monkeypatch.setattr(draftmeta.verify, "verify", rows)
    assert main(["verify", "--device", "cuda", "--batches", "2"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"draftmeta verify: checking {label} ({i}/2, 2 batches)"
                                for i, label in enumerate(labels, 1)]
    assert out.startswith("skipped (no plain-torch reference builder to rebuild them without "
                          "vLLM): every other builder\n")


_CLOSED = """
import os, subprocess, sys
read, write = os.pipe()
os.close(read)  # the reader is gone before the first line
done = subprocess.run([sys.executable, "-c",
                       "import sys; from draftmeta.cli import main; sys.exit(main(sys.argv[1:]))",
                       "explain", "--list"], stdout=write, stderr=subprocess.PIPE)
print(done.returncode, repr(done.stderr.decode()))
"""


def test_output_to_a_reader_that_went_away_ends_quietly_with_141() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CLOSED], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stdout.split() == ["141", "''"], done.stdout


_SHIPPED_EXPLAIN = """
import io, contextlib, sys
import draftmeta.cli
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = draftmeta.cli.main(["explain", "CPU_MLA"])
assert code == 0 and "def draft_update_CPU_MLA_advance" in out.getvalue()
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "vllm", "numpy"}))
"""


def _shipped_release() -> bool:
    from draftmeta import explained

    return explained.release_in_use() == explained.RELEASE


_SHIPPED_ONLY = "explain texts ship for the default vLLM release only"


@pytest.mark.skipif(not _shipped_release(), reason=_SHIPPED_ONLY)
def test_explain_of_a_shipped_spec_in_a_fresh_process_imports_neither_torch_nor_vllm() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SHIPPED_EXPLAIN], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.skipif(not _shipped_release(), reason=_SHIPPED_ONLY)
def test_explain_with_the_names_own_host_bound_prints_the_shipped_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the shipped text comes from vLLM's own classes, the other from the recorded lists (where
    # this process has not imported vLLM): the nested prefill records are in both
    assert main(["explain", "CPU_MLA"]) == 0
    shipped = capsys.readouterr().out
    assert main(["explain", "CPU_MLA", "--host-bound", "advance"]) == 0
    assert capsys.readouterr().out == shipped
    assert "_MLACommonPrefillMetadata = class" in shipped


@pytest.mark.skipif(not _shipped_release(), reason=_SHIPPED_ONLY)
def test_explain_prints_for_every_shipped_name_what_the_generator_makes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from draftmeta import explained
    from draftmeta.codegen import explain
    from draftmeta.registry import SPECS, get_spec, recorded_classes

    names = explained.names()
    assert names == list(SPECS)
    for name in names:
        assert main(["explain", name]) == 0
        printed = capsys.readouterr().out
        with recorded_classes():
            assert printed == explain(get_spec(name)), name
