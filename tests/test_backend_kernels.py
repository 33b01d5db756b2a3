"""The backend hooks call the kernels they are handed (``draftmeta.backends`` imports none), and
the vLLM binding hands in vLLM's own: DeepGEMM's paged-MQA schedule, FlashMLA's FP8 tile
schedule and its scheduler object."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from draftmeta.backends.hooks import DeepGemmPagedMqaSchedule, FlashMLAFp8TileSchedule
from draftmeta.integrations.vllm.catalogue import current_release
from draftmeta.integrations.vllm.specs.indexer import deep_gemm_kernel, installed_indexer_spec
from draftmeta.integrations.vllm.specs.mla import MLASpec, installed_mla_spec
from draftmeta.registry import recorded_classes
from draftmeta.rules import Recompute, Reset
from draftmeta.testing.reference_schedules import (
    flashmla_tile_schedule_reference,
    paged_mqa_schedule_reference,
)
from draftmeta.workspace import Workspace


def _lens(n: int = 3) -> torch.Tensor:
    return torch.arange(10, 10 + n, dtype=torch.int32)


def test_a_flashmla_tile_schedule_without_a_kernel_refuses_in_its_check() -> None:
    hook = FlashMLAFp8TileSchedule(16)
    tiles, splits = torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    assert hook.check(tiles, _lens(), also=(splits,)) == (
        "no FlashMLA tile-schedule kernel is handed in: declare the hook with compute= (the "
        "vLLM binding hands in FlashMLA's get_mla_metadata_dense_fp8)")
    with_kernel = FlashMLAFp8TileSchedule(
        16, lambda s, q: flashmla_tile_schedule_reference(s, q, 1, 4))
    assert with_kernel.check(tiles, _lens(), also=(splits,)) is None


def test_the_paged_mqa_schedule_asks_its_kernel_for_each_buffer_and_leaves_it_without_one(
) -> None:
    asked: list[torch.Tensor] = []

    def kernel(buffer: torch.Tensor) -> object:
        asked.append(buffer)
        return paged_mqa_schedule_reference if len(asked) == 1 else None

    hook = DeepGemmPagedMqaSchedule(64, kernel=kernel)  # type: ignore[arg-type]
    out = torch.full((5, 2), -7, dtype=torch.int32)
    assert hook.check(out, _lens()) is None
    hook.apply(out, _lens(), workspace=Workspace())
    filled = out.clone()
    assert asked == [out] and not torch.equal(filled, torch.full_like(out, -7))
    out.fill_(-7)
    hook.apply(out, _lens(), workspace=Workspace())  # the kernel has none now: left alone
    assert len(asked) == 2 and torch.equal(out, torch.full_like(out, -7))
    fixed = DeepGemmPagedMqaSchedule(64, paged_mqa_schedule_reference, kernel)
    fixed.apply(out, _lens(), workspace=Workspace())  # a compute handed in wins: not asked
    assert len(asked) == 2 and torch.equal(out, filled)


def test_vllms_deepgemm_kernel_serves_no_buffer_off_cuda() -> None:
    assert deep_gemm_kernel(torch.zeros(5, 2, dtype=torch.int32)) is None


def test_the_vllm_binding_hands_its_kernels_to_the_indexer_and_flashmla_specs() -> None:
    with recorded_classes():
        indexer = installed_indexer_spec()
        factory = current_release().entry("FLASHMLA").spec
        assert isinstance(factory, MLASpec)
        flashmla = factory(name="FLASHMLA")
        fp8 = installed_mla_spec(factory, name="FLASHMLA", fp8_kv_cache=True,
                                 num_q_tokens_per_head_k=16)
    schedule = indexer.rules["decode.schedule_metadata"]
    assert isinstance(schedule, Recompute) and isinstance(schedule.hook, DeepGemmPagedMqaSchedule)
    assert schedule.hook.kernel is deep_gemm_kernel and schedule.hook.compute is None
    reset = flashmla.rules["decode.scheduler_metadata"]
    assert isinstance(reset, Reset)
    assert reset.factory.__module__ == "draftmeta.integrations.vllm.specs.mla"
    tiles = fp8.rules["decode.scheduler_metadata.tile_scheduler_metadata"]
    assert isinstance(tiles, Recompute) and isinstance(tiles.hook, FlashMLAFp8TileSchedule)
    assert tiles.hook.compute is not None
    assert tiles.hook.compute.__module__ == "draftmeta.integrations.vllm.specs.mla"


def test_the_flashmla_fp8_tile_schedule_asks_flashmla_for_the_lengths_query_heads_and_one_kv_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # FlashMLA's kernel is CUDA-only: a stand-in with its signature records what it is asked
    import vllm.v1.attention.ops.flashmla as flashmla

    asked: list[tuple[torch.Tensor, int, int]] = []
    tiles, splits = torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)

    def get_mla_metadata_dense_fp8(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                                   num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        asked.append((cache_seqlens, num_q_tokens_per_head_k, num_heads_k))
        return tiles, splits

    monkeypatch.setattr(flashmla, "get_mla_metadata_dense_fp8", get_mla_metadata_dense_fp8)
    with recorded_classes():
        factory = current_release().entry("FLASHMLA").spec
        assert isinstance(factory, MLASpec)
        fp8 = installed_mla_spec(factory, name="FLASHMLA", fp8_kv_cache=True,
                                 num_q_tokens_per_head_k=16)
    rule = fp8.rules["decode.scheduler_metadata.tile_scheduler_metadata"]
    assert isinstance(rule, Recompute) and isinstance(rule.hook, FlashMLAFp8TileSchedule)
    assert rule.hook.compute is not None
    lens = _lens()
    result = rule.hook.compute(lens, 16)
    assert len(asked) == 1 and asked[0][0] is lens and asked[0][1:] == (16, 1)
    assert result[0] is tiles and result[1] is splits


def test_the_deepgemm_schedule_asks_deepgemm_for_the_lengths_the_block_size_and_the_sm_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DeepGEMM is CUDA-only: a CUDA buffer and DeepGEMM's presence are stood in for
    import vllm.utils.deep_gemm as deep_gemm

    asked: list[tuple[torch.Tensor, int, int]] = []
    schedule = torch.zeros(133, 2, dtype=torch.int32)

    def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int,
                                      num_sms: int) -> torch.Tensor:
        asked.append((context_lens, block_kv, num_sms))
        return schedule

    monkeypatch.setattr(deep_gemm, "has_deep_gemm", lambda: True)
    monkeypatch.setattr(deep_gemm, "get_paged_mqa_logits_metadata", get_paged_mqa_logits_metadata)
    compute = deep_gemm_kernel(SimpleNamespace(is_cuda=True))  # type: ignore[arg-type]
    assert compute is not None
    lens = _lens()
    assert compute(lens, 64, 132) is schedule
    assert len(asked) == 1 and asked[0][0] is lens and asked[0][1:] == (64, 132)


@pytest.mark.parametrize(("builder", "block_kv"), [
    (SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=32)), 32),
    (SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=128)), 128),
    (None, 64),
], ids=["builder-of-32-token-blocks", "builder-of-128-token-blocks", "no-builder"])
def test_the_indexer_spec_asks_its_schedule_for_the_builders_indexer_cache_block_size(
    builder: object, block_kv: int,
) -> None:
    """DeepGEMM's schedule depends on the indexer cache's block size (the builder's; 64, vLLM's
    default, without one, as ``draftmeta explain`` declares it); the kernel is stood in for."""
    import attrs

    from draftmeta.integrations.vllm.specs.indexer import IndexerSpec

    with recorded_classes():
        spec = IndexerSpec()(name="INDEXER", builder=builder)
    rule = spec.rules["decode.schedule_metadata"]
    assert isinstance(rule, Recompute) and isinstance(rule.hook, DeepGemmPagedMqaSchedule)
    asked: list[int] = []

    def schedule(context_lens: torch.Tensor, block: int, num_sms: int) -> torch.Tensor:
        asked.append(block)
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    out = torch.full((5, 2), -7, dtype=torch.int32)
    attrs.evolve(rule.hook, compute=schedule).apply(out, _lens(), workspace=Workspace())
    assert asked == [block_kv]


@pytest.mark.parametrize(("builder", "heads"), [
    (SimpleNamespace(is_fp8_kvcache=True, num_q_heads=16), 16),
    (SimpleNamespace(is_fp8_kvcache=True, num_q_heads=16, dcp_world_size=2), 32),
    (SimpleNamespace(is_fp8_kvcache=True, num_q_heads=16, dcp_world_size=1), 16),
], ids=["no-dcp-attribute", "dcp-2", "dcp-1"])
def test_a_flashmla_builder_with_an_fp8_cache_gets_the_tile_schedule_of_its_query_heads(
    builder: object, heads: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FlashMLA's FP8 schedule is for ``num_q_heads * dcp_world_size`` query tokens per KV head
    (the builder's heads; all ranks' under DCP); FlashMLA's CUDA kernel is stood in for."""
    import vllm.v1.attention.ops.flashmla as flashmla

    asked: list[int] = []

    def get_mla_metadata_dense_fp8(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                                   num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        asked.append(num_q_tokens_per_head_k)
        return torch.ones(4, 8, dtype=torch.int32), torch.ones(4, dtype=torch.int32)

    monkeypatch.setattr(flashmla, "get_mla_metadata_dense_fp8", get_mla_metadata_dense_fp8)
    factory = current_release().entry("FLASHMLA").spec
    assert isinstance(factory, MLASpec)
    with recorded_classes():
        spec = factory(name="FLASHMLA", builder=builder)
    assert spec.name == "FLASHMLA.fp8.advance"
    rule = spec.rules["decode.scheduler_metadata.tile_scheduler_metadata"]
    assert isinstance(rule, Recompute) and isinstance(rule.hook, FlashMLAFp8TileSchedule)
    tiles, splits = torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    rule.hook.apply(tiles, _lens(), workspace=Workspace(), also=(splits,))
    assert asked == [heads] and bool((tiles == 1).all()) and bool((splits == 1).all())


def test_a_flashmla_builder_without_an_fp8_cache_gets_a_fresh_scheduler_object_each_step(
) -> None:
    factory = current_release().entry("FLASHMLA").spec
    assert isinstance(factory, MLASpec)
    with recorded_classes():
        spec = factory(name="FLASHMLA",
                       builder=SimpleNamespace(is_fp8_kvcache=False, num_q_heads=16))
    assert spec.name == "FLASHMLA.advance"
    assert isinstance(spec.rules["decode.scheduler_metadata"], Reset)


@pytest.mark.parametrize(("builder", "reads"), [(SimpleNamespace(), 1), (None, 4)],
                         ids=["live-builder", "no-builder"])
def test_an_amx_spec_reads_the_compute_units_once_for_a_live_builder_else_at_each_step(
    builder: object, reads: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The split count is bounded by this machine's compute units: read once when a live
    builder is bound, at each step where the spec was declared without one (``draftmeta
    explain``, which must not import vLLM's platform)."""
    from draftmeta.integrations.vllm.specs import amx
    from draftmeta.rules import HostDerive

    calls: list[int] = []

    def compute_units() -> int:
        calls.append(1)
        return 4

    monkeypatch.setattr(amx, "compute_units", compute_units)
    factory = current_release().entry("AMX_MLA").spec
    assert isinstance(factory, MLASpec)
    with recorded_classes():
        spec = factory(name="AMX_MLA", builder=builder)
    rule = spec.rules["decode.num_kv_splits"]
    assert isinstance(rule, HostDerive)
    assert [rule.fn(n) for n in (512, 1024, 4096, 100_000)] == [1, 2, 8, 8]  # at most 2 * 4
    assert len(calls) == reads
