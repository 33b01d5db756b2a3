"""The reference scheduler-metadata implementations: hand examples, invariants, random batches.

The hand examples are worked out from the algorithms as documented in
:mod:`draftmeta.testing.reference_schedules`; the invariants check what the consuming kernels
rely on (every unit of work handed out exactly once, balanced, in order), by simulating the
consumers.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from draftmeta.testing.reference_schedules import (
    FLASHMLA_MAX_BATCH_SIZE,
    PAGED_MQA_SPLIT_KV,
    flashmla_num_sm_parts,
    flashmla_tile_schedule_into,
    flashmla_tile_schedule_reference,
    paged_mqa_schedule_into,
    paged_mqa_schedule_reference,
    paged_mqa_schedule_slots,
)

SPLIT = PAGED_MQA_SPLIT_KV


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def lens2d(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


# --------------------------------------------------------------------------------------------
# DeepGEMM paged MQA schedule: a scalar model and a consumer simulation
# --------------------------------------------------------------------------------------------


def scalar_model(lens: list[int], num_sms: int, split_kv: int, atoms: int) -> list[list[int]]:
    """One SM at a time, with an explicit binary search, as the kernel's lanes do it."""
    batch = len(lens)
    prefix, acc = [], 0
    for n in lens:
        acc += ceil_div(n, split_kv)
        prefix.append(acc)
    total = acc * atoms
    if total == 0:
        return [[batch * atoms, 0] for _ in range(num_sms + 1)]
    q, r = divmod(total, num_sms)
    rows = []
    for i in range(num_sms):
        start = i * q + max(0, i - (num_sms - r))
        lo, hi = 0, batch
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix[mid] * atoms <= start:
                lo = mid + 1
            else:
                hi = mid
        b = min(lo, batch - 1)
        before = prefix[b - 1] * atoms if b > 0 else 0
        segs = prefix[b] - (prefix[b - 1] if b > 0 else 0)
        off = start - before
        rows.append([b * atoms + off // segs, off % segs] if segs else [b * atoms, 0])
    rows.append([batch * atoms, 0])
    return rows


def consume(
    sched: list[list[int]], lens: list[int], atoms: int, block_kv: int = 64
) -> list[list[tuple[int, int]]]:
    """The (item, first KV block) tasks each SM runs, walking the schedule like the kernel."""
    per_split = SPLIT // block_kv

    def num_kv(item: int) -> int:
        return ceil_div(lens[item // atoms], block_kv)

    out = []
    for sm in range(len(sched) - 1):
        item, kv = sched[sm][0], sched[sm][1] * per_split
        end_item, end_kv = sched[sm + 1][0], sched[sm + 1][1] * per_split

        def exists(it: int, end_item: int = end_item, end_kv: int = end_kv) -> bool:
            return it < end_item or (it == end_item and end_kv > 0)

        cur = num_kv(item) if exists(item) else 0
        tasks: list[tuple[int, int]] = []
        for _ in range(100_000):
            while cur == 0 and (item, kv) != (end_item, end_kv):  # skip empty requests
                item, kv = item + 1, 0
                assert item <= end_item, "walked past the next SM's start"
                cur = num_kv(item) if exists(item) else 0
            if (item, kv) == (end_item, end_kv):
                break
            tasks.append((item, kv))
            kv += per_split
            if kv >= cur:
                item, kv = item + 1, 0
                cur = num_kv(item) if exists(item) else 0
        else:
            raise AssertionError("SM never reached its end")
        out.append(tasks)
    return out


def check_paged_mqa_invariants(ctx: torch.Tensor, num_sms: int, atoms: int = 1) -> None:
    sched_t = paged_mqa_schedule_reference(ctx, 64, num_sms, num_next_n_atoms=atoms)
    assert sched_t.dtype == torch.int32 and tuple(sched_t.shape) == (num_sms + 1, 2)
    sched = sched_t.tolist()
    lens = (ctx[:, -1] if ctx.dim() == 2 else ctx).tolist()
    batch = len(lens)
    assert sched == scalar_model(lens, num_sms, SPLIT, atoms)
    # Last row: one past the last item.
    assert sched[-1] == [batch * atoms, 0]
    # Rows are non-decreasing in (item, split) order.
    assert all(tuple(a) <= tuple(b) for a, b in pairwise(sched))
    # Every (item, KV split) is run exactly once, in order, split evenly (reversed remainder).
    tasks = consume(sched, lens, atoms)
    flat = [t for per_sm in tasks for t in per_sm]
    want = [
        (item, kv)
        for item in range(batch * atoms)
        for kv in range(0, ceil_div(lens[item // atoms], 64), SPLIT // 64)
    ]
    assert flat == want
    counts = [len(t) for t in tasks]
    total = len(want)
    assert counts == sorted(counts)
    assert sum(counts) == total and max(counts) - min(counts) <= 1
    assert counts.count(total // num_sms + 1) == (total % num_sms if total else 0)
    # A row that starts real work points inside a non-empty request.
    for (item, split), n in zip(sched[:-1], counts):
        if n:
            assert split < ceil_div(lens[item // atoms], SPLIT)


# --------------------------------------------------------------------------------------------
# DeepGEMM paged MQA schedule: hand examples
# --------------------------------------------------------------------------------------------


def test_two_requests_three_sms() -> None:
    # segs = [2, 3], total 5 = 3 * 1 + 2: SM0 takes 1, SM1 and SM2 take 2 each.
    got = paged_mqa_schedule_reference(lens2d([[300], [600]]), 64, 3)
    assert got.tolist() == [[0, 0], [0, 1], [1, 1], [2, 0]]


def test_empty_request_in_the_middle() -> None:
    # segs = [1, 0, 2]: SM1 starts at segment 1, the first segment of request 2.
    got = paged_mqa_schedule_reference(lens2d([[256], [0], [257]]), 64, 2)
    assert got.tolist() == [[0, 0], [2, 0], [3, 0]]


def test_more_sms_than_segments_idle_first() -> None:
    # One segment, three SMs: SM0 and SM1 are empty ranges, SM2 runs it.
    got = paged_mqa_schedule_reference(lens2d([[10]]), 64, 3)
    assert got.tolist() == [[0, 0], [0, 0], [0, 0], [1, 0]]


def test_reversed_remainder_on_132_sms() -> None:
    # 265 segments on 132 SMs: two each, the last SM three.
    got = paged_mqa_schedule_reference(lens2d([[265 * SPLIT]]), 64, 132).tolist()
    assert got[:132] == [[0, 2 * i] for i in range(132)]
    assert got[132] == [1, 0]


def test_all_empty_rows_are_sentinels() -> None:
    got = paged_mqa_schedule_reference(torch.zeros(3, 2, dtype=torch.int32), 64, 4)
    assert got.tolist() == [[3, 0]] * 5


def test_next_n_atoms_split_request_major() -> None:
    # Last column 600 -> 3 segments; 2 atoms -> 6 items-segments on 4 SMs (1, 1, 2, 2).
    got = paged_mqa_schedule_reference(lens2d([[100, 600]]), 64, 4, num_next_n_atoms=2)
    assert got.tolist() == [[0, 0], [0, 1], [0, 2], [1, 1], [2, 0]]


def test_only_last_column_counts_and_1d_means_next_n_1() -> None:
    a = lens2d([[5, 700], [1, 300], [9, 0], [0, 3000]])
    b = lens2d([[999, 700], [0, 300], [7, 0], [5, 3000]])
    ra = paged_mqa_schedule_reference(a, 64, 5)
    assert torch.equal(ra, paged_mqa_schedule_reference(b, 64, 5))
    assert torch.equal(ra, paged_mqa_schedule_reference(a[:, -1].contiguous(), 64, 5))
    assert torch.equal(ra, paged_mqa_schedule_reference(a[:, -1:], 64, 5))
    assert torch.equal(ra, paged_mqa_schedule_reference(a.to(torch.int64), 64, 5))


def test_block_kv_does_not_change_the_schedule() -> None:
    ctx = lens2d([[1000], [3], [70000]])
    ref = paged_mqa_schedule_reference(ctx, 64, 7)
    assert torch.equal(ref, paged_mqa_schedule_reference(ctx, 32, 7))
    with pytest.raises(ValueError, match="divide"):
        paged_mqa_schedule_reference(ctx, 96, 7)


def test_empty_batch() -> None:
    got = paged_mqa_schedule_reference(torch.zeros(0, 1, dtype=torch.int32), 64, 3)
    assert got.tolist() == [[0, 0]] * 4


def test_into_refills_in_place() -> None:
    out = torch.full((4, 2), -7, dtype=torch.int32)
    ptr = out.data_ptr()
    res = paged_mqa_schedule_into(out, lens2d([[300], [600]]), 64, 3)
    assert res is out and out.data_ptr() == ptr
    assert out.tolist() == [[0, 0], [0, 1], [1, 1], [2, 0]]
    paged_mqa_schedule_into(out, lens2d([[10]]), 64, 3)  # a later, smaller batch
    assert out.tolist() == [[0, 0], [0, 0], [0, 0], [1, 0]]


@pytest.mark.parametrize(
    "out",
    [torch.zeros(4, 2, dtype=torch.int64), torch.zeros(5, 2, dtype=torch.int32)],
)
def test_into_rejects_wrong_buffer(out: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="out must be int32"):
        paged_mqa_schedule_into(out, lens2d([[300]]), 64, 3)


@pytest.mark.parametrize(("lens", "block_kv", "num_sms", "kwargs", "error", "message"), [
    (torch.zeros(2, 1, 1, dtype=torch.int32), 64, 3, {}, ValueError,
     r"context_lens must be \[B\] or \[B, next_n\], got shape \(2, 1, 1\)"),
    (torch.zeros(2, 0, dtype=torch.int32), 64, 3, {}, ValueError,
     r"context_lens of shape \[B, next_n\] needs next_n >= 1"),
    (torch.zeros(2, 1), 64, 3, {}, TypeError,
     r"context_lens must have an integer dtype, got torch\.float32"),
    (lens2d([[1]]), 64, 0, {}, ValueError, r"num_sms must be positive, got 0"),
    (lens2d([[1]]), 48, 3, {}, ValueError,
     r"block_kv \(48\) must be positive and divide split_kv \(256\)"),
    (lens2d([[1]]), 64, 3, {"num_next_n_atoms": 0}, ValueError,
     r"num_next_n_atoms must be positive, got 0"),
], ids=["3-d lengths", "no next_n column", "float lengths", "no SMs", "block_kv not dividing",
        "no next_n atoms"])
def test_rejects_bad_inputs(lens: torch.Tensor, block_kv: int, num_sms: int,
                            kwargs: dict[str, int], error: type[Exception], message: str) -> None:
    """Each bad input is refused with its own reason (not some other error on the way)."""
    with pytest.raises(error, match=f"^{message}$"):
        paged_mqa_schedule_reference(lens, block_kv, num_sms, **kwargs)


def test_slots() -> None:
    assert paged_mqa_schedule_slots(132, 1) == 132
    assert paged_mqa_schedule_slots(132, 2) == 132
    assert paged_mqa_schedule_slots(132, 4) == 66
    assert paged_mqa_schedule_slots(132, 4, arch_major=10) == 132


# --------------------------------------------------------------------------------------------
# DeepGEMM paged MQA schedule: invariants on random batches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_paged_mqa_random_batches(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 70, (1,), generator=g))
    next_n = [1, 2, 4][seed % 3]
    num_sms = [1, 2, 3, 8, 33, 132][seed % 6]
    high = [1, 600, 5000, 200_000][seed % 4]
    ctx = torch.randint(0, high, (batch, next_n), generator=g, dtype=torch.int32)
    ctx[torch.rand((batch, next_n), generator=g) < 0.25] = 0  # some empty requests
    atoms = 2 if (next_n > 1 and seed % 2) else 1
    check_paged_mqa_invariants(ctx, num_sms, atoms)


@pytest.mark.parametrize("num_sms", [1, 5, 132])
def test_paged_mqa_boundary_lengths(num_sms: int) -> None:
    lens = [0, 1, 63, 64, 65, 255, 256, 257, 511, 512, 513, 0, 0, 1024]
    check_paged_mqa_invariants(torch.tensor(lens, dtype=torch.int32).view(-1, 1), num_sms)


# --------------------------------------------------------------------------------------------
# FlashMLA tile scheduler: a consumer simulation
# --------------------------------------------------------------------------------------------


def check_flashmla_invariants(lens: list[int], parts: int, bn: int = 64, ov: int = 5) -> None:
    seq = torch.tensor(lens, dtype=torch.int32)
    tile_t, splits_t = flashmla_tile_schedule_reference(seq, 128, 1, parts, bn, ov)
    assert tile_t.dtype == torch.int32 and tuple(tile_t.shape) == (parts, 8)
    assert splits_t.dtype == torch.int32 and tuple(splits_t.shape) == (len(lens) + 1,)
    tile, splits = tile_t.tolist(), splits_t.tolist()
    batch = len(lens)
    blocks = [ceil_div(n, bn) for n in lens]
    payload = ceil_div(sum(blocks) + ov * batch, parts) + ov
    # num_splits: exclusive prefix of pieces, at least one piece per request, bounded.
    assert splits[0] == 0
    assert all(b - a >= 1 for a, b in pairwise(splits))
    assert splits[-1] <= batch + parts - 1
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(batch)]
    prev_end = (0, 0)
    for row in tile:
        b0, s0, b1, s1, split0 = row[:5]
        assert row[5:] == [0, 0, 0]
        assert (b0, s0) >= prev_end or b0 == batch  # parts follow each other in order
        if b0 > b1:  # an empty part: only after everything was handed out
            assert (b0, b1, s0, split0) == (batch, batch - 1, 0, 0)
            continue
        cost = 0
        for b in range(b0, b1 + 1):
            start = s0 if b == b0 else 0
            end = s1 if b == b1 else lens[b]
            assert start % bn == 0
            pieces[b].append((start, end, splits[b] + (split0 if b == b0 else 0)))
            cost += (blocks[b] if end == lens[b] else end // bn) - start // bn + ov
        assert cost <= payload
        prev_end = (b1, s1)
    for b in range(batch):
        got = pieces[b]
        # Pieces tile [0, len) in order and write consecutive partial-result rows.
        assert got[0][0] == 0 and got[-1][1] == lens[b]
        assert all(x[1] == y[0] for x, y in pairwise(got))
        assert [p[2] for p in got] == list(range(splits[b], splits[b + 1]))
        assert all(p[0] < p[1] for p in got) or lens[b] == 0
        if lens[b] == 0:
            assert got == [(0, 0, splits[b])]


# --------------------------------------------------------------------------------------------
# FlashMLA tile scheduler: hand examples
# --------------------------------------------------------------------------------------------


def test_flashmla_two_requests_two_parts() -> None:
    # blocks [3, 1]; total 8 + 6 = 14; payload 7 + 5 = 12: each part takes one request.
    tile, splits = flashmla_tile_schedule_reference(lens2d([[192], [64]]).view(-1), 128, 1, 2)
    assert tile[:, :5].tolist() == [[0, 0, 0, 192, 0], [1, 0, 1, 64, 0]]
    assert splits.tolist() == [0, 1, 2]


def test_flashmla_one_request_split_in_two() -> None:
    # 10 blocks; total 15; payload 8 + 5 = 13: part 0 takes blocks 0-7, part 1 the rest.
    tile, splits = flashmla_tile_schedule_reference(torch.tensor([640]), 128, 1, 2)
    assert tile[:, :5].tolist() == [[0, 0, 0, 512, 0], [0, 512, 0, 640, 1]]
    assert splits.tolist() == [0, 2]


def test_flashmla_split_then_next_request() -> None:
    # blocks [16, 2]; total 21 + 7 = 28; payload 14 + 5 = 19: 14 blocks, then 2 + the next.
    tile, splits = flashmla_tile_schedule_reference(torch.tensor([1000, 100]), 128, 1, 2)
    assert tile[:, :5].tolist() == [[0, 0, 0, 896, 0], [0, 896, 1, 100, 1]]
    assert splits.tolist() == [0, 2, 3]


def test_flashmla_trailing_parts_are_empty() -> None:
    # blocks [10, 1, 2]; total 28; payload 10 + 5 = 15; the third part gets nothing.
    tile, splits = flashmla_tile_schedule_reference(torch.tensor([640, 64, 128]), 128, 1, 3)
    assert tile[:, :5].tolist() == [[0, 0, 0, 640, 0], [1, 0, 2, 128, 0], [3, 0, 2, 128, 0]]
    assert splits.tolist() == [0, 1, 2, 3]


def test_flashmla_end_is_true_length_not_block_multiple() -> None:
    tile, splits = flashmla_tile_schedule_reference(torch.tensor([100, 0]), 128, 1, 1)
    assert tile[:, :5].tolist() == [[0, 0, 1, 0, 0]]
    assert splits.tolist() == [0, 1, 2]
    tile, _ = flashmla_tile_schedule_reference(torch.tensor([0, 100]), 128, 1, 1)
    assert tile[:, :5].tolist() == [[0, 0, 1, 100, 0]]


def test_flashmla_num_sm_parts() -> None:
    assert flashmla_num_sm_parts(132, 128, 1) == 66  # DeepSeek: 128 heads, one query token
    assert flashmla_num_sm_parts(132, 64, 1) == 132
    assert flashmla_num_sm_parts(132, 65, 1) == 66
    assert flashmla_num_sm_parts(132, 16, 1) == 132
    assert flashmla_num_sm_parts(132, 4 * 128, 1) == 16  # four query tokens (MTP)
    assert flashmla_num_sm_parts(132, 128, 2) == 33
    assert flashmla_num_sm_parts(132, 100_000, 1) == 1
    with pytest.raises(ValueError):
        flashmla_num_sm_parts(132, 0, 1)


def test_flashmla_into_keeps_padding_columns() -> None:
    tile = torch.full((2, 8), 99, dtype=torch.int32)
    splits = torch.full((3,), -1, dtype=torch.int32)
    res = flashmla_tile_schedule_into(tile, splits, torch.tensor([192, 64], dtype=torch.int32))
    assert res[0] is tile and res[1] is splits
    assert tile[:, :5].tolist() == [[0, 0, 0, 192, 0], [1, 0, 1, 64, 0]]
    assert tile[:, 5:].eq(99).all()
    assert splits.tolist() == [0, 1, 2]
    # The number of SM parts is the buffer's row count, like the decode kernel reads it.
    big = torch.zeros(6, 8, dtype=torch.int32)
    flashmla_tile_schedule_into(big[:2], splits, torch.tensor([192, 64]))
    assert big[:2, :5].tolist() == [[0, 0, 0, 192, 0], [1, 0, 1, 64, 0]]
    assert big[2:].eq(0).all()


def test_flashmla_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError):
        flashmla_tile_schedule_reference(torch.zeros(0, dtype=torch.int32), 128, 1, 4)
    with pytest.raises(ValueError):
        flashmla_tile_schedule_reference(
            torch.ones(FLASHMLA_MAX_BATCH_SIZE, dtype=torch.int32), 128, 1, 4
        )
    with pytest.raises(ValueError):
        flashmla_tile_schedule_reference(torch.tensor([5, -1]), 128, 1, 4)
    with pytest.raises(ValueError):
        flashmla_tile_schedule_into(
            torch.zeros(2, 8, dtype=torch.int32),
            torch.zeros(2, dtype=torch.int32),
            torch.tensor([1, 2]),
        )
    with pytest.raises(ValueError):
        flashmla_tile_schedule_into(
            torch.zeros(2, 5, dtype=torch.int32),
            torch.zeros(3, dtype=torch.int32),
            torch.tensor([1, 2]),
        )


# --------------------------------------------------------------------------------------------
# FlashMLA tile scheduler: invariants on random batches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_flashmla_random_batches(seed: int) -> None:
    g = torch.Generator().manual_seed(1000 + seed)
    batch = [1, 2, 3, 17, 64, 300][seed % 6]
    parts = [1, 2, 7, 33, 66, 132][(seed // 6) % 6]
    high = [1, 65, 4000, 160_000][seed % 4]
    lens = torch.randint(0, high, (batch,), generator=g)
    lens[torch.rand(batch, generator=g) < 0.2] = 0
    check_flashmla_invariants(lens.tolist(), parts)


def test_flashmla_large_batch_few_parts() -> None:
    g = torch.Generator().manual_seed(7)
    check_flashmla_invariants(torch.randint(0, 9000, (4095,), generator=g).tolist(), 66)
