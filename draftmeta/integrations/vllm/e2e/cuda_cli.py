"""``draftmeta e2e --device cuda``: the CUDA matrix from command-line arguments.

Exit codes as for the CPU run: 0 every timed configuration produced identical output and draft
tokens (and the negative control, when asked for, differed); 1 otherwise or an engine failed;
2 this environment cannot run it (no CUDA device, no vLLM 0.34 GPU runner).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import attrs

from draftmeta.arguments import no_plot, replace_problem
from draftmeta.integrations.vllm.e2e.cuda_matrix import (
    SCHEDULED_BACKENDS,
    CudaCase,
    CudaComparison,
    CudaFailure,
    CudaMatrixConfig,
)
from draftmeta.integrations.vllm.e2e.environment import CUDA_BACKENDS, MODEL_NAMES
from draftmeta.integrations.vllm.e2e.model import default_max_tokens

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODELS",
    "cases_from",
    "run_cuda",
]

DEFAULT_BACKENDS = ["FLASH_ATTN_MLA", "FLASHMLA"]
"""The backends ``--device cuda`` runs unless ``--backends`` says otherwise: Hopper's two."""
DEFAULT_BATCH_SIZES = [1, 8]
"""Prompts per generate unless ``--batch-sizes`` says otherwise."""
DEFAULT_MAX_TOKENS = 256
"""Tokens per prompt unless ``--max-tokens`` says otherwise."""
DEFAULT_MODELS = ["tiny"]
"""The models unless ``--models`` says otherwise."""


def cases_from(models: list[str], backends: list[str], ks: list[int], *,
               kv_cache_dtype: str = "auto", negative_control: bool = False,
               eager: bool = False, limit: bool = False) -> tuple[CudaCase, ...]:
    """The engine pairs for these options: every model x backend x K (``TRITON_MLA`` with
    draftmeta's hook replacing vLLM's own), each with ``kv_cache_dtype`` and ``eager``; with
    ``limit``, each hooked case again with an empty hook; and the negative control (first
    model, first K >= 3) once per scheduled backend asked for (FlashMLA's where none is).

    Raises:
        ValueError: an unknown model or backend, an FP8 cache for a backend that takes none,
            or a negative control without a K >= 2.
    """
    unknown = [m for m in models if m not in MODEL_NAMES] + [b for b in backends
                                                        if b not in CUDA_BACKENDS]
    if unknown:
        raise ValueError(f"unknown model(s) or CUDA backend(s) {unknown}; models: "
                         f"{', '.join(MODEL_NAMES)}; backends: {', '.join(CUDA_BACKENDS)}")
    if kv_cache_dtype == "fp8" and set(backends) - {"FLASHMLA"}:
        raise ValueError(f"--kv-cache-dtype fp8 is for FLASHMLA; vLLM's "
                         f"{', '.join(sorted(set(backends) - {'FLASHMLA'}))} take no FP8 cache "
                         "here: run them without it")
    cases = [CudaCase(model, backend, k, override_upstream=backend == "TRITON_MLA",
                      kv_cache_dtype=kv_cache_dtype, eager=eager)
             for model in models for backend in backends for k in ks]
    if limit:
        # the same engines with a hook that does no metadata work, for every hooked case
        cases += [attrs.evolve(c, limit=True) for c in list(cases)
                  if c.k >= 2 and c.backend != "TRITON_MLA"]
    if negative_control:
        # its wrong spec leaves the scheduler of draft step 1 in place for steps 2..: a loop
        # needs K - 1 >= 2 draft steps to show it (K = 2 has one, freshly built)
        drafting = [k for k in ks if k >= 3]
        if not drafting:
            raise ValueError("the negative control needs a K of at least 3 (its stale "
                             "scheduler shows from a loop's second draft step on); add one to "
                             "--ks")
        scheduled = [b for b in SCHEDULED_BACKENDS if b in backends] or ["FLASHMLA"]
        if kv_cache_dtype == "fp8":
            scheduled = ["FLASHMLA"]
        cases += [CudaCase(models[0], backend, drafting[0], negative_control=True,
                           kv_cache_dtype=kv_cache_dtype, eager=eager) for backend in scheduled]
    return tuple(cases)


