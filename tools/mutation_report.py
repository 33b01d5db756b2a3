"""The mutation-testing report (issue 38): mutmut's results as ``mutation/results.json`` and
``docs/mutation.md``.

    python tools/mutation_report.py            # after ``nox -s mutation`` (or ``mutmut run``)

It reads what ``mutmut run`` left under ``mutants/`` (one ``<source>.meta`` JSON per mutated
file: each mutant's exit code), the committed reasons of the mutants judged equivalent
(``mutation/equivalent.json``: ``{mutant: reason}``), the tests written for survivors
(``mutation/killed_by.json``: ``{mutant: test}``, mutants killed by a test added after the run)
and the wall times of the runs (``mutation/runs.json``, written by ``nox -s mutation``), and
writes the raw results and the page. A module none of whose mutants was run is listed as not
run. Survivors' diffs come from ``mutmut show``.

The score of a module is ``(killed + timed out) / (mutants run - equivalent)``: a mutant that
no selected test reaches ("no tests") counts as a survivor. No golden-text test is among the
selected tests (``[tool.mutmut]`` in pyproject.toml), so every kill is a behaviour test's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
    35: "suspicious", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout",
    255: "timeout", -11: "segfault", -9: "segfault", 2: "interrupted", 37: "type check",
    None: "not run",
}
"""mutmut 3's exit codes (``mutmut.stats.status_by_exit_code``), with ``None`` (not run yet)."""

MODULES = (
    "draftmeta/spec.py", "draftmeta/codegen.py", "draftmeta/rules/base.py",
    "draftmeta/rules/host.py", "draftmeta/rules/passive.py", "draftmeta/rules/tensor.py",
    "draftmeta/derivations.py", "draftmeta/layout.py", "draftmeta/advance.py",
    "draftmeta/state.py", "draftmeta/backends/mla.py", "draftmeta/backends/indexer.py",
    "draftmeta/integrations/vllm/specs/mla.py", "draftmeta/integrations/vllm/specs/indexer.py",
    "draftmeta/integrations/vllm/plan.py",
    "draftmeta/integrations/vllm/hook.py", "draftmeta/integrations/vllm/older_proposer.py",
)
"""The mutated modules, in the order the report lists them (``only_mutate``)."""


def status(code: int | None) -> str:
    """The status of a mutant from mutmut's exit code."""
    return STATUS_BY_EXIT_CODE.get(code, "suspicious")


def read_meta(mutants: Path, module: str) -> dict[str, str]:
    """``{mutant: status}`` of one module from ``mutants/<module>.meta`` (empty if absent)."""
    path = mutants / f"{module}.meta"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {name: status(code) for name, code in data["exit_code_by_key"].items()}


@dataclass
class ModuleResult:
    """The tally of one module's mutants."""

    module: str
    statuses: dict[str, str]
    equivalent: dict[str, str] = field(default_factory=dict)
    killed_by: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None
    run_with: int = 1
    total: int | None = None  # mutants generated, where statuses omit those not run

    @property
    def mutants(self) -> int:
        return len(self.statuses) if self.total is None else self.total

    def count(self, *names: str) -> int:
        return sum(1 for s in self.statuses.values() if s in names)

    @property
    def run(self) -> int:
        return len(self.statuses) - self.count("not run", "interrupted")

    @property
    def detected(self) -> int:
        return self.count("killed", "timeout", "segfault")

    @property
    def undetected(self) -> list[str]:
        """Mutants no selected test caught, equivalent ones left out."""
        return sorted(m for m, s in self.statuses.items()
                      if s in ("survived", "no tests", "suspicious") and m not in self.equivalent)

    @property
    def open(self) -> list[str]:
        """Undetected mutants with neither an equivalence reason nor a test written since."""
        return [m for m in self.undetected if m not in self.killed_by]

    @property
    def score(self) -> float | None:
        """Caught share of the non-equivalent mutants run, counting the tests added since."""
        judged = self.run - len([m for m in self.equivalent if m in self.statuses])
        if judged <= 0:
            return None
        caught = self.detected + len([m for m in self.killed_by if m in self.undetected])
        return caught / judged

    @property
    def score_at_run(self) -> float | None:
        """Caught share of the non-equivalent mutants run, by the tests as they were then."""
        judged = self.run - len([m for m in self.equivalent if m in self.statuses])
        return self.detected / judged if judged > 0 else None

    def summary(self) -> dict[str, Any]:
        return {
            "module": self.module, "mutants": self.mutants, "run": self.run,
            "killed": self.count("killed"), "timeout": self.count("timeout"),
            "survived": self.count("survived", "suspicious"), "no_tests": self.count("no tests"),
            "equivalent": len([m for m in self.equivalent if m in self.statuses]),
            "killed_by_new_tests": len([m for m in self.killed_by if m in self.undetected]),
            "open": len(self.open), "score_at_run": self.score_at_run, "score": self.score,
            "seconds": self.seconds,
        }


