"""The CUDA end-to-end matrix: per model, backend and K, vLLM's GPU engine plugin off vs on.

For every configuration two fresh engines are alive at once, one with draftmeta's plugin off
and one with it on (made with the same seed, model and prompts). Per batch size each engine
first runs one *recorded* generate (output and draft token ids read back), then warm-up and
measured generates alternate between the engines (off, on, on, off, ...) so that load from
other processes on a shared host falls on both alike. Tok/s is generated tokens over the wall
time of a ``generate``; medians and spread over the measured ones.

Configurations:

* ``FLASH_ATTN_MLA`` and ``FLASHMLA`` (what vLLM picks on Hopper): vLLM has no hook for
  either, so plugin off means the rebuild path; on, draftmeta's hook lets vLLM take the fused,
  captured draft loop.
* ``TRITON_MLA`` with ``override_upstream``: vLLM's own no-op hook (off) against draftmeta's
  generated hook in its place (on): both take the fused path.
* the negative control: ``FLASHMLA`` with a deliberately wrong spec injected (the scheduler
  object left unchanged between steps, so steps 2.. reuse step 1's tile schedule): its draft
  tokens must differ from plugin off.

Every case runs either with CUDA graphs for the draft loop (the default) or ``eager``, without
any (``cudagraph_mode`` ``NONE``, as ``enforce_eager``): there vLLM's fused path, where the
plugin gives it one, builds the metadata once per draft loop and runs the hook on the host
before every step, and the rebuild path builds before every step.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from draftmeta.integrations.vllm.e2e.compare import make_prompts
from draftmeta.integrations.vllm.e2e.cuda_engine import (
    CudaEngine,
    CudaEngineSettings,
    CudaRecorder,
    GroupInfo,
    LoopCounts,
    open_cuda_engine,
    prepare_cuda_environment,
)
from draftmeta.integrations.vllm.e2e.engine import SpecOverride
from draftmeta.integrations.vllm.e2e.environment import CUDA_BACKENDS, MODEL_NAMES
from draftmeta.integrations.vllm.e2e.errors import E2EUnavailable
from draftmeta.integrations.vllm.e2e.model import (
    LARGE_MODEL_CONFIG,
    MODEL_CONFIG,
    reinitialized_weights,
    write_model,
)

__all__ = [
    "CUDA_BACKENDS",
    "MODELS",
    "CudaCase",
    "CudaComparison",
    "CudaFailure",
    "CudaMatrixConfig",
    "run_cuda_matrix",
    "stale_scheduler_spec",
]

MODELS: Mapping[str, Mapping[str, Any]] = dict(zip(MODEL_NAMES, (MODEL_CONFIG,
                                                                 LARGE_MODEL_CONFIG)))
"""The models by name: the tiny DeepSeek-V3 of the CPU run, and one with DeepSeek-V3's layer
dimensions (see :data:`draftmeta.integrations.vllm.e2e.model.LARGE_MODEL_CONFIG`)."""


@attrs.frozen
class CudaCase:
    """One engine pair of the matrix.

    Attributes:
        model: a key of :data:`MODELS`.
        backend: the attention backend.
        k: draft tokens per step.
        override_upstream: plugin on replaces vLLM's own hook (``TRITON_MLA``).
        negative_control: plugin on runs :func:`stale_scheduler_spec` (draft tokens must
            differ; not timed).
        kv_cache_dtype: vLLM's ``kv_cache_dtype``.
        eager: both engines without CUDA graphs (:attr:`CudaEngineSettings.eager`).
    """

    model: str
    backend: str
    k: int
    override_upstream: bool = False
    negative_control: bool = False
    kv_cache_dtype: str = "auto"
    eager: bool = False

    @property
    def label(self) -> str:
        """``tiny FLASHMLA K=3`` (with ``override``, ``fp8``, ``eager``, ``wrong spec`` as they
        apply)."""
        extra = [x for x, on in (("override", self.override_upstream),
                                 (self.kv_cache_dtype, self.kv_cache_dtype != "auto"),
                                 ("eager", self.eager),
                                 ("wrong spec", self.negative_control)) if on]
        return " ".join([self.model, self.backend, f"K={self.k}", *extra])


@attrs.frozen
class CudaMatrixConfig:
    """What :func:`run_cuda_matrix` runs.

    Attributes:
        cases: the engine pairs, in order.
        batch_sizes: prompts per generate.
        max_tokens: tokens per prompt.
        warmups: unmeasured generates per engine and batch size (after the recorded one).
        repeats: measured generates per engine and batch size.
        seed: engine, weight and prompt seed.
    """

    cases: tuple[CudaCase, ...]
    batch_sizes: tuple[int, ...] = (1, 8)
    max_tokens: int = 256
    warmups: int = 1
    repeats: int = 5
    seed: int = 0


@attrs.frozen
class CudaComparison:
    """One case at one batch size: plugin off against plugin on.

    Attributes:
        case: the engine pair.
        batch_size: prompts per generate.
        output_tokens_identical: the recorded generates' output tokens are the same.
        draft_tokens_identical: so are the draft tokens of every ``propose``.
        differing_draft_tokens: how many draft token ids differ.
        off_tokens_per_s: plugin off, tok/s of each measured generate.
        on_tokens_per_s: plugin on, likewise.
        off_loops: plugin off, the draft loops of the last measured generate.
        on_loops: plugin on, likewise.
        off_fused: vLLM chose the fused draft loop with the plugin off.
        on_fused: and with it on.
        off_groups: the draft model's attention groups, plugin off.
        on_groups: and on.
        startup_seconds: (off, on) engine creation times.
    """

    case: CudaCase
    batch_size: int
    output_tokens_identical: bool
    draft_tokens_identical: bool
    differing_draft_tokens: int
    off_tokens_per_s: tuple[float, ...]
    on_tokens_per_s: tuple[float, ...]
    off_loops: LoopCounts
    on_loops: LoopCounts
    off_fused: bool
    on_fused: bool
    off_groups: tuple[GroupInfo, ...]
    on_groups: tuple[GroupInfo, ...]
    startup_seconds: tuple[float, float]

    @property
    def speedup(self) -> float | None:
        """Median tok/s on over median tok/s off (``None`` when not timed)."""
        if not self.off_tokens_per_s or not self.on_tokens_per_s:
            return None
        return statistics.median(self.on_tokens_per_s) / statistics.median(self.off_tokens_per_s)


def stale_scheduler_spec(*, host_bound: str = "frozen", dcp: bool = False, builder: Any = None
                         ) -> Any:
    """The negative control: FlashMLA's shipped spec with its scheduler object left
    ``Unchanged`` between draft steps (the bug draftmeta exists to prevent: a forgotten field),
    so steps 2.. replay step 1's tile schedule over grown sequence lengths."""
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.rules import Unchanged
    from draftmeta.spec import DraftSpec

    real = current_release().entry("FLASHMLA").make_spec(host_bound=host_bound,  # type: ignore[arg-type]
                                                         dcp=dcp, builder=builder)
    rules = dict(real.rules)
    for path in [p for p in rules if p.startswith("decode.scheduler_metadata")]:
        del rules[path]
    rules["decode.scheduler_metadata"] = Unchanged()
    nested = {p: c for p, c in real.nested.items() if not p.startswith("decode.scheduler")}
    return DraftSpec(real.cls, rules, name="FLASHMLA.stale_scheduler",
                     preconditions=real.preconditions, nested=nested, dtypes=real.dtypes,
                     attributes=real.attributes)


