"""The shared source advance: positions, sequence lengths and slot mapping, once per step.

The draft loop advances the :class:`~draftmeta.state.DraftState` once per draft step for every
attention group together. That advance is itself a spec over ``DraftState`` (draftmeta's own
machinery, generated and checked like any backend's), chosen by the overflow policy:

* ``"wrap"`` (vLLM's older proposer): a position that reaches ``max_model_len`` restarts at 0,
  its sequence length at 1, and its slot becomes -1 (padding);
* ``"clamp"`` (vLLM's new model runner): the position stops at ``max_model_len - 1``, the
  sequence length at ``max_model_len``, and the slot stays real.

Either way only the ``num_reqs`` real rows advance: padded rows keep their positions and
sequence lengths (0, as vLLM's runners leave them) and always get slot -1. Every host operand
(``max_model_len``, ``block_size``, ``num_reqs``) is checked to be an exact int in range before
the first write, so an invalid state cannot leave the advance half-applied.

A group's spec that advances its own copy of a position must use the same policy as the loop
(:func:`check_policy`); the draft loop refuses a mismatch when it is built.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from draftmeta.conditions import Equals, Precondition, Satisfies
from draftmeta.derivations import DcpLocalSeqLens, SlotMapping
from draftmeta.errors import SpecError
from draftmeta.rules import (
    Advance,
    Clamp,
    Derive,
    HostAdvance,
    HostConstant,
    HostUpperBound,
    Rule,
    Unchanged,
    Wrap,
)
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = [
    "HostBound",
    "OverflowPolicy",
    "advance_spec",
    "advance_state",
    "check_policy",
    "overflow_policies",
]

OverflowPolicy = Literal["wrap", "clamp"]
"""How positions past ``max_model_len`` are handled: vLLM's older proposer wraps, its new runner
clamps."""

HostBound = Literal["advance", "frozen"]
"""How the host ``max_seq_len`` moves: ``+1`` per step clamped to ``max_model_len``, or frozen at
``max_model_len`` (the worst case a captured CUDA graph needs)."""


def _positions_rule(policy: OverflowPolicy) -> Advance:
    if policy == "wrap":
        return Advance(Wrap("max_model_len", offset=-1, restart=0), rows="num_reqs")
    return Advance(Clamp("max_model_len", offset=-1), rows="num_reqs")


def _seq_lens_rule(policy: OverflowPolicy) -> Advance:
    if policy == "wrap":
        return Advance(Wrap("max_model_len", offset=0, restart=1), rows="num_reqs")
    return Advance(Clamp("max_model_len"), rows="num_reqs")


def _dcp_enabled(world: int) -> bool:
    return world > 1


def _valid_policy(policy: object, host_bound: object) -> None:
    if policy not in ("wrap", "clamp"):
        raise ValueError(f"overflow policy must be 'wrap' or 'clamp', got {policy!r}")
    if host_bound not in ("advance", "frozen"):
        raise ValueError(f"host bound must be 'advance' or 'frozen', got {host_bound!r}")


@functools.cache
def advance_spec(
    policy: OverflowPolicy = "clamp", host_bound: HostBound = "advance", dcp: bool = False
) -> DraftSpec[DraftState]:
    """The spec of one step of the source advance, for an overflow policy and DCP setting.

    With ``dcp=True`` the DCP-local sequence lengths are recomputed from the global ones every
    step (never incremented); otherwise ``state.dcp_local_seq_lens`` is left alone.
    """
    _valid_policy(policy, host_bound)
    rules: dict[str, Rule] = {
        "positions": _positions_rule(policy),
        "seq_lens": _seq_lens_rule(policy),
        "slot_mapping": Derive(
            SlotMapping(),
            ("positions", "block_table", "seq_lens", "block_size", "num_reqs"),
        ),
        "dcp_local_seq_lens": (
            Derive(
                DcpLocalSeqLens(), ("seq_lens", "dcp_world_size", "dcp_rank", "dcp_interleave")
            )
            if dcp
            else Unchanged()
        ),
        "max_seq_len": (
            HostAdvance(clamp="max_model_len")
            if host_bound == "advance"
            else HostUpperBound("max_model_len")
        ),
        "step": HostAdvance(),
        "block_table": Unchanged(),
        "query_start_loc": Unchanged(),
        "num_reqs": HostConstant(),
        "max_model_len": HostConstant(),
        "block_size": HostConstant(),
        "dcp_world_size": HostConstant(),
        "dcp_rank": HostConstant(),
        "dcp_interleave": HostConstant(),
        "workspace": Unchanged(),
    }
    preconditions: list[Precondition] = [
        Satisfies("dcp_enabled", _dcp_enabled, ("dcp_world_size",), "dcp_world_size > 1")
        if dcp
        else Equals("dcp_world_size", 1, name="dcp_disabled")
    ]
    return DraftSpec(
        DraftState,
        rules,
        name=f"draft_state.{policy}.{host_bound}{'.dcp' if dcp else ''}",
        preconditions=preconditions,
    )


def overflow_policies(spec: DraftSpec[Any]) -> dict[str, OverflowPolicy]:
    """``{path: "clamp" | "wrap"}`` for every field the spec advances with an overflow policy."""
    return {
        path: rule.overflow_policy
        for path, rule in spec.rules.items()
        if rule.overflow_policy is not None
    }


def check_policy(spec: DraftSpec[Any], policy: OverflowPolicy) -> None:
    """Refuse a spec whose own advances move differently from the loop's source advance.

    A clamp spec in a wrap loop (or the reverse) would update without complaint and drift from
    the state at ``max_model_len``. (An advance of padded rows is refused earlier, when the
    spec is declared.)

    Raises:
        SpecError: naming the field, its policy and the loop's.
    """
    for path, own in overflow_policies(spec).items():
        if own != policy:
            raise SpecError(
                spec.name,
                path,
                f"advances with the {own} overflow policy, but the draft loop's source advance "
                f"uses {policy}, so the field would drift from the state at max_model_len",
                f"declare it Advance({'Wrap' if policy == 'wrap' else 'Clamp'}(...)) to match, "
                f"or run the loop with policy={own!r}",
            )


def advance_state(
    state: DraftState, policy: OverflowPolicy = "clamp", host_bound: HostBound = "advance"
) -> None:
    """Advance ``state`` by one draft step in place (positions, seq_lens, slot mapping, ...)."""
    advance_spec(policy, host_bound, state.dcp_world_size > 1).update(state, state)
