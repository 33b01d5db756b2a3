"""The synthetic task the trained model learns: deterministic sequences and prompts from a seed.

A sequence is ``BOS`` followed by symbols (token ids ``2 .. 2 + symbols - 1``). Each symbol after
the first ``max(lags)`` follows a fixed random lookup table over the symbols at the given lags
before it (``x[t] = table[x[t - lags[0]], x[t - lags[1]], ...]``); with probability ``noise``
(training data and prompts only) it is a uniformly random symbol instead, so that the prompts
do not fall into the table's short cycles and every table entry is seen. A model that learned
the table continues any prompt deterministically.

Why lags 1 and 2: the MTP layer at position ``i`` embeds token ``x[i + 1]`` and predicts
``x[i + 2] = table[x[i + 1], x[i]]``. Its own token is in its residual stream, so the one thing it
must read from its KV cache is ``x[i]``, which the key at position ``i - 1`` carries: the key
written by the *previous* draft step. A draft step that cannot see that key (``seq_lens`` or
``max_seq_len`` not advanced), finds it overwritten (slot mapping not advanced) or looks for it at
the wrong relative position (positions not advanced: RoPE makes the lookup position-precise)
reads the wrong symbol and drafts a wrong token. A plain copy task would not be sensitive: the
token to copy sits far back in the cache, where a stale update changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

__all__ = ["BOS", "DEFAULT_TASK", "EVAL_MAX_TOKENS", "EVAL_PROMPTS", "FIRST_SYMBOL", "Task"]

BOS = 0
"""Token id every sequence and prompt starts with."""

FIRST_SYMBOL = 2
"""Token id of symbol 0 (ids 0 and 1 are BOS and EOS, never produced by the task)."""

EVAL_PROMPTS = 16
"""Prompts acceptance is measured on (``task.prompts(EVAL_PROMPTS, seed=0)``)."""

EVAL_MAX_TOKENS = 32
"""Tokens generated per prompt when acceptance is measured; prompts (at most 32 tokens) plus
these stay within the 64 positions the model is trained on."""


@attrs.frozen
class Task:
    """A lookup-table sequence task.

    Attributes:
        symbols: how many symbols (token ids ``FIRST_SYMBOL .. FIRST_SYMBOL + symbols - 1``).
        lags: the table's arguments, as distances back from the predicted token.
        noise: probability that a symbol of training data or a prompt is random instead.
        seed: seed of the table.
    """

    symbols: int = 16
    lags: tuple[int, ...] = (1, 2)
    noise: float = 0.15
    seed: int = 0

    @property
    def vocab_size(self) -> int:
        """Smallest vocabulary holding BOS, EOS and the symbols."""
        return FIRST_SYMBOL + self.symbols

    def table(self) -> torch.Tensor:
        """The lookup table: ``symbols ** len(lags)`` symbols (0-based), flat, indexed by the
        lagged symbols in ``lags`` order (most significant first)."""
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, self.symbols, (self.symbols ** len(self.lags),),
                             generator=generator)

    def next_symbols(self, history: torch.Tensor, table: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """The table's next symbol (0-based) after each row of ``history`` (``[..., t]``
        0-based symbols, ``t >= max(lags)``)."""
        table = self.table() if table is None else table
        index = torch.zeros(history.shape[:-1], dtype=torch.long)
        for lag in self.lags:
            index = index * self.symbols + history[..., -lag]
        return table[index]

    def sequences(self, count: int, length: int, generator: torch.Generator,
                  noise: float | None = None) -> torch.Tensor:
        """``count`` sequences of ``length`` token ids (BOS first), ``[count, length]``."""
        noise = self.noise if noise is None else noise
        table = self.table()
        start = max(self.lags)
        body = length - 1
        symbols = torch.empty(count, body, dtype=torch.long)
        symbols[:, :start] = torch.randint(0, self.symbols, (count, start), generator=generator)
        random = torch.randint(0, self.symbols, (count, body), generator=generator)
        flips = torch.rand(count, body, generator=generator) < noise
        for t in range(start, body):
            ruled = self.next_symbols(symbols[:, :t], table)
            symbols[:, t] = torch.where(flips[:, t], random[:, t], ruled)
        bos = torch.full((count, 1), BOS, dtype=torch.long)
        return torch.cat([bos, symbols + FIRST_SYMBOL], dim=1)

    def prompts(self, count: int, seed: int, min_length: int = 12, max_length: int = 32
                ) -> tuple[tuple[int, ...], ...]:
        """``count`` prompts (token ids, BOS first) of lengths in ``[min_length, max_length]``,
        from ``seed`` (a different stream than training data for any seed)."""
        generator = torch.Generator().manual_seed(0x5EED0000 + seed)
        lengths = torch.randint(min_length, max_length + 1, (count,), generator=generator)
        rows = self.sequences(count, max_length, generator)
        return tuple(tuple(int(t) for t in row[:n]) for row, n in zip(rows, lengths.tolist()))

    def continuation(self, prompt: Sequence[int], count: int) -> list[int]:
        """The table's (noise-free) continuation of ``prompt`` by ``count`` tokens."""
        table = self.table()
        symbols = [t - FIRST_SYMBOL for t in prompt[1:]]
        out: list[int] = []
        for _ in range(count):
            nxt = int(self.next_symbols(torch.tensor(symbols), table))
            symbols.append(nxt)
            out.append(nxt + FIRST_SYMBOL)
        return out


DEFAULT_TASK = Task()
"""The task the shipped checkpoint was trained on."""