def _drafts_differ(a: list[list[list[int]]], b: list[list[list[int]]]) -> int:
    flat_a = [t for call in a for row in call for t in row]
    flat_b = [t for call in b for row in call for t in row]
    return sum(x != y for x, y in zip(flat_a, flat_b)) + abs(len(flat_a) - len(flat_b))


def _compare(case: CudaCase, off: CudaEngine, on: CudaEngine, prompts: Sequence[tuple[int, ...]],
             config: CudaMatrixConfig, recorder: CudaRecorder) -> CudaComparison:
    tokens_off, _, _, drafts_off = off.generate(prompts, config.max_tokens, recorder,
                                                recording=True)
    tokens_on, _, _, drafts_on = on.generate(prompts, config.max_tokens, recorder,
                                             recording=True)
    rates: dict[bool, list[float]] = {False: [], True: []}
    loops: dict[bool, LoopCounts] = {False: LoopCounts(), True: LoopCounts()}
    if not case.negative_control:
        for index in range(config.warmups + config.repeats):
            for engine in ((off, on) if index % 2 == 0 else (on, off)):
                tokens, seconds, counts, _ = engine.generate(prompts, config.max_tokens,
                                                             recorder, recording=False)
                plugin = engine.settings.plugin
                loops[plugin] = attrs.evolve(counts)
                if index >= config.warmups:
                    rates[plugin].append(sum(len(t) for t in tokens) / seconds)
    return CudaComparison(
        case=case,
        batch_size=len(prompts),
        output_tokens_identical=tokens_off == tokens_on,
        draft_tokens_identical=drafts_off == drafts_on,
        differing_draft_tokens=_drafts_differ(drafts_off, drafts_on),
        off_tokens_per_s=tuple(rates[False]),
        on_tokens_per_s=tuple(rates[True]),
        off_loops=loops[False],
        on_loops=loops[True],
        off_fused=off.fused,
        on_fused=on.fused,
        off_groups=off.groups,
        on_groups=on.groups,
        startup_seconds=(off.startup_seconds, on.startup_seconds),
    )


