"""vLLM engines with MTP, plugin off and on, measured side by side.

:func:`open_engine` creates a fresh ``vllm.LLM`` (same model folder, same seed for every
engine) and frees it on exit. :func:`measure_side_by_side` runs one prompt batch through an
engine with draftmeta's plugin off and one with it on, alternating their generates (off, on,
on, off, ...) so that load from other processes on a shared machine falls on both alike.

The plugin is installed only around what the plugin-on engine does: it is registered before
that engine is created and before each of its generates, and unregistered after each, so the
plugin-off engine always runs vLLM's own code (``DRAFTMETA_VLLM_PLUGIN=0`` keeps vLLM's plugin
loading from installing it). Registering again between generates is what a fresh process
would do; the builders' state from an earlier registration is rebuilt at draft index 1 of
every draft loop.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from draftmeta.integrations.vllm.e2e.capture import GenerateRecord, Recorder
from draftmeta.integrations.vllm.e2e.errors import E2EError

if TYPE_CHECKING:
    from draftmeta.spec import DraftSpec

__all__ = [
    "BatchRun",
    "Engine",
    "EngineSettings",
    "SpecOverride",
    "batch_run",
    "measure_side_by_side",
    "open_engine",
    "plugin_session",
]

SpecOverride = Callable[..., "DraftSpec[Any]"]
"""A spec factory that replaces the plugin's shipped spec for one builder, called like the
catalogue's ``make_spec`` (``host_bound=``, ``dcp=``, ``builder=`` keywords): the negative control's
deliberately wrong spec. See ``draftmeta.integrations.vllm.plugin.register``."""


@attrs.frozen
class EngineSettings:
    """What one engine is.

    Attributes:
        backend: vLLM's attention backend for target and draft model (``"CPU_MLA"``).
        k: draft tokens per step (``num_speculative_tokens``).
        plugin: whether draftmeta's vLLM plugin is on for this engine.
        seed: the engine's seed.
        spec_overrides: with the plugin on, specs replacing shipped ones, by builder name.
        max_model_len: the engine's context limit.
        load_format: vLLM's ``load_format`` (``"dummy"``: no weight files; ``"auto"``: the
            folder's checkpoint, vLLM's default loader).
    """

    backend: str
    k: int
    plugin: bool
    seed: int = 0
    spec_overrides: Mapping[str, SpecOverride] | None = None
    max_model_len: int = 1024
    load_format: str = "dummy"


@attrs.frozen
class Generated:
    """One ``generate`` call's results.

    Attributes:
        output_tokens: per prompt, the generated token ids.
        record: what the draft loop recorded.
        seconds: wall time of the call.
        plugin_stats: the plugin's own per-builder counts for this call (builders with a
            non-zero count only; empty with the plugin off).
    """

    output_tokens: list[list[int]]
    record: GenerateRecord
    seconds: float
    plugin_stats: dict[str, dict[str, int]]


@attrs.frozen
class BatchRun:
    """The measured generates of one prompt batch in one engine.

    Attributes:
        batch_size: prompts in the batch.
        output_tokens: per prompt, the generated token ids (first measured generate).
        first: the first measured generate's record (draft tokens, digests, timings, counts).
        seconds: wall time of each measured generate.
        refresh_seconds: host time refreshing draft metadata (draft indices >= 1) per generate.
        later_refresh_seconds: the same over draft indices >= 2 (where the plugin updates).
        index_seconds: per draft index, the median host time per generate spent there.
        deterministic: every generate (warm-ups included) produced the same output tokens,
            draft tokens and hidden-state digests as the first measured one.
        plugin_stats: the plugin's own counts for the first measured generate.
    """

    batch_size: int
    output_tokens: list[list[int]]
    first: GenerateRecord
    seconds: list[float]
    refresh_seconds: list[float]
    later_refresh_seconds: list[float]
    index_seconds: dict[int, float]
    deterministic: bool
    plugin_stats: dict[str, dict[str, int]]

    @property
    def generated_tokens(self) -> int:
        """Tokens generated per generate, over all prompts."""
        return sum(len(tokens) for tokens in self.output_tokens)


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
def plugin_session(on: bool, spec_overrides: Mapping[str, SpecOverride] | None = None
                   ) -> Iterator[Any]:
    """Draftmeta's vLLM plugin installed (``on``) or not, for the ``with`` block; yields it.

    Raises:
        E2EError: ``on`` and the plugin did not install (the message carries what it logged),
            or not ``on`` and someone else left it installed.
    """
    plugin = _plugin_module()
    env = plugin.DISABLE_ENV
    if not on:
        if plugin.installed() is not None:
            raise E2EError("draftmeta's vLLM plugin is installed although this engine runs "
                           "with it off; call plugin.unregister() first")
        os.environ[env] = "0"
        yield plugin
        return
    logger = logging.getLogger(plugin.LOGGER_NAME)
    capture = _LogCapture()
    logger.addHandler(capture)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    os.environ[env] = "1"
    # the comparison measures draftmeta's in-place path, also where it measured slower than
    # vLLM's and the plugin would leave the builder to vLLM by default
    forced = os.environ.get(plugin.FORCE_ENV)
    os.environ[plugin.FORCE_ENV] = "1"
    try:
        plugin.register(spec_overrides=dict(spec_overrides) if spec_overrides else None)
        if plugin.installed() is None:
            said = "; ".join(capture.lines) or "nothing logged"
            raise E2EError(f"draftmeta's vLLM plugin did not install (it said: {said})")
        logger.removeHandler(capture)
        logger.setLevel(previous_level)
        yield plugin
    finally:
        logger.removeHandler(capture)
        logger.setLevel(previous_level)
        plugin.unregister()
        os.environ[env] = "0"
        if forced is None:
            os.environ.pop(plugin.FORCE_ENV, None)
        else:
            os.environ[plugin.FORCE_ENV] = forced


@attrs.define
class Engine:
    """A live vLLM engine and how it was made.

    Attributes:
        settings: what it is.
        llm: the ``vllm.LLM``.
        startup_seconds: time to create it.
        plugin_builders: with the plugin on, the builders (catalogue names) the plugin updates
            in place in the older proposer.
    """

    settings: EngineSettings
    llm: Any
    startup_seconds: float
    plugin_builders: tuple[str, ...]

    def generate(self, prompts: Sequence[tuple[int, ...]], max_tokens: int,
                 recorder: Recorder, *, control: str | None = None) -> Generated:
        """Run one ``generate`` over ``prompts`` (greedy, ``max_tokens`` each, EOS ignored),
        with the plugin installed around it if this engine has it on, and the negative control
        ``control`` (:data:`~draftmeta.integrations.vllm.e2e.controls.CONTROLS`) injected if
        given."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from draftmeta.integrations.vllm.e2e.controls import injected

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        wrong = injected(control) if control is not None else contextlib.nullcontext()
        with plugin_session(self.settings.plugin, self.settings.spec_overrides) as plugin, \
                wrong:
            record = recorder.start()
            start = time.perf_counter()
            outputs = self.llm.generate(inputs, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            recorder.finish()
            stats: dict[str, dict[str, int]] = {}
            if self.settings.plugin:
                stats = {str(name): {str(k): int(v) for k, v in counts.items()}
                         for name, counts in plugin.stats().items() if any(counts.values())}
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        return Generated(tokens, record, elapsed, stats)


def _create_llm(model_dir: Path, settings: EngineSettings) -> Any:
    from vllm import LLM

    try:
        return LLM(
            model=str(model_dir),
            load_format=settings.load_format,
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            max_model_len=settings.max_model_len,
            seed=settings.seed,
            attention_config={"backend": settings.backend},
            speculative_config={
                "method": "mtp",
                "num_speculative_tokens": settings.k,
                "attention_backend": settings.backend,
            },
            # vLLM's scheduler counts accepted drafts only when it logs stats
            disable_log_stats=False,
        )
    except Exception as exc:
        raise E2EError(
            f"vLLM could not create an MTP engine with backend {settings.backend} and "
            f"K={settings.k}: {type(exc).__name__}: {exc}"
        ) from exc


@contextlib.contextmanager
def open_engine(model_dir: Path, settings: EngineSettings) -> Iterator[Engine]:
    """A fresh engine for ``settings`` (the plugin registered around its creation if on),
    shut down and freed on exit.

    Weights are whatever vLLM's dummy loader gives, unless the caller holds
    :func:`draftmeta.integrations.vllm.e2e.model.reinitialized_weights` around this.

    Raises:
        E2EError: vLLM could not create the engine, or the plugin did not install.
    """
    with plugin_session(settings.plugin, settings.spec_overrides) as plugin:
        start = time.perf_counter()
        llm = _create_llm(model_dir, settings)
        startup = time.perf_counter() - start
        builders = tuple(plugin.installed().older_proposer) if settings.plugin else ()
    try:
        yield Engine(settings, llm, startup, builders)
    finally:
        core: Any = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):
            core.shutdown()
        del llm
        gc.collect()


