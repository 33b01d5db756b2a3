"""What one ``generate`` showed inside an engine, whichever draft loop ran it.

The CPU engine's draft loop (vLLM 0.32's older proposer,
:class:`~draftmeta.integrations.vllm.tools.e2e.cpu_recorder.CpuRecorder`) and the GPU runner's
(vLLM 0.34's speculator, :class:`~draftmeta.integrations.vllm.tools.e2e.cuda_recorder.CudaRecorder`)
are observed differently; both give an :class:`Observed`: the draft tokens and hidden states
(when recorded), vLLM's acceptance counts, the draft loops, and the host time spent on draft
metadata in loops that ran on the host, with the loop's own record (:class:`LoopRecord`) for
the details only one of them has.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from draftmeta.integrations.vllm.tools.e2e.acceptance import Acceptance

__all__ = ["EngineShape", "GroupInfo", "LoopRecord", "Observed", "Recorder"]


class LoopRecord(Protocol):
    """A draft loop's own record of one ``generate`` (refresh timings on the CPU, loop paths on
    the GPU)."""

    def as_json(self) -> dict[str, Any]:
        """The record as a JSON object."""
        ...


@attrs.frozen
class Observed:
    """What one ``generate`` showed inside the engine.

    Attributes:
        draft_tokens: per ``propose``, the draft token ids (``[request][draft step]``); empty
            unless recorded.
        hidden: the draft hidden states the loop sampled from (per draft step on the CPU, the
            last step's per ``propose`` on the GPU, whose captured steps cannot be read one by
            one), float32 on the CPU; empty unless recorded.
        acceptance: vLLM's spec-decode counts.
        loops: engine steps that ran a draft loop (``propose`` calls).
        host_loops: draft loops whose metadata work ran on the host (every loop of the CPU
            engine; on the GPU, those that did not replay a captured graph).
        host_seconds: host time on draft metadata in those loops (builds and in-place
            updates after the first draft step's build).
        record: the loop's own record.
        loop_lengths: per ``propose``, each request's sequence length at the draft loop's
            first step (where the recorder reads it, while recording; else empty).
    """

    draft_tokens: list[list[list[int]]]
    hidden: list[Any]
    acceptance: Acceptance
    loops: int
    host_loops: int
    host_seconds: float
    record: LoopRecord
    loop_lengths: list[list[int]] = attrs.field(factory=list)


@attrs.frozen
class GroupInfo:
    """One attention group of an engine's draft model, as vLLM configured it.

    Attributes:
        backend: vLLM's backend name.
        builder: the metadata builder's class name.
        supports_update: the builder's ``supports_draft_decode_metadata_update`` (``False``
            where the draft loop never asks for it).
        hook_owner: whose draft-step update the builder has: ``draftmeta``, ``vllm`` (its own)
            or ``none``.
    """

    backend: str
    builder: str
    supports_update: bool
    hook_owner: str


@attrs.frozen
class EngineShape:
    """What vLLM configured in one engine's draft loop.

    Attributes:
        fused: the GPU runner took its fused draft loop (one captured graph for all steps);
            ``False`` on the CPU engine, whose loop runs step by step on the host.
        groups: the draft model's attention groups.
    """

    fused: bool
    groups: tuple[GroupInfo, ...]


class Recorder(Protocol):
    """Observes an engine's draft loop while active (a context manager around the engines'
    lives)."""

    def __enter__(self) -> Recorder: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def start(self, *, recording: bool) -> None:
        """Begin a ``generate``: forget what was counted; record draft tokens and hidden states
        only when ``recording`` (reading them back costs time)."""
        ...

    def finish(self) -> Observed:
        """End the ``generate``: what it showed."""
        ...

    def take_configured(self) -> EngineShape | None:
        """What vLLM configured in the draft loop of an engine created since the last call
        (``None`` where none was seen)."""
        ...