def _free_gpu() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


@attrs.frozen
class CudaFailure:
    """A case whose engines could not run (the others still do).

    Attributes:
        case: the engine pair.
        error: what failed, as vLLM or the plugin said it.
    """

    case: CudaCase
    error: str


def run_cuda_matrix(config: CudaMatrixConfig, *, workdir: Path,
                    progress: Callable[[str], None] = lambda line: None
                    ) -> tuple[list[CudaComparison], list[CudaFailure]]:
    """Run every case of ``config``; returns one comparison per case and batch size, and the
    cases that failed (an engine that could not be created, a plugin that did not install,
    an error inside vLLM), each with its error: one failing case does not stop the others.

    Raises:
        E2EUnavailable: no CUDA device, or a vLLM without the GPU model runner.
    """
    prepare_cuda_environment()
    import torch

    if not torch.cuda.is_available():
        raise E2EUnavailable("no CUDA device: the CUDA end-to-end run needs an NVIDIA GPU "
                             "(run the CPU one without --device cuda)")
    prompts = make_prompts(max(config.batch_sizes), config.seed)
    results: list[CudaComparison] = []
    failures: list[CudaFailure] = []
    with CudaRecorder() as recorder, reinitialized_weights(config.seed):
        for case in config.cases:
            try:
                results += _run_case(case, config, workdir, recorder, prompts, progress)
            except E2EUnavailable:
                raise
            except Exception as exc:  # one case's failure is reported, the others still run
                error = f"{type(exc).__name__}: {exc}"
                progress(f"{case.label}: FAILED: {error}")
                failures.append(CudaFailure(case, error))
            _free_gpu()
    return results, failures


def _run_case(case: CudaCase, config: CudaMatrixConfig, workdir: Path, recorder: CudaRecorder,
              prompts: Sequence[tuple[int, ...]], progress: Callable[[str], None]
              ) -> list[CudaComparison]:
    results: list[CudaComparison] = []
    model_dir = write_model(workdir / case.model, MODELS[case.model])
    overrides: Mapping[str, SpecOverride] | None = (
        {"FLASHMLA": stale_scheduler_spec} if case.negative_control else None)

    def settings(plugin: bool) -> CudaEngineSettings:
        return CudaEngineSettings(
            backend=case.backend, k=case.k, plugin=plugin,
            override_upstream=case.override_upstream and plugin,
            kv_cache_dtype=case.kv_cache_dtype, seed=config.seed,
            spec_overrides=overrides if plugin else None, eager=case.eager)

    progress(f"{case.label}: starting the plugin-off and plugin-on engines")
    with open_cuda_engine(model_dir, settings(False), recorder) as off, \
            open_cuda_engine(model_dir, settings(True), recorder) as on:
        progress(f"{case.label}: fused draft loop off={off.fused} on={on.fused}; "
                 f"started in {off.startup_seconds:.0f} s and {on.startup_seconds:.0f} s")
        for batch in config.batch_sizes:
            comparison = _compare(case, off, on, prompts[:batch], config, recorder)
            results.append(comparison)
            speed = (f"{statistics.median(comparison.off_tokens_per_s):.0f} vs "
                     f"{statistics.median(comparison.on_tokens_per_s):.0f} tok/s"
                     if comparison.speedup is not None else "not timed")
            progress(f"{case.label} batch {batch}: tokens identical "
                     f"{comparison.output_tokens_identical}, drafts identical "
                     f"{comparison.draft_tokens_identical} "
                     f"({comparison.differing_draft_tokens} differ); {speed}")
    return results
