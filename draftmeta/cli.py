"""The ``draftmeta`` command: explain, verify, coverage, bench, e2e, infer.

Exit codes: 0 success, 1 a check failed (``verify`` found a mismatch), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from draftmeta.arguments import integer_in, positive, seed

__all__ = ["main"]


def _explain(args: argparse.Namespace) -> int:
    """Print a spec's generated source from the recorded class lists: vLLM is never imported."""
    from draftmeta.codegen import explain
    from draftmeta.registry import SPECS, closest_names, get_spec, recorded_classes

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
    with recorded_classes():
        text = explain(get_spec(args.backend))
    print(text, end="")
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
    out = Path(args.out)
    for folder in (out, *out.parents):  # fail before the run, not after it
        if folder.exists():
            if not folder.is_dir():
                raise UsageError(
                    f"--out {out}: {folder} is a file, not a folder; name a folder for the results"
                )
            break
    config = BenchConfig(
        device=args.device,
        batch_sizes=tuple(args.batch_sizes),
        steps=tuple(range(2, args.max_steps + 1)),
        repeats=args.repeats,
    )
    try:
        samples = run_bench(config, progress=not args.quiet)
    except ValueError as exc:  # vLLM's config refuses a batch size, a block size, ...
        raise UsageError(f"vLLM refused this configuration: {exc}") from exc
    print(table(summarize(samples)))
    paths = write_results(samples, config, out)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0


_steps = integer_in(2, 16)


def parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the docs and tests)."""
    p = argparse.ArgumentParser(
        prog="draftmeta",
        description="Declarative in-place updates of attention metadata between draft steps.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser(
        "explain", help="print the generated update source for a backend's spec (no vLLM import)"
    )
    e.add_argument("backend", nargs="?",
                   help="a spec name, e.g. TRITON_MLA, INDEXER.dcp, state.wrap (see --list)")
    e.add_argument("--list", action="store_true", help="print every spec name, one per line")
    e.set_defaults(run=_explain)

    v = sub.add_parser("verify", help="update-versus-rebuild check for every registered backend")
    v.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    v.add_argument("--batches", type=positive, default=50, help="random batches per backend")
    v.add_argument("--steps", type=_steps, default=8, help="largest number of draft steps K")
    v.add_argument("--seed", type=seed, default=0, help="first seed (default: 0)")
    v.set_defaults(run=_verify)

    c = sub.add_parser(
        "coverage",
        help="the vLLM found, the plugin's state, and who covers each builder on each draft path",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    c.set_defaults(run=_coverage)

    b = sub.add_parser("bench", help="time per draft step: vLLM rebuild vs draftmeta update")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    b.add_argument("--batch-sizes", type=positive, nargs="+", default=[1, 8, 64, 256])
    b.add_argument("--max-steps", type=_steps, default=8, help="K runs from 2 to this")
    b.add_argument("--repeats", type=positive, default=12)
    b.add_argument(
        "--out", default="draftmeta-results",
        help="folder for JSON and PNG (default: draftmeta-results; --out benchmarks/results "
             "rewrites the committed results of a checkout)",
    )
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(run=_bench)

    from draftmeta.e2e.cli import add_parser as add_e2e
    from draftmeta.infer.cli import add_parser as add_infer

    add_e2e(sub)
    add_infer(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code.

    A user mistake the parser cannot see (an output folder that is a file, a batch size vLLM's
    config refuses) ends with one line on stderr and exit 2; Ctrl-C with exit 130.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    args = parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        print(f"draftmeta {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # an output path that cannot be written
        where = f": {exc.filename}" if exc.filename else ""
        print(f"draftmeta {args.command}: cannot write{where} ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"draftmeta {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


class UsageError(Exception):
    """A command-line value the parser accepted but the run cannot use (exit 2, one line)."""


if __name__ == "__main__":
    sys.exit(main())
