"""Run mutmut over some core modules, as ``nox -s mutation`` does (issue 38).

    python tools/mutation_run.py draftmeta/layout.py --max-children 1
    python tools/mutation_run.py draftmeta/spec.py --sample 150 --seed 38 --max-children 1

It runs ``mutmut run`` (mutmut 3.8, ``[tool.mutmut]`` in pyproject.toml) in this process, with
four changes that make a run fit a shared 2-core machine, and two that choose what is mutated:

- **Part of a module** (:data:`FUNCTIONS`): of a module whose other functions talk to vLLM or
  draw (the end-to-end modules), only the functions that decide a verdict are run and reported.
- **Properties too** (:func:`mutate_properties`): mutmut leaves every decorated function alone,
  and most of a verdict is ``@property`` functions; in :data:`PROPERTY_MODULES` they are
  mutated like methods.

- **Each mutant runs its module's behaviour tests only** (:data:`MODULE_TESTS`): of the
  selected tests that reach the mutated function (mutmut's per-function record), those in the
  module's own test files. Without it a surviving mutant of a function every test reaches (a
  layout guard, a rule's check) runs the whole selection, vLLM's plugin tests included:
  minutes each. A module without an entry keeps every test that reaches it.
- **A mutant already decided is not run again**: decided in ``mutants/`` (this machine's
  runs) or in the committed ``mutation/results.json``, where its function is unchanged since
  (the same source hash, or a result committed without hashes). mutmut itself reruns every
  mutant a name pattern matches.
- **A sample**: ``--sample N --seed S`` runs a fixed random sample of N of each module's
  mutants (the first N of the sorted names shuffled by ``random.Random(S)``: the same sample
  on every machine and every resumed run, and a larger N keeps the smaller sample's
  mutants); ``mutation/runs.json`` keeps it, and the report gives its score with a 95% Wilson
  interval.
- **Fastest test first**: mutmut's fork server runs a mutant's tests in set order, not by
  their recorded duration as its plain fork runner does, so a mutant a quick test kills often
  waited for the slow ones first (a killed layout mutant: 27 to 60 s instead of 1.7).
- **Each mutant's wall time**: mutmut's fork server reports none (0.0); it is measured here,
  from the mutant's submission to its result, and kept in mutmut's own ``durations_by_key``.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import random
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

CORE_TESTS = (
    "tests/test_advance.py", "tests/test_padded_rows.py", "tests/test_layout_guard.py",
    "tests/test_codegen.py", "tests/test_rule_lowering.py", "tests/test_host_set.py",
    "tests/test_generic_alias.py", "tests/test_spec_validation.py",
    "tests/test_spec_attributes.py", "tests/test_adversarial_declaration.py",
    "tests/test_adversarial_runtime.py", "tests/test_sealed_update.py", "tests/test_atomicity.py",
    "tests/test_loop.py", "tests/test_step_graph.py", "tests/test_shadow.py",
    "tests/test_schedules.py", "tests/test_rule_behaviours.py", "tests/test_fused_interpreted.py",
    "tests/test_hook_outputs.py",
)
"""The engine-neutral behaviour tests: the core's specification, without vLLM's builders."""

PLUGIN_TESTS = (
    "tests/test_vllm_plugin.py", "tests/test_vllm_carry_over.py", "tests/test_hook_checks.py",
    "tests/test_hook_outputs.py",
)
"""The plugin's behaviour tests: which builders it takes over, and how."""

BACKEND_TESTS = (
    "tests/test_backend_views.py", "tests/test_backend_kernels.py", "tests/test_vllm_backends.py",
    "tests/test_check_spec.py", "tests/test_hook_checks.py", "tests/test_registry.py",
    "tests/test_vllm_plugin.py",
)
"""The MLA and indexer specs' behaviour tests: the shipped specs declared, checked and run
against vLLM's own builders, their views, hooks and kernels, and the plugin that declares them."""

VERDICT_TESTS = (
    "tests/test_noise.py", "tests/test_best_k.py", "tests/test_e2e_acceptance.py",
    "tests/test_e2e_controls.py", "tests/test_e2e_compare.py", "tests/test_e2e_gpu.py",
    "tests/test_e2e_report.py", "tests/test_e2e_runner.py",
)
"""The end-to-end verdict's behaviour tests: runs made by hand (``tests/e2e_fakes.py``), no
engine started."""

E2E = "draftmeta/integrations/vllm/tools/e2e/"