def collect(mutants: Path, equivalent: Mapping[str, str], killed_by: Mapping[str, str],
            runs: Mapping[str, Mapping[str, Any]], modules: tuple[str, ...] = MODULES
            ) -> list[ModuleResult]:
    """Every module's result (a module whose mutants were never generated has none); ``runs``
    is ``mutation/runs.json``: ``{module: {"seconds": wall time, "run_with": [modules]}}``."""
    results = []
    for module in modules:
        statuses = read_meta(mutants, module)
        run = runs.get(module, {})
        results.append(ModuleResult(
            module, statuses,
            {m: r for m, r in equivalent.items() if m in statuses},
            {m: t for m, t in killed_by.items() if m in statuses},
            float(run["seconds"]) if "seconds" in run else None,
            len(run.get("run_with", [module])),
        ))
    return results


def total_score(results: list[ModuleResult], *, at_run: bool = False) -> float | None:
    """The score over every module run, as :attr:`ModuleResult.score` (or
    :attr:`ModuleResult.score_at_run`) over their union."""
    judged = sum(r.run - len(r.equivalent) for r in results)
    caught = sum(r.detected + (0 if at_run else len([m for m in r.killed_by if m in r.undetected]))
                 for r in results)
    return caught / judged if judged > 0 else None


def _percent(score: float | None) -> str:
    return "-" if score is None else f"{100 * score:.1f}%"


