"""Acceptance of draft tokens, as vLLM's own spec-decode metrics count it.

vLLM's scheduler records, for every request of every step that verified drafts,
``SpecDecodingStats.observe_draft(num_draft_tokens, num_accepted_tokens)``: the numbers behind
its ``vllm:spec_decode_*`` metrics and its "SpecDecoding metrics" log line (mean acceptance
length, per-position acceptance rate). :class:`AcceptanceCounter` adds up those same calls
around one ``generate``, in every supported vLLM alike, so that the counts
belong to one engine and one call even where two engines live in one process (vLLM's Prometheus
registry is process-wide). The engine must log stats (``disable_log_stats=False``): otherwise
vLLM's scheduler never calls ``observe_draft``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from draftmeta.integrations.patching import Patches

__all__ = ["Acceptance", "AcceptanceCounter", "total_acceptance"]


@attrs.frozen
class Acceptance:
    """vLLM's spec-decode counts over one or more ``generate`` calls.

    Attributes:
        drafts: verification steps that checked drafts, summed over requests (vLLM's
            ``num_drafts``).
        draft_tokens: draft tokens verified.
        accepted: draft tokens accepted.
        accepted_per_position: per draft position (0 is the first draft token), how many
            drafts had it accepted.
        draft_tokens_per_position: per draft position, how many drafts proposed it.
    """

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = ()
    draft_tokens_per_position: tuple[int, ...] = ()

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verification step (1 + accepted per draft), as vLLM logs it; ``None``
        without drafts."""
        return None if not self.drafts else 1.0 + self.accepted / self.drafts

    @property
    def per_token(self) -> float | None:
        """The share of draft tokens accepted; ``None`` without draft tokens."""
        return None if not self.draft_tokens else self.accepted / self.draft_tokens

    @property
    def per_position(self) -> tuple[float, ...]:
        """Per draft position, the share of drafts whose token there was accepted (vLLM's
        per-position acceptance rate)."""
        return tuple(a / d if d else 0.0 for a, d in zip(self.accepted_per_position,
                                                          self.draft_tokens_per_position))

    def __add__(self, other: Acceptance) -> Acceptance:
        """Both counts together (positions aligned from the first)."""
        def add(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
            longest = max(len(a), len(b))
            return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0)
                         for i in range(longest))

        return Acceptance(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                          self.accepted + other.accepted,
                          add(self.accepted_per_position, other.accepted_per_position),
                          add(self.draft_tokens_per_position, other.draft_tokens_per_position))

    def as_json(self) -> dict[str, Any]:
        """The counts and the rates derived from them, for a results file."""
        mean = self.mean_acceptance_length
        rate = self.per_token
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "accepted_per_position": list(self.accepted_per_position),
            "draft_tokens_per_position": list(self.draft_tokens_per_position),
            "mean_acceptance_length": None if mean is None else round(mean, 4),
            "per_token": None if rate is None else round(rate, 4),
            "per_position": [round(r, 4) for r in self.per_position],
        }


def total_acceptance(counts: Sequence[Acceptance]) -> Acceptance:
    """The sum of several calls' counts."""
    total = Acceptance()
    for count in counts:
        total = total + count
    return total


@attrs.define
class AcceptanceCounter:
    """Counts vLLM's ``observe_draft`` calls while active (a context manager).

    :meth:`start` begins a new count; :meth:`read` returns what was counted since.
    """

    _drafts: int = attrs.field(default=0, init=False)
    _draft_tokens: int = attrs.field(default=0, init=False)
    _accepted: int = attrs.field(default=0, init=False)
    _accepted_per_position: list[int] = attrs.field(factory=list, init=False)
    _draft_tokens_per_position: list[int] = attrs.field(factory=list, init=False)
    _patches: Patches = attrs.field(factory=Patches, init=False)

    def start(self) -> None:
        """Forget what was counted so far."""
        self._drafts = self._draft_tokens = self._accepted = 0
        self._accepted_per_position = []
        self._draft_tokens_per_position = []

    def read(self) -> Acceptance:
        """What was counted since :meth:`start` (per-position counts as long as the longest
        draft seen, positions never accepted counted 0)."""
        positions = len(self._draft_tokens_per_position)
        accepted = self._accepted_per_position + [0] * (positions
                                                        - len(self._accepted_per_position))
        return Acceptance(self._drafts, self._draft_tokens, self._accepted, tuple(accepted),
                          tuple(self._draft_tokens_per_position))

    def __enter__(self) -> AcceptanceCounter:
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        self._patches.replace(SpecDecodingStats, "observe_draft",
                              self._wrap(SpecDecodingStats.observe_draft))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._patches.restore()

    def _count(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self._drafts += 1
        self._draft_tokens += num_draft_tokens
        self._accepted += num_accepted_tokens
        for counts, n in ((self._accepted_per_position, num_accepted_tokens),
                          (self._draft_tokens_per_position, num_draft_tokens)):
            if len(counts) < n:
                counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    def _wrap(self, original: Callable[..., None]) -> Callable[..., None]:
        counter = self

        def observe_draft(stats: Any, num_draft_tokens: int, num_accepted_tokens: int
                          ) -> None:
            original(stats, num_draft_tokens, num_accepted_tokens)
            counter._count(int(num_draft_tokens), int(num_accepted_tokens))

        return observe_draft
