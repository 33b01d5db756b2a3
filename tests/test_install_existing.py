"""An operator adds draftmeta to the vLLM they already run, as the Install page's first section
says, and nothing else moves.

The section's commands are read from ``docs/install.md`` and run as written: draftmeta's wheel is
built from this checkout, then installed with ``--no-deps`` into a throwaway environment over the
test run's own (:mod:`tests.overlay`): an existing vLLM environment, whichever release the test
run has (vLLM 0.33 in README's environment, 0.34 in the ``nox`` session ``vllm-0.34``). Then:
only draftmeta went in, its requirements were all there already, and vLLM's own plugin loading
finds its entry point and registers it, unless ``DRAFTMETA_VLLM_PLUGIN=0``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.overlay import ROOT, needs_build_backend, overlay

pytest.importorskip("vllm", reason="adds draftmeta to an environment with vLLM: needs vLLM")

INSTALL = ROOT / "docs" / "install.md"

LOAD_PLUGINS = """
import json, os
import vllm.plugins
from vllm.plugins import load_general_plugins
import draftmeta
from draftmeta.integrations.vllm import plugin

seen = {}
for switch in ("0", "1"):  # the off switch, then on: vLLM loads its plugins once per process
    os.environ["DRAFTMETA_VLLM_PLUGIN"] = switch
    vllm.plugins.plugins_loaded = False
    load_general_plugins()
    active = plugin.installed()
    seen[switch] = None if active is None else {"release": active.release, "hook": active.hook}
    plugin.unregister()
print(json.dumps({"draftmeta": draftmeta.__file__, "vllm": vllm.__version__, **seen}))
"""


def section_commands(heading: str) -> list[list[str]]:
    """The commands of each shell block of the Install page's section ``heading``, in order."""
    page = INSTALL.read_text()
    start = page.index(f"## {heading}\n")
    section = page[start:page.index("\n## ", start + 1)]
    return [[line.strip() for line in block.splitlines() if line.strip()]
            for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def _distributions(site_packages: Path) -> set[str]:
    return {p.name.split("-")[0] for p in site_packages.glob("*.dist-info")}


def _checkout(tmp_path: Path) -> Path:
    """A copy of the checkout's sources: the build's dist/ lands there, not in the checkout."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".nox", "site", "dist", "build", "__pycache__", "*.egg-info",
        "draftmeta-results", "mutants", ".mypy_cache", ".ruff_cache", ".hypothesis", ".h200*"))
    return checkout


@needs_build_backend
def test_draftmeta_goes_into_an_existing_vllm_environment_alone_and_vllm_loads_its_plugin(
    tmp_path: Path,
) -> None:
    [build], [install, check] = section_commands("Into the vLLM you already run")
    assert build == "python3 -m pip wheel --no-deps -w dist ."
    assert install.startswith("pip install --no-deps dist/draftmeta-"), install
    assert check == "draftmeta coverage"
    env, checkout = overlay(tmp_path / "env"), _checkout(tmp_path)
    env.run(build, cwd=checkout)
    before = _distributions(env.site_packages)
    # pip, asked to resolve draftmeta's requirements with no index, finds every one installed
    dry = env.run(f"pip install --dry-run --no-index {install.split()[-1]}", cwd=checkout)
    assert re.findall(r"^Would install (.*)$", dry.stdout, re.M) == ["draftmeta-0.1.0"], dry.stdout
    env.run(install, cwd=checkout)
    assert _distributions(env.site_packages) - before == {"draftmeta"}
    loaded = json.loads(env.run(["python", "-c", LOAD_PLUGINS], cwd=tmp_path).stdout)
    assert Path(loaded["draftmeta"]).is_relative_to(env.site_packages)  # the wheel's
    assert loaded["0"] is None  # DRAFTMETA_VLLM_PLUGIN=0: vLLM loaded it, it changed nothing
    on = loaded["1"]
    assert on is not None and loaded["vllm"].startswith(on["release"] + ".")
    coverage = env.run(check, cwd=tmp_path).stdout.splitlines()
    assert coverage[0].startswith(f"vLLM {loaded['vllm']}; catalogue {on['release']} ")
    assert coverage[1].startswith("plugin: active (installed=True, enabled=True)"), coverage[:2]


@needs_build_backend
def test_a_wheel_without_the_vllm_entry_point_is_not_loaded_by_vllm(tmp_path: Path) -> None:
    # negative control for the check above: the same wheel built without its
    # vllm.general_plugins entry point is installed, and vLLM's loading registers nothing
    env, checkout = overlay(tmp_path / "env"), _checkout(tmp_path)
    pyproject = checkout / "pyproject.toml"
    point = '[project.entry-points."vllm.general_plugins"]\n'
    text = pyproject.read_text()
    assert point in text
    pyproject.write_text(text.replace(point, '[project.entry-points."not.vllm"]\n'))
    env.run("python3 -m pip wheel --no-deps -q -w dist .", cwd=checkout)
    env.run("pip install --no-deps -q dist/draftmeta-0.1.0-py3-none-any.whl", cwd=checkout)
    loaded = json.loads(env.run(["python", "-c", LOAD_PLUGINS], cwd=tmp_path).stdout)
    assert Path(loaded["draftmeta"]).is_relative_to(env.site_packages)
    assert loaded["0"] is None and loaded["1"] is None
