"""Where a backend's metadata views the draft state's buffers: each layout declared once.

A built metadata record does not copy the runner's step buffers: some of its fields are views of
them (the sequence lengths, the slot mapping, the block table). A :class:`StateViews` names
those fields, and both directions read it: a spec's rule for such a field is an
:class:`~draftmeta.rules.Alias` of the buffer it views (:meth:`StateViews.rule`), and a draft
state over a built record's buffers is read from the same fields (:meth:`StateViews.read`; the
vLLM hook's full refresh starts from it).
"""

from __future__ import annotations

import operator
from typing import Any

import attrs

from draftmeta.rules import Alias, Rule, Unchanged

__all__ = ["FLAT", "MLA_DENSE", "MLA_DENSE_DCP", "StateViews", "mla_views", "views_of"]


@attrs.frozen
class StateViews:
    """Which field of a metadata record views each draft-state buffer (dotted paths).

    Attributes:
        seq_lens: the field viewing ``state.seq_lens`` (the global sequence lengths).
        block_table: the field viewing ``state.block_table``.
        slot_mapping: the field viewing ``state.slot_mapping``.
        query_start_loc: the top-level field viewing ``state.query_start_loc``, where the
            record has it (the indexer's has none).
        dcp_local_seq_lens: the field viewing ``state.dcp_local_seq_lens`` (DCP > 1), or
            ``None``.
    """

    seq_lens: str
    block_table: str
    slot_mapping: str = "slot_mapping"
    query_start_loc: str = "query_start_loc"
    dcp_local_seq_lens: str | None = None

    def __attrs_post_init__(self) -> None:
        paths = [self.seq_lens, self.block_table, self.slot_mapping, self.query_start_loc,
                 self.dcp_local_seq_lens]
        twice = sorted({p for p in paths if p is not None and paths.count(p) > 1})
        if twice:
            raise ValueError(f"a field views one buffer, but {twice} are named for two; name "
                             "each buffer's own field")

    def buffers(self) -> dict[str, str]:
        """``{field path: the state buffer it views}``."""
        found = {self.seq_lens: "seq_lens", self.block_table: "block_table",
                 self.slot_mapping: "slot_mapping", self.query_start_loc: "query_start_loc"}
        if self.dcp_local_seq_lens is not None:
            found[self.dcp_local_seq_lens] = "dcp_local_seq_lens"
        return found

    def rule(self, path: str) -> Rule:
        """The rule of the field at ``path`` in this layout: an :class:`~draftmeta.rules.Alias`
        of the buffer it views, or :class:`~draftmeta.rules.Unchanged` where it views none
        (MLA's ``decode.dcp_tot_seq_lens`` without DCP)."""
        buffer = self.buffers().get(path)
        return Unchanged() if buffer is None else Alias(buffer)

    def read(self, metadata: Any) -> dict[str, Any]:
        """``{state buffer: the tensor a built record's field holds}``: ``query_start_loc`` is
        ``None`` where the record has no such field, and so is ``dcp_local_seq_lens`` where
        this layout has none."""
        return {
            "seq_lens": operator.attrgetter(self.seq_lens)(metadata),
            "block_table": operator.attrgetter(self.block_table)(metadata),
            "slot_mapping": operator.attrgetter(self.slot_mapping)(metadata),
            "query_start_loc": getattr(metadata, self.query_start_loc, None),
            "dcp_local_seq_lens": None if self.dcp_local_seq_lens is None
            else operator.attrgetter(self.dcp_local_seq_lens)(metadata),
        }


MLA_DENSE = StateViews(seq_lens="decode.seq_lens", block_table="decode.block_table")
"""Dense MLA metadata (``MLACommonMetadata`` with a decode part): the decode part views the
lengths and the block table."""

MLA_DENSE_DCP = StateViews(seq_lens="decode.dcp_tot_seq_lens", block_table="decode.block_table",
                           dcp_local_seq_lens="decode.seq_lens")
"""Dense MLA metadata under DCP > 1: ``decode.seq_lens`` are the DCP-local lengths and
``decode.dcp_tot_seq_lens`` the global ones."""

FLAT = StateViews(seq_lens="seq_lens", block_table="block_table")
"""Metadata without a decode part (sparse MLA): the record's own fields view the buffers. The
indexer's spec declares its top-level fields by it too."""


def mla_views(dcp: bool) -> StateViews:
    """The dense MLA layout, with or without DCP > 1."""
    return MLA_DENSE_DCP if dcp else MLA_DENSE


def views_of(metadata: Any, dcp: bool) -> StateViews:
    """The layout a built record's buffers are read by: :data:`FLAT` where the record holds
    its own ``seq_lens`` (sparse MLA; the indexer, whose decode part holds copies, not views),
    else the dense MLA one where it has a decode part (under DCP > 1 its DCP variant), else
    :data:`FLAT`."""
    if not hasattr(metadata, "seq_lens") and getattr(metadata, "decode", None) is not None:
        return mla_views(dcp)
    return FLAT
