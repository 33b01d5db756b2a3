"""The greedy speculative draft loop over the plain-torch reference, with simulated bugs.

:func:`speculative_generate` runs the MTP layer's draft loop over
:class:`~draftmeta.integrations.vllm.tools.e2e.trained.reference.Reference` as vLLM chains it
(greedy verification, the recycled post-norm hidden state) and counts what was accepted per
draft position (:class:`DraftStats`). A :class:`Bug` makes the draft steps use one stale
metadata value from a chosen step on, as a forgotten field of an in-place update would; the
training script's bug table (``train.bug_table``) says how far each lowers acceptance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import torch

from draftmeta.integrations.vllm.tools.e2e.trained.reference import Reference

__all__ = ["BUG_KINDS", "Bug", "DraftStats", "speculative_generate"]

BugKind = Literal["seq_lens", "positions", "slot_mapping", "max_seq_len"]
BUG_KINDS: tuple[BugKind, ...] = ("seq_lens", "positions", "slot_mapping", "max_seq_len")
"""The simulated draft-metadata bugs (see :class:`Bug`)."""


@attrs.frozen
class Bug:
    """A simulated stale draft-metadata update, from draft step ``first_step`` on.

    Draft step ``j`` (``1 .. K-1``) runs at position ``q = p + j`` (``p``: the position of the
    last verified token). With the bug, the value stays the one of step ``first_step - 1``,
    ``s = j - first_step + 1`` steps behind:

    * ``seq_lens``: the step attends over slots ``[0, q - s]`` only;
    * ``positions``: query and new key get RoPE (and the position-0 mask) for ``q - s``;
    * ``slot_mapping``: the new entry is written into the slot of ``q - s`` (overwriting it) and
      slot ``q`` keeps whatever it held;
    * ``max_seq_len``: every request attends over at most the batch's stale longest length (the
      longest request loses its newest ``s`` slots, shorter ones nothing).

    Attributes:
        kind: which value stays stale.
        first_step: the first draft step that gets it wrong (1: from step 1 on, 2: from 2 on).
    """

    kind: BugKind
    first_step: int = 1


@attrs.define
class DraftStats:
    """What a greedy speculative run did.

    Attributes:
        k: draft tokens per step.
        drafts: verified draft proposals (one per request per verification).
        accepted_per_position: per draft position ``1 .. K``, how many were accepted.
        outputs: per prompt, the generated tokens.
        proposals: per propose call (prefill and every verification), per request in the call,
            the ``K`` draft tokens (``[call][request][position]``).
    """

    k: int
    drafts: int = 0
    accepted_per_position: list[int] = attrs.field(factory=list)
    outputs: list[list[int]] = attrs.field(factory=list)
    proposals: list[list[list[int]]] = attrs.field(factory=list)

    @property
    def acceptance_per_position(self) -> list[float]:
        """Per draft position, the fraction of verified proposals that accepted it."""
        return [a / max(self.drafts, 1) for a in self.accepted_per_position]

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over verified draft tokens."""
        return sum(self.accepted_per_position) / max(self.drafts * self.k, 1)

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted draft tokens per verification (vLLM's definition)."""
        return 1.0 + sum(self.accepted_per_position) / max(self.drafts, 1)


@attrs.define
class _Request:
    prompt: list[int]
    target_cache: torch.Tensor
    mtp_cache: torch.Tensor
    tokens: list[int]
    out: list[int] = attrs.field(factory=list)
    drafts: list[int] = attrs.field(factory=list)
    p: int = 0
    hidden: torch.Tensor | None = None
    done: bool = False


@torch.no_grad()
def speculative_generate(model: Reference, prompts: Sequence[Sequence[int]], k: int,
                         max_tokens: int, bug: Bug | None = None,
                         recycle: Literal["post_norm", "pre_norm"] = "post_norm") -> DraftStats:
    """Greedy generation with the MTP layer drafting ``k`` tokens per step, as vLLM runs it.

    All requests advance in lockstep (one batch): prefill, then per round each unfinished
    request verifies its drafts with the target, accepts the longest matching prefix plus the
    target's next token, runs the MTP layer's first draft step over the newly verified positions
    (the target's normed hidden states) and ``k - 1`` chained draft steps (the MTP layer's own
    recycled hidden state: ``recycle`` says which, post-norm as in vLLM). A request
    stops once it has ``max_tokens`` tokens (extra accepted tokens are dropped, as vLLM does).
    ``bug`` simulates a stale draft-metadata update (:class:`Bug`).
    """
    c = model.config
    dtype = model.lm_head.weight.dtype
    slots = max(len(p) for p in prompts) + max_tokens + k + 2
    width = c.kv_lora_rank + c.qk_rope_head_dim
    stats = DraftStats(k=k, accepted_per_position=[0] * k)
    requests = [_Request(list(p), torch.zeros(c.num_hidden_layers, slots, width, dtype=dtype),
                         torch.zeros(slots, width, dtype=dtype), list(p)) for p in prompts]

    def first_draft(r: _Request, start: int, hidden: torch.Tensor) -> None:
        # MTP step 0 over positions start .. len(tokens) - 2 (tokens shifted by one)
        positions = torch.arange(start, len(r.tokens) - 1)
        toks = torch.tensor(r.tokens[start + 1:])
        o = model.mtp_step(r.mtp_cache, toks, hidden, positions, positions, positions + 1)
        r.p = int(positions[-1])
        r.hidden = (o.post_norm if recycle == "post_norm" else o.pre_norm)[-1:]
        r.drafts = [int(o.logits[-1].argmax())]

    # prefill: the target over the prompt, then the MTP layer's first draft step over it
    for r in requests:
        hidden, logits = model.target_step(r.target_cache, torch.tensor(r.tokens), 0)
        nxt = int(logits[-1].argmax())
        r.tokens.append(nxt)
        r.out.append(nxt)
        r.done = len(r.out) >= max_tokens
        first_draft(r, 0, hidden)
    active = requests
    while True:
        # chained draft steps 1 .. k-1 for every request of this step's batch (vLLM drafts
        # for a request that has just finished too: the scheduler learns it afterwards)
        for j in range(1, k):
            s = j - bug.first_step + 1 if bug is not None else 0
            stale_max = max(r.p + j - s + 1 for r in active)
            for r in active:
                q = r.p + j
                rope_pos, slot, visible = q, q, q + 1
                if bug is not None and s > 0:
                    if bug.kind == "seq_lens":
                        visible = q - s + 1
                    elif bug.kind == "positions":
                        rope_pos = q - s
                    elif bug.kind == "slot_mapping":
                        slot = q - s
                    else:
                        visible = min(visible, stale_max)
                assert r.hidden is not None
                o = model.mtp_step(r.mtp_cache, torch.tensor([r.drafts[-1]]), r.hidden,
                                   torch.tensor([rope_pos]), torch.tensor([slot]),
                                   torch.tensor([visible]))
                r.hidden = o.post_norm if recycle == "post_norm" else o.pre_norm
                r.drafts.append(int(o.logits[-1].argmax()))
        stats.proposals.append([list(r.drafts) for r in active])
        active = [r for r in active if not r.done]
        if not active:
            break
        # verification: the target on the last token and the k drafts
        for r in active:
            n = len(r.tokens) - 1  # position of the last token, verified but not yet input
            chunk = torch.tensor([r.tokens[-1], *r.drafts])
            hidden, logits = model.target_step(r.target_cache, chunk, n)
            greedy = logits.argmax(-1).tolist()
            a = 0
            while a < k and r.drafts[a] == greedy[a]:
                stats.accepted_per_position[a] += 1
                a += 1
            stats.drafts += 1
            new = [*r.drafts[:a], greedy[a]]
            r.tokens.extend(new)
            r.out.extend(new)
            if len(r.out) >= max_tokens:
                r.out = r.out[:max_tokens]
                r.done = True
            first_draft(r, n, hidden[: a + 1])
    stats.outputs = [r.out for r in requests]
    return stats
