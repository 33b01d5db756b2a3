"""A builder capable for one metadata type used for another: mypy --strict must reject it."""

from __future__ import annotations

import dataclasses

import torch

from draftmeta import Alias, DraftSpec, DraftState, DraftUpdatable, SupportsDraftUpdate


@dataclasses.dataclass
class MlaMeta:
    seq_lens: torch.Tensor


@dataclasses.dataclass
class IndexerMeta:
    seq_lens: torch.Tensor


class MlaBuilder(DraftUpdatable[MlaMeta]):
    draft_spec = DraftSpec(MlaMeta, {"seq_lens": Alias("seq_lens")})


def refresh(
    builder: SupportsDraftUpdate[IndexerMeta], meta: IndexerMeta, state: DraftState
) -> None:
    builder.update_draft_metadata(meta, state)


def run(state: DraftState) -> None:
    refresh(MlaBuilder(), IndexerMeta(state.seq_lens), state)  # error: wrong metadata type
    MlaBuilder().update_draft_metadata(IndexerMeta(state.seq_lens), state)  # error too
