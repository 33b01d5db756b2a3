"""vLLM 0.34's GPU model runner with MTP: engines, and what their draft loops did.

The GPU runner's draft loop (``vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py``)
takes the *fused* path when every attention group's builder sets
``supports_draft_decode_metadata_update``: for a captured batch size it replays one CUDA graph
holding all K - 1 draft steps, with each group's ``update_draft_decode_metadata`` recorded in it
at capture; otherwise it rebuilds attention metadata on the host before every draft step
(the *rebuild* path). :class:`CudaRecorder` observes, from outside vLLM and the plugin alike:

* which path each draft loop took, and whether the fused one replayed its graph;
* the draft token ids every ``propose`` returned (only while :attr:`CudaRecorder.recording`:
  reading them back waits for the GPU, so timed generates do not record);
* how often, and for how long on the host, ``update_draft_decode_metadata`` ran outside
  capture (the fused path's eager form, for batch sizes without a graph);
* per engine, each attention group's backend, builder class, whether the builder has the hook
  and whose hook it is (vLLM's or draftmeta's).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from draftmeta.integrations.patching import Patches
from draftmeta.integrations.vllm.e2e.acceptance import Acceptance, AcceptanceCounter
from draftmeta.integrations.vllm.e2e.engine import SpecOverride, plugin_session
from draftmeta.integrations.vllm.e2e.errors import E2EError, E2EUnavailable

__all__ = [
    "CUDA_ENVIRONMENT",
    "CudaEngine",
    "CudaEngineSettings",
    "CudaGenerated",
    "CudaRecorder",
    "GroupInfo",
    "LoopCounts",
    "open_cuda_engine",
    "prepare_cuda_environment",
]

CUDA_ENVIRONMENT: Mapping[str, str] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "DRAFTMETA_VLLM_PLUGIN": "0",
    "HF_HUB_OFFLINE": "1",
}
"""Set before vLLM is imported: the engine runs in this process (so the recorder and the plugin
see its classes) and vLLM's own plugin loading leaves draftmeta off (the run installs it around
the engines that use it)."""

_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator"
_PROPOSER = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"


def prepare_cuda_environment() -> None:
    """Set :data:`CUDA_ENVIRONMENT` in ``os.environ`` (before vLLM is imported)."""
    os.environ.update(CUDA_ENVIRONMENT)


@attrs.frozen
class CudaEngineSettings:
    """What one GPU engine is.

    Attributes:
        backend: vLLM's attention backend for target and draft model (``"FLASH_ATTN_MLA"``).
        k: draft tokens per step (``num_speculative_tokens``).
        plugin: whether draftmeta's plugin is installed for this engine.
        override_upstream: with the plugin on, also replace vLLM's own hook
            (``DRAFTMETA_VLLM_OVERRIDE_UPSTREAM=1``).
        kv_cache_dtype: vLLM's ``kv_cache_dtype`` (``"auto"``: the model's, bf16).
        seed: the engine's seed.
        spec_overrides: with the plugin on, specs replacing shipped ones (the negative control).
        max_model_len: the context limit.
        max_num_seqs: the most requests per batch (captured batch sizes follow from it).
        gpu_memory_utilization: the share of GPU memory this engine may take (two engines are
            alive at once).
        eager: no CUDA graphs (``cudagraph_mode`` ``NONE``, what ``enforce_eager`` gives):
            every draft loop runs on the host, step by step; else ``FULL_DECODE_ONLY`` (every
            batch size up to ``max_num_seqs`` captured).
        load_format: vLLM's ``load_format`` (``"dummy"``, or ``"auto"`` for a checkpoint).
        empty_hook: with the plugin on, every ``update_draft_decode_metadata`` call does
            nothing (at capture and outside it): the limit of what an in-place update can cost,
            for timing only (its metadata goes stale, so its tokens may differ).
    """

    backend: str
    k: int
    plugin: bool
    override_upstream: bool = False
    kv_cache_dtype: str = "auto"
    seed: int = 0
    spec_overrides: Mapping[str, SpecOverride] | None = None
    max_model_len: int = 1024
    max_num_seqs: int = 16
    gpu_memory_utilization: float = 0.2
    eager: bool = False
    load_format: str = "dummy"
    empty_hook: bool = False

    @property
    def cudagraph_mode(self) -> str:
        """vLLM's ``compilation_config["cudagraph_mode"]`` for this engine."""
        return "NONE" if self.eager else "FULL_DECODE_ONLY"


