"""What one ``generate`` does inside vLLM's older proposer (the CPU engine's draft loop).

:class:`CpuRecorder` wraps vLLM's methods for the length of a run:

* ``SpecDecodeBaseProposer.propose``: the draft loops (one per call), and while recording the
  draft token ids it returns;
* ``SpecDecodeBaseProposer._sample_draft_tokens``: while recording, the draft hidden states it
  samples from, per draft step (output tokens cannot reveal a draft-side bug, since the target
  re-checks every draft; draft tokens and these hidden states can);
* ``SpecDecodingStats.observe_draft`` (through
  :class:`~draftmeta.integrations.vllm.tools.e2e.acceptance.AcceptanceCounter`): vLLM's own count of
  accepted draft tokens, per draft position;
* ``AttentionGroup.build_metadata_for_drafting``: host time per draft index, as CPU time of
  the calling thread (``time.thread_time``: what the refresh costs the host, not what other
  processes on a shared machine take from it while it runs); from draft index 2 on, whether
  the group's metadata was updated in place (the same object as at the previous index comes
  back) or rebuilt (a new object); and at draft index 1, whether the previous draft loop's
  index-1 object came back (carried over and refreshed in place), per attention backend
  (vLLM's name, ``"CPU_MLA"``). These counts are observed from outside, independently of the
  plugin's own :func:`~draftmeta.integrations.vllm.plugin.stats`, and mean the same.

The timing wrapper sits above the builder's ``build_for_drafting``, so with the plugin off it
measures vLLM's rebuild and with it on draftmeta's in-place update, through the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from draftmeta.integrations.patching import Patches
from draftmeta.integrations.vllm.tools.e2e.acceptance import AcceptanceCounter
from draftmeta.integrations.vllm.tools.e2e.observed import EngineShape, Observed

__all__ = ["CpuRecorder", "IndexTiming", "RefreshRecord"]


@attrs.define
class IndexTiming:
    """Host time spent building or updating draft metadata at one draft index.

    Attributes:
        seconds: total over every call at this index.
        calls: how many calls (one per attention group per ``propose``).
    """

    seconds: float = 0.0
    calls: int = 0


@attrs.define
class RefreshRecord:
    """What the older proposer's draft loops of one ``generate`` did with draft metadata.

    Attributes:
        timings: host time by draft index (0 is the first draft step's build from the target's
            metadata, 1.. are the refreshes between draft steps).
        in_place: per attention backend, refreshes at draft index >= 2 that updated the previous
            index's metadata object in place.
        rebuilt: per attention backend, refreshes at draft index >= 2 that returned a new object.
        carried_over: per attention backend, draft loops whose index-1 metadata was the
            previous loop's object (refreshed in place instead of built).
    """

    timings: dict[int, IndexTiming] = attrs.field(factory=dict)
    in_place: dict[str, int] = attrs.field(factory=dict)
    rebuilt: dict[str, int] = attrs.field(factory=dict)
    carried_over: dict[str, int] = attrs.field(factory=dict)

    def refresh(self, first_index: int = 1) -> IndexTiming:
        """Host time over draft indices ``>= first_index`` (1: every refresh between steps)."""
        total = IndexTiming()
        for index, timing in self.timings.items():
            if index >= first_index:
                total.seconds += timing.seconds
                total.calls += timing.calls
        return total

    def as_json(self) -> dict[str, Any]:
        """The record as a JSON object (microseconds per draft index)."""
        return {
            "in_place_updates": dict(self.in_place),
            "rebuilds": dict(self.rebuilt),
            "carried_over": dict(self.carried_over),
            "us_by_draft_index": {str(i): round(t.seconds * 1e6, 1)
                                  for i, t in sorted(self.timings.items())},
            "calls_by_draft_index": {str(i): t.calls for i, t in sorted(self.timings.items())},
        }


@attrs.define
class CpuRecorder:
    """Installs the recording wrappers around the older proposer (module docs); a context
    manager around the engines' whole lives: vLLM's classes are patched on entry and restored
    exactly on exit."""

    acceptance: AcceptanceCounter = attrs.field(factory=AcceptanceCounter)
    recording: bool = False
    _record: RefreshRecord = attrs.field(factory=RefreshRecord, init=False)
    _draft_tokens: list[list[list[int]]] = attrs.field(factory=list, init=False)
    _hidden: list[Any] = attrs.field(factory=list, init=False)
    _loops: int = attrs.field(default=0, init=False)
    _patches: Patches = attrs.field(factory=Patches, init=False)
    _last: dict[int, object] = attrs.field(factory=dict, init=False)
    # per group, the last index-1 object: held across generates, as the plugin's builders
    # hold theirs (a strong reference, so identity comparisons stay exact)
    _first: dict[int, object] = attrs.field(factory=dict, init=False)

    def start(self, *, recording: bool) -> None:
        """Begin a ``generate`` (draft tokens and hidden states kept only when
        ``recording``)."""
        self.recording = recording
        self._record = RefreshRecord()
        self._draft_tokens, self._hidden, self._loops = [], [], 0
        self._last.clear()
        self.acceptance.start()

    def finish(self) -> Observed:
        """End the ``generate``: what it showed (every draft loop runs on the host here)."""
        return Observed(self._draft_tokens, self._hidden, self.acceptance.read(), self._loops,
                        self._loops, self._record.refresh(1).seconds, self._record)

    def take_configured(self) -> EngineShape:
        """The CPU engine runs its draft loop step by step on the host, never fused (its
        groups show in the refresh counts, by backend)."""
        return EngineShape(False, ())

    def __enter__(self) -> CpuRecorder:
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
        from vllm.v1.worker.utils import AttentionGroup

        self._patches.replace(SpecDecodeBaseProposer, "propose",
                              self._wrap_propose(SpecDecodeBaseProposer.propose))
        self._patches.replace(SpecDecodeBaseProposer, "_sample_draft_tokens",
                              self._wrap_sample(SpecDecodeBaseProposer._sample_draft_tokens))
        self._patches.replace(AttentionGroup, "build_metadata_for_drafting",
                              self._wrap_build(AttentionGroup.build_metadata_for_drafting))
        self.acceptance.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.acceptance.__exit__(*exc_info)
        self._patches.restore()
        self._last.clear()
        self._first.clear()

    def _wrap_propose(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def propose(proposer: Any, *args: Any, **kwargs: Any) -> Any:
            draft_token_ids = original(proposer, *args, **kwargs)
            recorder._loops += 1
            if recorder.recording:
                recorder._draft_tokens.append(draft_token_ids.tolist())
            return draft_token_ids

        return propose

    def _wrap_sample(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def sample(proposer: Any, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.recording:
                recorder._hidden.append(hidden_states.detach().float().cpu())
            return original(proposer, hidden_states, *args, **kwargs)

        return sample

    def _wrap_build(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def build_metadata_for_drafting(group: Any, common_attn_metadata: Any,
                                        draft_index: int) -> Any:
            start = time.thread_time()
            metadata = original(group, common_attn_metadata, draft_index)
            elapsed = time.thread_time() - start
            record = recorder._record
            timing = record.timings.get(draft_index)
            if timing is None:
                timing = record.timings[draft_index] = IndexTiming()
            timing.seconds += elapsed
            timing.calls += 1
            name = str(group.backend.get_name())
            if draft_index >= 2:
                counts = record.in_place if recorder._last.get(id(group)) is metadata else (
                    record.rebuilt)
                counts[name] = counts.get(name, 0) + 1
            elif draft_index == 1:
                if recorder._first.get(id(group)) is metadata:
                    record.carried_over[name] = record.carried_over.get(name, 0) + 1
                recorder._first[id(group)] = metadata
            recorder._last[id(group)] = metadata
            return metadata

        return build_metadata_for_drafting
