"""A builder without the update method: mypy --strict must reject passing it as capable."""

from __future__ import annotations

import dataclasses

import torch

from draftmeta import DraftState, SupportsDraftUpdate


@dataclasses.dataclass
class MyMeta:
    seq_lens: torch.Tensor


class NotCapable:
    def build(self, state: DraftState) -> MyMeta:
        return MyMeta(state.seq_lens)


def refresh(builder: SupportsDraftUpdate[MyMeta], meta: MyMeta, state: DraftState) -> None:
    builder.update_draft_metadata(meta, state)


def run(state: DraftState) -> None:
    builder = NotCapable()
    refresh(builder, builder.build(state), state)  # error: missing update_draft_metadata
