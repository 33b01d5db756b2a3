"""vLLM's distributed state as the harness stands it in: a stand-in DCP group (no
``torch.distributed``) that builders and MLA layers read while they are constructed, a DCP
rank's share of the sequence lengths by vLLM's own function, and the one-rank world vLLM's
single-GPU runner builds inside (:func:`one_rank_world`)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import attrs
import torch

from draftmeta.integrations.vllm.testing.harness.environment import prepare_environment

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["dcp_group", "dcp_local_seq_lens", "one_rank_world", "release_one_rank_world"]


def dcp_local_seq_lens(seq_lens: torch.Tensor, world_size: int, rank: int,
                       interleave: int) -> torch.Tensor:
    """One DCP rank's share of the global ``seq_lens`` by vLLM's own
    ``get_dcp_local_seq_lens``, int32 as the runner keeps it: what a rebuild is given, so that
    draftmeta's own recomputation is checked against vLLM's."""
    prepare_environment()
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    local = get_dcp_local_seq_lens(seq_lens, world_size, rank, interleave)
    return torch.as_tensor(local).to(torch.int32).contiguous()


@attrs.frozen
class _StandInGroup:
    """What vLLM's builders and MLA layers read of the DCP process group while they are
    constructed and build decode metadata: its size and this rank; a ``device_group`` that
    MLA's DCP manager binds its NCCL fallbacks to (chunked-prefill KV gather; called only in
    a forward); and a hash (vLLM caches its symmetric-memory workspaces per group). No
    ``cpu_group``: the stand-in has no peers to ask whether they share this node, so
    :func:`dcp_group` turns the symmetric-memory paths that ask (on CUDA) off."""

    world_size: int
    rank_in_group: int
    device_group: Any = None


_DIRECT_DCP_SWITCHES: Final = ("VLLM_USE_DIRECT_DCP_A2A", "VLLM_USE_DIRECT_DCP_Q_GATHER",
                               "VLLM_USE_DIRECT_DCP_KV_GATHER")
"""vLLM's switches for MLA's symmetric-memory DCP collectives (unset: on where the group's
ranks share a node, which vLLM asks the group's ``cpu_group``; ``0``: its NCCL paths)."""


@contextlib.contextmanager
def _direct_dcp_off() -> Iterator[None]:
    """Inside, vLLM's symmetric-memory DCP collectives are switched off (its own variables
    set to ``0``), as they were afterwards."""
    said = {name: os.environ.get(name) for name in _DIRECT_DCP_SWITCHES}
    os.environ.update(dict.fromkeys(_DIRECT_DCP_SWITCHES, "0"))
    try:
        yield
    finally:
        for name, value in said.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def dcp_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """Inside, vLLM's ``get_dcp_group()`` answers a stand-in group of ``world_size`` ranks
    with this process as ``rank``, in every loaded vLLM module that imported it (builders and
    MLA layers read the DCP world size from it when constructed); no ``torch.distributed``.

    With more than one rank, vLLM's symmetric-memory DCP collectives are switched off inside
    (``VLLM_USE_DIRECT_DCP_A2A``, ``VLLM_USE_DIRECT_DCP_Q_GATHER`` and
    ``VLLM_USE_DIRECT_DCP_KV_GATHER`` set to ``0``, restored afterwards): on CUDA, MLA's DCP
    manager would otherwise ask the group's peers whether they share this node, and a stand-in
    has none. Either kind of collective runs only in a forward: what the builders put in the
    metadata does not depend on which one is bound.

    Raises:
        ValueError: ``rank`` is not one of the ``world_size`` ranks.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    prepare_environment()
    from vllm.distributed import parallel_state

    original = parallel_state.get_dcp_group
    group = _StandInGroup(world_size, rank)

    def stand_in() -> _StandInGroup:
        return group

    def holding(function: object) -> list[Any]:
        return [m for name, m in list(sys.modules.items())
                if name.startswith("vllm") and getattr(m, "get_dcp_group", None) is function]

    for module in holding(original):
        module.get_dcp_group = stand_in
    try:
        with _direct_dcp_off() if world_size > 1 else contextlib.nullcontext():
            yield
    finally:  # modules imported inside took the stand-in by name: they get the original too
        for module in holding(stand_in):
            module.get_dcp_group = original


_world: list[str] = []  # the store directory of the one-rank world this module set up


def one_rank_world(config: VllmConfig) -> None:
    """Set up vLLM's distributed state for one process without parallelism, as vLLM's
    single-GPU runner has it: a world of one rank (``init_distributed_environment`` over a
    file store in a temporary directory, gloo: nothing is ever sent) and its model-parallel
    groups, all of size 1 (``ensure_model_parallel_initialized(1, 1)``, made under
    ``config``). vLLM's layers read them when constructed (a sparse MLA layer asks the tensor
    parallel group's size).
    :func:`~draftmeta.integrations.vllm.testing.harness.builders.make_builder` calls it for
    CUDA builders.

    Once per process: a second call finds the groups made and returns; so does a call where
    vLLM's groups were made by someone else with one rank each. The world is torn down at
    interpreter exit, or by :func:`release_one_rank_world`.

    Raises:
        RuntimeError: vLLM's groups, or ``torch.distributed``'s world, already exist with more
            than one rank (the harness builds for one), or ``torch.distributed`` is set up
            without vLLM's groups (make them with
            ``vllm.distributed.ensure_model_parallel_initialized(1, 1)`` first).
    """
    prepare_environment()
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        sizes = (parallel_state.get_tensor_model_parallel_world_size(),
                 parallel_state.get_pp_group().world_size)
        if sizes != (1, 1):
            raise RuntimeError(
                f"vLLM's model-parallel groups in this process have tensor x pipeline sizes "
                f"{sizes[0]} x {sizes[1]}; the harness builds for one rank: run it in a "
                "process without them")
        return
    if torch.distributed.is_initialized():
        ranks = torch.distributed.get_world_size()
        raise RuntimeError(
            f"torch.distributed is set up in this process ({ranks} rank(s)) without vLLM's "
            "model-parallel groups; make them first "
            "(vllm.distributed.ensure_model_parallel_initialized(1, 1)), or run the harness "
            "in a process without torch.distributed")
    directory = tempfile.mkdtemp(prefix="draftmeta-vllm-world-")
    try:
        with set_current_vllm_config(config):
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"file://{os.path.join(directory, 'store')}")
            parallel_state.ensure_model_parallel_initialized(1, 1)
    except BaseException:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    _world.append(directory)
    atexit.register(release_one_rank_world)


def release_one_rank_world() -> None:
    """Tear down the world :func:`one_rank_world` set up (vLLM's groups, then
    ``torch.distributed``'s), and remove its store; nothing where it set up none."""
    if not _world:
        return
    from vllm.distributed import parallel_state

    atexit.unregister(release_one_rank_world)
    directory = _world.pop()
    try:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