def render(results: list[ModuleResult], diffs: Mapping[str, str], command: str) -> str:
    """The markdown page."""
    ran = [r for r in results if r.run]
    lines = [
        "# Mutation testing",
        "",
        "Generated by `tools/mutation_report.py` from mutmut's results; do not edit by hand.",
        f"Command: `{command}` (see [Contributing](contributing.md#mutation-testing)).",
        "",
        "The score is (killed + timed out + killed by a test written since the run) over the "
        "non-equivalent mutants run. The selected tests (`[tool.mutmut]` in `pyproject.toml`) "
        "include no golden-text test: every kill is a behaviour test's.",
        "",
        f"**Score over the modules run: {_percent(total_score(ran))}** "
        f"({_percent(total_score(ran, at_run=True))} at the run, before the tests written for "
        "its survivors)",
        "",
        "| module | mutants | killed | timed out | survived | no tests | equivalent "
        "| killed by new tests | open | score at the run | score | run time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        s = r.summary()
        if not r.run:
            lines.append(f"| `{r.module}` | {s['mutants'] or '-'} | not run | | | | | | | | | |")
            continue
        took = "-" if r.seconds is None else f"{r.seconds / 60:.0f} min"
        if r.seconds is not None and r.run_with > 1:
            took += f" (one run of {r.run_with} modules)"
        count = str(s["mutants"])
        if s["run"] != s["mutants"]:
            count += f" ({s['run']} run)"
        lines.append(
            f"| `{r.module}` | {count} | {s['killed']} | {s['timeout']} | {s['survived']} "
            f"| {s['no_tests']} | {s['equivalent']} | {s['killed_by_new_tests']} | {s['open']} "
            f"| {_percent(r.score_at_run)} | {_percent(r.score)} | {took} |")
    not_run = [r.module for r in results if not r.run]
    if not_run:
        lines += ["", "Not run yet: " + ", ".join(f"`{m}`" for m in not_run) + "."]
    partly = [r for r in ran if r.run < r.mutants]
    if partly:
        lines += ["", "Partly run (the run was stopped): " + ", ".join(
            f"`{r.module}` ({r.mutants - r.run} of {r.mutants} left)" for r in partly) + "."]
    lines += ["", "## Equivalent mutants", ""]
    equivalents = [(m, reason) for r in ran for m, reason in sorted(r.equivalent.items())]
    if not equivalents:
        lines.append("None.")
    for m, reason in equivalents:
        lines.append(f"- `{m}`: {reason}")
    lines += ["", "## Survivors killed by tests written since the run", ""]
    fixed = [(m, t) for r in ran for m, t in sorted(r.killed_by.items()) if m in r.undetected]
    if not fixed:
        lines.append("None.")
    for m, test in fixed:
        lines.append(f"- `{m}`: `{test}`")
    lines += ["", "## Open survivors", "",
              "Neither a test nor a reason yet (each diff as `mutmut show` gives it).", ""]
    opened = [m for r in ran for m in r.open]
    if not opened:
        lines.append("None.")
    for m in opened:
        lines += [f"- `{m}`", "", "  ```diff", *(f"  {d}" for d in
                                                  diffs.get(m, "").splitlines()), "  ```", ""]
    return "\n".join(lines).rstrip() + "\n"


def mutmut_diff(name: str) -> str:
    """The changed lines of one mutant, from ``mutmut show``."""
    done = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    return "\n".join(line for line in done.stdout.splitlines()
                     if line.startswith(("+", "-")) and not line.startswith(("+++", "---")))


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=Path, default=ROOT / "mutants")
    parser.add_argument("--folder", type=Path, default=ROOT / "mutation",
                        help="equivalent.json, killed_by.json, runs.json; results.json is "
                             "written here")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "mutation.md")
    parser.add_argument("--command", default="nox -s mutation")
    args = parser.parse_args(argv)
    equivalent = _load(args.folder / "equivalent.json")
    killed_by = _load(args.folder / "killed_by.json")
    runs = _load(args.folder / "runs.json")
    old = _load(args.folder / "results.json")
    results = collect(args.mutants, equivalent, killed_by, runs)
    # a module not run this time keeps the committed statuses of its last run
    for r in results:
        if not r.run and old.get("modules", {}).get(r.module, {}).get("statuses"):
            r.statuses = dict(old["modules"][r.module]["statuses"])
            r.total = int(old["modules"][r.module]["mutants"])
            r.equivalent = {m: e for m, e in equivalent.items() if m in r.statuses}
            r.killed_by = {m: t for m, t in killed_by.items() if m in r.statuses}
    known = {m: d for m, d in old.get("diffs", {}).items()}
    diffs = {m: known.get(m) or mutmut_diff(m) for r in results for m in r.open}
    args.folder.mkdir(exist_ok=True)
    (args.folder / "results.json").write_text(json.dumps({
        "tool": "mutmut", "command": args.command,
        "score": total_score([r for r in results if r.run]),
        "modules": {r.module: {**r.summary(), "statuses": {
            m: st for m, st in sorted(r.statuses.items()) if st != "not run"}}
                    for r in results},
        "diffs": dict(sorted(diffs.items())),
    }, indent=1) + "\n")
    args.page.write_text(render(results, diffs, args.command))
    print(f"wrote {args.folder / 'results.json'} and {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
