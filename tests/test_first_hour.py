"""What a new user meets in their first hour reads true: the off switch README gives, the
builder counts README and the CUDA page quote from vLLM's log, ``explain``'s default variant,
``coverage --out``, and each of them against the code or the committed log it comes from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftmeta.cli import main
from draftmeta.commands.inspection import _default_host_bound
from draftmeta.integrations.vllm.catalogue import release

ROOT = Path(__file__).resolve().parents[1]
_COUNT = re.compile(r"hook: (\d+) of (\d+) builders by draftmeta")
_LOG = re.compile(r"(?:benchmarks/results/)?([\w.-]+\.log)")


def builder_count_quotes(text: str) -> list[tuple[str, str | None]]:
    """``(quote, log)`` for each "hook: N of M builders by draftmeta" a page quotes outside a
    log excerpt, with the committed log its paragraph names: the first after the quote, else
    the last before it (``None``: none named)."""
    found = []
    for match in _COUNT.finditer(text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        if re.match(r"\(\w+ pid=\d+\)", text[line_start:]):  # a line of a log excerpt itself
            continue
        start = text.rfind("\n\n", 0, match.start()) + 2
        end = text.find("\n\n", match.end())
        after = _LOG.findall(text[match.end():end if end >= 0 else len(text)])
        before = _LOG.findall(text[start:match.start()])
        named = after[:1] or before[-1:]
        found.append((match[0], named[0] if named else None))
    return found


def quotes_not_in_their_logs(text: str) -> list[str]:
    """The quotes of :func:`builder_count_quotes` that their log does not say."""
    wrong = []
    for quote, log in builder_count_quotes(text):
        path = ROOT / "benchmarks" / "results" / (log or "")
        if log is None or not path.is_file() or quote not in path.read_text():
            wrong.append(f"{quote!r} (log: {log})")
    return wrong


@pytest.mark.parametrize("page", ["README.md", "docs/e2e-cuda.md"])
def test_the_builder_counts_quoted_from_vllms_log_are_in_the_committed_log_named(
    page: str,
) -> None:
    text = (ROOT / page).read_text()
    assert builder_count_quotes(text), page
    assert quotes_not_in_their_logs(text) == []


def test_a_builder_count_the_named_log_does_not_say_is_caught() -> None:
    # negative control: README's quote with the count of the older log
    readme = (ROOT / "README.md").read_text()
    assert quotes_not_in_their_logs(readme.replace("hook: 5 of 14", "hook: 8 of 14")) != []


def test_readmes_off_switch_turns_the_plugin_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from draftmeta.integrations.vllm import plugin

    readme = (ROOT / "README.md").read_text()
    (switch,) = set(re.findall(r"`(DRAFTMETA_VLLM_PLUGIN)=0` turns it off", readme))
    assert switch == plugin.DISABLE_ENV
    monkeypatch.setenv(switch, "0")
    assert not plugin.enabled_by_environment()
    monkeypatch.setenv(switch, "1")
    assert plugin.enabled_by_environment()


@pytest.mark.parametrize("name, version, expected", [
    ("TRITON_MLA", "0.34", "frozen"),        # vLLM 0.34 drafts only through its hook
    ("FLASHMLA.fp8", "0.34", "frozen"),
    ("TRITON_MLA.dcp", "0.34", "frozen"),
    ("TRITON_MLA", "0.33", None),            # the older proposer's, its default path there
    ("state.wrap", "0.34", None),            # the source advance: the name says
])
def test_explain_shows_the_variant_of_the_releases_draft_path(name: str, version: str,
                                                              expected: str | None) -> None:
    assert _default_host_bound(name, release(version)) == expected


def test_explain_on_vllm_0_34_prints_the_hooks_frozen_variant(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta.codegen import explain
    from draftmeta.integrations.vllm import catalogue
    from draftmeta.registry import get_spec, recorded_classes

    monkeypatch.setattr(catalogue, "installed_version", lambda: "0.34.0")
    monkeypatch.setattr("draftmeta.explained.release_in_use", lambda: "0.34")
    assert main(["explain", "TRITON_MLA"]) == 0
    printed = capsys.readouterr().out
    with recorded_classes():
        frozen = explain(get_spec("TRITON_MLA", "frozen"))
        advance = explain(get_spec("TRITON_MLA", "advance"))
    assert frozen != advance and printed == frozen


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None,
                    reason="coverage reads the installed vLLM")
def test_coverage_out_writes_its_json_where_told(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coverage", "--json", "--quiet", "--out", str(tmp_path / "results")]) == 0
    printed = json.loads(capsys.readouterr().out)
    (written,) = (tmp_path / "results").glob("coverage-vllm-*.json")
    assert written.name == f"coverage-vllm-{printed['release']}.json"
    assert json.loads(written.read_text()) == printed


def test_coverage_out_that_is_a_file_stops_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "taken").write_text("")
    assert main(["coverage", "--out", str(tmp_path / "taken")]) == 2
    assert "--out" in capsys.readouterr().err
