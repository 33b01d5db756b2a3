"""The ``draftmeta infer`` command (wired into ``draftmeta.cli`` with :func:`add_parser`).

Standard output carries the inferred spec as a Python module and nothing else
(``draftmeta infer CPU_MLA > spec.py``); whether it verified goes to standard error.

Exit codes: 0 the inferred spec verified; 1 it did not (or fields are unsettled); 2 the builder
cannot be resolved or constructed here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from draftmeta.arguments import positive, seed

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``infer`` to a ``draftmeta`` subparsers object and return its parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "infer", help="infer a builder's spec from what it builds, print it, verify it",
        description="Build a builder's metadata for probe batches, classify how every field "
                    "changes from one draft step to the next, print the spec as Python source "
                    "and verify it (update against rebuild) over random batches. Needs vLLM "
                    "for catalogue names. Exit 0 verified, 1 not verified, 2 the builder cannot "
                    "be resolved or built here.")
    p.add_argument("builder", help="a catalogue name (CPU_MLA, TRITON_MLA, INDEXER, KPOOL_TAIL, "
                                   "AMX_MLA) or MODULE:BuilderClass")
    p.add_argument("--batches", type=positive, default=200,
                   help="random batches to verify over")
    p.add_argument("--seed", type=seed, default=0, help="first verification seed")
    p.add_argument("--no-verify", action="store_true", help="print the spec without verifying")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Infer, print the source, verify; print ``verified`` only when every batch passed."""
    from draftmeta.integrations.vllm.tools.infer import infer_vllm, resolve, verify_vllm

    try:
        # First, whether vLLM imports at all: its submodules may already be loaded (and so
        # importable) in a process where the package itself no longer imports.
        import vllm  # noqa: F401

        name = resolve(args.builder)
        inference = infer_vllm(name)
    except ImportError as exc:
        missing = exc.name or ""
        if missing == "vllm" or missing.startswith("vllm."):
            print(f"draftmeta infer: it reads vLLM's own builder, and vLLM does not import here "
                  f"({exc}); install it first: pip install vllm==0.33.0", file=sys.stderr)
        else:
            print(f"draftmeta infer: {exc}", file=sys.stderr)
        return 2
    except (LookupError, ValueError) as exc:
        print(f"draftmeta infer: {exc}", file=sys.stderr)
        return 2
    print(inference.source(), end="", flush=True)  # stdout: the module alone (> spec.py)

    def report(line: str) -> None:  # the verdict goes to stderr
        print(line, file=sys.stderr)

    if inference.unsettled:
        report("not verified: fields infer could not settle:")
        for v in inference.unsettled:
            report(f"  {v.path}: {v.evidence}")
        return 1
    if args.no_verify:
        report("not verified (--no-verify)")
        return 1
    result = verify_vllm(name, inference.spec(), batches=args.batches, seed=args.seed)
    if result.ok:
        report(f"verified: update equals rebuild over {result.batches} random batches "
               f"({result.seconds:.1f} s)")
        return 0
    report(f"not verified: {len(result.failures)} of {result.batches} batches differ; first:")
    for what, problem in result.failures[:5]:
        report(f"  {what}: {problem}")
    return 1
