"""The mutation-testing report (issue 38): mutmut's results as ``mutation/results.json`` and
``docs/mutation.md``.

    python tools/mutation_report.py            # after ``nox -s mutation``

It reads what ``mutmut run`` left under ``mutants/`` (one ``<source>.meta`` JSON per mutated
file: each mutant's exit code, wall time and function hashes), the committed results of the
earlier runs (``mutation/results.json``), the reasons of the mutants judged equivalent
(``mutation/equivalent.json``: ``{mutant: reason}``), the tests written for survivors
(``mutation/killed_by.json``: ``{mutant: test}``, mutants killed by a test added after the run),
the runs and samples (``mutation/runs.json``, written by ``tools/mutation_run.py``) and the
fresh checks (``mutation/check.json``: seeded samples run again on the suite as it stands), and
writes the raw results and the page. Of a module mutated in part (``FUNCTIONS`` of
``tools/mutation_run.py``), only the mutated functions' mutants count. Survivors' diffs come
from ``mutmut show``.

A mutant's status is this machine's (``mutants/``) where it was run here, else the committed
one, where its function's source is unchanged (the same hash) or was committed without a hash.
The mutated modules are ``[tool.mutmut] only_mutate``'s; committed results of a module no
longer among them are kept and listed as such (a module moved or renamed).

The score of a module is ``(killed + timed out) / (mutants run - equivalent)``: a mutant that
no selected test reaches ("no tests") counts as a survivor. A sampled module's score comes with
its 95% Wilson interval. No golden-text test is among the selected tests (``[tool.mutmut]`` in
pyproject.toml), so every kill is a behaviour test's.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_run import committed_decisions, mutated_modules, selected  # noqa: E402

STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
    35: "suspicious", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout",
    255: "timeout", -11: "segfault", -9: "segfault", 2: "interrupted", 37: "type check",
    None: "not run",
}
"""mutmut 3's exit codes (``mutmut.stats.status_by_exit_code``), with ``None`` (not run yet)."""

Z_95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval."""


def status(code: int | None) -> str:
    """The status of a mutant from mutmut's exit code."""
    return STATUS_BY_EXIT_CODE.get(code, "suspicious")


def wilson(successes: int, trials: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (95% by default): ``successes`` of ``trials``
    sampled at random; None without trials."""
    if trials <= 0:
        return None
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must lie in 0..trials, got {successes} of {trials}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class MutmutMeta:
    """What mutmut wrote for one module: each mutant's status and measured wall time, and each
    mutated function's source hash."""

    statuses: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)


def read_mutmut(mutants: Path, module: str) -> MutmutMeta | None:
    """``mutants/<module>.meta``, or None if absent; of a module mutated in part (``FUNCTIONS``
    of ``tools/mutation_run.py``), its mutated functions only."""
    path = mutants / f"{module}.meta"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    codes = {name: code for name, code in data["exit_code_by_key"].items()
             if selected(name, module)}
    return MutmutMeta(
        {name: status(code) for name, code in codes.items()},
        {name: float(s) for name, s in data.get("durations_by_key", {}).items()
         if s and codes.get(name) is not None},
        {f: h for f, h in data.get("hash_by_function_name", {}).items() if selected(f, module)},
    )


def read_meta(mutants: Path, module: str) -> dict[str, str]:
    """``{mutant: status}`` of one module from ``mutants/<module>.meta`` (empty if absent)."""
    meta = read_mutmut(mutants, module)
    return {} if meta is None else meta.statuses