@attrs.frozen
class GroupInfo:
    """One attention group of an engine's draft model, as vLLM configured it.

    Attributes:
        backend: vLLM's backend name.
        builder: the metadata builder's class name.
        supports_update: the builder's ``supports_draft_decode_metadata_update``.
        hook_owner: whose ``update_draft_decode_metadata`` the builder has: ``draftmeta``,
            ``vllm`` (its own) or ``none`` (the base class's, which raises).
    """

    backend: str
    builder: str
    supports_update: bool
    hook_owner: str


@attrs.define
class LoopCounts:
    """What the draft loops of one ``generate`` did.

    Attributes:
        fused_replays: draft loops that replayed one captured graph of all K - 1 steps.
        fused_eager: draft loops on the fused path without a graph (the hook ran on the host
            at every step).
        rebuilt: draft loops that rebuilt metadata on the host before each step.
        hook_calls: ``update_draft_decode_metadata`` calls (per attention group) outside
            capture.
        hook_seconds: host time in those calls.
        build_calls: builds of the draft steps' attention metadata (all groups at once) in
            draft loops that ran on the host: one per step on the rebuild path, one per loop
            (before its first step) on the fused path without a graph.
        build_seconds: host time in those builds.
    """

    fused_replays: int = 0
    fused_eager: int = 0
    rebuilt: int = 0
    hook_calls: int = 0
    hook_seconds: float = 0.0
    build_calls: int = 0
    build_seconds: float = 0.0


def _hook_owner(builder: Any) -> str:
    method = getattr(type(builder), "update_draft_decode_metadata", None)
    module = getattr(method, "__module__", "") or ""
    if module.startswith("draftmeta."):
        return "draftmeta"
    owner = getattr(method, "__qualname__", "").split(".")[0]
    return "none" if owner in ("AttentionMetadataBuilder", "") else "vllm"


