#!/usr/bin/env python3
"""Plot draft tokens/s against batch size from draft-loop-h200.json (one panel per layer and K).

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


def main(src: Path, dst: Path) -> None:
    rows: list[dict[str, Any]] = json.loads(src.read_text())["draft_loop"]
    layers = sorted({r["layer"] for r in rows}, key=lambda n: n != "DeepSeek-V2-Lite")
    ks = sorted({r["k"] for r in rows})
    paths = list(dict.fromkeys(r["path"] for r in rows))
    fig, axes = plt.subplots(len(layers), len(ks), figsize=(3.4 * len(ks), 3.2 * len(layers)),
                             squeeze=False, sharey="row")
    for i, layer in enumerate(layers):
        for j, k in enumerate(ks):
            ax = axes[i][j]
            for path in paths:
                pts = sorted((r["batch"], r["tokens_per_s"]) for r in rows
                             if r["layer"] == layer and r["k"] == k and r["path"] == path)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=path)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{layer}, K={k}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if i == len(layers) - 1:
                ax.set_xlabel("batch")
            if j == 0:
                ax.set_ylabel("draft tokens / s")
    axes[0][0].legend(fontsize=6, loc="upper left")
    fig.suptitle("Draft loop on an H200 with vLLM 0.33's Triton MLA decode kernel", fontsize=11)
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
