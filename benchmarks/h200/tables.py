"""Markdown tables of ``benchmarks/results/draft-loop-h200.json``, for docs/h200.md.

    python benchmarks/h200/tables.py  # writes benchmarks/results/draft-loop-h200.md

The site includes the generated file, so the page always shows the committed run's numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"

_PATHS = {
    "(a) eager + vLLM rebuild": "(a) vLLM rebuild",
    "(b) eager + draftmeta update": "(b) update",
    "(b) eager + draftmeta fused step (FusedStep)": "(b) fused",
    "(b) eager + draftmeta step graph (StepGraph)": "(b) step graph",
    "(b) eager + DraftLoop fused=True (StepGraph)": "(b) DraftLoop",
    "(c) captured K-step loop (fused update)": "(c) captured",
}


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _loop_table(rows: list[dict[str, Any]], layer: str, *, batch: int | None,
                k: int | None) -> list[str]:
    keyed = {(r["batch"], r["k"], r["path"]): r["tokens_per_s"] for r in rows
             if r["layer"] == layer}
    axis = "K" if batch is not None else "batch"
    values = sorted({r["k"] if batch is not None else r["batch"] for r in rows
                     if r["layer"] == layer})
    paths = [p for p in _PATHS if any(key[2] == p for key in keyed)]
    lines = [_row([axis, *(_PATHS[p] for p in paths), "(c) / (a)"]),
             _row(["---:"] * (len(paths) + 2))]
    for v in values:
        b, kk = (batch, v) if batch is not None else (v, k)
        got = [keyed.get((b, kk, p)) for p in paths]
        if any(g is None for g in got):
            continue
        ratio = got[-1] / got[0]  # type: ignore[operator]
        lines.append(_row([str(v), *(f"{g:,.0f}" for g in got), f"{ratio:.2f}x"]))
    return lines


def render(data: dict[str, Any]) -> str:
    """The Markdown for one run's JSON."""
    out = [f"Run: {data['environment']['time']} on {data['environment']['gpu']} "
           f"(torch {data['environment']['torch']}, vLLM {data['environment']['vllm']}'s "
           "Python code); command `" + data["command"] + "`.", ""]
    out += ["**Update equals vLLM's rebuild on CUDA**", "",
            _row(["builder", "random batches", "steps checked", "mismatched",
                  "negative control caught"]),
            _row(["---", "---:", "---:", "---:", "---"])]
    for name, e in data["equivalence"].items():
        out.append(_row([name, str(e["batches"]), str(e["steps_checked"]),
                         str(e["steps_mismatched"]), str(e["negative_control_caught"])]))
    out += ["", "**Host time per draft step, MLA + indexer groups** (median (p90) us)", "",
            _row(["path", "batch", "host median (p90) us"]), _row(["---", "---:", "---:"])]
    for r in sorted(data["metadata_steps"], key=lambda r: (r["batch"], r["path"])):
        out.append(_row([r["path"], str(r["batch"]),
                         f"{r['host_median_us']:.1f} ({r['host_p90_us']:.1f})"]))
    loop = data["draft_loop"]
    same = all(r["same_tokens_as_a"] for r in loop)
    cases = len({(r["layer"], r["batch"], r["k"]) for r in loop})
    out += ["", f"**Draft loop with vLLM's Triton MLA decode kernel**, draft tokens/s; "
            f"same draft tokens as (a) in all {cases} cases: {same}", ""]
    for layer in sorted({r["layer"] for r in loop}):
        out += [f"{layer}-sized layer, batch 1:", "", *_loop_table(loop, layer, batch=1, k=None),
                "", f"{layer}-sized layer, K = 5:", "",
                *_loop_table(loop, layer, batch=None, k=5), ""]
    return "\n".join(out) + "\n"


def main() -> None:
    """Write ``draft-loop-h200.md`` beside the JSON."""
    data = json.loads((RESULTS / "draft-loop-h200.json").read_text())
    target = RESULTS / "draft-loop-h200.md"
    target.write_text(render(data))
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