@attrs.define
class CudaRecorder:
    """Observes vLLM's GPU draft loop while active (a context manager around the engines).

    Attributes:
        recording: record draft token ids (waits for the GPU at every ``propose``).
        draft_tokens: per ``propose`` since :meth:`start`, the draft token ids
            (``[request][draft step]``), while :attr:`recording`.
        draft_hidden: per ``propose`` since :meth:`start`, the hidden states its last draft
            step left for the next (the speculator's ``hidden_states``, float32 on the CPU),
            while :attr:`recording`: the captured loop's steps cannot be read one by one, this
            is what the whole chain computed.
        counts: the draft loops since :meth:`start`.
        groups: per speculator configured so far, in order, its attention groups.
        fused: per speculator configured so far, whether vLLM chose the fused path.
        acceptance: vLLM's spec-decode counts since :meth:`start`.
        empty_hook: ``update_draft_decode_metadata`` calls do nothing while set (the limit
            row's engine sets it around its creation and its generates).
    """

    recording: bool = False
    draft_tokens: list[list[list[int]]] = attrs.field(factory=list)
    draft_hidden: list[Any] = attrs.field(factory=list)
    counts: LoopCounts = attrs.field(factory=LoopCounts)
    groups: list[tuple[GroupInfo, ...]] = attrs.field(factory=list)
    fused: list[bool] = attrs.field(factory=list)
    acceptance: AcceptanceCounter = attrs.field(factory=AcceptanceCounter)
    empty_hook: bool = False
    _patches: Patches = attrs.field(factory=Patches, init=False)
    _capturing: bool = attrs.field(default=False, init=False)
    _in_loop: bool = attrs.field(default=False, init=False)

    def start(self, *, recording: bool) -> None:
        """Begin a new ``generate``: clear draft tokens, loop and acceptance counts."""
        self.recording = recording
        self.draft_tokens = []
        self.draft_hidden = []
        self.counts = LoopCounts()
        self.acceptance.start()

    def __enter__(self) -> CudaRecorder:
        import importlib

        try:
            speculator = importlib.import_module(_SPECULATOR).AutoRegressiveSpeculator
            proposer = importlib.import_module(_PROPOSER).TargetDependentARSpeculator
            from vllm.v1.worker.utils import AttentionGroup
        except (ImportError, AttributeError) as exc:
            raise E2EUnavailable(
                f"this vLLM has no GPU model runner draft loop draftmeta knows ({exc}); the "
                "CUDA end-to-end run is written against vLLM 0.34: pip install -e "
                "'.[vllm,bench]' vllm==0.33.0, then pip install --no-deps vllm==0.34.0 "
                "(docs/install.md, vLLM 0.34)"
            ) from exc
        p = self._patches
        p.replace(speculator, "_configure_decode_metadata_update",
                  self._wrap_configure(speculator._configure_decode_metadata_update))
        p.replace(speculator, "_run_fused_multi_step_decode",
                  self._wrap_fused(speculator._run_fused_multi_step_decode))
        p.replace(speculator, "_multi_step_decode",
                  self._wrap_rebuild(speculator._multi_step_decode))
        p.replace(speculator, "_build_uniform_attn_metadata",
                  self._wrap_build(speculator._build_uniform_attn_metadata))
        p.replace(speculator, "capture", self._wrap_capture(speculator.capture))
        p.replace(proposer, "propose", self._wrap_propose(proposer.propose))
        p.replace(AttentionGroup, "update_draft_decode_metadata",
                  self._wrap_hook(AttentionGroup.update_draft_decode_metadata))
        self.acceptance.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.acceptance.__exit__(*exc_info)
        self._patches.restore()

    def _wrap_configure(self, original: Callable[..., None]) -> Callable[..., None]:
        recorder = self

        def configure(speculator: Any) -> None:
            original(speculator)
            groups = []
            for per_kind in speculator.attn_groups:
                for group in per_kind:
                    builder = group.get_metadata_builder()
                    groups.append(GroupInfo(
                        str(group.backend.get_name()), type(builder).__name__,
                        bool(builder.supports_draft_decode_metadata_update),
                        _hook_owner(builder)))
            recorder.groups.append(tuple(groups))
            recorder.fused.append(bool(speculator.supports_decode_metadata_update))

        return configure

    def _wrap_capture(self, original: Callable[..., None]) -> Callable[..., None]:
        recorder = self

        def capture(speculator: Any) -> None:
            recorder._capturing = True
            try:
                original(speculator)
            finally:
                recorder._capturing = False

        return capture

    def _wrap_fused(self, original: Callable[..., None]) -> Callable[..., None]:
        recorder = self

        def run_fused(speculator: Any, num_reqs: int, skip_attn: bool, batch_desc: Any,
                      *args: Any, **kwargs: Any) -> None:
            if getattr(getattr(batch_desc, "cg_mode", None), "name", "") == "FULL":
                recorder.counts.fused_replays += 1
            else:
                recorder.counts.fused_eager += 1
            with recorder._draft_loop():
                original(speculator, num_reqs, skip_attn, batch_desc, *args, **kwargs)

        return run_fused

    def _wrap_rebuild(self, original: Callable[..., None]) -> Callable[..., None]:
        recorder = self

        def multi_step_decode(speculator: Any, *args: Any, **kwargs: Any) -> None:
            if not recorder._capturing:
                recorder.counts.rebuilt += 1
            with recorder._draft_loop():
                original(speculator, *args, **kwargs)

        return multi_step_decode

    @contextlib.contextmanager
    def _draft_loop(self) -> Iterator[None]:
        """A draft loop runs for the block: its metadata builds are timed."""
        self._in_loop = True
        try:
            yield
        finally:
            self._in_loop = False

    def _wrap_build(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def build(speculator: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder._capturing or not recorder._in_loop:
                return original(speculator, *args, **kwargs)
            start = time.perf_counter()
            built = original(speculator, *args, **kwargs)
            recorder.counts.build_seconds += time.perf_counter() - start
            recorder.counts.build_calls += 1
            return built

        return build

    def _wrap_propose(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def propose(speculator: Any, *args: Any, **kwargs: Any) -> Any:
            drafts = original(speculator, *args, **kwargs)
            if recorder.recording and not kwargs.get("dummy_run", False):
                recorder.draft_tokens.append(drafts.tolist())
                hidden = getattr(speculator, "hidden_states", None)
                if hidden is not None:
                    recorder.draft_hidden.append(hidden[:len(drafts)].float().cpu())
            return drafts

        return propose

    def _wrap_hook(self, original: Callable[..., None]) -> Callable[..., None]:
        recorder = self

        def update(group: Any, attn_metadata: Any) -> None:
            if recorder.empty_hook:
                return
            if recorder._capturing:
                original(group, attn_metadata)
                return
            start = time.perf_counter()
            original(group, attn_metadata)
            recorder.counts.hook_seconds += time.perf_counter() - start
            recorder.counts.hook_calls += 1

        return update


@attrs.frozen
class CudaGenerated:
    """One ``generate`` call on a GPU engine.

    Attributes:
        output_tokens: per prompt, the generated token ids.
        seconds: wall time of the call.
        loops: what its draft loops did.
        draft_tokens: per ``propose``, the draft token ids (only when recorded).
        acceptance: vLLM's spec-decode counts of the call.
        draft_hidden: per ``propose``, the last draft step's hidden states (only when
            recorded; see :attr:`CudaRecorder.draft_hidden`).
    """

    output_tokens: list[list[int]]
    seconds: float
    loops: LoopCounts
    draft_tokens: list[list[list[int]]]
    acceptance: Acceptance
    draft_hidden: list[Any] = attrs.field(factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the call's wall time."""
        return sum(len(t) for t in self.output_tokens) / self.seconds


@attrs.define
class CudaEngine:
    """A live GPU engine and what vLLM configured in it.

    Attributes:
        settings: what it is.
        llm: the ``vllm.LLM``.
        startup_seconds: time to create it (graph capture included).
        fused: whether vLLM chose the fused draft loop.
        groups: the draft model's attention groups.
    """

    settings: CudaEngineSettings
    llm: Any
    startup_seconds: float
    fused: bool
    groups: tuple[GroupInfo, ...]

    def generate(self, prompts: Sequence[tuple[int, ...]], max_tokens: int,
                 recorder: CudaRecorder, *, recording: bool) -> CudaGenerated:
        """One greedy ``generate`` (``max_tokens`` each, EOS ignored): output tokens, wall
        seconds, the draft loops' counts, vLLM's acceptance counts and (when ``recording``)
        the draft tokens."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        with _plugin(self.settings), _empty_hook(recorder, self.settings.empty_hook):
            recorder.start(recording=recording)
            start = time.perf_counter()
            outputs = self.llm.generate(inputs, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        return CudaGenerated(tokens, elapsed, attrs.evolve(recorder.counts),
                             recorder.draft_tokens, recorder.acceptance.read(),
                             recorder.draft_hidden)


@contextlib.contextmanager
def _empty_hook(recorder: CudaRecorder, empty: bool) -> Iterator[None]:
    recorder.empty_hook = empty
    try:
        yield
    finally:
        recorder.empty_hook = False


@contextlib.contextmanager
def _plugin(settings: CudaEngineSettings) -> Iterator[None]:
    from draftmeta.integrations.vllm.plan import OVERRIDE_ENV

    previous = os.environ.get(OVERRIDE_ENV)
    os.environ[OVERRIDE_ENV] = "1" if settings.override_upstream else "0"
    try:
        with plugin_session(settings.plugin, settings.spec_overrides):
            yield
    finally:
        if previous is None:
            os.environ.pop(OVERRIDE_ENV, None)
        else:
            os.environ[OVERRIDE_ENV] = previous


def _vocabulary(model_dir: Path) -> int:
    """The model's vocabulary size, from its ``config.json``."""
    import json

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return int(config["vocab_size"])


def _create_llm(model_dir: Path, settings: CudaEngineSettings) -> Any:
    from vllm import LLM

    try:
        return LLM(
            model=str(model_dir),
            load_format=settings.load_format,
            skip_tokenizer_init=True,
            dtype="bfloat16",
            kv_cache_dtype=settings.kv_cache_dtype,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            seed=settings.seed,
            attention_config={"backend": settings.backend},
            speculative_config={"method": "mtp", "num_speculative_tokens": settings.k},
            compilation_config={"mode": 0, "cudagraph_mode": settings.cudagraph_mode},
            # vLLM's scheduler counts accepted drafts only when it logs stats
            disable_log_stats=False,
            # its sampler warm-up takes the top max_logprobs of every row: no more than the
            # vocabulary (the trained model has 18 tokens; vLLM's default is 20)
            max_logprobs=min(20, _vocabulary(model_dir)),
        )
    except Exception as exc:
        raise E2EError(
            f"vLLM could not create a GPU MTP engine with backend {settings.backend}, "
            f"K={settings.k}, kv_cache_dtype={settings.kv_cache_dtype}, cudagraph_mode="
            f"{settings.cudagraph_mode}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


@contextlib.contextmanager
def open_cuda_engine(model_dir: Path, settings: CudaEngineSettings, recorder: CudaRecorder
                     ) -> Iterator[CudaEngine]:
    """A fresh GPU engine for ``settings`` (the plugin registered around its creation if on:
    the builders' hook flags and the captured draft-loop graphs are made then), shut down and
    freed on exit.

    Raises:
        E2EError: vLLM could not create the engine, or the plugin did not install.
    """
    configured = len(recorder.fused)
    with _plugin(settings), _empty_hook(recorder, settings.empty_hook):
        start = time.perf_counter()
        llm = _create_llm(model_dir, settings)
        startup = time.perf_counter() - start
    if len(recorder.fused) == configured:
        raise E2EError("vLLM's GPU speculator never configured its draft loop: is this the "
                       "GPU model runner of vLLM 0.34 with an MTP draft model?")
    try:
        yield CudaEngine(settings, llm, startup, recorder.fused[-1], recorder.groups[-1])
    finally:
        core: Any = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        with contextlib.suppress(Exception):
            core.shutdown()
        del llm
        gc.collect()
