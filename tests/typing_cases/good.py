"""A correct user module: mypy --strict must accept it."""

from __future__ import annotations

import dataclasses

import torch

from draftmeta import (
    Alias,
    DraftSpec,
    DraftState,
    DraftUpdatable,
    HostAdvance,
    SupportsDraftUpdate,
    Unchanged,
)


@dataclasses.dataclass
class MyMeta:
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_seq_len: int


class MyBuilder(DraftUpdatable[MyMeta]):
    draft_spec = DraftSpec(
        MyMeta,
        {
            "seq_lens": Alias("seq_lens"),
            "block_table": Unchanged(),
            "max_seq_len": HostAdvance(clamp="max_model_len"),
        },
    )

    def build(self, state: DraftState) -> MyMeta:
        return MyMeta(state.seq_lens, state.block_table, state.max_seq_len)


class HandWritten:
    """A builder that implements the protocol by hand, without the base class."""

    def update_draft_metadata(self, metadata: MyMeta, state: DraftState, /) -> None:
        metadata.max_seq_len = state.max_seq_len


def refresh(builder: SupportsDraftUpdate[MyMeta], meta: MyMeta, state: DraftState) -> None:
    builder.update_draft_metadata(meta, state)


def run(state: DraftState) -> None:
    builder = MyBuilder()
    meta = builder.build(state)
    refresh(builder, meta, state)
    refresh(HandWritten(), meta, state)
    spec: DraftSpec[MyMeta] = MyBuilder.draft_spec
    spec.update(meta, state)
