"""Merge the results of ``draftmeta e2e`` runs of one device into one result, then write its
Markdown and PNG beside it (:func:`draftmeta.integrations.vllm.tools.e2e.report.merge`: a later
run's
configuration replaces the same case and batch size and is added otherwise; what the result
decides is computed again over the merged configurations).

    python benchmarks/h200/merge_results.py benchmarks/results/e2e-cuda-h100.json \\
        /work/.device/5/a/e2e-cuda.json /work/.device/5/b/e2e-cuda.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftmeta.integrations.vllm.tools.e2e.rendering import write_results
from draftmeta.integrations.vllm.tools.e2e.report import merge


def main(argv: list[str] | None = None) -> None:
    """Merge ``argv``'s results (the first path is written; it is read too where it exists)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("result", type=Path, help="the merged result, written (and read first "
                                                  "where it exists)")
    parser.add_argument("runs", type=Path, nargs="+", help="the runs' e2e-*.json files")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.runs]
    if args.result.exists():
        runs.insert(0, json.loads(args.result.read_text()))
    merged = merge(runs[0], *runs[1:])
    paths = write_results(merged, args.result.parent, args.result.stem)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")


if __name__ == "__main__":
    main()
