"""On the H200: draftmeta's line in vLLM's own log, in the engine users run (issue 26, item 3).

Two real vLLM 0.34 MTP engines (the tiny model, ``FLASH_ATTN_MLA``, K = 3, CUDA graphs on), each
in a fresh process, in vLLM's default multiprocess mode, draftmeta's plugin on and off through
``DRAFTMETA_VLLM_PLUGIN`` only: vLLM loads the plugin itself, in every process it starts. Writes
``h200-plugin-log.log`` (draftmeta's lines and vLLM's draft-loop lines of both runs, each with
its process) and ``h200-plugin-log.json`` (per run: the lines, the output tokens, per worker what
the plugin installed) to ``--out``; exits 1 if a line is missing or the tokens differ.

    python3 benchmarks/h200/plugin_log.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftmeta.arguments import DEFAULT_OUT, OUT_HELP
from draftmeta.integrations.vllm.tools.e2e.multiprocess import run_engine_process

DRAFT_LOOP = ("cannot update draft decode metadata", "draft decode metadata")
"""Substrings of vLLM's own lines about its draft loop (the eager fallback warning)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"{OUT_HELP}; writes h200-plugin-log.log and .json")
    parser.add_argument("--force", action="store_true",
                        help="replace the h200-plugin-log files already in --out")
    parser.add_argument("--backend", default="FLASH_ATTN_MLA", help="(default FLASH_ATTN_MLA)")
    args = parser.parse_args(argv)
    existing = args.out / "h200-plugin-log.json"  # a device run's fresh $OUT holds none
    if existing.exists() and not args.force:
        parser.exit(2, f"{existing} exists; name another --out, or pass --force to replace "
                    "it\n")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {}
    lines: list[str] = []
    for plugin in (False, True):
        run = run_engine_process(plugin=plugin, multiprocess=True, backend=args.backend, k=3,
                                 batch_size=2, max_tokens=32, device="cuda", timeout_s=400)
        name = "on" if plugin else "off"
        mine = run.plugin_lines()
        vllms = [line for line in run.log.splitlines()
                 if any(s in line for s in DRAFT_LOOP) and "] draftmeta" not in line]
        header = (f"== plugin {name} (DRAFTMETA_VLLM_PLUGIN={int(plugin)}), engine process "
                  f"{run.engine_pid}")
        lines += [header, *mine, *vllms]
        runs[name] = {"plugin_lines": mine, "vllm_draft_loop_lines": vllms,
                      "output_tokens": run.output_tokens, "workers": run.workers}
    same = runs["on"]["output_tokens"] == runs["off"]["output_tokens"]
    lines.append(f"== output tokens identical plugin off vs on: {same}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (args.out / "h200-plugin-log.log").write_text(text)
    (args.out / "h200-plugin-log.json").write_text(json.dumps(runs, indent=2) + "\n")
    on_line = any("draftmeta on" in line for line in runs["on"]["plugin_lines"])
    off_line = any("draftmeta off" in line for line in runs["off"]["plugin_lines"])
    return 0 if same and on_line and off_line else 1


if __name__ == "__main__":
    sys.exit(main())
