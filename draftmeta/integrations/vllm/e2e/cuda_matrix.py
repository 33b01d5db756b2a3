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

from draftmeta.integrations.vllm.e2e.acceptance import Acceptance
from draftmeta.integrations.vllm.e2e.compare import (
    TRAINED_MAX_MODEL_LEN,
    draft_token_difference,
    hidden_max_abs_difference,
    model_prompts,
)
from draftmeta.integrations.vllm.e2e.cuda_engine import (
    CudaEngine,
    CudaEngineSettings,
    CudaGenerated,
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
    V2_LITE_CONFIG,
    V3_RANK_CONFIG,
    model_folder,
    reinitialized_weights,
)

__all__ = [
    "CUDA_BACKENDS",
    "MODELS",
    "SCHEDULED_BACKENDS",
    "CudaCase",
    "CudaComparison",
    "CudaFailure",
    "CudaMatrixConfig",
    "CudaModel",
    "run_cuda_matrix",
    "stale_scheduler_spec",
]

ENGINE_HEADROOM_GIB = 8.0
"""GPU memory an engine needs beside its weights here (KV cache for 1,024 tokens per request,
activations, the profiling pass, CUDA graphs), GiB."""


@attrs.frozen
class CudaModel:
    """A model of the CUDA run and how much GPU memory its weights take.

    Attributes:
        config: its ``config.json``; ``None`` for the trained model, whose checkpoint holds
            its own.
        weights_gib: its weights (target and MTP layer) on the GPU, GiB.
        max_model_len: its engines' context limit.
    """

    config: Mapping[str, Any] | None
    weights_gib: float
    max_model_len: int = 1024

    def placement(self, total_gib: float) -> tuple[bool, float]:
        """How an engine pair of this model shares a GPU of ``total_gib``: whether both
        engines fit at once (their generates then alternate; else each is created, measured
        and freed before the other), and the share of GPU memory each may take.

        Raises:
            E2EUnavailable: one engine does not fit this GPU.
        """
        need = self.weights_gib + ENGINE_HEADROOM_GIB
        if 2 * need <= 0.9 * total_gib:
            return True, round(max(0.2, need / total_gib), 3)
        if need <= 0.92 * total_gib:
            return False, 0.92
        raise E2EUnavailable(
            f"this model needs about {need:.0f} GiB of GPU memory for one engine "
            f"({self.weights_gib:.0f} GiB of weights); this GPU has {total_gib:.0f} GiB "
            "(an H200 has 139 GiB)")


MODELS: Mapping[str, CudaModel] = dict(zip(MODEL_NAMES, (
    CudaModel(MODEL_CONFIG, weights_gib=0.1),
    CudaModel(LARGE_MODEL_CONFIG, weights_gib=5.0),
    CudaModel(V3_RANK_CONFIG, weights_gib=81.0),
    CudaModel(V2_LITE_CONFIG, weights_gib=31.0),
    CudaModel(None, weights_gib=0.1, max_model_len=TRAINED_MAX_MODEL_LEN),
)))
"""The models by name: the tiny DeepSeek-V3 of the CPU run; one with DeepSeek-V3's layer
dimensions and 3 layers (:data:`~draftmeta.integrations.vllm.e2e.model.LARGE_MODEL_CONFIG`,
2.5 billion parameters in bf16); one rank of DeepSeek-V3 under TP8
(:data:`~draftmeta.integrations.vllm.e2e.model.V3_RANK_CONFIG`, about 86 billion parameters in
FP8: one engine at a time on an H200, too large for an H100); a whole Moonlight-shaped MLA MoE
(:data:`~draftmeta.integrations.vllm.e2e.model.V2_LITE_CONFIG`, about 16.5 billion parameters in
bf16: both engines at once on an H200); the trained model
(:mod:`draftmeta.integrations.vllm.e2e.trained`: its checkpoint, vLLM's default loader, its task's
prompts)."""