@dataclass
class ModuleResult:
    """The tally of one module's mutants."""

    module: str
    statuses: dict[str, str]
    equivalent: dict[str, str] = field(default_factory=dict)
    killed_by: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    total: int | None = None  # mutants generated, where statuses omit those not run
    sample: Mapping[str, int] | None = None  # {"size": N, "seed": S} of a sampled module
    hashes: dict[str, str] = field(default_factory=dict)
    mutated: bool = True  # False: a committed module no longer in only_mutate

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
    def judged(self) -> int:
        """Non-equivalent mutants run (an equivalent mutant not run here is no mutant run)."""
        unrun = ("not run", "interrupted")
        return self.run - len([m for m in self.equivalent
                               if self.statuses.get(m, "not run") not in unrun])

    @property
    def caught(self) -> int:
        """Mutants run that a test catches: at the run, or by a test written since."""
        return self.detected + len([m for m in self.killed_by if m in self.undetected])

    @property
    def score(self) -> float | None:
        """Caught share of the non-equivalent mutants run, counting the tests added since."""
        return self.caught / self.judged if self.judged > 0 else None

    @property
    def score_at_run(self) -> float | None:
        """Caught share of the non-equivalent mutants run, by the tests as they were then."""
        return self.detected / self.judged if self.judged > 0 else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The score's 95% Wilson interval, for a sampled module (None otherwise)."""
        return wilson(self.caught, self.judged) if self.sample else None

    @property
    def seconds(self) -> float | None:
        """The measured wall time of the mutants run, added up (None if none was timed)."""
        return sum(self.durations.values()) if self.durations else None

    def summary(self) -> dict[str, Any]:
        interval = self.interval
        return {
            "module": self.module, "mutants": self.mutants, "run": self.run,
            "killed": self.count("killed"), "timeout": self.count("timeout"),
            "survived": self.count("survived", "suspicious"), "no_tests": self.count("no tests"),
            "equivalent": len([m for m in self.equivalent
                               if self.statuses.get(m, "not run") not in ("not run",
                                                                          "interrupted")]),
            "killed_by_new_tests": len([m for m in self.killed_by if m in self.undetected]),
            "open": len(self.open), "score_at_run": self.score_at_run, "score": self.score,
            "interval_95": None if interval is None else list(interval),
            "sample": None if self.sample is None else dict(self.sample),
            "timed": len(self.durations),
            "seconds": None if self.seconds is None else round(self.seconds, 1),
        }


def collect(mutants: Path, equivalent: Mapping[str, str], killed_by: Mapping[str, str],
            runs: Mapping[str, Any], modules: Iterable[str],
            committed: Mapping[str, Any] | None = None) -> list[ModuleResult]:
    """Every module's result: this machine's mutmut results (``mutants``) over the committed
    ones (``committed``: an earlier ``results.json``); ``runs`` is ``mutation/runs.json``
    (``{"samples": {module: {"size": N, "seed": S}}, "runs": [...]}``). A committed module not
    among ``modules`` is kept, marked as no longer mutated."""
    old = dict((committed or {}).get("modules", {}))
    samples = runs.get("samples", {})
    modules = list(modules)
    results = []
    for module in modules + [m for m in old if m not in modules]:
        meta = read_mutmut(mutants, module)
        before = old.get(module, {})
        statuses = {} if meta is None else dict(meta.statuses)
        durations = {} if meta is None else dict(meta.durations)
        hashes = {} if meta is None else dict(meta.hashes)
        kept = committed_decisions({"modules": {module: before}}, hashes) if meta else {
            m: s for m, s in before.get("statuses", {}).items() if s != "not run"}
        for mutant, st in kept.items():
            if statuses.get(mutant, "not run") in ("not run", "interrupted"):
                statuses[mutant] = st
                if mutant in before.get("durations", {}):
                    durations[mutant] = float(before["durations"][mutant])
        if meta is None:
            hashes = dict(before.get("function_hashes") or {})
        results.append(ModuleResult(
            module, statuses,
            {m: r for m, r in equivalent.items() if m in statuses},
            {m: t for m, t in killed_by.items() if m in statuses},
            durations,
            None if meta is not None else before.get("mutants"),
            samples.get(module),
            hashes,
            module in modules,
        ))
    return results


def total_score(results: list[ModuleResult], *, at_run: bool = False) -> float | None:
    """The score over every module run, as :attr:`ModuleResult.score` (or
    :attr:`ModuleResult.score_at_run`) over their union."""
    judged = sum(r.judged for r in results)
    caught = sum(r.detected if at_run else r.caught for r in results)
    return caught / judged if judged > 0 else None


def _percent(score: float | None) -> str:
    return "-" if score is None else f"{100 * score:.1f}%"


def _score_cell(r: ModuleResult) -> str:
    interval = r.interval
    if interval is None:
        return _percent(r.score)
    return f"{_percent(r.score)} (95%: {_percent(interval[0])}-{_percent(interval[1])})"


def _time_cell(r: ModuleResult) -> str:
    if r.seconds is None:
        return "-"
    return f"{r.seconds / len(r.durations):.0f} s ({r.seconds / 60:.0f} min, {len(r.durations)})"


def _runs_lines(runs: Mapping[str, Any]) -> list[str]:
    lines = []
    for run in runs.get("runs", []):
        modules = ", ".join(f"`{m}`" for m in run.get("modules", []))
        what = f"{run['mutants']} mutants" if run.get("mutants") is not None else "mutants"
        sample = (f", a sample of {run['sample']} per module (seed {run['seed']})"
                  if run.get("sample") else "")
        lines.append(f"- {run.get('started', '?')}: {modules}: {what} in "
                     f"{run['seconds'] / 60:.0f} min, {run.get('max_children') or 'one per core'} "
                     f"at a time{sample}{'; ' + run['note'] if run.get('note') else ''}")
    return lines


