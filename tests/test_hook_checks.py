"""A shipped recompute hook refuses, in its check (before the update writes anything), every
buffer its apply could not fill: undersized, mistyped or on another device. WriteFailed is left
for a kernel whose result contradicts its buffer (a bug), and even then the hook writes neither
of its outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from draftmeta import Alias, CopyFrom, Derive, DraftSpec, Recompute, WrittenBy, advance_state
from draftmeta.backends.hooks import (
    DeepGemmPagedMqaSchedule,
    FlashAttnSchedule,
    FlashMLAFp8TileSchedule,
)
from draftmeta.errors import UpdateError, WriteFailed
from draftmeta.testing import random_state
from draftmeta.testing.reference_schedules import (
    flashmla_tile_schedule_reference,
    paged_mqa_schedule_reference,
)
from draftmeta.workspace import Workspace

B = 5
PARTS = 4


def _tiles(seq_lens: torch.Tensor, q_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    return flashmla_tile_schedule_reference(seq_lens, q_tokens, 1, PARTS)


def _lens(n: int = B, **kw: Any) -> torch.Tensor:
    return torch.arange(10, 10 + n, dtype=kw.pop("dtype", torch.int32), **kw)


def _i32(*shape: int, **kw: Any) -> torch.Tensor:
    return torch.zeros(shape, dtype=kw.pop("dtype", torch.int32), **kw)


# (what is wrong, out, inputs, also, words expected in the check's answer)
Case = tuple[str, Callable[[], tuple[torch.Tensor, tuple[object, ...], tuple[torch.Tensor, ...]]],
             str]

FLASHMLA_CASES: list[Case] = [
    ("num_splits smaller than the batch",
     lambda: (_i32(PARTS, 8), (_lens(),), (_i32(B),)), "fewer than batch + 1 = 6"),
    ("num_splits empty", lambda: (_i32(PARTS, 8), (_lens(),), (_i32(0),)), "fewer than batch"),
    ("num_splits int64", lambda: (_i32(PARTS, 8), (_lens(),), (_i32(B + 1, dtype=torch.int64),)),
     "num_splits must be int32"),
    ("num_splits two-dimensional", lambda: (_i32(PARTS, 8), (_lens(),), (_i32(B + 1, 1),)),
     "num_splits must be int32 [B + 1]"),
    ("num_splits on another device",
     lambda: (_i32(PARTS, 8), (_lens(),), (_i32(B + 1, device="meta"),)),
     "num_splits is on meta"),
    ("num_splits missing", lambda: (_i32(PARTS, 8), (_lens(),), ()), "needs both"),
    ("tile metadata float", lambda: (_i32(PARTS, 8, dtype=torch.float32), (_lens(),),
                                     (_i32(B + 1),)), "tile metadata must be int32"),
    ("tile metadata without rows", lambda: (_i32(0, 8), (_lens(),), (_i32(B + 1),)), "no rows"),
    ("tile metadata of the wrong width", lambda: (_i32(PARTS, 5), (_lens(),), (_i32(B + 1),)),
     "[parts, 8]"),
    ("tile metadata on another device",
     lambda: (_i32(PARTS, 8, device="meta"), (_lens(),), (_i32(B + 1, device="meta"),)),
     "seq_lens are on cpu but the tile metadata on meta"),
    ("seq_lens int64", lambda: (_i32(PARTS, 8), (_lens(dtype=torch.int64),), (_i32(B + 1),)),
     "seq_lens must be int32"),
    ("seq_lens two-dimensional", lambda: (_i32(PARTS, 8), (_lens().view(-1, 1),), (_i32(B + 1),)),
     "seq_lens must be [B]"),
    ("seq_lens a host int", lambda: (_i32(PARTS, 8), (B,), (_i32(B + 1),)),
     "seq_lens must be a tensor"),
]

DEEPGEMM_CASES: list[Case] = [
    ("schedule without an SM slot", lambda: (_i32(1, 2), (_lens(),), ()), "at least one SM slot"),
    ("schedule int64", lambda: (_i32(9, 2, dtype=torch.int64), (_lens(),), ()),
     "must be int32 [slots + 1, 2]"),
    ("schedule of the wrong width", lambda: (_i32(9, 3), (_lens(),), ()), "[slots + 1, 2]"),
    ("schedule on another device", lambda: (_i32(9, 2, device="meta"), (_lens(),), ()),
     "seq_lens are on cpu but the schedule on meta"),
    ("seq_lens int64", lambda: (_i32(9, 2), (_lens(dtype=torch.int64),), ()),
     "seq_lens must be int32"),
    ("seq_lens three-dimensional", lambda: (_i32(9, 2), (_lens().view(-1, 1, 1),), ()),
     "seq_lens must be [B] or [B, next_n]"),
    ("an extra output in also=", lambda: (_i32(9, 2), (_lens(),), (_i32(B),)), "remove also="),
]

def _fa3(seq_lens: torch.Tensor, query_start_loc: torch.Tensor, max_seq_len: int,
         max_num_splits: int) -> torch.Tensor:
    """A stand-in FA3 schedule: one entry per request and a semaphore."""
    return torch.cat([seq_lens, seq_lens.new_zeros(1)])


def _qsl(n: int = B, **kw: Any) -> torch.Tensor:
    return torch.arange(n + 1, dtype=kw.pop("dtype", torch.int32), **kw)


FA3_CASES: list[Case] = [
    ("schedule int64", lambda: (_i32(B + 1, dtype=torch.int64), (_lens(), _qsl(), 64, 0), ()),
     "must be int32 [n >= 1]"),
    ("schedule two-dimensional", lambda: (_i32(B + 1, 1), (_lens(), _qsl(), 64, 0), ()),
     "must be int32 [n >= 1]"),
    ("schedule empty", lambda: (_i32(0), (_lens(), _qsl(), 64, 0), ()), "[n >= 1]"),
    ("schedule on another device",
     lambda: (_i32(B + 1, device="meta"), (_lens(), _qsl(), 64, 0), ()),
     "seq_lens are on cpu but the flash_attn_scheduler on meta"),
    ("seq_lens int64", lambda: (_i32(B + 1), (_lens(dtype=torch.int64), _qsl(), 64, 0), ()),
     "seq_lens must be int32"),
    ("query_start_loc one short", lambda: (_i32(B + 1), (_lens(), _qsl(B - 1), 64, 0), ()),
     "query_start_loc must be int32 [batch + 1] = [6]"),
    ("query_start_loc int64",
     lambda: (_i32(B + 1), (_lens(), _qsl(dtype=torch.int64), 64, 0), ()),
     "query_start_loc must be int32"),
    ("query_start_loc on another device",
     lambda: (_i32(B + 1), (_lens(), _qsl(device="meta"), 64, 0), ()),
     "query_start_loc is on meta"),
]

HOOKS: dict[str, tuple[Any, list[Case]]] = {
    "flashmla_fp8": (FlashMLAFp8TileSchedule(16, _tiles), FLASHMLA_CASES),
    "deep_gemm": (DeepGemmPagedMqaSchedule(64, paged_mqa_schedule_reference), DEEPGEMM_CASES),
    "flash_attn": (FlashAttnSchedule(_fa3), FA3_CASES),
}


@pytest.mark.parametrize(
    ("hook", "make", "words"),
    [pytest.param(HOOKS[h][0], m, w, id=f"{h}: {what}")
     for h in HOOKS for what, m, w in HOOKS[h][1]],
)
def test_a_shipped_hook_refuses_a_buffer_it_cannot_fill_in_its_check(
    hook: Any, make: Callable[[], Any], words: str
) -> None:
    out, inputs, also = make()
    problem = hook.check(out, *inputs, also=also)
    assert problem is not None and words in problem, problem


@pytest.mark.parametrize(
    ("hook", "out", "also"),
    [pytest.param(HOOKS["flashmla_fp8"][0], _i32(PARTS, 8), (_i32(B + 1),), id="flashmla_fp8"),
     pytest.param(HOOKS["flashmla_fp8"][0], _i32(PARTS, 8), (_i32(64 + 1),),
                  id="flashmla_fp8 with a longer num_splits"),
     pytest.param(HOOKS["deep_gemm"][0], _i32(9, 2), (), id="deep_gemm"),
     pytest.param(HOOKS["flash_attn"][0], _i32(B + 1), (), id="flash_attn")],
)
def test_a_shipped_hook_accepts_and_fills_the_buffers_it_checks(
    hook: Any, out: torch.Tensor, also: tuple[torch.Tensor, ...]
) -> None:
    out.fill_(-7)
    for splits in also:
        splits.fill_(-7)
    inputs = (_lens(), _qsl(), 64, 0) if isinstance(hook, FlashAttnSchedule) else (_lens(),)
    assert hook.check(out, *inputs, also=also) is None
    hook.apply(out, *inputs, workspace=Workspace(), also=also)
    assert not (out == -7).any() and all(not (s == -7).any() for s in also)


# -- through a spec: the refusal comes before the first write ---------------------------------


@dataclasses.dataclass
class _Sched:
    seq_lens: torch.Tensor
    lens_copy: torch.Tensor
    tiles: torch.Tensor
    num_splits: torch.Tensor


def _spec(compute: Any = _tiles) -> DraftSpec[_Sched]:
    return DraftSpec(_Sched, {
        "seq_lens": Alias("seq_lens"),
        "lens_copy": Derive(CopyFrom(), ("seq_lens",)),  # written before the hook
        "tiles": Recompute(FlashMLAFp8TileSchedule(16, compute), ("lens_copy",),
                           also=("num_splits",)),
        "num_splits": WrittenBy("tiles"),
    }, name="sched")


def _meta(splits: int) -> tuple[_Sched, Any]:
    state = random_state(torch.Generator().manual_seed(0), batch_size=B, block_size=16,
                         max_model_len=512, steps=3)
    advance_state(state)
    meta = _Sched(state.seq_lens, state.seq_lens.clone(),
                  torch.full((PARTS, 8), -7, dtype=torch.int32),
                  torch.full((splits,), -7, dtype=torch.int32))
    return meta, state


def _snapshot(meta: _Sched) -> list[torch.Tensor]:
    return [meta.lens_copy.clone(), meta.tiles.clone(), meta.num_splits.clone()]


def test_a_num_splits_buffer_smaller_than_the_batch_is_refused_before_any_write() -> None:
    meta, state = _meta(splits=B)  # one short of B + 1
    before = _snapshot(meta)
    advance_state(state)
    with pytest.raises(UpdateError, match=r"'tiles'.*num_splits has 5 entries") as info:
        _spec().update(meta, state)
    assert not isinstance(info.value, WriteFailed)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(meta)))


def test_the_proposed_num_splits_size_is_accepted() -> None:
    meta, state = _meta(splits=B + 1)
    advance_state(state)
    _spec().update(meta, state)
    want_tiles, want_splits = _tiles(state.seq_lens, 16)
    assert torch.equal(meta.tiles, want_tiles) and torch.equal(meta.num_splits, want_splits)


def test_a_kernel_result_too_large_for_its_buffer_writes_neither_output() -> None:
    """A bug (a kernel that returns more split counts than the batch has) is WriteFailed, and
    the hook checks both results before writing either: the tile metadata, which would fit,
    is not written either."""

    def one_split_too_many(seq_lens: torch.Tensor, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        tiles, splits = _tiles(seq_lens, q)
        return tiles, torch.cat([splits, splits[-1:]])

    meta, state = _meta(splits=B + 1)
    advance_state(state)
    tiles, splits = meta.tiles.clone(), meta.num_splits.clone()
    with pytest.raises(WriteFailed, match=r"'tiles'.*num_splits: the kernel returned \(7, 1\)"):
        _spec(one_split_too_many).update(meta, state)
    assert torch.equal(meta.tiles, tiles) and torch.equal(meta.num_splits, splits)
