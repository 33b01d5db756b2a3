"""Every option of every ``draftmeta`` command is checked by draftmeta before the command runs:
a bad value ends with exit 2 and one line naming the option and what it allows, never a
traceback or a third-party validation message."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from draftmeta.arguments import IntegerIn
from draftmeta.cli import BENCH_MAX_BATCH_SIZE, main, parser

# options whose text a command checks itself, each with the test that shows it
FREE_TEXT = {
    ("explain", "backend"): "test_cli.py: an unknown spec name exits 2 with a did-you-mean",
    ("infer", "builder"): "test_cli.py: an unknown builder exits 2",
    ("bench", "--out"): "test_cli.py: an output under a regular file exits 2 with one line",
    ("e2e", "--out"): "test_an_e2e_output_under_a_file_is_refused_before_any_engine_starts",
    ("e2e", "--model"): "test_e2e_model.py: a folder that is missing or has no config is refused",
    ("e2e", "--draft-model"): "test_e2e_model.py: a separate draft must be an MLA EAGLE or MTP "
                              "model",
    ("e2e", "--prompts"): "test_e2e_model.py: a prompts file that cannot be used is refused",
    ("audit", "backends"): "test_audit.py: a name without a hook exits 2 naming those with one",
    ("audit", "--out"): "test_audit.py: an output under a regular file exits 2 before the run",
    ("coverage", "--out"): "test_first_hour.py: an --out that is a file exits 2 before the run",
}
POSITIONALS = {"infer": ["TRITON_MLA"]}
THIRD_PARTY = ("Traceback", "pydantic", "For further information")


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _valued_options() -> list[tuple[str, argparse.Action]]:
    return [(name, a) for name, p in _commands().items() for a in p._actions
            if a.nargs != 0 and not isinstance(a, argparse._HelpAction)]


def _name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def test_every_option_that_takes_a_value_is_checked_by_draftmeta() -> None:
    unchecked = [
        (command, _name(a)) for command, a in _valued_options()
        if a.choices is None and not isinstance(a.type, IntegerIn)
        and (command, _name(a)) not in FREE_TEXT
    ]
    assert unchecked == []


def _bad_integers() -> list[tuple[str, str, str, str]]:
    cases = []
    for command, action in _valued_options():
        kind = action.type
        if not isinstance(kind, IntegerIn) or not action.option_strings:
            continue
        option = action.option_strings[-1]
        bad = ["x", "1.5", str(kind.low - 1)] + ([str(kind.high + 1)] if kind.high else [])
        cases += [(command, option, value, kind.allowed) for value in bad]
    return cases


@pytest.mark.parametrize(("command", "option", "value", "allowed"), _bad_integers(),
                         ids=lambda v: str(v))
def test_every_integer_option_refuses_a_bad_value_with_one_line_naming_its_range(
    command: str, option: str, value: str, allowed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, *POSITIONALS.get(command, []), option, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {option}: " in err and allowed in err, err
    assert not any(word in err for word in THIRD_PARTY), err


@pytest.mark.parametrize(
    ("command", "option"),
    [(c, a.option_strings[-1]) for c, a in _valued_options()
     if a.choices is not None and a.option_strings],
)
def test_every_choice_option_refuses_an_unknown_value_with_one_line(
    command: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, *POSITIONALS.get(command, []), option, "nope"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {option}: invalid choice: 'nope'" in err, err


def test_a_bench_batch_size_vllm_would_refuse_is_refused_first_naming_the_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--batch-sizes", "4096", "--quiet"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "draftmeta bench: argument --batch-sizes: a batch size must be an integer from 1 to "
        f"{BENCH_MAX_BATCH_SIZE}, got 4096 (see draftmeta bench --help)\n")


def test_the_bench_batch_size_range_is_the_one_vllm_accepts() -> None:
    pytest.importorskip("vllm", reason="needs vLLM")
    from draftmeta.integrations.vllm.testing.harness import make_vllm_config

    make_vllm_config(max_model_len=4096, block_size=64, max_num_seqs=BENCH_MAX_BATCH_SIZE)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_vllm_config(max_model_len=4096, block_size=64,
                         max_num_seqs=BENCH_MAX_BATCH_SIZE + 1)


def test_an_e2e_output_under_a_file_is_refused_before_any_engine_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "results"
    blocker.write_text("")
    assert main(["e2e", "--out", str(blocker / "sub"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"draftmeta e2e: --out {blocker / 'sub'}: {blocker} is a file, not a folder; name a "
        "folder for the results\n")


def test_every_options_help_states_a_real_default_never_none() -> None:
    """An option whose default depends on something (the device) says so in its own words;
    ``--help`` never prints "(default: none)" for it."""
    for command, sub in _commands().items():
        text = sub.format_help()
        assert "(default: none)" not in text.replace("\n", " "), command


def test_bench_without_vllm_says_so_in_one_line_with_the_install_command_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No traceback and nothing written: exit 2 and the command that installs vLLM."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    out = tmp_path / "results"
    assert main(["bench", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vLLM does not import here" in err[0], err
    assert "pip install vllm==0.33.0" in err[0]
    assert not out.exists()


def test_infer_without_vllm_says_so_in_one_line_with_the_install_command(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only "No module named 'vllm'": what needs it, and the command that installs it."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm...` now raises ImportError
    assert main(["infer", "TRITON_MLA", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vLLM does not import here" in err[0], err
    assert "pip install vllm==0.33.0" in err[0]
