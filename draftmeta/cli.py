"""The ``draftmeta`` command: explain, verify, coverage, bench, e2e.

Exit codes: 0 success, 1 a check failed (``verify`` found a mismatch), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _explain(args: argparse.Namespace) -> int:
    from draftmeta.codegen import explain
    from draftmeta.registry import SPECS, get_spec

    if args.backend not in SPECS:
        print(f"draftmeta explain: unknown backend {args.backend!r}; choose one of:\n  "
              + "\n  ".join(SPECS), file=sys.stderr)
        return 2
    print(explain(get_spec(args.backend)), end="")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from draftmeta.verify import verify

    return verify(device=args.device, batches=args.batches, steps=args.steps, seed=args.seed)


def _coverage(args: argparse.Namespace) -> int:
    import json

    from draftmeta.integrations.vllm.coverage import coverage, coverage_table

    report = coverage()
    print(json.dumps(report, indent=1) if args.json else coverage_table(report))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from draftmeta.bench import BenchConfig, run_bench, summarize, table, write_results

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("draftmeta bench: --device cuda needs a CUDA device", file=sys.stderr)
            return 2
    config = BenchConfig(
        device=args.device,
        batch_sizes=tuple(args.batch_sizes),
        steps=tuple(range(2, args.max_steps + 1)),
        repeats=args.repeats,
    )
    samples = run_bench(config, progress=not args.quiet)
    print(table(summarize(samples)))
    paths = write_results(samples, config, Path(args.out))
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _steps(text: str) -> int:
    value = int(text)
    if not 2 <= value <= 16:
        raise argparse.ArgumentTypeError(f"must be between 2 and 16, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the docs and tests)."""
    p = argparse.ArgumentParser(
        prog="draftmeta",
        description="Declarative in-place updates of attention metadata between draft steps.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("explain", help="print the generated update source for a backend's spec")
    e.add_argument("backend", help="a spec name, e.g. TRITON_MLA, INDEXER.dcp, state.wrap")
    e.set_defaults(run=_explain)

    v = sub.add_parser("verify", help="update-versus-rebuild check for every registered backend")
    v.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    v.add_argument("--batches", type=_positive, default=50, help="random batches per backend")
    v.add_argument("--steps", type=_steps, default=8, help="largest number of draft steps K")
    v.add_argument("--seed", type=int, default=0, help="first seed")
    v.set_defaults(run=_verify)

    c = sub.add_parser(
        "coverage",
        help="the vLLM found, the plugin's state, and who covers each builder on each draft path",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    c.set_defaults(run=_coverage)

    b = sub.add_parser("bench", help="time per draft step: vLLM rebuild vs draftmeta update")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    b.add_argument("--batch-sizes", type=_positive, nargs="+", default=[1, 8, 64, 256])
    b.add_argument("--max-steps", type=_steps, default=8, help="K runs from 2 to this")
    b.add_argument("--repeats", type=_positive, default=12)
    b.add_argument(
        "--out", default="draftmeta-results",
        help="folder for JSON and PNG (default: draftmeta-results; --out benchmarks/results "
             "rewrites the committed results of a checkout)",
    )
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(run=_bench)

    from draftmeta.e2e.cli import add_parser as add_e2e

    add_e2e(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