MODULE_TESTS: dict[str, tuple[str, ...]] = {
    "draftmeta/spec.py": CORE_TESTS,
    "draftmeta/spec_tree.py": CORE_TESTS,
    "draftmeta/spec_validation.py": CORE_TESTS,
    "draftmeta/codegen/*": (*CORE_TESTS, "tests/test_generated_update.py"),
    "draftmeta/rules/*": CORE_TESTS,
    "draftmeta/derivations.py": CORE_TESTS,
    "draftmeta/layout.py": CORE_TESTS,
    "draftmeta/advance.py": CORE_TESTS,
    "draftmeta/state.py": CORE_TESTS,
    "draftmeta/step_policy.py": (*CORE_TESTS, "tests/test_step_policy.py"),
    "draftmeta/integrations/vllm/plugin/plan.py": PLUGIN_TESTS,
    "draftmeta/integrations/vllm/plugin/older_proposer.py": (*PLUGIN_TESTS,
                                                              "tests/test_step_policy.py"),
    "draftmeta/backends/mla.py": BACKEND_TESTS,
    "draftmeta/backends/indexer.py": BACKEND_TESTS,
    "draftmeta/integrations/vllm/specs/*": BACKEND_TESTS,
    "draftmeta/measure/noise.py": VERDICT_TESTS,
    E2E + "*": VERDICT_TESTS,
}
"""Module (or ``only_mutate`` glob) -> the test files a mutant of it runs (those of them that
reach the mutated function). Each file must be in ``pytest_add_cli_args_test_selection``."""


FUNCTIONS: dict[str, tuple[str, ...]] = {
    E2E + "compare.py": ("x_flat_draft_tokens", "x_draft_token_difference",
                         "x_hidden_max_abs_difference", "x__sum_loops", "xǁSideǁmedian_rate",
                         "xǁComparisonǁ*"),
    E2E + "controls.py": ("x_verdict", "x_caught", "x_judged", "x_tile_of"),
    E2E + "report.py": ("x__finite", "x__identity", "x__control", "x__control_verdict",
                        "x_noise_check", "x__decided", "x__key", "x_merge", "x__rederived",
                        "x__acceptance_of", "x__best_k", "x__label", "x_extent",
                        "x_planned_extent"),
    E2E + "gpu_time.py": ("x_union_length",),
    E2E + "acceptance.py": ("x_total_acceptance", "xǁAcceptanceǁ*", "xǁAcceptanceCounterǁstart",
                            "xǁAcceptanceCounterǁread", "xǁAcceptanceCounterǁ_count"),
}
"""Module -> the functions of it that are mutated (``fnmatch`` patterns of mutmut's keys:
``x_verdict``, ``xǁComparisonǁ*``), for a module of which only a part is the code under test:
the end-to-end verdict (the comparison, the controls' verdicts, what the report decides, the
GPU's busy time, acceptance counting), not what talks to vLLM (``AcceptanceCounter.__enter__``,
``controls.injected``) nor the Markdown and the plot. A module without an entry is mutated
whole."""

PROPERTY_MODULES = ("draftmeta/measure/noise.py", *FUNCTIONS)
"""The modules whose ``@property`` functions are mutated too (:func:`mutate_properties`):
mutmut 3.8 leaves a decorated function alone, and most of the verdict is properties
(``Comparison.strictly_identical``, ``Control.straddles``, ``Acceptance.per_position``)."""


def mutmut_config(root: Path = ROOT) -> dict[str, Any]:
    """``[tool.mutmut]`` of pyproject.toml."""
    data = tomllib.loads((root / "pyproject.toml").read_text())
    config: dict[str, Any] = data["tool"]["mutmut"]
    return config


def mutated_modules(root: Path = ROOT) -> list[str]:
    """The mutated modules, in ``only_mutate``'s order (its globs expanded, sorted)."""
    modules: list[str] = []
    for pattern in mutmut_config(root)["only_mutate"]:
        found = sorted(str(p.relative_to(root)) for p in root.glob(pattern)
                       if p.suffix == ".py" and p.name != "__init__.py")
        modules += [m for m in found if m not in modules]
    return modules


def dotted(module: str) -> str:
    """``draftmeta/rules/base.py`` -> ``draftmeta.rules.base`` (mutmut's mutant-name prefix)."""
    return module.removesuffix(".py").replace("/", ".")


def module_of(name: str, modules: Iterable[str]) -> str | None:
    """The module a mutant or mutated function (``draftmeta.layout.x__span__mutmut_3``,
    ``draftmeta.layout.xǁLayoutGuardǁcheck``) belongs to, or None."""
    for module in modules:
        prefix = dotted(module) + "."
        if name.startswith(prefix) and "." not in name[len(prefix):]:
            return module
    return None


def tests_for(module: str) -> tuple[str, ...] | None:
    """The test files a mutant of ``module`` may run (:data:`MODULE_TESTS`), or None: all."""
    for pattern, tests in MODULE_TESTS.items():
        if fnmatch.fnmatch(module, pattern):
            return tests
    return None


