"""The prompts of an end-to-end run: a file of the user's, the trained model's task, or random.

``--prompts FILE`` is JSON Lines, one prompt per line, either text (``{"text": "..."}`` or
``{"prompt": "..."}``, put through the model folder's tokenizer with ``transformers``) or token
ids (``{"prompt_token_ids": [...]}`` or a bare list). Batch size ``b`` runs the first ``b``
prompts, the file's prompts taken again from its start where it holds fewer. Without a file the
trained model runs its task's prompts and every other model random token ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from draftmeta.integrations.vllm.tools.e2e.errors import E2EUnavailable

__all__ = ["PromptProblem", "Prompts", "make_prompts", "prompts_for", "read_prompts"]


class PromptProblem(E2EUnavailable):
    """A prompts file cannot be used: the message names the file, the line and the fix."""


@attrs.frozen
class Prompts:
    """A pool of prompts as token ids.

    Attributes:
        token_ids: the prompts, in order.
        origin: where they come from, in words (``random token ids``, ``the trained model's
            task``, the file's path).
    """

    token_ids: tuple[tuple[int, ...], ...]
    origin: str

    def batch(self, size: int) -> tuple[tuple[int, ...], ...]:
        """The first ``size`` prompts (from the start again where the pool holds fewer)."""
        if not self.token_ids:
            raise ValueError("an empty prompt pool has no batch")
        return tuple(self.token_ids[i % len(self.token_ids)] for i in range(size))

    @property
    def longest(self) -> int:
        """The longest prompt's length in tokens."""
        return max((len(p) for p in self.token_ids), default=0)


def make_prompts(count: int, seed: int, vocab_size: int = 2048
                 ) -> tuple[tuple[int, ...], ...]:
    """``count`` prompts of token ids in ``[2, min(vocab_size, 2048))`` with mixed lengths (16 to
    95 tokens), from ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 96, (count,), generator=generator).tolist()
    high = max(3, min(vocab_size, 2048))
    return tuple(tuple(torch.randint(2, high, (n,), generator=generator).tolist())
                 for n in lengths)


def _tokenizer(folder: Path, path: Path, line: int) -> Any:
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise PromptProblem(
            f"--prompts {path}, line {line}: a text prompt, but {folder} has no tokenizer "
            f"transformers can load ({type(exc).__name__}: {str(exc)[:200]}); give token ids "
            '({"prompt_token_ids": [...]}) or add the tokenizer files to the model folder'
        ) from exc


def read_prompts(path: Path, folder: Path | None, vocab_size: int) -> tuple[tuple[int, ...], ...]:
    """The prompts of the JSON Lines file ``path`` as token ids (module docs); text goes
    through the tokenizer in ``folder``.

    Raises:
        PromptProblem: the file is missing or empty, a line is not a prompt, a text prompt has
            no tokenizer to go through, or a token id is outside the vocabulary.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptProblem(f"--prompts {path}: cannot read it ({exc})") from exc
    tokenizer: Any = None
    prompts: list[tuple[int, ...]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError as exc:
            raise PromptProblem(f"--prompts {path}, line {number}: not JSON ({exc})") from exc
        text = item.get("text", item.get("prompt")) if isinstance(item, dict) else None
        ids = (item.get("prompt_token_ids", item.get("token_ids")) if isinstance(item, dict)
               else item)
        if isinstance(text, str):
            if folder is None:
                raise PromptProblem(f"--prompts {path}, line {number}: a text prompt needs a "
                                    "model folder with a tokenizer; give token ids instead")
            tokenizer = tokenizer or _tokenizer(folder, path, number)
            ids = tokenizer(text)["input_ids"]
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise PromptProblem(
                f"--prompts {path}, line {number}: expected {{\"text\": \"...\"}}, "
                '{"prompt_token_ids": [int, ...]} or a non-empty list of token ids')
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise PromptProblem(f"--prompts {path}, line {number}: token id {bad[0]} is outside "
                                f"the model's vocabulary (0 to {vocab_size - 1})")
        prompts.append(tuple(ids))
    if not prompts:
        raise PromptProblem(f"--prompts {path}: no prompt in it (one JSON object per line)")
    return tuple(prompts)


def prompts_for(*, trained: bool, count: int, seed: int, vocab_size: int,
                file: Path | None = None, folder: Path | None = None,
                room: int | None = None) -> Prompts:
    """The run's prompt pool: the file's (``file``), the trained model's task prompts
    (``trained``), else ``count`` random prompts.

    Args:
        trained: the model is the shipped trained checkpoint.
        count: prompts wanted (the largest batch size).
        seed: the seed of generated prompts.
        vocab_size: the model's vocabulary size.
        file: a JSON Lines prompts file.
        folder: the model folder (its tokenizer, for text prompts).
        room: the longest prompt the engines can take (``max_model_len`` less the tokens to
            generate and the drafts); generated prompts are cut to it, a file's prompt longer
            than it is refused.

    Raises:
        PromptProblem: see :func:`read_prompts`; a prompt longer than ``room``.
    """
    if file is not None:
        pool = Prompts(read_prompts(file, folder, vocab_size), str(file))
        if room is not None and pool.longest > room:
            raise PromptProblem(
                f"--prompts {file}: a prompt of {pool.longest} tokens does not fit "
                f"--max-model-len with the tokens to generate (room for {room}): raise "
                "--max-model-len or lower --max-tokens")
        return pool
    if trained:
        from draftmeta.integrations.vllm.tools.e2e.trained import prompts

        return Prompts(prompts(count, seed), "the trained model's task")
    generated = make_prompts(count, seed, vocab_size)
    if room is not None:
        generated = tuple(p[:max(1, room)] for p in generated)
    return Prompts(generated, "random token ids")
