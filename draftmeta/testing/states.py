"""Random draft states for update-versus-rebuild checks, and the edge cases that matter.

:func:`random_state` makes a random decode batch with mixed context lengths;
:func:`state_for_lengths` makes one with exactly the given lengths. :func:`batch_case` picks,
from a seed alone, one batch of the edge-case schedule :func:`~draftmeta.testing.check_spec`
runs: a batch of one, every request crossing a block boundary, every request reaching
``max_model_len``, padded rows, or a mixed batch. A case rebuilds its state from its seed, so
any failure reproduces from the seed printed in its report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import torch

from draftmeta.advance import HostBound, OverflowPolicy
from draftmeta.state import DraftState

__all__ = [
    "EDGE_CASES",
    "BatchCase",
    "EdgeCase",
    "batch_case",
    "check_sizes",
    "random_state",
    "state_for_lengths",
]

EdgeCase = Literal["batch_of_one", "block_crossing", "at_max_model_len", "padded_rows", "mixed"]
"""The kind of a batch in :func:`batch_case`'s schedule."""

EDGE_CASES: tuple[EdgeCase, ...] = (
    "batch_of_one",
    "block_crossing",
    "at_max_model_len",
    "padded_rows",
    "mixed",
)
"""The kinds of batch, in schedule order: batch seed ``s`` is of kind ``EDGE_CASES[s % 5]``."""

_LABELS: dict[EdgeCase, str] = {
    "batch_of_one": "batch of one",
    "block_crossing": "block crossing",
    "at_max_model_len": "at max_model_len",
    "padded_rows": "padded rows",
    "mixed": "mixed",
}


