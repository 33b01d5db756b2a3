"""Runs of ``draftmeta e2e`` made by hand, for the tests of what decides a verdict: generates,
sides and comparisons with chosen tokens, drafts, hidden states, acceptance and timings, no
engine involved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftmeta.integrations.vllm.tools.e2e.acceptance import Acceptance
from draftmeta.integrations.vllm.tools.e2e.compare import Case, Comparison, Pair, Side
from draftmeta.integrations.vllm.tools.e2e.cuda_recorder import LoopCounts
from draftmeta.integrations.vllm.tools.e2e.engine import Generated
from draftmeta.integrations.vllm.tools.e2e.observed import EngineShape, GroupInfo, Observed

DRAFTS = [[[5, 6, 7], [8, 9, 10]], [[11, 12, 13], [14, 15, 16]]]
"""Two ``propose`` calls of two requests, K = 3."""

TOKENS = [[1, 2, 3, 4], [5, 6, 7, 8]]


def acceptance(accepted: Sequence[int] = (2, 2, 1), drafts: int = 4, k: int = 3) -> Acceptance:
    """Counts of ``drafts`` verifications of ``k`` drafts with ``accepted[i]`` accepted at
    position ``i``."""
    return Acceptance(drafts, drafts * k, sum(accepted), tuple(accepted), (drafts,) * k)


def generated(*, tokens: Any = None, drafts: Any = None, hidden: Any = None,
              accepted: Sequence[int] = (2, 2, 1), seconds: float = 1.0, loops: int = 10,
              host_loops: int = 10, host_seconds: float = 0.001,
              busy: float | None = None, record: Any = None,
              loop_lengths: Any = None) -> Generated:
    """One generate: by default two requests' tokens, two ``propose`` calls' drafts, one hidden
    state of zeros per call."""
    return Generated(
        [list(t) for t in (TOKENS if tokens is None else tokens)], seconds,
        Observed(DRAFTS if drafts is None else drafts,
                 [torch.zeros(2, 4), torch.zeros(2, 4)] if hidden is None else hidden,
                 acceptance(accepted), loops, host_loops, host_seconds,
                 record if record is not None else LoopCounts(rebuilt=loops),
                 loop_lengths=loop_lengths or []),
        {}, busy)


def side(recorded: Generated | None = None, seconds: Sequence[float] = (1.0, 1.0, 1.0), *,
         busy: float | None = None, loops: int = 10, host_seconds: float = 0.001) -> Side:
    """One engine at one batch size: its recorded generate, measured generates of ``seconds``,
    and a profiled one where ``busy`` is given."""
    measured = tuple(generated(seconds=s, loops=loops, host_seconds=host_seconds)
                     for s in seconds)
    profiled = generated(loops=loops, busy=busy) if busy is not None else None
    return Side(recorded or generated(), measured, profiled, 10.0)


SHAPE = EngineShape(True, (GroupInfo("FLASHMLA", "FlashMLAMetadataBuilder", True, "draftmeta"),))


def comparison(case: Case | None = None, pairs: Sequence[tuple[Side, Side]] | None = None,
               batch_size: int = 2) -> Comparison:
    """A comparison of ``pairs`` (default: one pair of identical sides)."""
    return Comparison(case or Case("tiny", "FLASHMLA", 3), batch_size,
                      tuple(Pair(off, on) for off, on in (pairs or [(side(), side())])),
                      (SHAPE, SHAPE))
