"""The import graph of ``draftmeta/``: no cycle among its modules, read from the source.

Each module's imports are read with ``ast`` (nothing is imported). An import of ``a.b.c`` is an
edge to ``a.b.c`` and to the packages ``a`` and ``a.b`` that Python imports first, except the
packages that enclose the importing module itself (Python has imported them already).

The graph checked for cycles is the *whole* one: the imports at module level, those inside
functions (which run later, so a cycle through one fails no import, but it ties two modules to
each other all the same) and those under ``if TYPE_CHECKING:`` (which never run, but a type
names the module it comes from). A cycle through any of them fails, so two modules never need
each other, the way ``spec.py`` and ``codegen.py`` once did (a function-level import one way, a
type-checking import the other). The run-time checks further down read the graph without the
type-checking imports, which load nothing.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "draftmeta"

def _modules(root: Path) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(name: str, path: Path, lazy: bool, typing: bool = False) -> Iterator[str]:
    """The modules ``name`` (at ``path``) imports: at import time, or also inside functions
    (``lazy``), and also under ``if TYPE_CHECKING:`` (``typing``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not typing:
                yield from (m for c in child.orelse for m in visit(ast.Module([c], [])))
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
                    and not lazy:
                continue
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                yield module
                # ``from package import submodule`` imports the submodule too
                yield from (f"{module}.{alias.name}" for alias in child.names)
            yield from visit(child)

    yield from visit(ast.parse(path.read_text(encoding="utf-8")))


def import_graph(root: Path, *, lazy: bool, typing: bool = False) -> dict[str, set[str]]:
    """``{module: modules it imports}`` within the package at ``root``: at import time, or also
    inside functions (``lazy``), and also under ``if TYPE_CHECKING:`` (``typing``)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        enclosing = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges: set[str] = set()
        for target in _imported(name, path, lazy, typing):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != name and prefix not in enclosing:
                    edges.add(prefix)
        graph[name] = edges
    return graph


def cycles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _describe(found: set[frozenset[str]]) -> list[list[str]]:
    return sorted(sorted(c) for c in found)


def whole_graph(root: Path) -> dict[str, set[str]]:
    """Every import of the package at ``root``: module-level, function-level, type-checking."""
    return import_graph(root, lazy=True, typing=True)


def test_no_module_imports_itself_back_even_through_function_level_or_type_checking_imports(
) -> None:
    graph = whole_graph(PACKAGE)
    # the reader sees all three kinds of import in the package itself
    assert "draftmeta.loop_capture" in graph["draftmeta.loop"]  # module level
    assert "draftmeta.step_graph" in graph["draftmeta.loop"]  # inside DraftLoop._refresh_fused
    assert "draftmeta.spec" in graph["draftmeta"]  # the exports, under TYPE_CHECKING
    assert "draftmeta.spec" not in import_graph(PACKAGE, lazy=True)["draftmeta"]
    assert _describe(cycles(graph)) == []


def _planted(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package with ``line`` appended to ``module`` (a path under it)."""
    root = tmp_path / "draftmeta"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "*.txt",
                                                                 "*.json", "*.pt"))
    path = root / module
    path.write_text(path.read_text(encoding="utf-8") + line, encoding="utf-8")
    return root


@pytest.mark.parametrize(("line", "kind"), [
    ("\n\ndef _compile_here():\n    from draftmeta.spec import DraftSpec\n", "function-level"),
    ("\nif TYPE_CHECKING:\n    from draftmeta.spec import DraftSpec\n", "type-checking"),
], ids=["function-level", "type-checking"])
def test_a_circle_planted_in_the_package_through_a_function_level_or_typing_import_is_reported(
    tmp_path: Path, line: str, kind: str,
) -> None:
    # negative control: the code generator's phases importing the spec back, as codegen.py
    # once did (the spec imports the code generator), in a copy of the package
    root = _planted(tmp_path, "codegen/phases.py", line)
    found = _describe(cycles(whole_graph(root)))
    assert len(found) == 1 and {"draftmeta.spec", "draftmeta.codegen.phases"} <= set(found[0])
    assert _describe(cycles(import_graph(root, lazy=False))) == [], kind  # none at import time


