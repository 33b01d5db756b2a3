"""A FlashInfer-style paged decode metadata family for the check_spec tests (not a backend).

``kv_indices`` is a fixed-capacity buffer valid only up to ``kv_indptr[-1]``; ``kv_last_page_len``
is meaningful only for the first ``num_reqs`` rows (the builder leaves padded rows at 0, the
derivation writes ``block_size`` there). ``seq_lens`` is the builder's own int32 copy.
"""

from __future__ import annotations

import dataclasses

import torch

from draftmeta import (
    Advance,
    Clamp,
    CopyFrom,
    Derivation,
    Derive,
    DraftSpec,
    HostConstant,
    Rule,
    Workspace,
    copy_of,
)
from draftmeta.derivations import argument_problem
from draftmeta.testing import ValidPrefix


@dataclasses.dataclass
class PagedMeta:
    num_reqs: int
    max_seq_len: int
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor


VALID = {
    "kv_indices": ValidPrefix("kv_indptr", at=-1),
    "kv_last_page_len": ValidPrefix("state.num_reqs"),
}


def _tensor(x: object) -> torch.Tensor:
    assert isinstance(x, torch.Tensor)
    return x


@dataclasses.dataclass(frozen=True)
class PageIndptr(Derivation):
    name = "page_indptr"
    formula = "indptr[0] = 0; indptr[r + 1] = indptr[r] + ceil(seq_lens[r] / block_size)"
    arguments = ("tensor", "int")

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return argument_problem(inputs, self.arguments)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        seq_lens, block_size = _tensor(inputs[0]), int(inputs[1])  # type: ignore[call-overload]
        pages = workspace.buffer("pages", tuple(seq_lens.shape), torch.int32, out.device)
        torch.add(seq_lens, block_size - 1, out=pages)
        pages.div_(block_size, rounding_mode="floor")
        out[:1].zero_()
        torch.cumsum(pages, 0, dtype=torch.int32, out=out[1:])


@dataclasses.dataclass(frozen=True)
class PageIndices(Derivation):
    """Writes the whole buffer: the valid prefix right, the tail with whatever the gather finds.
    ``scribble`` writes ``GARBAGE`` "inside" the prefix (its last element) or "beyond" it."""

    scribble: str = ""
    name = "page_indices"
    formula = "indices[indptr[r] + j] = block_table[r, j] for j < indptr[r + 1] - indptr[r]"
    arguments = ("tensor", "tensor")

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return argument_problem(inputs, self.arguments)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        indptr, table = _tensor(inputs[0]), _tensor(inputs[1])
        rows, width, dev = indptr.shape[0] - 1, table.shape[1], out.device
        slot = workspace.arange(out.shape[0], torch.int64, dev)
        req = workspace.buffer("req", tuple(out.shape), torch.int64, dev)
        start = workspace.buffer("start", tuple(out.shape), indptr.dtype, dev)
        col = workspace.buffer("col", tuple(out.shape), torch.int64, dev)
        torch.searchsorted(indptr[1:], slot, right=True, out=req)
        req.clamp_(max=rows - 1)
        torch.index_select(indptr, 0, req, out=start)
        torch.sub(slot, start, out=col)
        col.clamp_(0, width - 1)
        req.mul_(width).add_(col)
        torch.take(table, req, out=out)
        total = int(indptr[-1])
        if self.scribble == "inside" and total:
            out[total - 1] = GARBAGE
        elif self.scribble == "beyond":
            out[total:] = GARBAGE


GARBAGE = -12345


@dataclasses.dataclass(frozen=True)
class LastPageLen(Derivation):
    name = "last_page_len"
    formula = "(seq_lens - 1) % block_size + 1"
    arguments = ("tensor", "int")

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return argument_problem(inputs, self.arguments)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Workspace) -> None:
        seq_lens, block_size = _tensor(inputs[0]), int(inputs[1])  # type: ignore[call-overload]
        torch.sub(seq_lens, 1, out=out)
        out.remainder_(block_size).add_(1)


def build(state: object, *, tail: int = -1) -> PagedMeta:
    """From scratch; the tail of kv_indices beyond the prefix holds random garbage."""
    from draftmeta import DraftState

    assert isinstance(state, DraftState)
    bs, n, dev = state.block_size, state.batch_size, state.device
    table = state.block_table[:n]
    pages = (state.seq_lens + bs - 1) // bs
    indptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
    indptr[1:] = pages.cumsum(0)
    indices = torch.randint(-(2**30), 0, (table.numel(),), dtype=torch.int32, device=dev)
    used = torch.arange(table.shape[1], device=dev) < pages[:, None]
    indices[: int(indptr[-1])] = table[used]
    last = torch.zeros(n, dtype=torch.int32, device=dev)
    r = state.num_reqs
    last[:r] = (state.seq_lens[:r] - 1) % bs + 1
    return PagedMeta(state.num_reqs, state.max_seq_len, state.seq_lens.clone(), indptr, indices,
                     last)


def rules(**overrides: Rule) -> dict[str, Rule]:
    """A correct rule set (policy-independent), with ``overrides`` replacing some rules."""
    out: dict[str, Rule] = {
        "num_reqs": HostConstant(),
        "max_seq_len": copy_of("state.max_seq_len"),
        "seq_lens": Derive(CopyFrom(), ("state.seq_lens",)),
        "kv_indptr": Derive(PageIndptr(), ("state.seq_lens", "state.block_size")),
        "kv_indices": Derive(PageIndices(), ("kv_indptr", "state.block_table")),
        "kv_last_page_len": Derive(LastPageLen(), ("state.seq_lens", "state.block_size")),
    }
    out.update(overrides)
    return out


def spec(name: str = "paged", **overrides: Rule) -> DraftSpec[PagedMeta]:
    return DraftSpec(PagedMeta, rules(**overrides), name=name)


CLAMP_SEQ_LENS = Advance(Clamp("max_model_len"), rows="num_reqs")
"""An advance without wrap: right under clamp, wrong under wrap."""
