"""What the audit's builders need of vLLM's distributed state, shown on a CPU: a stand-in DCP
group that MLA's DCP manager accepts where vLLM runs on CUDA, and a one-rank world that sparse
MLA layers ask their tensor-parallel size of (the two reasons rows did not construct on an
H100 with vLLM 0.34)."""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")

from draftmeta.integrations.vllm.catalogue import HarnessRecipe
from draftmeta.integrations.vllm.catalogue.classes import ClassRef
from draftmeta.integrations.vllm.testing import harness
from draftmeta.integrations.vllm.testing.harness import builders
from draftmeta.integrations.vllm.testing.harness import world as harness_world
from draftmeta.integrations.vllm.tools.audit_builders import _declares_hook, registry_backend

harness.prepare_environment()

SWITCHES = ("VLLM_USE_DIRECT_DCP_A2A", "VLLM_USE_DIRECT_DCP_Q_GATHER",
            "VLLM_USE_DIRECT_DCP_KV_GATHER")


@pytest.fixture
def as_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's choice of its symmetric-memory DCP collectives made as on a CUDA machine with
    symmetric memory (an H100's): the branch that asks the DCP group's ``cpu_group``."""
    from vllm.v1.attention.ops import cp_common, dcp

    monkeypatch.setattr(cp_common, "current_platform", types.SimpleNamespace(is_cuda=lambda: True))
    monkeypatch.setattr(cp_common, "symm_mem_available", True)
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    for getter in ("get_direct_dcp_a2a_workspace", "get_direct_dcp_q_gather_workspace",
                   "get_direct_dcp_kv_gather_workspace"):  # cached per group: choose again
        getattr(dcp, getter).cache_clear()


@pytest.mark.usefixtures("as_on_cuda")
def test_under_a_stand_in_dcp_group_mlas_dcp_manager_on_cuda_binds_vllms_nccl_paths() -> None:
    from vllm.v1.attention.ops.dcp import MLADCPManager

    config = harness.make_vllm_config(max_model_len=256, block_size=16, dcp_world_size=2)
    builder: Any = harness.make_builder("TRITON_MLA", config, block_size=16, dcp_rank=1)
    manager = builder.dcp_manager
    assert isinstance(manager, MLADCPManager)
    assert (manager.group.world_size, manager.group.rank_in_group) == (2, 1)
    assert manager.query_gather == manager._gather_query  # not the symmetric-memory gather
    assert isinstance(manager._kv_gather, functools.partial)  # torch's all-gather, bound
    assert manager._kv_gather.func is torch.distributed.all_gather_into_tensor
    assert all(name not in os.environ for name in SWITCHES)  # as they were before


def test_vllms_direct_dcp_switches_are_off_only_inside_a_group_of_several_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm import envs

    monkeypatch.setenv("VLLM_USE_DIRECT_DCP_A2A", "1")
    monkeypatch.delenv("VLLM_USE_DIRECT_DCP_Q_GATHER", raising=False)
    with harness.dcp_group(2, 0):
        assert [getattr(envs, name) for name in SWITCHES] == [False, False, False]
    with harness.dcp_group(1, 0):
        assert envs.VLLM_USE_DIRECT_DCP_A2A is True
        assert envs.VLLM_USE_DIRECT_DCP_Q_GATHER is None
    assert os.environ["VLLM_USE_DIRECT_DCP_A2A"] == "1"
    assert "VLLM_USE_DIRECT_DCP_Q_GATHER" not in os.environ


@pytest.fixture
def world() -> Iterator[None]:
    """No distributed state before; whatever the test made torn down after."""
    assert not torch.distributed.is_initialized()
    yield
    harness.release_one_rank_world()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _sparse_recipe(name: str) -> HarnessRecipe:
    backend = registry_backend(name)
    if backend is None:
        pytest.skip(f"vLLM's registry does not load {name} here")
    return HarnessRecipe("mla", ClassRef(backend.__module__, backend.__qualname__),
                         block_size=64)


@pytest.mark.usefixtures("world")
def test_a_sparse_mla_builder_constructs_inside_a_one_rank_world_and_not_without_one() -> None:
    from vllm.distributed import parallel_state

    recipe = _sparse_recipe("FLASHINFER_MLA_SPARSE")
    config = harness.make_vllm_config(max_model_len=1024, block_size=64)
    with pytest.raises(AssertionError, match="tensor model parallel group is not initialized"):
        harness.make_builder("FLASHINFER_MLA_SPARSE", config, block_size=64, recipe=recipe)
    harness.one_rank_world(config)
    assert parallel_state.get_tensor_model_parallel_world_size() == 1
    assert torch.distributed.get_world_size() == 1
    builder: Any = harness.make_builder("FLASHINFER_MLA_SPARSE", config, block_size=64,
                                        recipe=recipe)
    assert type(builder).__name__ == "FlashInferMLASparseTRTLLMMetadataBuilder"
    # its flag as vLLM sets it: on where its class has vLLM's hook (0.33 on), off in 0.32
    assert builder.supports_draft_decode_metadata_update is _declares_hook(type(builder))


@pytest.mark.usefixtures("world")
def test_the_one_rank_world_is_made_once_and_torn_down_with_its_store() -> None:
    from vllm.distributed import parallel_state

    config = harness.cached_vllm_config(max_model_len=256, block_size=16)
    harness.one_rank_world(config)
    groups = parallel_state.get_tp_group(), parallel_state.get_dcp_group()
    harness.one_rank_world(config)
    assert (parallel_state.get_tp_group(), parallel_state.get_dcp_group()) == groups
    assert [g.world_size for g in groups] == [1, 1]
    (store,) = harness_world._world
    harness.release_one_rank_world()
    assert not torch.distributed.is_initialized()
    assert not parallel_state.model_parallel_is_initialized()
    assert not Path(store).exists()
    harness.release_one_rank_world()  # nothing left to release


@pytest.mark.usefixtures("world")
def test_a_torch_world_without_vllms_groups_is_refused_with_how_to_make_them(
    tmp_path: Path,
) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}",
                                         world_size=1, rank=0)
    config = harness.cached_vllm_config(max_model_len=256, block_size=16)
    with pytest.raises(RuntimeError, match=r"ensure_model_parallel_initialized\(1, 1\)"):
        harness.one_rank_world(config)
    assert harness_world._world == []


@pytest.mark.usefixtures("world")
def test_vllms_groups_of_more_than_one_rank_are_refused_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.distributed import parallel_state

    config = harness.cached_vllm_config(max_model_len=256, block_size=16)
    harness.one_rank_world(config)
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_world_size", lambda: 2)
    with pytest.raises(RuntimeError, match="tensor x pipeline sizes 2 x 1"):
        harness.one_rank_world(config)


def test_a_cuda_builder_is_made_inside_the_one_rank_world_and_a_cpu_one_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[str] = []

    class Made(Exception):
        pass

    def record(config: Any) -> None:
        made.append(config.model_config.model)
        raise Made

    monkeypatch.setattr(builders, "one_rank_world", record)
    config = harness.cached_vllm_config(max_model_len=256, block_size=16)
    harness.make_builder("TRITON_MLA", config, block_size=16)
    assert made == []
    with pytest.raises(Made):
        harness.make_builder("TRITON_MLA", config, block_size=16, device="cuda")
    assert made == [config.model_config.model]
