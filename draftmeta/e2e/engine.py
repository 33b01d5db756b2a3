"""One vLLM engine with MTP, plugin off or on, over a set of prompt batches.

Each :func:`run_engine` call creates a fresh ``vllm.LLM`` (same model folder, same seed), runs
every batch of prompts through it (warm-up generates first, then the measured ones), and frees
it before returning, so the next engine starts from the same state. With ``plugin=True``
draftmeta's vLLM plugin is registered just before the engine is created and unregistered after
it is freed; with ``plugin=False`` it stays off (``DRAFTMETA_VLLM_PLUGIN=0`` keeps vLLM's own
plugin loading from installing it).
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

from draftmeta.e2e.capture import GenerateRecord, Recorder
from draftmeta.e2e.errors import E2EError
from draftmeta.e2e.model import reinitialized_weights

if TYPE_CHECKING:
    from draftmeta.spec import DraftSpec

__all__ = [
    "BatchRun",
    "EngineRun",
    "EngineSettings",
    "SpecFactory",
    "plugin_installed",
    "run_engine",
]

SpecFactory = Callable[[str, Any], "DraftSpec[Any]"]
"""``(policy, builder) -> DraftSpec``: a spec that replaces the plugin's shipped one for a
builder (the negative control's deliberately wrong spec)."""


@attrs.frozen
class EngineSettings:
    """What one engine runs.

    Attributes:
        backend: vLLM's attention backend for target and draft model (``"CPU_MLA"``).
        k: draft tokens per step (``num_speculative_tokens``).
        plugin: whether draftmeta's vLLM plugin is on.
        batches: prompt batches, each a tuple of prompts (token-id tuples).
        max_tokens: tokens generated per prompt.
        warmups: unmeasured generates per batch before the measured ones.
        repeats: measured generates per batch.
        seed: the engine's seed and the weight re-initialisation's.
        spec_factories: with the plugin on, specs replacing shipped ones, by builder name.
        max_model_len: the engine's context limit.
    """

    backend: str
    k: int
    plugin: bool
    batches: tuple[tuple[tuple[int, ...], ...], ...]
    max_tokens: int = 64
    warmups: int = 1
    repeats: int = 5
    seed: int = 0
    spec_factories: Mapping[str, SpecFactory] | None = None
    max_model_len: int = 1024


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
        deterministic: every measured generate (and the warm-ups) produced the same output
            tokens, draft tokens and hidden-state digests as the first measured one.
        plugin_stats: the plugin's own per-builder counts for the first measured generate
            (empty with the plugin off).
    """

    batch_size: int
    output_tokens: list[list[int]]
    first: GenerateRecord
    seconds: list[float]
    refresh_seconds: list[float]
    later_refresh_seconds: list[float]
    deterministic: bool
    plugin_stats: dict[str, dict[str, int]]

    @property
    def generated_tokens(self) -> int:
        """Tokens generated per generate, over all prompts."""
        return sum(len(tokens) for tokens in self.output_tokens)


@attrs.frozen
class EngineRun:
    """One engine's results.

    Attributes:
        settings: what it ran.
        batches: one :class:`BatchRun` per prompt batch, in order.
        startup_seconds: time to create the engine.
        plugin_builders: with the plugin on, the builder classes it patched for the older
            proposer.
    """

    settings: EngineSettings
    batches: list[BatchRun]
    startup_seconds: float
    plugin_builders: tuple[str, ...]


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _plugin_module() -> Any:
    from draftmeta.integrations.vllm import plugin

    return plugin


def plugin_installed() -> bool:
    """Whether draftmeta's vLLM plugin is installed in this process right now."""
    return _plugin_module().installed() is not None


@contextlib.contextmanager
def _plugin(on: bool, spec_factories: Mapping[str, SpecFactory] | None) -> Iterator[Any]:
    plugin = _plugin_module()
    env = plugin.DISABLE_ENV
    if not on:
        if plugin.installed() is not None:
            raise E2EError("draftmeta's vLLM plugin is installed although this engine runs "
                           "with it off; call plugin.unregister() first")
        os.environ[env] = "0"
        yield plugin
        return
    logger = logging.getLogger("draftmeta.vllm")
    capture = _LogCapture()
    logger.addHandler(capture)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    os.environ[env] = "1"
    try:
        if spec_factories:
            plugin.register(spec_factories=dict(spec_factories))
        else:
            plugin.register()
        if plugin.installed() is None:
            said = "; ".join(capture.lines) or "nothing logged"
            raise E2EError(f"draftmeta's vLLM plugin did not install (it said: {said})")
        yield plugin
    finally:
        logger.removeHandler(capture)
        logger.setLevel(previous_level)
        plugin.unregister()
        os.environ[env] = "0"


def _plugin_stats(plugin: Any) -> dict[str, dict[str, int]]:
    stats = getattr(plugin, "stats", None)
    if stats is None or plugin.installed() is None:
        return {}
    return {str(k): {str(a): int(b) for a, b in v.items()} for k, v in stats().items()}


def _reset_plugin_stats(plugin: Any) -> None:
    reset = getattr(plugin, "reset_stats", None)
    if reset is not None and plugin.installed() is not None:
        reset()


def _create_llm(model_dir: Path, settings: EngineSettings) -> Any:
    from vllm import LLM

    try:
        return LLM(
            model=str(model_dir),
            load_format="dummy",
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
            disable_log_stats=True,
        )
    except Exception as exc:
        raise E2EError(
            f"vLLM could not create an MTP engine with backend {settings.backend} and "
            f"K={settings.k}: {type(exc).__name__}: {exc}"
        ) from exc


def _free(llm: Any) -> None:
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        with contextlib.suppress(Exception):
            shutdown()


def _same(a: GenerateRecord, b: GenerateRecord) -> bool:
    return a.draft_tokens == b.draft_tokens and a.hidden_digests == b.hidden_digests


def _run_batch(llm: Any, recorder: Recorder, plugin: Any, prompts: Sequence[tuple[int, ...]],
               settings: EngineSettings) -> BatchRun:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=settings.max_tokens, ignore_eos=True)
    inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    seconds: list[float] = []
    refresh: list[float] = []
    later: list[float] = []
    records: list[tuple[list[list[int]], GenerateRecord]] = []
    stats: dict[str, dict[str, int]] = {}
    for index in range(settings.warmups + settings.repeats):
        measured = index >= settings.warmups
        record = recorder.start()
        _reset_plugin_stats(plugin)
        start = time.perf_counter()
        outputs = llm.generate(inputs, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        records.append((tokens, record))
        if not measured:
            continue
        if len(seconds) == 0:
            stats = _plugin_stats(plugin)
        seconds.append(elapsed)
        refresh.append(record.refresh(1).seconds)
        later.append(record.refresh(2).seconds)
    first_tokens, first = records[settings.warmups]
    deterministic = all(t == first_tokens and _same(r, first) for t, r in records)
    return BatchRun(len(prompts), first_tokens, first, seconds, refresh, later, deterministic,
                    stats)


def run_engine(model_dir: Path, settings: EngineSettings) -> EngineRun:
    """Create a fresh engine for ``settings``, run its batches, free it; see the module docs.

    Raises:
        E2EError: the engine could not be created, or the plugin was asked for and did not
            install (the message carries what the plugin logged).
    """
    if settings.repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {settings.repeats}")
    with _plugin(settings.plugin, settings.spec_factories) as plugin, \
            reinitialized_weights(settings.seed), Recorder() as recorder:
        start = time.perf_counter()
        llm = _create_llm(model_dir, settings)
        startup = time.perf_counter() - start
        try:
            builders = tuple(plugin.installed().v1) if settings.plugin else ()
            batches = [_run_batch(llm, recorder, plugin, prompts, settings)
                       for prompts in settings.batches]
        finally:
            _free(llm)
            del llm
            gc.collect()
    return EngineRun(settings, batches, startup, builders)