# -- the reader itself, on a package written for the test ----------------------------------------


def _package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / "pkg"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("files", "lazy", "want"),
    [
        # a module-level cycle
        ({"__init__.py": "", "a.py": "from pkg.b import x\n", "b.py": "import pkg.a\n"},
         False, [["pkg.a", "pkg.b"]]),
        # a relative import closes it just the same
        ({"__init__.py": "", "a.py": "from .b import x\n", "b.py": "from . import a\n"},
         False, [["pkg.a", "pkg.b"]]),
        # a function-level import: a cycle of the whole graph only
        ({"__init__.py": "", "a.py": "from pkg.b import x\n",
          "b.py": "def f():\n    import pkg.a\n"}, False, []),
        ({"__init__.py": "", "a.py": "from pkg.b import x\n",
          "b.py": "def f():\n    import pkg.a\n"}, True, [["pkg.a", "pkg.b"]]),
        # TYPE_CHECKING imports never run
        ({"__init__.py": "", "a.py": "from pkg.b import x\n",
          "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"},
         True, []),
        # a submodule importing a sibling through its own package is no cycle
        ({"__init__.py": "from pkg.sub import a\n", "sub/__init__.py": "from pkg.sub.a import x\n",
          "sub/a.py": "from pkg.sub.b import y\n", "sub/b.py": ""}, False, []),
        # importing a package imports its __init__, which may close a cycle
        ({"__init__.py": "", "a.py": "from pkg.sub.b import y\n",
          "sub/__init__.py": "from pkg.a import x\n", "sub/b.py": ""},
         False, [["pkg.a", "pkg.sub"]]),
    ],
    ids=["module-level", "relative", "lazy-import-time", "lazy-whole", "type-checking",
         "own-package", "package-init"],
)
def test_the_reader_finds_cycles_and_only_cycles(
    tmp_path: Path, files: Mapping[str, str], lazy: bool, want: list[list[str]]
) -> None:
    assert _describe(cycles(import_graph(_package(tmp_path, files), lazy=lazy))) == want


@pytest.mark.parametrize(("b", "want"), [
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
     [["pkg.a", "pkg.b"]]),
    ("import typing\nif typing.TYPE_CHECKING:\n    from pkg import a\n", [["pkg.a", "pkg.b"]]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import pkg.a\n",
     [["pkg.a", "pkg.b"]]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\n", []),
], ids=["type-checking", "typing-attribute", "else-branch", "elsewhere"])
def test_the_whole_graph_closes_a_cycle_through_a_type_checking_import(
    tmp_path: Path, b: str, want: list[list[str]]
) -> None:
    # a.py imports b.py inside a function (as spec.py imported codegen.py), b.py imports a.py
    # back for its types (as codegen.py imported spec.py): a cycle of the whole graph only
    root = _package(tmp_path, {"__init__.py": "", "a.py": "def f():\n    from pkg.b import x\n",
                               "b.py": b, "c.py": ""})
    assert _describe(cycles(whole_graph(root))) == want
    assert _describe(cycles(import_graph(root, lazy=True))) == (want if "else" in b else [])


# -- test support never imports vLLM on import --------------------------------------------------

_TESTING_IMPORTS = """
import importlib, sys

def loaded(prefix):
    return sorted(m for m in sys.modules if m == prefix or m.startswith(prefix + "."))

for module in ("draftmeta.testing", "draftmeta.testing.reference_builds",
               "draftmeta.testing.reference_schedules", "draftmeta.integrations.vllm.testing",
               "draftmeta.integrations.vllm.testing.harness",
               "draftmeta.integrations.vllm.testing.equivalence"):
    importlib.import_module(module)
    print(module, loaded("vllm")[:3], loaded("draftmeta.integrations.vllm.testing")
          if module == "draftmeta.testing" else "")
"""


def test_importing_the_test_support_modules_imports_no_vllm() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TESTING_IMPORTS], capture_output=True,
                          text=True, check=True, timeout=300)
    assert done.stdout.splitlines() == [
        "draftmeta.testing [] []",  # nor the vLLM test support
        "draftmeta.testing.reference_builds [] ",
        "draftmeta.testing.reference_schedules [] ",
        "draftmeta.integrations.vllm.testing [] ",
        "draftmeta.integrations.vllm.testing.harness [] ",
        "draftmeta.integrations.vllm.testing.equivalence [] ",
    ], done.stdout


