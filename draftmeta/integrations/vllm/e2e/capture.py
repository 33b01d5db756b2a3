"""What one ``generate`` records inside vLLM's older proposer.

:class:`Recorder` wraps three of vLLM's methods for the length of a run:

* ``SpecDecodeBaseProposer.propose``: the draft token ids it returns, per call;
* ``SpecDecodeBaseProposer._sample_draft_tokens``: the draft hidden states it samples from, per
  draft step, and a digest of them (output tokens cannot reveal a draft-side bug, since the
  target re-checks every draft; draft tokens and these hidden states can);
* ``SpecDecodingStats.observe_draft`` (through
  :class:`~draftmeta.integrations.vllm.e2e.acceptance.AcceptanceCounter`): vLLM's own count of
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

import hashlib
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from draftmeta.integrations.patching import Patches
from draftmeta.integrations.vllm.e2e.acceptance import Acceptance, AcceptanceCounter

__all__ = ["GenerateRecord", "IndexTiming", "Recorder"]


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
class GenerateRecord:
    """What one ``generate`` call did in the draft loop.

    Attributes:
        draft_tokens: per ``propose`` call, the draft token ids it returned
            (``[request][draft step]``).
        hidden_digests: per draft step, a digest of the draft hidden states sampled from.
        hidden_states: per draft step, those hidden states (float32, on the CPU).
        timings: host time by draft index (0 is the first draft step's build from the target's
            metadata, 1.. are the refreshes between draft steps).
        in_place: per attention backend, refreshes at draft index >= 2 that updated the previous
            index's metadata object in place.
        rebuilt: per attention backend, refreshes at draft index >= 2 that returned a new object.
        carried_over: per attention backend, draft loops whose index-1 metadata was the
            previous loop's object (refreshed in place instead of built).
        acceptance: vLLM's acceptance counts for the ``generate`` (filled when it returns).
    """

    draft_tokens: list[list[list[int]]] = attrs.field(factory=list)
    hidden_digests: list[str] = attrs.field(factory=list)
    hidden_states: list[torch.Tensor] = attrs.field(factory=list)
    timings: dict[int, IndexTiming] = attrs.field(factory=dict)
    in_place: dict[str, int] = attrs.field(factory=dict)
    rebuilt: dict[str, int] = attrs.field(factory=dict)
    carried_over: dict[str, int] = attrs.field(factory=dict)
    acceptance: Acceptance = attrs.field(factory=Acceptance)

    def refresh(self, first_index: int = 1) -> IndexTiming:
        """Host time over draft indices ``>= first_index`` (1: every refresh between steps)."""
        total = IndexTiming()
        for index, timing in self.timings.items():
            if index >= first_index:
                total.seconds += timing.seconds
                total.calls += timing.calls
        return total


def _digest(hidden_states: torch.Tensor) -> str:
    raw = hidden_states.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(raw.tobytes(), digest_size=8).hexdigest()


@attrs.define
class Recorder:
    """Installs the recording wrappers; :meth:`start` begins a fresh :class:`GenerateRecord`.

    Use as a context manager around the engine's whole life: vLLM's classes are patched on
    entry and restored exactly on exit.

    Attributes:
        record: what the current ``generate`` has recorded so far.
        acceptance: counts vLLM's accepted drafts (read into the record by :meth:`finish`).
    """

    record: GenerateRecord = attrs.field(factory=GenerateRecord)
    acceptance: AcceptanceCounter = attrs.field(factory=AcceptanceCounter)
    _patches: Patches = attrs.field(factory=Patches, init=False)
    _last: dict[int, object] = attrs.field(factory=dict, init=False)
    # per group, the last index-1 object: held across generates, as the plugin's builders
    # hold theirs (a strong reference, so identity comparisons stay exact)
    _first: dict[int, object] = attrs.field(factory=dict, init=False)

    def start(self) -> GenerateRecord:
        """Begin recording a new ``generate``; returns the (empty) record it fills."""
        self.record = GenerateRecord()
        self._last.clear()
        self.acceptance.start()
        return self.record

    def finish(self) -> GenerateRecord:
        """End the current ``generate``'s record: its acceptance counts go in; returns it."""
        self.record.acceptance = self.acceptance.read()
        return self.record

    def __enter__(self) -> Recorder:
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
            recorder.record.draft_tokens.append(draft_token_ids.tolist())
            return draft_token_ids

        return propose

    def _wrap_sample(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def sample(proposer: Any, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            host = hidden_states.detach().cpu()  # one copy, for the digest and the record
            recorder.record.hidden_digests.append(_digest(host))
            recorder.record.hidden_states.append(host.float())
            return original(proposer, hidden_states, *args, **kwargs)

        return sample

    def _wrap_build(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def build_metadata_for_drafting(group: Any, common_attn_metadata: Any,
                                        draft_index: int) -> Any:
            start = time.thread_time()
            metadata = original(group, common_attn_metadata, draft_index)
            elapsed = time.thread_time() - start
            record = recorder.record
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