def _same(a: Generated, b: Generated) -> bool:
    return (a.output_tokens == b.output_tokens
            and a.record.draft_tokens == b.record.draft_tokens
            and a.record.hidden_digests == b.record.hidden_digests)


def batch_run(runs: list[Generated], warmups: int) -> BatchRun:
    """The measured generates ``runs[warmups:]`` of one batch as a :class:`BatchRun` (medians
    of their timings; ``deterministic`` compares every run with the first measured one)."""
    first = runs[warmups]
    measured = runs[warmups:]
    indices = sorted({i for g in measured for i in g.record.timings})
    index_seconds = {}
    for i in indices:
        values = sorted(g.record.timings[i].seconds if i in g.record.timings else 0.0
                        for g in measured)
        index_seconds[i] = values[len(values) // 2]
    return BatchRun(
        batch_size=len(first.output_tokens),
        output_tokens=first.output_tokens,
        first=first.record,
        seconds=[g.seconds for g in measured],
        refresh_seconds=[g.record.refresh(1).seconds for g in measured],
        later_refresh_seconds=[g.record.refresh(2).seconds for g in measured],
        index_seconds=index_seconds,
        deterministic=all(_same(g, first) for g in runs),
        plugin_stats=first.plugin_stats,
    )


def measure_side_by_side(off: Engine, on: Engine, prompts: Sequence[tuple[int, ...]], *,
                         max_tokens: int, warmups: int, repeats: int, recorder: Recorder,
                         on_generate: Callable[[str], None] | None = None
                         ) -> tuple[BatchRun, BatchRun]:
    """``warmups + repeats`` generates of ``prompts`` on each engine, alternating which goes
    first (:func:`draftmeta.noise.alternating`: generate ``i`` of both engines is pair ``i``);
    returns the (off, on) runs. ``on_generate`` is told of each generate before it runs
    (``"generate 2/5, plugin on"``).

    Raises:
        ValueError: ``repeats`` < 1, ``warmups`` < 0, or the engines are not (off, on).
    """
    if repeats < 1 or warmups < 0:
        raise ValueError(f"need repeats >= 1 and warmups >= 0, got {repeats} and {warmups}")
    if off.settings.plugin or not on.settings.plugin:
        raise ValueError("measure_side_by_side(off, on, ...) takes the plugin-off engine first "
                         "and the plugin-on engine second")
    from draftmeta.noise import alternating

    runs: dict[bool, list[Generated]] = {False: [], True: []}
    for index, engine in alternating((off, on), warmups + repeats):
        if on_generate is not None:
            which = (f"warm-up generate {index + 1}/{warmups}" if index < warmups
                     else f"generate {index - warmups + 1}/{repeats}")
            on_generate(f"{which}, plugin {'on' if engine.settings.plugin else 'off'}")
        runs[engine.settings.plugin].append(engine.generate(prompts, max_tokens, recorder))
    return batch_run(runs[False], warmups), batch_run(runs[True], warmups)