def run_cuda(args: argparse.Namespace,
             engine_output: Callable[[], AbstractContextManager[None]],
             progress: Callable[[str], None]) -> int:
    """Run ``draftmeta e2e --device cuda`` with parsed ``args``; returns the exit code.

    ``engine_output`` wraps the engines' run (with ``--json``: everything written to stdout
    goes to stderr, so stdout carries the JSON document alone); ``progress`` takes the
    progress lines (the command's, shared with the CPU run).
    """
    from draftmeta.integrations.vllm.e2e.cuda_matrix import run_cuda_matrix
    from draftmeta.integrations.vllm.e2e.cuda_report import (
        CUDA_RESULT_NAME,
        control_missed,
        cuda_extent,
        cuda_markdown,
        cuda_summary,
        planned_cuda_extent,
        write_cuda_results,
    )
    from draftmeta.integrations.vllm.e2e.errors import E2EError, E2EUnavailable

    try:
        config = CudaMatrixConfig(
            cases=cases_from(args.models or DEFAULT_MODELS,
                             args.backends or DEFAULT_BACKENDS, args.ks,
                             kv_cache_dtype=args.kv_cache_dtype,
                             negative_control=args.negative_control, eager=args.eager,
                             limit=args.limit),
            batch_sizes=tuple(dict.fromkeys(args.batch_sizes or DEFAULT_BATCH_SIZES)),
            max_tokens=args.max_tokens or default_max_tokens(args.models or DEFAULT_MODELS,
                                                             DEFAULT_MAX_TOKENS),
            warmups=args.warmups,
            repeats=args.repeats,
            seed=args.seed,
            pairs=args.pairs,
        )
    except ValueError as exc:
        print(f"draftmeta e2e: {exc}", file=sys.stderr)
        return 2
    if not args.force:
        problem = replace_problem(Path(args.out) / f"{CUDA_RESULT_NAME}.json",
                                  planned_cuda_extent(config), cuda_extent)
        if problem is not None:
            print(f"draftmeta e2e: {problem}", file=sys.stderr)
            return 2

    command = "draftmeta e2e " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 else [])

    def checkpoint(done: list[CudaComparison], failed: list[CudaFailure]) -> None:
        # what a run stopped from outside (a time limit) keeps: the pairs finished so far
        write_cuda_results(cuda_summary(done, failed, command=command), args.out,
                           f"{CUDA_RESULT_NAME}-running", plot=False)

    plotless = no_plot()
    if plotless is not None:  # said before the run, not found missing after it
        print(f"draftmeta e2e: {plotless}", file=sys.stderr, flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="draftmeta-e2e-cuda-") as workdir, \
                engine_output():
            comparisons, failures = run_cuda_matrix(config, workdir=Path(workdir),
                                                    progress=progress, checkpoint=checkpoint)
    except E2EUnavailable as exc:
        print(f"draftmeta e2e: cannot run here: {exc}", file=sys.stderr)
        return 2
    except E2EError as exc:
        print(f"draftmeta e2e: failed: {exc}", file=sys.stderr)
        return 1
    data = cuda_summary(comparisons, failures, command=command)
    (Path(args.out) / f"{CUDA_RESULT_NAME}-running.json").unlink(missing_ok=True)
    (Path(args.out) / f"{CUDA_RESULT_NAME}-running.md").unlink(missing_ok=True)
    stem = CUDA_RESULT_NAME
    # checked before the run too; a case that failed can leave this result short of it
    if failures and not args.force and replace_problem(
            Path(args.out) / f"{stem}.json", cuda_extent(data), cuda_extent) is not None:
        stem += "-partial"
        print(f"draftmeta e2e: a case failed, so this run holds less than "
              f"{Path(args.out) / (CUDA_RESULT_NAME + '.json')}: its results go to "
              f"{stem}.* beside it", file=sys.stderr)
    paths = write_cuda_results(data, args.out, stem)
    if args.json:
        print(json.dumps(data))
    else:
        print(cuda_markdown(data), end="")
        for kind, path in paths.items():
            print(f"wrote {kind}: {path}")
    ok = data["output_tokens_identical"] and data["draft_tokens_identical"]
    for failed in data["failed"]:
        print(f"draftmeta e2e: {failed['case']} failed: {failed['error']}", file=sys.stderr)
        ok = False
    if not ok:
        print("draftmeta e2e: plugin on and off disagree (see the table)", file=sys.stderr)
    missed = control_missed(data)
    if missed is not None:
        print(f"draftmeta e2e: {missed}", file=sys.stderr)
        ok = False
    return 0 if ok else 1