@attrs.frozen
class CudaCase:
    """One engine pair of the matrix.

    Attributes:
        model: a key of :data:`MODELS`.
        backend: the attention backend.
        k: draft tokens per step.
        override_upstream: plugin on replaces vLLM's own hook (``TRITON_MLA``).
        negative_control: plugin on runs :func:`stale_scheduler_spec` of ``backend`` (its
            draft tokens must differ; not timed).
        kv_cache_dtype: vLLM's ``kv_cache_dtype``.
        eager: both engines without CUDA graphs (:attr:`CudaEngineSettings.eager`).
        limit: plugin on with a hook that does no metadata work
            (:attr:`CudaEngineSettings.empty_hook`): the limit of what the plugin's captured
            loop can gain, timed only (its tokens may differ and are no result).
    """

    model: str
    backend: str
    k: int
    override_upstream: bool = False
    negative_control: bool = False
    kv_cache_dtype: str = "auto"
    eager: bool = False
    limit: bool = False

    @property
    def label(self) -> str:
        """``tiny FLASHMLA K=3`` (with ``override``, ``fp8``, ``eager``, ``wrong spec`` as they
        apply)."""
        extra = [x for x, on in (("override", self.override_upstream),
                                 (self.kv_cache_dtype, self.kv_cache_dtype != "auto"),
                                 ("eager", self.eager),
                                 ("wrong spec", self.negative_control),
                                 ("limit: empty hook", self.limit)) if on]
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
        pairs: fresh engine pairs per case, the order of creation swapped from one pair to
            the next (plugin off first in the first pair).
    """

    cases: tuple[CudaCase, ...]
    batch_sizes: tuple[int, ...] = (1, 8)
    max_tokens: int = 256
    warmups: int = 1
    repeats: int = 5
    seed: int = 0
    pairs: int = 1


@attrs.frozen
class CudaComparison:
    """One case at one batch size: plugin off against plugin on, over every engine pair.

    Attributes:
        case: the engine pair.
        batch_size: prompts per generate.
        output_tokens_identical: the recorded generates' output tokens are the same, off and
            on, in every pair.
        draft_tokens_identical: so are the draft tokens of every ``propose``.
        differing_draft_tokens: how many draft token ids differ (over every pair).
        draft_tokens_compared: how many draft token ids were compared (over every pair; per
            generate the longer one's count: a draft only one made counts as differing).
        hidden_max_abs_difference: the largest absolute difference between the draft hidden
            states the recorded generates' draft loops ended with (``inf`` where their shapes
            or counts differ).
        acceptance_identical: vLLM accepted as many drafts at every position in every
            recorded generate.
        off_tokens_per_s: plugin off, tok/s of each measured generate (pair by pair).
        on_tokens_per_s: plugin on, likewise.
        off_seconds: plugin off, the wall time of each measured generate.
        on_seconds: plugin on, likewise.
        pair_speedups: per engine pair, its median tok/s on over its median tok/s off.
        off_loops: plugin off, what the draft loops of each measured generate did.
        on_loops: plugin on, likewise.
        off_acceptance: plugin off, vLLM's acceptance counts of each measured generate.
        on_acceptance: plugin on, likewise.
        recorded_acceptance: (off, on): vLLM's acceptance counts of the recorded generates.
        off_fused: vLLM chose the fused draft loop with the plugin off.
        on_fused: and with it on.
        off_groups: the draft model's attention groups, plugin off.
        on_groups: and on.
        startup_seconds: per pair, the (off, on) engines' creation times.
    """

    case: CudaCase
    batch_size: int
    output_tokens_identical: bool
    draft_tokens_identical: bool
    differing_draft_tokens: int
    draft_tokens_compared: int
    hidden_max_abs_difference: float
    acceptance_identical: bool
    off_tokens_per_s: tuple[float, ...]
    on_tokens_per_s: tuple[float, ...]
    off_seconds: tuple[float, ...]
    on_seconds: tuple[float, ...]
    pair_speedups: tuple[float, ...]
    off_loops: tuple[LoopCounts, ...]
    on_loops: tuple[LoopCounts, ...]
    off_acceptance: tuple[Acceptance, ...]
    on_acceptance: tuple[Acceptance, ...]
    recorded_acceptance: tuple[Acceptance, Acceptance]
    off_fused: bool
    on_fused: bool
    off_groups: tuple[GroupInfo, ...]
    on_groups: tuple[GroupInfo, ...]
    startup_seconds: tuple[tuple[float, float], ...]

    @property
    def speedup(self) -> float | None:
        """The median of the pairs' tok/s ratios (one pair: its median on over its median
        off); ``None`` when not timed."""
        if not self.pair_speedups:
            return None
        return statistics.median(self.pair_speedups)


SCHEDULED_BACKENDS = ("FLASHMLA", "FLASH_ATTN_MLA")
"""The backends whose metadata holds a kernel schedule draftmeta refreshes every draft step:
FlashMLA's scheduler object and FA3's ahead-of-time scheduler metadata (the negative controls
leave it stale)."""


def stale_scheduler_spec(backend: str = "FLASHMLA") -> SpecOverride:
    """The negative control for ``backend`` (one of :data:`SCHEDULED_BACKENDS`): its shipped
    spec with the decode part's scheduler left ``Unchanged`` between draft steps (the bug
    draftmeta exists to prevent: a forgotten field). FlashMLA's steps 2.. then replay step 1's
    tile schedule over grown sequence lengths; FA3's captured draft steps read whatever schedule
    the buffer held before the loop.

    Raises:
        ValueError: ``backend`` has no scheduler draftmeta refreshes.
    """
    if backend not in SCHEDULED_BACKENDS:
        raise ValueError(f"{backend} has no kernel schedule to leave stale; the negative "
                         f"control is for {' and '.join(SCHEDULED_BACKENDS)}")

    def spec(*, host_bound: str = "frozen", dcp: bool = False, builder: Any = None) -> Any:
        from draftmeta.integrations.vllm.catalogue import current_release
        from draftmeta.rules import Unchanged
        from draftmeta.spec import DraftSpec

        real = current_release().entry(backend).make_spec(host_bound=host_bound,  # type: ignore[arg-type]
                                                          dcp=dcp, builder=builder)
        rules = dict(real.rules)
        for path in [p for p in rules if p.startswith("decode.scheduler_metadata")]:
            del rules[path]
        rules["decode.scheduler_metadata"] = Unchanged()
        nested = {p: c for p, c in real.nested.items()
                  if not p.startswith("decode.scheduler")}
        return DraftSpec(real.cls, rules, name=f"{backend}.stale_scheduler",
                         preconditions=real.preconditions, nested=nested, dtypes=real.dtypes,
                         attributes=real.attributes)

    return spec


@attrs.define
class _Side:
    """What one engine of a pair gave at one batch size."""

    recorded: CudaGenerated
    measured: list[CudaGenerated] = attrs.field(factory=list)

    @property
    def median_rate(self) -> float:
        return statistics.median(g.tokens_per_s for g in self.measured)


@attrs.define
class _Pair:
    """One engine pair's results at one batch size, and its engines' start-up times."""

    off: _Side
    on: _Side
    startup: tuple[float, float]


def _measure_together(off: CudaEngine, on: CudaEngine, prompts: Sequence[tuple[int, ...]],
                      config: CudaMatrixConfig, recorder: CudaRecorder, timed: bool
                      ) -> tuple[_Side, _Side]:
    sides = {False: _Side(off.generate(prompts, config.max_tokens, recorder, recording=True)),
             True: _Side(on.generate(prompts, config.max_tokens, recorder, recording=True))}
    if timed:
        for index in range(config.warmups + config.repeats):
            for engine in ((off, on) if index % 2 == 0 else (on, off)):
                generated = engine.generate(prompts, config.max_tokens, recorder,
                                            recording=False)
                if index >= config.warmups:
                    sides[engine.settings.plugin].measured.append(generated)
    return sides[False], sides[True]


def _measure_alone(engine: CudaEngine, prompts: Sequence[tuple[int, ...]],
                   config: CudaMatrixConfig, recorder: CudaRecorder, timed: bool) -> _Side:
    side = _Side(engine.generate(prompts, config.max_tokens, recorder, recording=True))
    if timed:
        for index in range(config.warmups + config.repeats):
            generated = engine.generate(prompts, config.max_tokens, recorder, recording=False)
            if index >= config.warmups:
                side.measured.append(generated)
    return side


@attrs.frozen
class _Configured:
    """What vLLM configured in one engine (kept after the engine, and its GPU memory, are
    freed)."""

    fused: bool
    groups: tuple[GroupInfo, ...]

    @classmethod
    def of(cls, engine: CudaEngine) -> _Configured:
        return cls(engine.fused, engine.groups)


def _comparison(case: CudaCase, batch: int, pairs: list[_Pair], off: _Configured,
                on: _Configured) -> CudaComparison:
    reference = pairs[0].off.recorded
    offs = [p.off for p in pairs]
    ons = [p.on for p in pairs]
    recorded_off = [s.recorded for s in offs]
    recorded_on = [s.recorded for s in ons]
    # every pair's plugin-on engine against the first plugin-off engine, and every later
    # plugin-off engine against the first (they must all agree)
    against = recorded_on + recorded_off[1:]
    timed = all(s.measured for s in offs + ons)
    differences = [draft_token_difference(reference.draft_tokens, g.draft_tokens)
                   for g in against]
    return CudaComparison(
        case=case,
        batch_size=batch,
        output_tokens_identical=all(g.output_tokens == reference.output_tokens
                                    for g in against),
        draft_tokens_identical=all(g.draft_tokens == reference.draft_tokens for g in against),
        differing_draft_tokens=sum(differing for differing, _ in differences),
        draft_tokens_compared=sum(compared for _, compared in differences),
        hidden_max_abs_difference=max((hidden_max_abs_difference(reference.draft_hidden,
                                                                 g.draft_hidden)
                                       for g in against), default=0.0),
        acceptance_identical=all(g.acceptance == reference.acceptance for g in against),
        off_tokens_per_s=tuple(g.tokens_per_s for s in offs for g in s.measured),
        on_tokens_per_s=tuple(g.tokens_per_s for s in ons for g in s.measured),
        off_seconds=tuple(g.seconds for s in offs for g in s.measured),
        on_seconds=tuple(g.seconds for s in ons for g in s.measured),
        pair_speedups=tuple(p.on.median_rate / p.off.median_rate for p in pairs) if timed
        else (),
        off_loops=tuple(g.loops for s in offs for g in s.measured),
        on_loops=tuple(g.loops for s in ons for g in s.measured),
        off_acceptance=tuple(g.acceptance for s in offs for g in s.measured),
        on_acceptance=tuple(g.acceptance for s in ons for g in s.measured),
        recorded_acceptance=(reference.acceptance, pairs[0].on.recorded.acceptance),
        off_fused=off.fused,
        on_fused=on.fused,
        off_groups=off.groups,
        on_groups=on.groups,
        startup_seconds=tuple(p.startup for p in pairs),
    )


def _gpu_gib() -> float:
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory) / 2**30


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
                    progress: Callable[[str], None] = lambda line: None,
                    checkpoint: Callable[[list[CudaComparison], list[CudaFailure]], None]
                    | None = None
                    ) -> tuple[list[CudaComparison], list[CudaFailure]]:
    """Run every case of ``config``; returns one comparison per case and batch size, and the
    cases that failed (an engine that could not be created, a plugin that did not install,
    an error inside vLLM), each with its error: one failing case does not stop the others.

    ``checkpoint``, if given, is called after every engine pair with everything measured so far
    (the running case's comparisons over its finished pairs included), so that a run stopped
    from outside keeps what it measured.

    Raises:
        E2EUnavailable: no CUDA device, or a vLLM without the GPU model runner.
    """
    prepare_cuda_environment()
    import torch

    if not torch.cuda.is_available():
        raise E2EUnavailable("no CUDA device: the CUDA end-to-end run needs an NVIDIA GPU "
                             "(run the CPU one without --device cuda)")
    results: list[CudaComparison] = []
    failures: list[CudaFailure] = []
    with CudaRecorder() as recorder, reinitialized_weights(config.seed):
        def pair_done(partial: list[CudaComparison]) -> None:
            if checkpoint is not None:
                checkpoint(results + partial, failures)

        for case in config.cases:
            try:
                results += _run_case(case, config, workdir, recorder, progress, pair_done)
            except Exception as exc:  # one case's failure is reported, the others still run
                error = f"{type(exc).__name__}: {exc}"
                progress(f"{case.label}: FAILED: {error}")
                failures.append(CudaFailure(case, error))
            _free_gpu()
    return results, failures


def _run_case(case: CudaCase, config: CudaMatrixConfig, workdir: Path, recorder: CudaRecorder,
              progress: Callable[[str], None],
              pair_done: Callable[[list[CudaComparison]], None] = lambda partial: None
              ) -> list[CudaComparison]:
    model = MODELS[case.model]
    together, utilization = model.placement(_gpu_gib())
    model_dir, load_format = model_folder(case.model, workdir, model.config)
    prompts = model_prompts(case.model, max(config.batch_sizes), config.seed)
    overrides: Mapping[str, SpecOverride] | None = (
        {case.backend: stale_scheduler_spec(case.backend)} if case.negative_control else None)
    timed = not case.negative_control
    max_batch = max(config.batch_sizes)

    def settings(plugin: bool) -> CudaEngineSettings:
        return CudaEngineSettings(
            backend=case.backend, k=case.k, plugin=plugin,
            override_upstream=case.override_upstream and plugin,
            kv_cache_dtype=case.kv_cache_dtype, seed=config.seed,
            spec_overrides=overrides if plugin else None, eager=case.eager,
            empty_hook=case.limit and plugin,
            max_num_seqs=max(16, max_batch), max_model_len=model.max_model_len,
            gpu_memory_utilization=utilization, load_format=load_format)

    def report(batch: int, pair: _Pair, number: int) -> None:
        speed = (f"{pair.off.median_rate:.0f} vs {pair.on.median_rate:.0f} tok/s"
                 if pair.off.measured else "not timed")
        same = (pair.off.recorded.output_tokens == pair.on.recorded.output_tokens,
                pair.off.recorded.draft_tokens == pair.on.recorded.draft_tokens)
        differing, compared = draft_token_difference(pair.off.recorded.draft_tokens,
                                                     pair.on.recorded.draft_tokens)
        progress(f"{case.label} batch {batch}, pair {number}: tokens identical {same[0]}, "
                 f"drafts identical {same[1]} ({differing} of {compared} differ); {speed}")

    per_batch: dict[int, list[_Pair]] = {b: [] for b in config.batch_sizes}
    configured: dict[bool, _Configured] = {}
    for number in range(1, config.pairs + 1):
        order = (False, True) if number % 2 == 1 else (True, False)
        progress(f"{case.label}: pair {number} of {config.pairs}, engines "
                 f"{' then '.join('on' if o else 'off' for o in order)}"
                 f"{'' if together else ', one at a time'}")
        if together:
            with open_cuda_engine(model_dir, settings(order[0]), recorder) as first, \
                    open_cuda_engine(model_dir, settings(order[1]), recorder) as second:
                off, on = (first, second) if not order[0] else (second, first)
                configured = {False: _Configured.of(off), True: _Configured.of(on)}
                for batch in config.batch_sizes:
                    sides = _measure_together(off, on, prompts[:batch], config, recorder, timed)
                    pair = _Pair(*sides, (off.startup_seconds, on.startup_seconds))
                    per_batch[batch].append(pair)
                    report(batch, pair, number)
        else:
            measured: dict[bool, dict[int, _Side]] = {}
            startup: dict[bool, float] = {}
            for plugin in order:
                with open_cuda_engine(model_dir, settings(plugin), recorder) as engine:
                    configured[plugin] = _Configured.of(engine)
                    startup[plugin] = engine.startup_seconds
                    progress(f"{case.label}: plugin {'on' if plugin else 'off'} engine started "
                             f"in {engine.startup_seconds:.0f} s (fused draft loop "
                             f"{engine.fused})")
                    measured[plugin] = {b: _measure_alone(engine, prompts[:b], config,
                                                          recorder, timed)
                                        for b in config.batch_sizes}
                _free_gpu()
            for batch in config.batch_sizes:
                pair = _Pair(measured[False][batch], measured[True][batch],
                             (startup[False], startup[True]))
                per_batch[batch].append(pair)
                report(batch, pair, number)
        _free_gpu()
        pair_done([_comparison(case, batch, pairs, configured[False], configured[True])
                   for batch, pairs in per_batch.items()])
    return [_comparison(case, batch, pairs, configured[False], configured[True])
            for batch, pairs in per_batch.items()]
