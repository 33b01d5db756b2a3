"""The mutation run (``tools/mutation_run.py``, ``nox -s mutation``) chooses what mutmut runs as
its docstring says: each module's own tests, quickest first, and a fixed sample."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run() -> ModuleType:
    return load_script("tools/mutation_run.py")


def test_the_mutated_modules_are_only_mutates_globs_expanded_in_order(run: ModuleType) -> None:
    modules = run.mutated_modules()
    assert modules[0] == "draftmeta/spec.py"
    assert {"draftmeta/rules/base.py", "draftmeta/rules/host.py", "draftmeta/rules/passive.py",
            "draftmeta/rules/tensor.py"} <= set(modules)
    assert "draftmeta/rules/__init__.py" not in modules
    assert all((ROOT / m).is_file() for m in modules) and len(set(modules)) == len(modules)


def test_a_mutant_belongs_to_its_own_module_not_to_a_package_of_the_same_prefix(
    run: ModuleType,
) -> None:
    modules = ["draftmeta/rules.py", "draftmeta/rules/base.py", "draftmeta/spec.py"]
    assert run.module_of("draftmeta.rules.base.xǁRuleǁcheck__mutmut_3", modules) == modules[1]
    assert run.module_of("draftmeta.rules.base.x_f", modules) == modules[1]
    assert run.module_of("draftmeta.spec.x_declare__mutmut_1", modules) == modules[2]
    assert run.module_of("draftmeta.rules.x_g__mutmut_1", modules) == modules[0]
    assert run.module_of("draftmeta.codegen.x_emit__mutmut_1", modules) is None


def test_each_mutated_function_keeps_only_the_tests_of_its_modules_files(
    run: ModuleType,
) -> None:
    tests = {
        "draftmeta.layout.x__span": {"tests/test_layout_guard.py::test_a",
                                     "tests/test_vllm_plugin.py::test_b"},
        "draftmeta.integrations.vllm.plugin.plan.x_plan": {"tests/test_layout_guard.py::test_a",
                                                    "tests/test_vllm_plugin.py::test_b"},
        "draftmeta.codegen.x_emit": {"tests/test_vllm_plugin.py::test_b"},
    }
    dropped = run.narrow(tests, ["draftmeta/layout.py",
                                 "draftmeta/integrations/vllm/plugin/plan.py"])
    assert tests == {
        "draftmeta.layout.x__span": {"tests/test_layout_guard.py::test_a"},
        "draftmeta.integrations.vllm.plugin.plan.x_plan": {"tests/test_vllm_plugin.py::test_b"},
        "draftmeta.codegen.x_emit": {"tests/test_vllm_plugin.py::test_b"},  # not run: as it was
    }
    assert dropped == 2


def test_every_module_tests_file_is_one_mutmut_selects(run: ModuleType) -> None:
    """A file outside ``pytest_add_cli_args_test_selection`` would never reach a mutant."""
    selection = set(run.mutmut_config()["pytest_add_cli_args_test_selection"])
    for pattern, files in run.MODULE_TESTS.items():
        assert set(files) <= selection, pattern
        assert any(run.tests_for(m) == files for m in run.mutated_modules()), pattern


def test_a_mutants_tests_run_quickest_first(run: ModuleType) -> None:
    durations = {"t::slow": 9.0, "t::quick": 0.1, "t::middle": 1.0}
    assert run.fastest_first({"t::slow", "t::new", "t::middle", "t::quick"}, durations) == [
        "t::new", "t::quick", "t::middle", "t::slow"]


def test_a_sample_is_the_same_for_the_same_seed_whatever_the_order_of_the_names(
    run: ModuleType,
) -> None:
    names = [f"draftmeta.spec.x_f__mutmut_{i}" for i in range(1, 101)]
    first = run.sample(names, 20, 38)
    assert len(first) == len(set(first)) == 20 and set(first) <= set(names)
    assert run.sample(reversed(names), 20, 38) == first
    assert run.sample(names, 20, 39) != first
    assert run.sample(names, None, 38) == sorted(names) == run.sample(names, 500, 38)
    assert set(first) <= set(run.sample(names, 50, 38))  # grown, it keeps the mutants run


E2E = "draftmeta/integrations/vllm/tools/e2e/"


def test_of_a_module_mutated_in_part_only_the_functions_named_are_run(run: ModuleType) -> None:
    """The verdict functions of the e2e modules, not what patches vLLM or draws."""
    assert run.selected("draftmeta.integrations.vllm.tools.e2e.controls.x_judged__mutmut_3",
                        E2E + "controls.py")
    assert not run.selected("draftmeta.integrations.vllm.tools.e2e.controls.x_injected__mutmut_1",
                            E2E + "controls.py")
    compare = "draftmeta.integrations.vllm.tools.e2e.compare."
    assert run.selected(compare + "xǁComparisonǁlimit__mutmut_2", E2E + "compare.py")
    assert not run.selected(compare + "xǁCaseǁlabel__mutmut_1", E2E + "compare.py")
    assert not run.selected("draftmeta.integrations.vllm.tools.e2e.acceptance."
                            "xǁAcceptanceCounterǁ__enter____mutmut_1", E2E + "acceptance.py")
    assert run.selected("draftmeta.layout.x__span__mutmut_1", "draftmeta/layout.py")  # whole


def _keys(path: Path) -> set[str]:
    """mutmut's keys of the functions and methods of the module at ``path``."""
    import ast

    keys: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            keys.add(f"x_{node.name}")
        elif isinstance(node, ast.ClassDef):
            keys |= {f"xǁ{node.name}ǁ{f.name}" for f in node.body
                     if isinstance(f, ast.FunctionDef)}
    return keys


