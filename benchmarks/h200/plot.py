#!/usr/bin/env python3
"""Plot the draft loop's gain from draft-loop-h200.json: per layer, draft tokens/s of the
captured K-step loop over eager + vLLM's rebuild, one line per K, against the measured batch
sizes (every path's numbers are in draft-loop-h200.md).

    .venv/bin/python benchmarks/h200/plot.py benchmarks/results/draft-loop-h200.json \
        benchmarks/results/draft-loop-h200.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from draftmeta.measure.plots import PLOT_FONT_PT, PLOT_WIDTH_IN

BASE = "(a) eager + vLLM rebuild"
CAPTURED = "(c) captured K-step loop (fused update)"


def figure(rows: list[dict[str, Any]]) -> Any:
    """The figure: one panel per layer, the captured loop's draft tokens/s over eager + vLLM
    rebuild against batch size (evenly spaced categories), one line per K."""
    layers = sorted({r["layer"] for r in rows}, key=lambda n: n != "DeepSeek-V2-Lite")
    ks = sorted({r["k"] for r in rows})
    batches = sorted({r["batch"] for r in rows})
    rate = {(r["layer"], r["path"], r["k"], r["batch"]): r["tokens_per_s"] for r in rows}
    with plt.rc_context({"font.size": PLOT_FONT_PT}):
        fig, axes = plt.subplots(len(layers), 1, sharex=True, squeeze=False,
                                 layout="constrained",
                                 figsize=(PLOT_WIDTH_IN, 1.0 + 2.6 * len(layers)))
        for ax, layer in zip(axes[:, 0], layers):
            for k in ks:
                xs = [i for i, b in enumerate(batches)
                      if (layer, BASE, k, b) in rate and (layer, CAPTURED, k, b) in rate]
                ax.plot(xs, [rate[(layer, CAPTURED, k, batches[i])]
                             / rate[(layer, BASE, k, batches[i])] for i in xs],
                        marker="o", label=f"K = {k}")
            ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
            ax.set_title(f"{layer}-sized draft layer")
            ax.set_ylabel("tokens/s over (a)")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        bottom = axes[-1][0]
        bottom.set_xticks(range(len(batches)), [str(b) for b in batches])
        bottom.set_xlabel("batch size")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(ks), frameon=False)
        fig.suptitle("Captured draft loop on an H200: draft tokens/s over eager + vLLM rebuild")
    return fig


def main(src: Path, dst: Path) -> None:
    """Draw the plot of ``src`` (draft-loop-h200.json) into ``dst`` (PNG)."""
    fig = figure(json.loads(src.read_text())["draft_loop"])
    fig.savefig(dst, dpi=150)
    plt.close(fig)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
