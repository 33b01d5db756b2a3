"""The backend guide's worked example installs as a package, and the guide's and the example
page's commands work as written.

``examples/oot_mla`` is built into a wheel and installed, as a user installs it, into a throwaway
environment over the test run's own (:mod:`tests.overlay`: nothing downloaded, the test run's
environment untouched); vLLM and draftmeta then find it through its entry points alone (no
``sys.path`` edit), and ``draftmeta audit`` checks its hook. The guide's commands are read from
``docs/guide.md``'s shell block and run as written; the example page's ``python example.py`` too.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.overlay import ROOT, Overlay, needs_build_backend, overlay

pytest.importorskip("vllm", reason="the example is a vLLM backend: needs vLLM")

EXAMPLE = ROOT / "examples" / "oot_mla"
GUIDE = ROOT / "docs" / "guide.md"


def shell_block_after(page: str, heading: str) -> list[str]:
    """The command lines of the first ```bash block after ``heading`` in a Markdown page."""
    start = page.index(heading)
    block = re.search(r"```bash\n(.*?)```", page[start:], re.S)
    assert block, f"no shell block after {heading!r}"
    return [line.strip() for line in block[1].splitlines()
            if line.strip() and not line.strip().startswith("#")]


def guide_commands() -> list[str]:
    """The guide's commands for its worked example, as written."""
    return shell_block_after(GUIDE.read_text(), "Installed next to draftmeta")


def build_wheel(source: Path, out: Path, env: Overlay) -> Path:
    """``source``'s wheel, built offline into ``out``."""
    env.run(["python", "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
            cwd=out.parent)
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def draftmeta_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """draftmeta's own wheel, built from this checkout (for its ``draftmeta`` command)."""
    folder = tmp_path_factory.mktemp("draftmeta-wheel")
    return build_wheel(ROOT, folder / "dist", overlay(folder / "builder"))


def _installed(env: Overlay, draftmeta_wheel: Path) -> Overlay:
    """``env`` with draftmeta's wheel installed (its ``draftmeta`` command)."""
    env.run(["pip", "install", "--no-deps", "-q", str(draftmeta_wheel)])
    return env


@needs_build_backend
def test_the_examples_wheel_ships_its_package_and_both_entry_points(tmp_path: Path) -> None:
    wheel = build_wheel(EXAMPLE, tmp_path / "dist", overlay(tmp_path / "env"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in names if not n.split("/")[0].endswith(".dist-info"))
    assert shipped == [f"draftmeta_example_oot/{m}.py" for m in ("__init__", "backend", "spec")]
    (points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(points).decode()
    assert "[vllm.general_plugins]" in text and "[draftmeta.vllm_builders]" in text
    assert "OOT_CPU_MLA = draftmeta_example_oot.spec:ENTRY" in text


@needs_build_backend
def test_the_example_installs_editable_and_its_entry_points_are_found(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "oot_mla")
    env = overlay(tmp_path / "env")
    env.run("pip install -e examples/oot_mla", cwd=tmp_path)
    found = env.run(["python", "-c", FIND_ENTRY_POINTS], cwd=tmp_path / "env").stdout.split()
    assert found == [str(tmp_path / "examples" / "oot_mla" / "draftmeta_example_oot"),
                     "draftmeta_example_oot:register_with_vllm",
                     "draftmeta_example_oot.spec:ENTRY"], found


FIND_ENTRY_POINTS = """
from importlib.metadata import entry_points
from pathlib import Path
import draftmeta_example_oot
print(Path(draftmeta_example_oot.__file__).parent)
for group in ("vllm.general_plugins", "draftmeta.vllm_builders"):
    print(*[p.value for p in entry_points(group=group) if p.name.startswith(("draftmeta_example",
                                                                           "OOT_"))])
"""


@needs_build_backend
def test_the_guides_commands_for_its_example_work_as_written(tmp_path: Path,
                                                             draftmeta_wheel: Path) -> None:
    commands = guide_commands()
    assert commands[0] == "pip install examples/oot_mla", commands
    # the commands run from a checkout's root: here a copy of the example at the same place
    shutil.copytree(EXAMPLE, tmp_path / "checkout" / "examples" / "oot_mla")
    env = _installed(overlay(tmp_path / "env"), draftmeta_wheel)
    out = [env.run(command, cwd=tmp_path / "checkout").stdout for command in commands]
    # pip built the example's wheel and installed it: the package is in the environment
    assert (env.site_packages / "draftmeta_example_oot" / "spec.py").is_file()
    assert re.search(r"^OOT_CPU_MLA +draftmeta +16 +\d+ +equal +yes +equal$", out[1], re.M), out[1]
    rows = [line.split() for line in out[2].splitlines() if line.startswith("OOT_CPU_MLA ")]
    assert rows and all(row[3] == "no" for row in rows), out[2]  # proven: no recorded run
    page = GUIDE.read_text()
    assert "`OOT_CPU_MLA  draftmeta  16  59  equal  yes  equal`" in page
    assert re.search(r"^OOT_CPU_MLA +draftmeta +16 +59 +equal +yes +equal$", out[1], re.M), (
        "the guide quotes the audit's row: update it")


def test_a_guide_command_that_fails_fails_the_check(tmp_path: Path) -> None:
    # negative control for the runner above: a command as broken as a wrong path is reported
    env = overlay(tmp_path / "env")
    with pytest.raises(AssertionError, match="exited"):
        env.run("pip install -e examples/no_such_example", cwd=tmp_path)


def test_the_example_pages_python_example_py_prints_the_function_it_shows(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "example.md").read_text()
    command = re.search(r"run with `(python [\w.]+)`", page)
    assert command, "docs/example.md no longer says how to run its example"
    code = re.search(r"```python\n(.*?)```", page, re.S)
    shown = re.search(r"```text\n(.*?)```", page, re.S)
    assert code and shown
    (tmp_path / command[1].split()[1]).write_text(code[1])
    env = overlay(tmp_path / "env")
    done = env.run(command[1], cwd=tmp_path,
                   env={"PYTHONPATH": str(ROOT)})  # draftmeta from this checkout
    assert done.stdout == shown[1]
