"""On a GPU: the Hopper MLA builders' hooks against vLLM's own rebuild, through ``draftmeta audit``.

A thin caller of :func:`draftmeta.integrations.vllm.tools.audit.audit` on CUDA for
``FLASH_ATTN_MLA``,
``FLASHMLA`` (bf16 and FP8 KV cache) and ``TRITON_MLA``, with the negative controls (each
scheduler left stale on batches placed across a scheduler tile): update == rebuild with kernel
schedules compared as their kernels read them and FlashMLA's decode run on both sides, the hook
captured in a CUDA graph and replayed, idempotent, and equal at the first step from the metadata
built for capture. ``draftmeta audit --device cuda`` audits every hook that constructs on the
GPU; this script keeps the name and the output file the H200 runs used.

Run on the GPU machine with vLLM on the path:
``python3 benchmarks/h200/hook_equivalence.py --out $OUT``. Prints the audit's table and writes
``hook-equivalence.json`` (the audit's JSON); exit 1 on any failure or an uncaught negative
control. ``--dcp N``: the same under decode context parallelism, each batch for one rank of a
stand-in group of N (the rebuild's local lengths from vLLM's own function); writes
``hook-equivalence-dcpN.json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from draftmeta.arguments import DEFAULT_OUT, OUT_HELP

BUILDERS = ("FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")
"""The builders the H200 runs proved (FlashMLA with both KV caches: the audit does both)."""


def main(argv: list[str] | None = None) -> int:
    """Run the audit on CUDA for :data:`BUILDERS`; the exit code."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="random batches per builder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"{OUT_HELP}; writes hook-equivalence.json")
    parser.add_argument("--force", action="store_true",
                        help="replace the hook-equivalence.json already in --out")
    parser.add_argument("--dcp", type=int, default=1,
                        help="decode context parallelism: DCP world size of a stand-in group "
                        "(each batch for rank seed %% world, interleave 1 or 8; default 1: "
                        "off); writes hook-equivalence-dcpN.json")
    args = parser.parse_args(argv)
    stem = "hook-equivalence" + (f"-dcp{args.dcp}" if args.dcp > 1 else "")
    existing = args.out / f"{stem}.json"  # a device run's fresh $OUT holds none
    if existing.exists() and not args.force:
        parser.exit(2, f"{existing} exists; name another --out, or pass --force to replace "
                    "it\n")
    from draftmeta.integrations.vllm.tools.audit import GPU_CONTROLS, audit, audit_table

    command = shlex.join(["python3", "benchmarks/h200/hook_equivalence.py",
                          *(argv if argv is not None else sys.argv[1:])])
    report = audit(list(BUILDERS), batches=args.batches, plugin=True, negative_control=True,
                   echo=lambda line: print(line, flush=True), device="cuda",
                   dcp=(args.dcp,), command=command, controls=GPU_CONTROLS)
    print(audit_table(report), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    existing.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
