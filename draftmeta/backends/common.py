"""Rules and preconditions shared by the backend specs (MLA, the indexer): the host
``max_seq_len`` under a host bound and DCP, and the preconditions of chain drafting."""

from __future__ import annotations

from draftmeta.advance import HostBound
from draftmeta.conditions import Equals, IsNone, IsNotNone, Precondition, SameValue, Satisfies
from draftmeta.rules import HostDerive, HostUpperBound, Rule, copy_of

__all__ = [
    "dcp_max_seq_len",
    "decode_only",
    "max_seq_len_rule",
]


def dcp_max_seq_len(max_seq_len: int, world: int, interleave: int) -> int:
    """The per-rank bound vLLM's MLA builder uses under DCP: ``ceil(L / (N*I)) * I``."""
    parts = world * interleave
    return (max_seq_len + parts - 1) // parts * interleave


def max_seq_len_rule(host_bound: HostBound, dcp: bool) -> Rule:
    """The rule for an MLA-style host ``max_seq_len`` under a host bound and DCP."""
    if host_bound not in ("advance", "frozen"):
        raise ValueError(f"host bound must be 'advance' or 'frozen', got {host_bound!r}")
    source = "state.max_seq_len" if host_bound == "advance" else "state.max_model_len"
    if dcp:
        return HostDerive(
            dcp_max_seq_len,
            (source, "state.dcp_world_size", "state.dcp_interleave"),
            formula="ceil(L / (dcp_world_size * interleave)) * interleave",
        )
    if host_bound == "frozen":
        return HostUpperBound("max_model_len")
    return copy_of(source)


def _dcp_enabled(world: int) -> bool:
    return world > 1


def decode_only(
    *, dcp: bool, decode_part: bool = True, max_query_len: bool = True
) -> list[Precondition]:
    """Preconditions of chain drafting: a decode-only batch, one query token per request."""
    conditions: list[Precondition] = [
        Equals("num_prefills", 0, name="decode_only"),
        IsNone("prefill", name="no_prefill_part"),
        SameValue("num_decodes", "num_decode_tokens", name="one_token_per_request"),
    ]
    if max_query_len:
        conditions.insert(2, Equals("max_query_len", 1, name="query_len_1"))
    if decode_part:
        conditions.insert(0, _has("decode"))
    conditions.insert(  # the draft-state condition first: it holds for every group alike
        0,
        Satisfies("dcp_enabled", _dcp_enabled, ("state.dcp_world_size",), "dcp_world_size > 1")
        if dcp
        else Equals("state.dcp_world_size", 1, name="no_dcp"),
    )
    return conditions


def _has(ref: str) -> Precondition:
    return IsNotNone(ref, name=f"has_{ref}")
