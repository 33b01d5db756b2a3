"""``draftmeta bench``: the host cost of one draft step, vLLM's rebuild against draftmeta's
in-place update, timed on the CPU against vLLM's builders or on CUDA against the plain-torch
models; refused before it starts where it would lose a fuller result already in ``--out``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from draftmeta.arguments import folder_problem, no_plot, replace_problem
from draftmeta.commands.terminal import Progress, UsageError

__all__ = ["run_bench"]


def run_bench(args: argparse.Namespace) -> int:
    """``draftmeta bench``: run every configuration, print the table, write JSON, Markdown and
    (where matplotlib is installed) the plot into ``--out``."""
    from draftmeta import bench
    from draftmeta.bench import BenchConfig, summarize, table, write_results
    from draftmeta.bench.report import pair_summary
    from draftmeta.integrations.vllm.versions import import_problem
    from draftmeta.measure.machine import load_average

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda needs a CUDA device")
    else:
        # vLLM picks its platform when first imported: the CPU one, before the check imports it
        from draftmeta.integrations.vllm.testing.harness import prepare_environment

        prepare_environment()
    if args.device == "cpu" and (missing := import_problem()) is not None:
        raise UsageError(f"it times vLLM's own metadata builders, and vLLM does not import "
                         f"here ({missing}); install it first: pip install vllm==0.33.0")
    out = Path(args.out)
    problem = folder_problem("--out", out)  # fail before the run, not after it
    if problem is not None:
        raise UsageError(problem)
    config = BenchConfig(
        device=args.device,
        batch_sizes=tuple(dict.fromkeys(args.batch_sizes)),
        steps=tuple(range(2, args.max_steps + 1)),
        repeats=args.repeats,
    )
    if not args.force:
        import attrs

        from draftmeta.bench.report import extent, result_name

        problem = replace_problem(out / f"{result_name(args.device)}.json",
                                  extent(attrs.asdict(config)),
                                  lambda data: extent(data["environment"]["config"]))
        if problem is not None:
            raise UsageError(problem)
    plotless = no_plot()
    if plotless is not None:
        print(f"draftmeta bench: {plotless}", file=sys.stderr)
    before, started = load_average(), time.monotonic()
    try:
        samples = bench.run_bench(config, progress=not args.quiet)
    except ValueError as exc:  # vLLM's config refuses a batch size, a block size, ...
        raise UsageError(f"vLLM refused this configuration: {exc}") from exc
    run = {"wall_seconds": round(time.monotonic() - started, 1),
           "load_average": {"before": before, "after": load_average()}}
    print(table(summarize(samples), pair_summary(samples, args.device)))
    with Progress("bench", enabled=not args.quiet) as progress:
        progress.update(f"writing JSON, Markdown{'' if plotless else ' and the plot'} to {out}")
        paths = write_results(samples, config, out, run=run)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0

