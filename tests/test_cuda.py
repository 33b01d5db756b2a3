"""CUDA: eager updates, the fused one-launch kernel and the captured loop each equal the
rebuild path; capture refuses what a graph cannot replay. Skipped without a GPU."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from draftmeta import DraftState, DraftUpdatable, HostUpperBound, Unchanged
from draftmeta.loop import AttentionGroup, CaptureError, DraftLoop
from draftmeta.testing import compare_metadata, random_state
from tests.toy import Scheduler, ToyDecode, ToyMeta, toy_metadata, toy_rules, toy_spec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BATCHES = 50


def _spec(policy: str, graph: bool) -> Any:
    rules = toy_rules(policy)
    if graph:  # what a captured loop needs: a frozen host bound, no host object replaced
        rules["max_seq_len"] = HostUpperBound("max_model_len")
        rules["scheduler"] = Unchanged()
    return toy_spec(rules=rules, name=f"toy_{policy}{'_graph' if graph else ''}")


@functools.cache
def builder_class(policy: str = "clamp", graph: bool = False) -> type:
    """A builder class declaring the toy spec for an overflow policy."""
    name = f"Builder_{policy}_{graph}"
    return type(name, (DraftUpdatable,), {"draft_spec": _spec(policy, graph)})


def _opaque(obj: object) -> bool:
    return isinstance(obj, Scheduler)


def _case(seed: int, device: str) -> tuple[DraftState, int]:
    g = torch.Generator().manual_seed(seed)
    steps = 2 + seed % 7
    batch = [1, 2, 7, 16, 64, 100, 256][seed % 7]
    padded = 3 if seed % 5 == 0 else 0
    state = random_state(g, batch_size=batch, block_size=[16, 64][seed % 2],
                         max_model_len=[256, 1000, 4096][seed % 3], steps=steps,
                         num_padded=padded)
    return (state.to(device) if device != "cpu" else state), steps


def _run(seed: int, device: str, policy: str, fused: bool) -> list[ToyMeta[ToyDecode]]:
    state, steps = _case(seed, device)
    group = AttentionGroup("toy", builder_class(policy)(), toy_metadata(state),
                           lambda s, i: toy_metadata(s))
    loop = DraftLoop([group], state, policy=policy, fused=fused)  # type: ignore[arg-type]
    seen: list[ToyMeta[ToyDecode]] = []

    def step(index: int, metadata: Any) -> None:
        meta = metadata["toy"]
        rebuilt = toy_metadata(state)
        assert compare_metadata(meta, rebuilt, opaque=_opaque) == [], (seed, index)
        seen.append(meta)

    stats = loop.run(step, steps)
    assert stats.fallbacks() == {}
    assert stats.groups["toy"].updates == steps - 1
    return seen


@pytest.mark.parametrize("policy", ["wrap", "clamp"])
@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
def test_updates_equal_rebuild_on_cuda(policy: str, fused: bool) -> None:
    for seed in range(BATCHES):
        _run(seed, "cuda", policy, fused)


def test_fused_step_is_one_launch() -> None:
    state, _ = _case(3, "cuda")
    group = AttentionGroup("toy", builder_class()(), toy_metadata(state),
                           lambda s, i: toy_metadata(s))
    loop = DraftLoop([group], state, fused=True)
    loop.refresh(1)  # builds and compiles the kernel
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loop.refresh(2)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = sorted({e.name for e in kernels})
    assert len(kernels) == 1, names
    assert names[0].startswith("draftmeta_fused_step_")
    assert loop.fused_source is not None and "tl.store" in loop.fused_source


@pytest.mark.parametrize("policy", ["wrap", "clamp"])
def test_captured_loop_replays_the_eager_results(policy: str) -> None:
    for seed in range(BATCHES):
        state, steps = _case(seed, "cuda")
        eager_state = state.clone()
        eager = AttentionGroup("toy", builder_class(policy, True)(), toy_metadata(eager_state),
                               lambda s, i: toy_metadata(s))
        eager_loop = DraftLoop([eager], eager_state, policy=policy,  # type: ignore[arg-type]
                               host_bound="frozen", fused=False)
        eager_loop.run(lambda i, m: None, steps)

        start = state.clone()
        meta = toy_metadata(state)
        group = AttentionGroup("toy", builder_class(policy, True)(), meta,
                               lambda s, i: toy_metadata(s))
        loop = DraftLoop([group], state, policy=policy, host_bound="frozen")  # type: ignore[arg-type]
        # one per index the warm-up and the captured steps use
        snapshots = [torch.empty_like(state.slot_mapping) for _ in range(steps + 3)]

        def step(index: int, metadata: Any, snapshots: list[torch.Tensor] = snapshots) -> None:
            snapshots[index].copy_(metadata["toy"].slot_mapping)

        captured = loop.capture(step, steps, warmup=1)
        # restore the inputs the warm-up and capture advanced, then replay for real
        for name in ("positions", "seq_lens", "slot_mapping"):
            getattr(state, name).copy_(getattr(start, name))
        meta.positions.copy_(start.positions)
        captured.replay(state)
        torch.cuda.synchronize()
        for name in ("positions", "seq_lens", "slot_mapping"):
            assert torch.equal(getattr(state, name), getattr(eager_state, name)), (seed, name)
        assert compare_metadata(meta, eager.metadata, opaque=_opaque) == [], seed


def _loop(builder: object, state: DraftState, **kw: Any) -> DraftLoop:
    return DraftLoop([AttentionGroup("g", builder, toy_metadata(state),
                                     lambda s, i: toy_metadata(s))], state, **kw)


def test_capture_refuses_a_device_sync() -> None:
    state, _ = _case(1, "cuda")
    loop = _loop(builder_class(graph=True)(), state, host_bound="frozen")
    with pytest.raises(CaptureError, match="synchronizes with the device"):
        loop.capture(lambda i, m: m["g"].positions.sum().item(), 4)


def test_capture_refuses_a_buffer_that_moves() -> None:
    class Moving(DraftUpdatable[ToyMeta[ToyDecode]]):
        draft_spec = _spec("clamp", True)

        def update_draft_metadata(self, metadata: Any, state: DraftState, /) -> None:
            super().update_draft_metadata(metadata, state)
            metadata.weights = metadata.weights.clone()  # a hand-written update gone wrong

    state, _ = _case(2, "cuda")
    with pytest.raises(CaptureError, match=r"g\.weights moved between steps"):
        _loop(Moving(), state, host_bound="frozen", fused=False).capture(lambda i, m: None, 4)


def test_capture_refuses_host_values_that_change() -> None:
    state, _ = _case(4, "cuda")
    state.max_seq_len = state.max_model_len - 10  # room to grow
    with pytest.raises(CaptureError, match=r"host value .*max_seq_len changes between steps"):
        _loop(builder_class(graph=True)(), state, host_bound="advance").capture(
            lambda i, m: None, 4)


def test_capture_refuses_a_reset_rule() -> None:
    state, _ = _case(5, "cuda")
    with pytest.raises(CaptureError, match="scheduler"):
        _loop(builder_class()(), state, host_bound="frozen").capture(lambda i, m: None, 4)


def test_replay_refuses_another_batch_shape() -> None:
    state, _ = _case(6, "cuda")
    loop = _loop(builder_class(graph=True)(), state, host_bound="frozen")
    captured = loop.capture(lambda i, m: None, 3)
    other, _ = _case(7, "cuda")
    if other.batch_size == state.batch_size:
        other, _ = _case(8, "cuda")
    with pytest.raises(CaptureError, match="captured for"):
        captured.replay(other)


@pytest.mark.parametrize("policy", ["wrap", "clamp"])
def test_fused_advance_with_dcp_equals_the_cpu_advance(policy: str) -> None:
    from draftmeta import advance_state

    for seed in range(BATCHES):
        cpu, steps = _case(seed, "cpu")
        cpu.dcp_world_size, cpu.dcp_rank, cpu.dcp_interleave = 4, seed % 4, [1, 8][seed % 2]
        cpu.dcp_local_seq_lens = torch.zeros_like(cpu.seq_lens)
        gpu = cpu.to("cuda")
        loop = DraftLoop([], gpu, policy=policy, fused=True)  # type: ignore[arg-type]
        for index in range(1, steps):
            advance_state(cpu, policy)  # type: ignore[arg-type]
            loop.refresh(index)
            for name in ("positions", "seq_lens", "slot_mapping", "dcp_local_seq_lens"):
                assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), (seed, name)
            assert gpu.max_seq_len == cpu.max_seq_len
