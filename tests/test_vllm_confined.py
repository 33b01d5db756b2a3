"""Everything that names vLLM lives under ``draftmeta/integrations/vllm/``.

Read from the source with ``ast`` (nothing is imported): a module outside that folder that
imports vLLM (at import time or inside a function) or names a vLLM class path in a string
(``"vllm.v1.attention..."``) is a finding. The modules that still do are pinned in
:data:`NOT_YET_MOVED`, each with why; the list only shrinks: a pinned module that no longer
names vLLM fails too, so that it is taken off.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "draftmeta"
HOME = PACKAGE / "integrations" / "vllm"

NOT_YET_MOVED: dict[str, str] = {
    "draftmeta/e2e/capture.py": "records vLLM's draft loop in a real CPU engine",
    "draftmeta/e2e/cuda_engine.py": "vLLM's GPU engine",
    "draftmeta/e2e/cuda_report.py": "the GPU report names the installed vLLM",
    "draftmeta/e2e/engine.py": "vLLM's CPU engine",
    "draftmeta/e2e/model.py": "vLLM's model loader (dummy weights)",
    "draftmeta/e2e/multiprocess.py": "vLLM's default multiprocess engine",
    "draftmeta/infer/vllm.py": "infers specs from vLLM's builders",
    "draftmeta/testing/vllm/harness.py": "constructs vLLM's builders on a CPU",
}
"""Modules outside ``integrations/vllm/`` that still name vLLM (issue 23, item 1)."""


def _names_vllm(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(
                a.name == "vllm" or a.name.startswith("vllm.") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "vllm" or node.module.startswith("vllm.")):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value.startswith("vllm.v1.") or node.value.startswith("vllm.model_executor.")):
            return True
    return False


def findings(root: Path = PACKAGE, home: Path = HOME) -> set[str]:
    """The modules under ``root`` outside ``home`` that name vLLM, as repository paths."""
    return {str(p.relative_to(root.parent)) for p in sorted(root.rglob("*.py"))
            if home not in p.parents and _names_vllm(p)}


def test_no_module_outside_the_vllm_binding_names_vllm_except_those_pinned() -> None:
    found = findings()
    assert found - set(NOT_YET_MOVED) == set(), "move these under draftmeta/integrations/vllm/"
    assert set(NOT_YET_MOVED) - found == set(), "no longer names vLLM: take it off the list"


def test_an_import_of_vllm_or_a_class_path_outside_the_binding_is_found(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "integrations" / "vllm").mkdir(parents=True)
    (root / "integrations" / "vllm" / "inside.py").write_text("import vllm\n")
    (root / "core.py").write_text("def f():\n    from vllm.config import VllmConfig\n")
    (root / "names.py").write_text("PATH = 'vllm.v1.attention.backends.mla.Foo'\n")
    (root / "clean.py").write_text("import torch\nTEXT = 'vllm is an engine'\n")
    assert findings(root, root / "integrations" / "vllm") == {"pkg/core.py", "pkg/names.py"}