def function_of(name: str) -> str:
    """mutmut's key of the function a mutant or mutated function belongs to:
    ``draftmeta.layout.xǁLayoutGuardǁcheck__mutmut_3`` -> ``xǁLayoutGuardǁcheck``."""
    return name.rpartition(".")[2].partition("__mutmut_")[0]


def selected(name: str, module: str) -> bool:
    """Whether the mutant ``name`` of ``module`` is of a function that is mutated
    (:data:`FUNCTIONS`; every function of a module without an entry)."""
    patterns = FUNCTIONS.get(module)
    return patterns is None or any(fnmatch.fnmatchcase(function_of(name), p) for p in patterns)


def _is_property(function: Any) -> bool:
    import libcst as cst

    decorators = function.decorators
    return (len(decorators) == 1 and isinstance(decorators[0].decorator, cst.Name)
            and decorators[0].decorator.value == "property")


def mutate_properties(modules: Iterable[str]) -> None:
    """Make mutmut mutate the plain ``@property`` functions of ``modules`` (a function whose
    one decorator is ``@property``) as it does a method: mutmut 3.8 skips every decorated
    function but a static or class method, since it copies the decorator onto the original and
    onto every mutant, and a property is no function to call. Here the original and the
    mutants are plain methods and only the trampoline is a property, the way mutmut arranges a
    method. (``mutmut apply`` of such a mutant writes it without its ``@property``: show a
    survivor's test failing through the trampoline instead.)"""
    from mutmut.mutation import file_mutation as fm

    wanted = {str(Path(m)) for m in modules}
    here = {"on": False}
    create, skip, arrange = (fm.create_mutations, fm.MutationVisitor._skip_node_and_children,
                             fm.function_trampoline_arrangement)

    def create_mutations(filename: str, *args: Any, **kwargs: Any) -> Any:
        here["on"] = str(Path(filename)) in wanted
        return create(filename, *args, **kwargs)

    def skip_node_and_children(self: Any, node: Any) -> bool:
        import libcst as cst
        from libcst.metadata import PositionProvider

        if not (here["on"] and isinstance(node, cst.FunctionDef) and _is_property(node)):
            return bool(skip(self, node))
        position = self.get_metadata(PositionProvider, node, None)
        if position and position.start.line in self._ignored_node_lines:  # no mutate block
            self.ignored_functions.add(node.name.value)
            return True
        return False  # its decorator is skipped as a node of its own

    def arrangement(function: Any, mutants: Any, class_name: str | None) -> Any:
        if not (here["on"] and _is_property(function)):
            return arrange(function, mutants, class_name)
        declared, nodes, assigned, names = arrange(function.with_changes(decorators=[]),
                                                   mutants, class_name)
        trampoline = nodes[0].with_changes(decorators=[*function.decorators,
                                                       *nodes[0].decorators])
        return declared, [trampoline, *nodes[1:]], assigned, names

    fm.create_mutations = create_mutations  # type: ignore[assignment]
    fm.MutationVisitor._skip_node_and_children = skip_node_and_children  # type: ignore[method-assign]
    fm.function_trampoline_arrangement = arrangement  # type: ignore[assignment]


def narrow(tests_by_function: dict[str, set[str]], modules: Iterable[str]) -> int:
    """Keep, for each mutated function of ``modules``, only the tests of its module's test
    files (:func:`tests_for`); returns how many (function, test) pairs were dropped."""
    modules = list(modules)
    dropped = 0
    for function, tests in tests_by_function.items():
        module = module_of(function, modules)
        files = tests_for(module) if module else None
        if files is None:
            continue
        kept = {t for t in tests if t.split("::")[0] in files}
        dropped += len(tests) - len(kept)
        tests_by_function[function] = kept
    return dropped


def fastest_first(tests: Iterable[str], durations: Mapping[str, float]) -> list[str]:
    """``tests`` by their recorded duration, quickest first (then by name); pytest runs them
    in this order, so a mutant that a quick test kills costs that test, not the slow ones."""
    return sorted(tests, key=lambda test: (durations.get(test, 0.0), test))


def sample(names: Iterable[str], size: int | None, seed: int) -> list[str]:
    """A fixed random sample of ``size`` of ``names`` (all of them if ``size`` is None or not
    smaller): the first ``size`` of the names shuffled by ``seed``, so the same for the same
    names and seed whatever order they come in, and a larger sample contains a smaller one
    (a sample grown later keeps the mutants already run)."""
    ordered = sorted(names)
    if size is None or size >= len(ordered):
        return ordered
    random.Random(seed).shuffle(ordered)
    return sorted(ordered[:size])


