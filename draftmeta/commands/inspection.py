"""What ships and what it covers: ``draftmeta explain`` (a spec's generated update, vLLM never
imported) and ``draftmeta coverage`` (the vLLM found, the plugin's state, who covers each
builder)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from draftmeta.arguments import folder_problem, stdout_to_stderr
from draftmeta.commands.terminal import Progress, UsageError, import_torch_quietly

__all__ = ["run_coverage", "run_explain"]


def _default_host_bound(name: str, release: Any) -> str | None:
    """The host bound ``draftmeta explain NAME`` shows without ``--host-bound``: that of the
    draft path ``release`` (a catalogue :class:`~draftmeta.integrations.vllm.catalogue.Release`)
    drafts through by default. Where it keeps the older proposer (``build_for_drafting`` at every
    draft index), its ``advance``; where vLLM's hook is its only draft path, the hook's
    ``frozen`` (the bound its captured loop keeps). ``None``: the name's own (a ``state.*``
    name, or the older proposer's)."""
    builder = name.split(".")[0]
    if builder in release.names and "older_proposer" not in release.paths:
        return "frozen"
    return None


def _explain_spec(name: str, host_bound: str | None) -> Any:
    """The spec ``name`` from the registry, with its own host bound or with ``host_bound``."""
    from draftmeta.registry import get_spec

    try:
        return get_spec(name, host_bound)  # type: ignore[arg-type]  # argparse checked choices
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_explain(args: argparse.Namespace) -> int:
    """``draftmeta explain``: print a spec's generated source from the recorded class lists:
    vLLM is never imported. For the default release the text ships with the package
    (:mod:`draftmeta.explained`), so neither torch nor the generator is imported either."""
    from draftmeta import explained

    if args.host_bound is None:
        if args.list and (shipped_names := explained.names()) is not None:
            print("\n".join(shipped_names))
            return 0
        if not args.list and args.backend is not None:
            text = explained.shipped(args.backend)
            if text is not None:
                print(text, end="")
                return 0
    if not args.verbose:
        import_torch_quietly()
    from draftmeta.codegen import explain
    from draftmeta.registry import SPECS, closest_names, recorded_classes

    if args.list:
        print("\n".join(SPECS))
        return 0
    if args.backend is None:
        raise UsageError("name a spec (draftmeta explain TRITON_MLA) or list them with --list")
    if args.backend not in SPECS:
        close = closest_names(args.backend)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise UsageError(f"unknown backend {args.backend!r}; {hint}"
                         "draftmeta explain --list prints every name")
    from draftmeta.integrations.vllm.catalogue import current_release

    host_bound = args.host_bound or _default_host_bound(args.backend, current_release())
    with recorded_classes():
        text = explain(_explain_spec(args.backend, host_bound))
    print(text, end="")
    return 0


def run_coverage(args: argparse.Namespace) -> int:
    """``draftmeta coverage``: the coverage report as a table (or ``--json``) on stdout, and in
    ``--out`` as ``coverage-vllm-RELEASE.json``."""
    import json

    # fail before the run, not after it (folder_problem creates and test-writes the folder)
    if args.out is not None and (problem := folder_problem("--out", args.out)) is not None:
        raise UsageError(problem)
    with Progress("coverage", enabled=not args.quiet) as progress, \
            stdout_to_stderr() if args.json else contextlib.nullcontext():
        progress.update("importing vLLM and checking every builder")
        from draftmeta.integrations.vllm.tools.coverage import coverage, coverage_table

        report = coverage()
    print(json.dumps(report, indent=1) if args.json else coverage_table(report))
    if args.out is not None:
        path = args.out / f"coverage-vllm-{report['release']}.json"
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0

