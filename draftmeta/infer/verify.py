"""Verify an inferred spec: update equals rebuild over many random batches.

:func:`verify_generic` runs draftmeta's own update-versus-rebuild loop with a caller's build
function; for vLLM's builders, :func:`draftmeta.integrations.vllm.tools.infer.verify_vllm` runs
vLLM's harness (a second builder instance, fresh buffers, both overflow and host-bound
policies) with the inferred spec in place of the hand-written one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from draftmeta.advance import advance_state
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState
from draftmeta.testing import compare_metadata, random_state

__all__ = ["Verification", "verify_generic"]


@attrs.frozen
class Verification:
    """What verification found.

    Attributes:
        batches: random batches checked.
        failures: ``(batch description, first problem)`` for each failing batch.
        seconds: wall time it took.
    """

    batches: int
    failures: tuple[tuple[str, str], ...]
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether every batch's updated metadata equaled the rebuilt one at every step."""
        return self.batches > 0 and not self.failures


def verify_generic(
    spec: DraftSpec[Any],
    build: Callable[[DraftState], Any],
    rebuild: Callable[[DraftState], Any],
    *,
    block_size: int,
    batches: int = 200,
    max_steps: int = 8,
    max_model_lens: tuple[int, ...] = (256, 1000, 4096),
    seed: int = 0,
) -> Verification:
    """Update versus rebuild over ``batches`` random batches (K up to ``max_steps``, both
    overflow policies, both host bounds, padded rows, batches of one).

    ``build`` and ``rebuild`` must not share buffers (two builder instances)."""
    start = time.perf_counter()
    failures: list[tuple[str, str]] = []
    for i in range(batches):
        g = torch.Generator().manual_seed(seed + i)

        def pick(n: int, g: torch.Generator = g) -> int:
            return int(torch.randint(n, (1,), generator=g))

        batch = (1, 2, 7, 16, 64)[pick(5)]
        padded = (0, 0, 3)[pick(3)]
        length = max_model_lens[pick(len(max_model_lens))]
        steps = 2 + pick(max_steps - 1)
        overflow = ("wrap", "clamp")[i % 2]
        host_bound = ("advance", "frozen")[(i // 2) % 2]
        what = (f"batch {i}: B={batch}+{padded} L={length} K={steps} {overflow}/{host_bound}")
        state = random_state(g, batch_size=batch, block_size=block_size, max_model_len=length,
                             steps=steps, num_padded=padded)
        try:
            metadata = build(state)
            for _ in range(2, steps + 1):
                advance_state(state, overflow, host_bound)  # type: ignore[arg-type]
                spec.update(metadata, state)
                found = compare_metadata(metadata, rebuild(state.clone()))
                if found:
                    failures.append((what, str(found[0])))
                    break
        except Exception as exc:
            failures.append((what, f"{type(exc).__name__}: {exc}"))
    return Verification(batches, tuple(failures), time.perf_counter() - start)