def committed_decisions(results: Mapping[str, Any], hashes: Mapping[str, str]) -> dict[str, str]:
    """``{mutant: status}`` decided in the committed ``results.json`` whose function is
    unchanged: the same source hash (``function_hashes``: ``{function: hash}``, mutmut's
    ``hash_by_function_name``) as now, or a module result committed without hashes."""
    decided: dict[str, str] = {}
    for module in results.get("modules", {}).values():
        then = module.get("function_hashes")
        for mutant, status in module.get("statuses", {}).items():
            if status in ("not run", "interrupted"):
                continue
            function = function_of(mutant)
            if then is None or (function in then and then[function] == hashes.get(function)):
                decided[mutant] = status
    return decided


class _NothingToRun(Exception):
    """Every chosen mutant is decided already."""


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="mutated modules (default: all of them)")
    parser.add_argument("--max-children", type=int, default=None,
                        help="mutants run at once (default: one per core)")
    parser.add_argument("--sample", type=int, default=None,
                        help="run a fixed random sample of this many mutants of each module")
    parser.add_argument("--seed", type=int, default=38, help="the sample's seed (default 38)")
    parser.add_argument("--rerun", action="store_true",
                        help="run decided mutants again too")
    args = parser.parse_args(argv)

    known = mutated_modules()
    modules = args.modules or known
    unknown = [m for m in modules if m not in known]
    if unknown:
        parser.error(f"not a mutated module: {', '.join(unknown)} "
                     f"(one of: {', '.join(known)}; [tool.mutmut] only_mutate)")

    import mutmut.__main__ as mm
    from mutmut.state import state
    from mutmut.workers.isolation import ForkServerRunner

    runs_path = ROOT / "mutation" / "runs.json"
    runs = _load(runs_path)
    committed = _load(ROOT / "mutation" / "results.json")

    original_stats = mm.collect_or_load_stats

    def narrowed_stats(*a: Any, **kw: Any) -> None:
        original_stats(*a, **kw)
        dropped = narrow(state().tests_by_mangled_function_name, modules)
        print(f"    each mutant runs its module's tests only: {dropped} (function, test) "
              "pairs left out")

    original_collect = mm.collect_source_file_mutation_data

    def chosen(*, mutant_names: Any) -> Any:
        mutants, by_path = original_collect(mutant_names=mutant_names)
        hashes = {f: h for m in by_path.values() for f, h in m.hash_by_function_name.items()}
        decided = committed_decisions(committed, hashes)
        keep = []
        for module in modules:
            ours = [(m, name, r) for m, name, r in mutants
                    if module_of(name, [module]) and selected(name, module)]
            picked = set(sample((name for _, name, _ in ours), args.sample, args.seed))
            keep += [(m, name, r) for m, name, r in ours if name in picked and (
                args.rerun or (r is None and name not in decided))]
            if args.sample is not None and args.sample < len(ours):
                runs.setdefault("samples", {})[module] = {"size": args.sample, "seed": args.seed}
            print(f"    {module}: {len(ours)} mutants, {len(picked)} chosen, "
                  f"{len([1 for _, n, _ in keep if module_of(n, [module])])} to run")
        if not keep:
            raise _NothingToRun
        return keep, by_path

    original_wait = ForkServerRunner.wait_for_result

    done: list[str] = []

    def timed_wait(self: ForkServerRunner, timeout: float | None = None) -> Any:
        started = {name: work[3] for name, work in self._pending_work.items()}
        result = original_wait(self, timeout)
        done.append(result.mutant_name)
        if result.mutant_name in started:
            took = datetime.now() - started[result.mutant_name]
            result = dataclasses.replace(result, duration=took.total_seconds())
        return result

    original_submit = ForkServerRunner.submit

    def submit_fastest_first(self: ForkServerRunner, mutant_name: str, tests: list[str],
                             cpu_time_limit: int, estimated_time: float) -> None:
        original_submit(self, mutant_name, fastest_first(tests, state().duration_by_test),
                        cpu_time_limit, estimated_time)

    mutate_properties(PROPERTY_MODULES)  # whichever modules run: mutmut mutates every file
    mm.collect_or_load_stats = narrowed_stats  # type: ignore[assignment]
    mm.collect_source_file_mutation_data = chosen  # type: ignore[assignment]
    ForkServerRunner.wait_for_result = timed_wait  # type: ignore[method-assign]
    ForkServerRunner.submit = submit_fastest_first  # type: ignore[method-assign]

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # mutmut stops its workers and keeps what was decided

    signal.signal(signal.SIGTERM, stop)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    start = time.monotonic()
    try:
        mm._run(tuple(dotted(m) + ".*" for m in modules), args.max_children)
    except _NothingToRun:
        print("nothing left to run: every chosen mutant is decided (--rerun runs them again)")
        return 0
    finally:
        runs.setdefault("runs", []).append({
            "modules": modules, "mutants": len(done), "seconds": round(time.monotonic() - start),
            "max_children": args.max_children, "sample": args.sample,
            "seed": args.seed if args.sample is not None else None,
            "started": started,
        })
        runs_path.parent.mkdir(exist_ok=True)
        runs_path.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
