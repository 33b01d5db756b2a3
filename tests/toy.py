"""A small metadata family used by the core tests (not a backend)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Generic, TypeVar

import torch

from draftmeta import (
    Advance,
    Alias,
    Clamp,
    CopyFrom,
    Derive,
    DraftSpec,
    Equals,
    Fill,
    HostAdvance,
    HostConstant,
    HostDerive,
    IsNotNone,
    Reset,
    Rule,
    SameValue,
    Unchanged,
    Wrap,
)


class Scheduler:
    """A lazily filled host object (like FlashMLA's scheduler metadata)."""

    def __init__(self) -> None:
        self.filled = False


@dataclasses.dataclass
class ToyDecode:
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    lens_copy: Annotated[torch.Tensor, torch.int32]
    decode_lens: torch.Tensor
    dcp_tot_seq_lens: torch.Tensor | None


D = TypeVar("D")


@dataclasses.dataclass
class ToyMeta(Generic[D]):
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    max_seq_len: int
    scale: float
    causal: bool
    positions: Annotated[torch.Tensor, torch.int64]
    slot_mapping: torch.Tensor
    weights: Annotated[torch.Tensor, torch.float32]
    scheduler: Scheduler
    decode: D | None



def toy_rules(policy: str = "clamp") -> dict[str, Rule]:
    """A correct rule set for ToyMeta[ToyDecode]; its own positions follow ``policy``."""
    positions = (
        Advance(Clamp("max_model_len", offset=-1), rows="num_reqs")
        if policy == "clamp"
        else Advance(Wrap("max_model_len", offset=-1, restart=0), rows="num_reqs")
    )
    return {
        "num_reqs": HostConstant(),
        "num_decodes": HostConstant(),
        "num_decode_tokens": HostConstant(),
        "num_prefills": HostConstant(),
        "max_seq_len": HostAdvance(clamp="max_model_len"),
        "scale": HostDerive(lambda m: 1.0 / m, ("state.max_model_len",), formula="1/L"),
        "causal": HostConstant(),
        "positions": positions,
        "slot_mapping": Alias("slot_mapping"),
        "weights": Unchanged(),
        "scheduler": Reset(Scheduler),
        "decode.block_table": Unchanged(),
        "decode.seq_lens": Alias("seq_lens"),
        "decode.lens_copy": Derive(CopyFrom(), ("decode.seq_lens",)),
        "decode.decode_lens": Derive(Fill(1), ()),
        "decode.dcp_tot_seq_lens": Unchanged(),
    }


def toy_spec(**overrides: object) -> DraftSpec[ToyMeta[ToyDecode]]:
    kwargs: dict[str, object] = {
        "name": "toy",
        "nested": {"decode": ToyDecode},
        "preconditions": [
            IsNotNone("decode", name="has_decode"),
            Equals("num_prefills", 0, name="decode_only"),
            SameValue("num_decodes", "num_decode_tokens", name="query_len_1"),
        ],
    }
    kwargs.update(overrides)
    rules = kwargs.pop("rules", toy_rules())
    return DraftSpec(ToyMeta, rules, **kwargs)  # type: ignore[arg-type]


def toy_metadata(state: object) -> ToyMeta[ToyDecode]:
    """Metadata built "from scratch" for a draft state (the rebuild reference)."""
    from draftmeta import DraftState

    assert isinstance(state, DraftState)
    n = state.batch_size
    return ToyMeta(
        num_reqs=state.num_reqs,
        num_decodes=n,
        num_decode_tokens=n,
        num_prefills=0,
        max_seq_len=state.max_seq_len,
        scale=1.0 / state.max_model_len,
        causal=True,
        positions=state.positions.clone(),
        slot_mapping=state.slot_mapping,
        weights=torch.ones(n, dtype=torch.float32, device=state.device),
        scheduler=Scheduler(),
        decode=ToyDecode(
            block_table=state.block_table,
            seq_lens=state.seq_lens,
            lens_copy=state.seq_lens.clone(),
            decode_lens=torch.ones(n, dtype=torch.int32, device=state.device),
            dcp_tot_seq_lens=None,
        ),
    )


def toy_group(name: str, state: object, builder: object | None = None, *,
              spec: DraftSpec[Any] | None = None, metadata: object | None = None) -> Any:
    """A draft loop's attention group of the toy: ``metadata`` (default: built for ``state``),
    rebuilt with :func:`toy_metadata`, its builder ``builder`` or one declaring ``spec``
    (default: :func:`toy_spec`)."""
    from draftmeta.loop import AttentionGroup
    from draftmeta.protocol import SpecBuilder

    if builder is None:
        builder = SpecBuilder(spec if spec is not None else toy_spec())
    return AttentionGroup(name, builder, toy_metadata(state) if metadata is None else metadata,
                          lambda s, i: toy_metadata(s))
