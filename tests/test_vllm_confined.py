"""Everything that names vLLM lives under ``draftmeta/integrations/vllm/``.

Read from the source with ``ast`` (nothing is imported): a module outside that folder that
imports vLLM (at import time or inside a function) or names a vLLM class path in a string
(``"vllm.v1.attention..."``) is a finding. There are none: the engine runs of ``draftmeta e2e``,
the harness that builds vLLM's builders and ``draftmeta infer``'s vLLM adapter live there too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "draftmeta"
HOME = PACKAGE / "integrations" / "vllm"

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


def test_no_module_outside_the_vllm_binding_names_vllm() -> None:
    assert findings() == set(), "move these under draftmeta/integrations/vllm/"


def test_the_binding_itself_is_read_and_names_vllm() -> None:
    assert findings(PACKAGE, PACKAGE / "no-such-folder") >= {
        "draftmeta/integrations/vllm/plugin/__init__.py",
        "draftmeta/integrations/vllm/tools/e2e/engine.py",
        "draftmeta/integrations/vllm/testing/harness/builders.py",
    }


def test_an_import_of_vllm_or_a_class_path_outside_the_binding_is_found(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "integrations" / "vllm").mkdir(parents=True)
    (root / "integrations" / "vllm" / "inside.py").write_text("import vllm\n")
    (root / "core.py").write_text("def f():\n    from vllm.config import VllmConfig\n")
    (root / "names.py").write_text("PATH = 'vllm.v1.attention.backends.mla.Foo'\n")
    (root / "clean.py").write_text("import torch\nTEXT = 'vllm is an engine'\n")
    assert findings(root, root / "integrations" / "vllm") == {"pkg/core.py", "pkg/names.py"}
