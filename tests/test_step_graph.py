"""StepGraph: the fused step's kernel replayed from a cached CUDA graph equals the eager advance
and update, recaptures when a baked argument changes, and costs one kernel per step. The CUDA
tests skip without a GPU; the refusal of a CPU state runs everywhere."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from draftmeta import advance_state
from draftmeta.rules import Unchanged
from draftmeta.state import DraftState
from draftmeta.step_graph import StepGraph
from draftmeta.testing import compare_metadata, random_state
from tests.toy import Scheduler, toy_metadata, toy_rules, toy_spec

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BATCHES = 50


def _opaque(obj: object) -> bool:
    return isinstance(obj, Scheduler)


def _case(seed: int, device: str = "cuda") -> tuple[DraftState, int]:
    g = torch.Generator().manual_seed(seed)
    steps = 3 + seed % 6
    batch = [1, 2, 7, 16, 64, 100, 256][seed % 7]
    state = random_state(g, batch_size=batch, block_size=[16, 64][seed % 2],
                         max_model_len=[256, 1000, 4096][seed % 3], steps=steps,
                         num_padded=3 if seed % 5 == 0 else 0)
    return (state.to(device) if device != "cpu" else state), steps


def _same_state(a: DraftState, b: DraftState) -> list[str]:
    return [name for name in ("positions", "seq_lens", "slot_mapping")
            if not torch.equal(getattr(a, name), getattr(b, name))] + (
        ["max_seq_len"] if a.max_seq_len != b.max_seq_len else [])


def test_a_step_graph_refuses_a_draft_state_on_the_cpu() -> None:
    state, _ = _case(0, "cpu")
    with pytest.raises(ValueError, match="needs the draft state on CUDA"):
        StepGraph(state, [(toy_spec(), toy_metadata(state))])


@cuda
@pytest.mark.parametrize("policy", ["wrap", "clamp"])
def test_graph_replayed_steps_equal_the_eager_advance_and_update(policy: Any) -> None:
    spec = toy_spec(rules=toy_rules(policy), name=f"toy_{policy}")
    for seed in range(BATCHES):
        state, steps = _case(seed)
        ref_state = state.clone()
        ref_meta = toy_metadata(ref_state)
        meta = toy_metadata(state)
        step = StepGraph(state, [(spec, meta)], policy=policy)
        for index in range(1, steps):
            advance_state(ref_state, policy)
            spec.update(ref_meta, ref_state)
            step()
            assert _same_state(state, ref_state) == [], (seed, index)
            assert compare_metadata(meta, ref_meta, opaque=_opaque) == [], (seed, index)
        # not vacuous: the first step launched and captured, every later one replayed
        assert (step.direct_launches, step.captures, step.replays) == (1, 1, steps - 2), seed


@cuda
def test_a_changed_host_scalar_recaptures_and_a_stale_graph_would_be_wrong() -> None:
    spec = toy_spec()
    state, _ = _case(4)  # 64 requests
    ref_state = state.clone()
    meta, ref_meta = toy_metadata(state), toy_metadata(ref_state)
    step = StepGraph(state, [(spec, meta)])
    for _ in range(3):
        advance_state(ref_state)
        spec.update(ref_meta, ref_state)
        step()
    assert step.captures == 1 and step.replays == 2
    # fewer real requests: the slot mapping's padding mask is a baked kernel argument
    state.num_reqs = ref_state.num_reqs = 40
    stale = step._graph
    assert stale is not None
    written = [state.positions, state.seq_lens, state.slot_mapping, meta.positions,
               meta.decode.lens_copy, meta.decode.decode_lens]  # type: ignore[union-attr]
    saved = [t.clone() for t in written]
    stale.replay()  # negative control: the old graph still masks with 64 requests
    torch.cuda.synchronize()
    assert not bool((state.slot_mapping[40:64] == -1).all())
    for t, s in zip(written, saved):  # undo the stale replay
        t.copy_(s)
    assert _same_state(state, ref_state) == []
    advance_state(ref_state)
    spec.update(ref_meta, ref_state)
    step()
    assert step.captures == 2 and step.direct_launches == 2
    assert _same_state(state, ref_state) == []
    assert compare_metadata(meta, ref_meta, opaque=_opaque) == []
    assert bool((state.slot_mapping[40:] == -1).all())


@cuda
def test_a_replayed_step_runs_one_kernel() -> None:
    state, _ = _case(3)
    step = StepGraph(state, [(toy_spec(), toy_metadata(state))])
    step()  # launches, compiles and captures
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = sorted({e.name for e in kernels})
    assert step.replays == 1
    assert len(kernels) == 1 and names[0].startswith("draftmeta_fused_step_"), names


def _capture_safe_toy() -> Any:
    """The toy spec without its Reset scheduler, which a captured graph cannot replay."""
    return toy_spec(rules={**toy_rules(), "scheduler": Unchanged()}, name="toy_graphable")


@cuda
def test_inside_an_enclosing_capture_the_kernel_is_launched_not_replayed() -> None:
    state, _ = _case(2)
    step = StepGraph(state, [(_capture_safe_toy(), toy_metadata(state))])
    assert step.capture_unsafe_reason is None
    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    assert step.replays == 0 and step.direct_launches == 2


@cuda
def test_a_step_whose_spec_is_not_capture_safe_refuses_an_enclosing_capture() -> None:
    state, _ = _case(2)
    step = StepGraph(state, [(toy_spec(), toy_metadata(state))])  # scheduler: Reset
    assert step.capture_unsafe_reason == (
        "spec 'toy': scheduler is replaced by a host object every step (Reset), which a "
        "captured graph cannot replay")
    step()  # eagerly it runs: its own graph holds the elementwise kernel only
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="a replay would skip that host work"), \
            torch.cuda.graph(graph):
        step()
