"""``benchmarks/e2e_floor.py --backend AMX_MLA``: the check-free floor refreshes what vLLM's AMX
build derives from the lengths (so the floor's tokens can equal the rebuild's in the engine).

No engine here (no CPU with AMX): the floor's AMX part runs on a stand-in decode record.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest
import torch

from draftmeta.integrations.vllm.specs import amx


def test_the_amx_floor_copies_the_lengths_and_recomputes_the_split_count(
    e2e_floor: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(amx, "compute_units", lambda: 4)
    seq_lens = torch.tensor([700, 4100, 9], dtype=torch.int32)
    decode = SimpleNamespace(seq_lens=seq_lens, seq_lens_i64=seq_lens.to(torch.int64) - 1,
                             num_kv_splits=1)
    extras = e2e_floor.amx_floor_extras()
    extras(SimpleNamespace(decode=decode), 4100)
    assert decode.seq_lens_i64.dtype == torch.int64
    assert decode.seq_lens_i64.tolist() == [700, 4100, 9]
    assert decode.num_kv_splits == 8  # next power of two above 4100 // 512 = 8, at most 2 * 4
    extras(SimpleNamespace(decode=decode), 100_000)
    assert decode.num_kv_splits == 8  # bounded by twice the compute units
    extras(SimpleNamespace(decode=decode), 1024)
    assert decode.num_kv_splits == 2  # 1024 // 512 = 2: read at this very length
    extras(SimpleNamespace(decode=decode), 100)
    assert decode.num_kv_splits == 1