def render(results: list[ModuleResult], diffs: Mapping[str, str], command: str,
           runs: Mapping[str, Any] | None = None, check: list[str] | None = None,
           extra_open: Iterable[str] = (), checked: Iterable[ModuleResult] = ()) -> str:
    """The markdown page (``check``: the lines of :func:`render_check`, placed before the
    runs; ``extra_open``: the check's open survivors, listed with the others; ``checked``: the
    checks' modules, whose equivalent mutants and survivors killed by new tests are listed
    with the runs')."""
    ran = [r for r in results if r.run]
    checked = list(checked)
    lines = [
        "# Mutation testing",
        "",
        "Generated by `tools/mutation_report.py` from mutmut's results; do not edit by hand.",
        f"Command: `{command}` (see [Contributing](contributing.md#mutation-testing)).",
        "",
        "The score is (killed + timed out + killed by a test written since the run) over the "
        "non-equivalent mutants run; a sampled module's comes with its 95% Wilson interval. "
        "The selected tests (`[tool.mutmut]` in `pyproject.toml`) include no golden-text test: "
        "every kill is a behaviour test's. Time is each mutant's measured wall time, on "
        "average (and added up, over how many mutants were timed).",
        "",
        f"**Score over the mutants run: {_percent(total_score(ran))}** "
        f"({_percent(total_score(ran, at_run=True))} at the run, before the tests written for "
        "its survivors)",
        "",
        "| module | mutants | killed | timed out | survived | no tests | equivalent "
        "| killed by new tests | open | score at the run | score | time per mutant |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        s = r.summary()
        name = f"`{r.module}`" + ("" if r.mutated else " (no longer mutated)")
        if not r.run:
            lines.append(f"| {name} | {s['mutants'] or '-'} | not run | | | | | | | | | |")
            continue
        count = str(s["mutants"])
        if r.sample:
            count += f" (sample of {r.sample['size']}, seed {r.sample['seed']}"
            count += ")" if s["run"] >= r.sample["size"] else f": {s['run']} run)"
        elif s["run"] != s["mutants"]:
            count += f" ({s['run']} run)"
        lines.append(
            f"| {name} | {count} | {s['killed']} | {s['timeout']} | {s['survived']} "
            f"| {s['no_tests']} | {s['equivalent']} | {s['killed_by_new_tests']} | {s['open']} "
            f"| {_percent(r.score_at_run)} | {_score_cell(r)} | {_time_cell(r)} |")
    not_run = [r.module for r in results if not r.run and r.mutated]
    if not_run:
        lines += ["", "Not run yet: " + ", ".join(f"`{m}`" for m in not_run) + "."]
    sampled = [r for r in ran if r.sample]
    if sampled:
        lines += ["", "Sampled (a fixed random sample of the module's mutants, "
                  "`tools/mutation_run.py --sample N --seed S`): " + ", ".join(
                      f"`{r.module}` ({r.sample['size']} of {r.mutants}"
                      + (f", {r.run} run" if r.run < r.sample["size"] else "") + ")"
                      for r in sampled) + "."]
        if any(r.run < r.sample["size"] for r in sampled):
            lines += ["", "Where a sample was not finished, the mutants left are those mutmut "
                      "runs last (the slowest to test), so the interval describes the mutants "
                      "run, not the whole module."]
    partly = [r for r in ran if r.run < r.mutants and not r.sample]
    if partly:
        lines += ["", "Partly run (a run was stopped, or functions changed since their run): "
                  + ", ".join(f"`{r.module}` ({r.mutants - r.run} of {r.mutants} left)"
                              for r in partly) + "."]
    if check:
        lines += ["", *check]
    if runs and runs.get("runs"):
        lines += ["", "## Runs", "", *_runs_lines(runs)]
    lines += ["", "## Equivalent mutants", ""]
    equivalents = _unique((m, reason) for r in ran + checked
                          for m, reason in sorted(r.equivalent.items()))
    if not equivalents:
        lines.append("None.")
    for m, reason in equivalents:
        lines.append(f"- `{m}`: {reason}")
    lines += ["", "## Survivors killed by tests written since the run", ""]
    fixed = _unique((m, t) for r in ran + checked for m, t in sorted(r.killed_by.items())
                    if m in r.undetected)
    if not fixed:
        lines.append("None.")
    for m, test in fixed:
        lines.append(f"- `{m}`: `{test}`")
    lines += ["", "## Open survivors", "",
              "Neither a test nor a reason yet (each diff as `mutmut show` gives it).", ""]
    opened = [m for r in ran for m in r.open] + [m for m in extra_open if m not in
                                                 {o for r in ran for o in r.open}]
    if not opened:
        lines.append("None.")
    for m in opened:
        lines += [f"- `{m}`", "", "  ```diff", *(f"  {d}" for d in
                                                  diffs.get(m, "").splitlines()), "  ```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _unique(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pairs in order, each mutant once (a mutant a run and a check both decided)."""
    seen: dict[str, str] = {}
    for m, value in pairs:
        seen.setdefault(m, value)
    return list(seen.items())


def checks_of(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The fresh checks ``mutation/check.json`` holds: ``{"checks": [check, ...]}``, or one
    check (``{"statuses": ..., "command": ...}``), or none."""
    if "checks" in data:
        return list(data["checks"])
    return [data] if data.get("statuses") else []


def check_results(check: Mapping[str, Any], equivalent: Mapping[str, str],
                  killed_by: Mapping[str, str]) -> list[ModuleResult]:
    """The modules of a fresh check (``mutation/check.json``: a seeded sample run again on the
    suite as it stands, ``{"statuses": {module: {mutant: status}}, ...}``), each with the
    equivalent mutants and the tests written for its survivors."""
    return [ModuleResult(module, dict(statuses),
                         {m: r for m, r in equivalent.items() if m in statuses},
                         {m: t for m, t in killed_by.items() if m in statuses})
            for module, statuses in check.get("statuses", {}).items()]


def render_check(check: Mapping[str, Any], results: list[ModuleResult]) -> list[str]:
    """The page's section on a fresh check (headed by its ``title``, if it has one): its
    command, the score at the run over every module with its 95% Wilson interval, per module
    what it ran, and the score after the tests written for its survivors."""
    judged = sum(r.judged for r in results)
    caught_at_run = sum(r.detected for r in results)
    interval = wilson(caught_at_run, judged)
    spread = "" if interval is None else (
        f" (95%: {_percent(interval[0])}-{_percent(interval[1])})")
    lines = [
        f"## {check.get('title', 'A fresh check: the suite as it stands')}",
        "",
        f"`{check['command']}` on commit {check['commit']} ({check['started']}, "
        f"{check['seconds'] / 60:.0f} min): {check['note']}.",
        "",
        f"**At the run: {caught_at_run} of {judged} non-equivalent mutants killed, "
        f"{_percent(total_score(results, at_run=True))}{spread}**; "
        f"{_percent(total_score(results))} after the tests written for its survivors.",
        "",
        "| module | run | killed | survived | equivalent | killed by new tests | open |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        s = r.summary()
        lines.append(f"| `{r.module}` | {s['run']} | {s['killed'] + s['timeout']} "
                     f"| {s['survived'] + s['no_tests']} | {s['equivalent']} "
                     f"| {s['killed_by_new_tests']} | {s['open']} |")
    return lines


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
    checks = checks_of(_load(args.folder / "check.json"))
    modules = mutated_modules()
    results = collect(args.mutants, equivalent, killed_by, runs, modules, old)
    checked = [check_results(c, equivalent, killed_by) for c in checks]
    for r in results:
        if not r.mutated:
            print(f"note: {r.module} is no longer in [tool.mutmut] only_mutate (moved or "
                  "renamed?): its committed results are kept as they are", file=sys.stderr)
    known = {m: d for m, d in old.get("diffs", {}).items()}
    diffs = {m: known.get(m) or mutmut_diff(m)
             for r in results + [r for rs in checked for r in rs] for m in r.open}
    args.folder.mkdir(exist_ok=True)
    (args.folder / "results.json").write_text(json.dumps({
        "tool": "mutmut", "command": args.command,
        "score": total_score([r for r in results if r.run]),
        "modules": {r.module: {
            **r.summary(),
            "statuses": {m: st for m, st in sorted(r.statuses.items()) if st != "not run"},
            "durations": {m: round(s, 2) for m, s in sorted(r.durations.items())},
            "function_hashes": dict(sorted(r.hashes.items())) or None,
        } for r in results},
        "checks": [{
            "command": c["command"], "score_at_run": total_score(rs, at_run=True),
            "score": total_score(rs), "modules": {r.module: r.summary() for r in rs}}
            for c, rs in zip(checks, checked)],
        "diffs": dict(sorted(diffs.items())),
    }, indent=1, ensure_ascii=False) + "\n")
    sections = [line for i, (c, rs) in enumerate(zip(checks, checked))
                for line in [*([""] if i else []), *render_check(c, rs)]]
    args.page.write_text(render(results, diffs, args.command, runs, sections or None,
                                [m for rs in checked for r in rs for m in r.open],
                                [r for rs in checked for r in rs]))
    print(f"wrote {args.folder / 'results.json'} and {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
