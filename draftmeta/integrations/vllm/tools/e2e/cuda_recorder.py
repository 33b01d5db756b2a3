"""What vLLM 0.34's GPU draft loop does in one ``generate``, observed from outside.

The GPU runner's draft loop (``vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py``)
takes the *fused* path when every attention group's builder sets
``supports_draft_decode_metadata_update``: for a captured batch size it replays one CUDA graph
holding all K - 1 draft steps, with each group's ``update_draft_decode_metadata`` recorded in it
at capture; otherwise it rebuilds attention metadata on the host before every draft step
(the *rebuild* path). :class:`CudaRecorder` observes, from outside vLLM and the plugin alike:

* which path each draft loop took, and whether the fused one replayed its graph;
* the draft token ids every ``propose`` returned (only while recording: reading them back waits
  for the GPU, so timed generates do not record);
* how often, and for how long on the host, ``update_draft_decode_metadata`` ran outside
  capture (the fused path's eager form, for batch sizes without a graph);
* per engine, each attention group's backend, builder class, whether the builder has the hook
  and whose hook it is (vLLM's or draftmeta's).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from draftmeta.integrations.patching import Patches
from draftmeta.integrations.vllm.tools.e2e.acceptance import AcceptanceCounter
from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable
from draftmeta.integrations.vllm.tools.e2e.observed import EngineShape, GroupInfo, Observed

__all__ = ["CudaRecorder", "LoopCounts"]

_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator"
_PROPOSER = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"


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

    @property
    def loops(self) -> int:
        """Every draft loop, whichever path it took."""
        return self.fused_replays + self.fused_eager + self.rebuilt

    @property
    def host_loops(self) -> int:
        """Draft loops whose metadata work ran on the host (no graph replayed)."""
        return self.fused_eager + self.rebuilt

    def as_json(self) -> dict[str, Any]:
        """The counts as a JSON object."""
        return {name: round(v, 6) if isinstance(v, float) else v
                for name, v in attrs.asdict(self).items()}


def _first_step_lengths(signature: inspect.Signature, speculator: Any, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> list[int] | None:
    """Per request, the sequence length at the draft loop's first step: the target's length
    less the drafts it rejected, plus one (vLLM 0.34's ``_prepare_decode_inputs_kernel``);
    ``None`` where ``propose`` was called without them."""
    try:
        bound = signature.bind(speculator, *args, **kwargs).arguments
        batch, rejected = bound["input_batch"], bound["num_rejected"]
        count = int(batch.num_reqs)
        lengths = batch.seq_lens[:count].tolist()
        return [int(n) - int(r) + 1 for n, r in zip(lengths, rejected[:count].tolist())]
    except (TypeError, KeyError, AttributeError):
        return None


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
        loop_lengths: per ``propose`` since :meth:`start`, each request's sequence length at
            its draft loop's first step, while :attr:`recording`.
        counts: the draft loops since :meth:`start`.
        groups: per speculator configured so far, in order, its attention groups.
        fused: per speculator configured so far, whether vLLM chose the fused path.
        acceptance: vLLM's spec-decode counts since :meth:`start`.
    """

    recording: bool = False
    draft_tokens: list[list[list[int]]] = attrs.field(factory=list)
    draft_hidden: list[Any] = attrs.field(factory=list)
    loop_lengths: list[list[int]] = attrs.field(factory=list)
    counts: LoopCounts = attrs.field(factory=LoopCounts)
    groups: list[tuple[GroupInfo, ...]] = attrs.field(factory=list)
    fused: list[bool] = attrs.field(factory=list)
    acceptance: AcceptanceCounter = attrs.field(factory=AcceptanceCounter)
    _patches: Patches = attrs.field(factory=Patches, init=False)
    _capturing: bool = attrs.field(default=False, init=False)
    _in_loop: bool = attrs.field(default=False, init=False)
    _taken: int = attrs.field(default=0, init=False)

    def start(self, *, recording: bool) -> None:
        """Begin a new ``generate``: clear draft tokens, loop and acceptance counts."""
        self.recording = recording
        self.draft_tokens = []
        self.draft_hidden = []
        self.loop_lengths = []
        self.counts = LoopCounts()
        self.acceptance.start()

    def finish(self) -> Observed:
        """End the ``generate``: what its draft loops showed."""
        counts = attrs.evolve(self.counts)
        return Observed(self.draft_tokens, self.draft_hidden, self.acceptance.read(),
                        counts.loops, counts.host_loops,
                        counts.build_seconds + counts.hook_seconds, counts,
                        loop_lengths=self.loop_lengths)

    def take_configured(self) -> EngineShape | None:
        """What vLLM configured in the speculator configured last, if one was configured
        since the last call."""
        if len(self.fused) == self._taken:
            return None
        self._taken = len(self.fused)
        return EngineShape(self.fused[-1], self.groups[-1])

    def __enter__(self) -> CudaRecorder:
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
        signature = inspect.signature(original)

        def propose(speculator: Any, *args: Any, **kwargs: Any) -> Any:
            recording = recorder.recording and not kwargs.get("dummy_run", False)
            lengths = _first_step_lengths(signature, speculator, args, kwargs) if recording \
                else None
            drafts = original(speculator, *args, **kwargs)
            if recording:
                recorder.draft_tokens.append(drafts.tolist())
                recorder.loop_lengths.append(lengths or [])
                hidden = getattr(speculator, "hidden_states", None)
                if hidden is not None:
                    recorder.draft_hidden.append(hidden[:len(drafts)].float().cpu())
            return drafts

        return propose

    def _wrap_hook(self, original: Callable[..., None]) -> Callable[..., None]:
        recorder = self

        def update(group: Any, attn_metadata: Any) -> None:
            if recorder._capturing:
                original(group, attn_metadata)
                return
            start = time.perf_counter()
            original(group, attn_metadata)
            recorder.counts.hook_seconds += time.perf_counter() - start
            recorder.counts.hook_calls += 1

        return update