# -- what a serving engine runs imports no test support -----------------------------------------

TEST_SUPPORT = ("draftmeta.testing", "draftmeta.integrations.vllm.testing")
"""The test support: the engine-neutral one and the one against vLLM's real builders."""

TOOLS = (*TEST_SUPPORT, "draftmeta.cli", "draftmeta.commands", "draftmeta.arguments",
         "draftmeta.verify", "draftmeta.bench", "draftmeta.integrations.vllm.tools.e2e",
         "draftmeta.infer", "draftmeta.integrations.vllm.tools.infer",
         "draftmeta.integrations.vllm.tools.audit", "draftmeta.__main__")
"""The test support and the commands that check and measure (they may use the test support);
every other module of the package is run time."""


def _run_time_modules(graph: Mapping[str, set[str]]) -> list[str]:
    return sorted(m for m in graph if not m.startswith(TOOLS))


def _reaching_test_support(graph: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """``{run-time module: the test-support modules it reaches}``, for those that reach any."""
    found: dict[str, list[str]] = {}
    for module in _run_time_modules(graph):
        seen: set[str] = set()
        pending = [module]
        while pending:
            for target in graph.get(pending.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        testing = sorted(t for t in seen if t.startswith(TEST_SUPPORT))
        if testing:
            found[module] = testing
    return found


def test_no_run_time_module_reaches_the_test_support_even_through_function_level_imports(
) -> None:
    graph = import_graph(PACKAGE, lazy=True)
    assert {"draftmeta.shadow", "draftmeta.integrations.vllm.plugin"} <= set(
        _run_time_modules(graph))
    assert _reaching_test_support(graph) == {}


def test_the_reader_reports_a_run_time_module_that_reaches_the_test_support() -> None:
    # negative control: shadow importing the test support again, as it once did
    graph = import_graph(PACKAGE, lazy=True)
    graph["draftmeta.shadow"] = graph["draftmeta.shadow"] | {"draftmeta.testing"}
    reached = _reaching_test_support(graph)
    assert "draftmeta.testing" in reached["draftmeta.shadow"]
    assert "draftmeta.testing" in reached["draftmeta.loop"]  # the loop runs shadow mode


def test_the_reader_reports_a_run_time_module_that_reaches_vllms_test_harness() -> None:
    graph = import_graph(PACKAGE, lazy=True)
    plugin = "draftmeta.integrations.vllm.plugin"
    graph[plugin] = graph[plugin] | {"draftmeta.integrations.vllm.testing.harness"}
    assert "draftmeta.integrations.vllm.testing.harness" in _reaching_test_support(graph)[plugin]


_RUN_TIME_IMPORTS = """
import importlib, sys
for module in sys.argv[2:]:
    importlib.import_module(module)
print(sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[1].split(",")))))
"""


def test_loading_the_plugin_and_every_run_time_module_loads_no_test_support() -> None:
    import subprocess
    import sys

    modules = _run_time_modules(import_graph(PACKAGE, lazy=False))
    assert modules[0] == "draftmeta" and "draftmeta.integrations.vllm.plugin" in modules
    done = subprocess.run([sys.executable, "-c", _RUN_TIME_IMPORTS, ",".join(TEST_SUPPORT),
                           *modules],
                          capture_output=True, text=True, check=True, timeout=300,
                          cwd=PACKAGE.parent)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


# -- the backend specs are engine-neutral ------------------------------------------------------

ENGINE_NEUTRAL = "draftmeta.backends"
"""The backend specs (rule families, hooks, formulas): classes and kernels are handed in."""


def _is_engine(name: str, bindings: str) -> bool:
    return name == "vllm" or name.startswith(("vllm.", bindings))


def engine_imports(root: Path, package: str) -> dict[str, list[str]]:
    """``{module: the engine modules it reaches}`` for each module of ``package`` (at ``root``)
    that reaches one, through the package's own modules and function-level imports included:
    an engine (``vllm...``) or the package's bindings to one (``<root>.integrations...``)."""
    bindings = f"{root.name}.integrations"
    modules = _modules(root)
    graph = import_graph(root, lazy=True)
    found: dict[str, list[str]] = {}
    for module in sorted(m for m in graph if m == package or m.startswith(package + ".")):
        seen, pending = {module}, [module]
        while pending:
            for target in graph.get(pending.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        reached = {name for m in seen for name in _imported(m, modules[m], lazy=True)
                   if _is_engine(name, bindings)}
        if reached:
            found[module] = sorted(reached)
    return found


def test_the_backend_specs_reach_neither_vllm_nor_an_engine_binding() -> None:
    graph = import_graph(PACKAGE, lazy=True)
    backends = sorted(m for m in graph if m.startswith(ENGINE_NEUTRAL + "."))
    assert {"draftmeta.backends.mla", "draftmeta.backends.indexer", "draftmeta.backends.hooks",
            "draftmeta.backends.amx", "draftmeta.backends.views"} <= set(backends)
    assert engine_imports(PACKAGE, ENGINE_NEUTRAL) == {}


@pytest.mark.parametrize(("body", "reached"), [
    ("def kernel():\n    from vllm.v1.attention.ops.flashmla import get_mla_metadata\n",
     ["vllm.v1.attention.ops.flashmla", "vllm.v1.attention.ops.flashmla.get_mla_metadata"]),
    ("import vllm\n", ["vllm"]),
    ("from pkg.integrations.vllm import classes\n",
     ["pkg.integrations.vllm", "pkg.integrations.vllm.classes"]),
    ("from pkg import core\n", ["vllm.platforms", "vllm.platforms.current_platform"]),
    ("from pkg.core import units\n", ["vllm.platforms", "vllm.platforms.current_platform"]),
    ("from pkg import rules\n", None),
], ids=["function-level-vllm", "module-level-vllm", "a-binding", "through-a-core-module",
        "through-a-name-of-a-core-module", "neutral"])
def test_the_reader_reports_a_backend_module_that_reaches_an_engine(
    tmp_path: Path, body: str, reached: list[str] | None
) -> None:
    # negative control: a package shaped like draftmeta, its backends/spec.py planted with the
    # import (the last case, a core module that imports no engine, is the control)
    root = _package(tmp_path, {
        "__init__.py": "", "rules.py": "import torch\n", "backends/__init__.py": "",
        "backends/spec.py": body,
        "core.py": "def units():\n    from vllm.platforms import current_platform\n",
        "integrations/__init__.py": "", "integrations/vllm/__init__.py": "",
        "integrations/vllm/classes.py": "",
    })
    assert engine_imports(root, "pkg.backends").get("pkg.backends.spec") == reached


# -- each Literal of the vocabulary is defined once ----------------------------------------------


def literal_definitions(root: Path) -> dict[tuple[str, ...], list[str]]:
    """``{sorted values: ["module.Name", ...]}`` of every module-level ``Name = Literal[...]``."""
    found: dict[tuple[str, ...], list[str]] = {}
    for name, path in _modules(root).items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if not (isinstance(value, ast.Subscript) and ast.unparse(value.value).endswith(
                    "Literal")):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            key = tuple(sorted(ast.unparse(i) for i in items))
            found.setdefault(key, []).extend(f"{name}.{ast.unparse(t)}" for t in targets)
    return found


def test_each_literal_of_the_vocabulary_is_defined_once() -> None:
    twice = {k: v for k, v in literal_definitions(PACKAGE).items() if len(v) > 1}
    assert twice == {}
    host_bound = literal_definitions(PACKAGE)[("'advance'", "'frozen'")]
    assert host_bound == ["draftmeta.advance.HostBound"]


def test_a_literal_defined_twice_is_reported(tmp_path: Path) -> None:
    # negative control: HostBound and HostBoundPolicy, as they once were
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import Literal\nHostBound = Literal['advance', 'frozen']\n",
        "b.py": "import typing\nHostBoundPolicy = typing.Literal['frozen', 'advance']\n",
    })
    assert literal_definitions(root)[("'advance'", "'frozen'")] == ["pkg.a.HostBound",
                                                                   "pkg.b.HostBoundPolicy"]