def test_every_function_named_for_a_module_mutated_in_part_is_one_it_has(
    run: ModuleType,
) -> None:
    """A function renamed or moved would silently leave the mutation run."""
    import fnmatch

    for module, patterns in run.FUNCTIONS.items():
        assert module in run.mutated_modules(), module
        keys = _keys(ROOT / module)
        assert [p for p in patterns if not fnmatch.filter(keys, p)] == [], module


def test_a_property_of_a_module_listed_is_mutated_and_switched_like_a_method(
    run: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mutmut 3.8 skips decorated functions; with :func:`mutate_properties` a property's
    mutants exist, the class keeps a property, and the trampoline switches to a mutant."""
    pytest.importorskip("mutmut", reason="mutmut is a dev extra (pip install -e '.[dev]'); "
                        "the release sessions install draftmeta's own requirements only")
    from mutmut.mutation import file_mutation as fm
    from mutmut.mutation.trampoline import set_mutant_under_test

    source = ("class A:\n    @property\n    def size(self) -> int:\n        return 3\n\n"
              "    @staticmethod\n    def f() -> int:\n        return 1\n")
    for name in ("create_mutations", "function_trampoline_arrangement"):
        monkeypatch.setattr(fm, name, getattr(fm, name))  # restored after the test
    monkeypatch.setattr(fm.MutationVisitor, "_skip_node_and_children",
                        fm.MutationVisitor._skip_node_and_children)
    before = fm.mutate_file_contents("pkg/mod.py", source).mutant_names
    assert not [n for n in before if "size" in n]  # mutmut's own behaviour
    run.mutate_properties(["pkg/mod.py"])
    assert not [n for n in fm.mutate_file_contents("pkg/other.py", source).mutant_names
                if "size" in n]
    mutated = fm.mutate_file_contents("pkg/mod.py", source)
    assert "xǁAǁsize__mutmut_1" in mutated.mutant_names
    namespace: dict[str, object] = {"__name__": "pkg.mod"}
    exec(compile(mutated.code, "pkg/mod.py", "exec"), namespace)
    a = namespace["A"]()  # type: ignore[operator]
    monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    try:
        set_mutant_under_test("")
        assert a.size == 3
        set_mutant_under_test("pkg.mod.xǁAǁsize__mutmut_1")
        assert a.size == 4
    finally:
        set_mutant_under_test(None)
        monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