def state_for_lengths(
    generator: torch.Generator,
    seq_lens: Sequence[int] | torch.Tensor,
    *,
    block_size: int,
    max_model_len: int,
    num_padded: int = 0,
    device: torch.device | str = "cpu",
) -> DraftState:
    """A draft state whose real requests have exactly these context lengths.

    Block ids are a random permutation drawn from ``generator`` (so a wrong block lookup
    shows); ``num_padded`` rows are appended as padding (slot -1, sequence length 0).

    Raises:
        ValueError: no lengths, or a length outside ``1..max_model_len``.
    """
    seq = torch.as_tensor(seq_lens, dtype=torch.int64).reshape(-1)
    n = int(seq.shape[0])
    if n < 1:
        raise ValueError("state_for_lengths needs at least one sequence length")
    if int(seq.min()) < 1 or int(seq.max()) > max_model_len:
        raise ValueError(
            f"sequence lengths must be in 1..max_model_len={max_model_len}, got "
            f"{seq.tolist()}; lower them or raise max_model_len"
        )
    width = -(-max_model_len // block_size)
    rows = n + num_padded
    lens = torch.zeros(rows, dtype=torch.int32)
    lens[:n] = seq.to(torch.int32)
    positions = (lens.to(torch.int64) - 1).clamp(min=0)
    perm = torch.randperm(rows * width, generator=generator).to(torch.int32) + 1
    block_table = perm.view(rows, width)
    blk = block_table.gather(1, (positions // block_size).clamp(max=width - 1).view(-1, 1))
    slot = blk.view(-1).to(torch.int64) * block_size + positions % block_size
    slot[n:] = -1
    state = DraftState(
        positions=positions,
        seq_lens=lens,
        slot_mapping=slot,
        block_table=block_table,
        query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
        num_reqs=n,
        max_seq_len=int(lens.max()),
        max_model_len=max_model_len,
        block_size=block_size,
    )
    return state.to(device) if str(device) != "cpu" else state


def random_state(
    generator: torch.Generator,
    *,
    batch_size: int,
    block_size: int,
    max_model_len: int,
    steps: int,
    num_padded: int = 0,
    device: torch.device | str = "cpu",
    near_limit: float = 0.2,
    near_boundary: float = 0.3,
) -> DraftState:
    """A random decode batch as a draft state, before its first in-place step.

    Context lengths are mixed: some requests end just before a block boundary (so drafting
    crosses it), some are within ``steps`` of ``max_model_len`` (so drafting reaches it), the rest
    are uniform. Block ids are a random permutation, so a wrong block lookup shows. ``num_padded``
    rows are appended as padding (slot -1, sequence length 0).
    """
    g = generator
    n = batch_size
    seq = torch.randint(2, max_model_len + 1, (n,), generator=g)
    kind = torch.rand(n, generator=g)
    for i in range(n):
        if kind[i] < near_limit:
            seq[i] = max_model_len - int(torch.randint(0, steps + 1, (1,), generator=g))
        elif kind[i] < near_limit + near_boundary:
            blocks = max(1, int(seq[i]) // block_size)
            seq[i] = blocks * block_size - int(torch.randint(0, steps + 1, (1,), generator=g))
    seq = seq.clamp(2, max_model_len)
    return state_for_lengths(
        g, seq, block_size=block_size, max_model_len=max_model_len, num_padded=num_padded,
        device=device,
    )


def check_sizes(
    block_sizes: Sequence[int],
    max_model_lens: Sequence[int],
    max_steps: int,
    max_batch_size: int,
) -> None:
    """Refuse options with which the edge-case schedule cannot be drawn.

    Raises:
        ValueError: naming the option, its value and the smallest value that works.
    """
    if type(max_steps) is not int or max_steps < 2:
        raise ValueError(f"max_steps is {max_steps!r}; it must be an int >= 2 (K draft steps "
                         "include the build and at least one update)")
    if type(max_batch_size) is not int or max_batch_size < 1:
        raise ValueError(f"max_batch_size is {max_batch_size!r}; it must be an int >= 1")
    if not block_sizes or any(type(b) is not int or b < 1 for b in block_sizes):
        raise ValueError(f"block_sizes is {tuple(block_sizes)!r}; give one or more ints >= 1")
    if not max_model_lens:
        raise ValueError("max_model_lens is empty; give one or more context limits")
    need = max(block_sizes) + max_steps + 2
    for length in max_model_lens:
        if type(length) is not int or length < need:
            raise ValueError(
                f"max_model_len {length!r} is too short for block_size {max(block_sizes)} "
                f"and K up to {max_steps}: the block-crossing edge case needs a block boundary "
                f"that drafting crosses before max_model_len; use max_model_len >= {need}"
            )


@attrs.frozen
class BatchCase:
    """One batch of the edge-case schedule, everything drawn from its seed.

    Attributes:
        seed: the batch seed (printed in reports; ``check_spec(..., seed=seed, batches=1)``
            reruns exactly this batch).
        kind: which edge case the batch is built for.
        policy: the overflow policy of the source advance.
        host_bound: how the host ``max_seq_len`` moves.
        batch_size: real requests.
        num_padded: padding rows after them.
        block_size: the KV-cache block size.
        max_model_len: the context limit.
        steps: draft steps K: the metadata is built for step 0, then advanced and updated
            K - 1 times.
        state_seed: the seed of the generator that draws the state (drawn from ``seed``).
    """

    seed: int
    kind: EdgeCase
    policy: OverflowPolicy
    host_bound: HostBound
    batch_size: int
    num_padded: int
    block_size: int
    max_model_len: int
    steps: int
    state_seed: int

    def state(self, device: torch.device | str = "cpu") -> DraftState:
        """The batch's draft state before its first step (a fresh one on every call), with
        its buffers on ``device`` (drawn on the CPU, so the same on every device)."""
        g = torch.Generator().manual_seed(self.state_seed)
        bs, length, padded = self.block_size, self.max_model_len, self.num_padded
        if self.kind in ("block_crossing", "at_max_model_len"):
            lens = []
            for _ in range(self.batch_size):
                # r + 1 <= K - 1 advances: the crossing (or the overflow) happens while drafting
                r = int(torch.randint(0, self.steps - 1, (1,), generator=g))
                if self.kind == "at_max_model_len":
                    lens.append(self.max_model_len - r)
                else:
                    top = (self.max_model_len - self.steps) // self.block_size
                    m = 1 + int(torch.randint(0, top, (1,), generator=g))
                    lens.append(max(m * self.block_size - r, 2))
            return state_for_lengths(g, lens, block_size=bs, max_model_len=length,
                                     num_padded=padded, device=device)
        return random_state(g, batch_size=self.batch_size, steps=self.steps, block_size=bs,
                            max_model_len=length, num_padded=padded, device=device)

    def __str__(self) -> str:
        return f"{self.shape()}\n{self.schedule()}"

    def shape(self) -> str:
        """The seed, kind and batch shape: ``seed 3 (padded rows): 7 requests + 2 padded rows``."""
        reqs = f"{self.batch_size} request{'s' if self.batch_size != 1 else ''}"
        pads = f"{self.num_padded} padded row{'s' if self.num_padded != 1 else ''}"
        return f"seed {self.seed} ({_LABELS[self.kind]}): {reqs} + {pads}"

    def schedule(self) -> str:
        """Block size, context limit, K and the policies of the batch."""
        return (
            f"block_size {self.block_size}, max_model_len {self.max_model_len}, "
            f"K={self.steps} draft steps, policy {self.policy}, host bound {self.host_bound}"
        )


def batch_case(
    seed: int,
    policy: OverflowPolicy = "clamp",
    host_bound: HostBound = "advance",
    *,
    block_sizes: Sequence[int] = (16,),
    max_model_lens: Sequence[int] = (256, 1000),
    max_steps: int = 8,
    max_batch_size: int = 64,
    padded_rows: bool = True,
) -> BatchCase:
    """The batch of the edge-case schedule for ``seed`` (its kind is ``EDGE_CASES[seed % 5]``).

    The same seed gives the same batch under either policy, so a spec that fails under one
    policy only shows on the same batch. ``padded_rows=False`` never appends padding rows (for
    a builder that does not support them): the ``padded_rows`` kind becomes ``mixed``.
    K is drawn from ``2..max_steps``, the block size and context limit from the options given.
    """
    check_sizes(block_sizes, max_model_lens, max_steps, max_batch_size)
    g = torch.Generator().manual_seed(seed)

    def pick(options: Sequence[int]) -> int:
        return int(options[int(torch.randint(len(options), (1,), generator=g))])

    kind = EDGE_CASES[seed % len(EDGE_CASES)]
    if kind == "padded_rows" and not padded_rows:
        kind = "mixed"
    block_size = pick(block_sizes)
    max_model_len = pick(max_model_lens)
    steps = 2 + int(torch.randint(0, max_steps - 1, (1,), generator=g))
    sizes = [min(b, max_batch_size) for b in (2, 3, 7, 16, max_batch_size)]
    sizes.append(1 + int(torch.randint(0, max_batch_size, (1,), generator=g)))
    batch = 1 if kind == "batch_of_one" else pick(sizes)
    if kind == "padded_rows":
        padded = 1 + int(torch.randint(0, 4, (1,), generator=g))
    elif kind == "batch_of_one" or not padded_rows:
        padded = 0
    else:
        padded = pick((0, 0, 3))
    state_seed = int(torch.randint(0, 2**62, (1,), generator=g))
    return BatchCase(seed, kind, policy, host_bound, batch, padded, block_size, max_model_len,
                     steps, state_seed)
