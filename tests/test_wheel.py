"""The wheel is the library (docs/install.md, "What the wheel holds"): under 1 MB, with the
package, its types, the shipped texts and recorded class lists, the command and vLLM's plugin
entry point, and without what only a checkout uses (the trained checkpoint, its training code and
its reference). Installing it beside vLLM is tests/test_install_existing.py's."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.overlay import ROOT, needs_build_backend

TRAINED = "draftmeta/integrations/vllm/tools/e2e/trained/"
LEFT_OUT = (TRAINED + "checkpoint/", TRAINED + "train.py", TRAINED + "reference.py",
            TRAINED + "draft_loop.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (built,) = out.glob("draftmeta-*.whl")
    return built


@needs_build_backend
def test_the_wheel_is_under_a_megabyte_and_leaves_out_what_only_a_checkout_uses(
        wheel: Path) -> None:
    assert wheel.stat().st_size < 1_000_000, wheel.stat().st_size
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith(LEFT_OUT)] == []
    assert TRAINED + "__init__.py" in names and TRAINED + "task.py" in names  # its prompts
    page = (ROOT / "docs" / "install.md").read_text()
    for path in LEFT_OUT:
        assert f"`{path}`" in page or f"`{path.removeprefix(TRAINED[:-8])}`" in page, path


@needs_build_backend
def test_the_wheel_holds_the_library_its_types_texts_records_command_and_plugin_entry_point(
        wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert "draftmeta/py.typed" in names
    assert any(n.startswith("draftmeta/explained/vllm-") and n.endswith(".txt") for n in names)
    recorded = [n for n in names if n.startswith("draftmeta/integrations/vllm/catalogue/recorded/")]
    assert len(recorded) == len(list((ROOT / "draftmeta/integrations/vllm/catalogue/recorded")
                                     .glob("*.json")))
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "draftmeta").rglob("*.py")}
    shipped = {n for n in names if n.endswith(".py")}
    assert sources - shipped == {p for p in sources if p.startswith(LEFT_OUT)}
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = archive.read(entry_points).decode()
    assert "[vllm.general_plugins]\ndraftmeta = draftmeta.integrations.vllm.plugin:register" in text
    assert "[console_scripts]\ndraftmeta = draftmeta.cli:main" in text


def test_the_trained_model_from_an_installed_wheel_is_refused_with_what_to_do(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from draftmeta.integrations.vllm.tools.e2e import trained
    from draftmeta.integrations.vllm.tools.e2e.models import ModelProblem, resolve

    monkeypatch.setattr(trained, "CHECKPOINT", tmp_path / "checkpoint")  # as the wheel has it
    with pytest.raises(ModelProblem, match="ships with draftmeta's source, not its wheel"):
        resolve("trained")
