"""The draft loop on CPU: dispatch, fallback reasons, statistics, guards, and equivalence of
its output with an all-rebuild loop over vLLM's real builders."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

from draftmeta import DraftState, DraftUpdatable, Equals
from draftmeta.integrations.vllm.catalogue import builder_spec
from draftmeta.loop import AttentionGroup, CaptureError, DraftLoop
from draftmeta.protocol import SpecBuilder
from draftmeta.state_validation import validate_state
from draftmeta.testing import compare_metadata, random_state
from tests.toy import ToyDecode, ToyMeta, toy_group, toy_metadata, toy_spec


def _vllm_groups(state: DraftState, *, capable: bool) -> list[AttentionGroup]:
    pytest.importorskip("vllm", reason="compares with vLLM's real builders")
    from draftmeta.integrations.vllm.testing import harness

    _cad = harness.common_metadata_for
    config = harness.cached_vllm_config(max_model_len=state.max_model_len, block_size=64)
    groups = []
    for name, spec in (("TRITON_MLA", builder_spec("TRITON_MLA")), ("CPU_MLA", None),
                       ("INDEXER", builder_spec("INDEXER"))):
        kwargs: dict[str, Any] = {"block_size": 64}
        if name == "INDEXER":
            kwargs["block_table_width"] = state.block_table.shape[1]
        builder = harness.make_builder(name, config, **kwargs)
        metadata = harness.build_metadata(builder, _cad(state), draft_index=1)

        def rebuild(s: DraftState, index: int, builder: Any = builder, cad: Any = _cad) -> Any:
            return harness.build_metadata(builder, cad(s), draft_index=index)

        declared = SpecBuilder(spec, builder) if capable and spec is not None else builder
        groups.append(AttentionGroup(name, declared, metadata, rebuild))
    return groups


def _unfilled(path: str) -> bool:
    return path.endswith("decode.schedule_metadata")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["wrap", "clamp"])
def test_loop_output_equals_an_all_rebuild_loop(seed: int, policy: str) -> None:
    g = torch.Generator().manual_seed(seed)
    batch = [1, 5, 17, 64, 3, 33][seed]
    base = random_state(g, batch_size=batch, block_size=64, max_model_len=1000, steps=8)
    outputs: dict[bool, list[dict[str, Any]]] = {}
    stats = {}
    for capable in (True, False):
        state = base.clone()
        groups = _vllm_groups(state, capable=capable)
        loop = DraftLoop(groups, state, policy=policy)  # type: ignore[arg-type]
        seen: list[dict[str, Any]] = []
        outputs[capable] = seen
        stats[capable] = loop.run(lambda i, m, seen=seen: seen.append(copy.deepcopy(dict(m))), 8)
    for step, (fast, slow) in enumerate(zip(outputs[True], outputs[False])):
        for name in fast:
            diff = compare_metadata(fast[name], slow[name], ignore=lambda p: _unfilled(p))
            assert diff == [], (seed, step, name, diff)
    fast_stats = stats[True]
    assert fast_stats.steps == 8 and fast_stats.advances == 7
    assert fast_stats.groups["TRITON_MLA"].updates == 7
    assert fast_stats.groups["INDEXER"].updates == 7
    assert fast_stats.groups["CPU_MLA"].rebuilds == 7
    assert set(fast_stats.fallbacks()) == {"CPU_MLA"}
    assert "declares no draft-update capability" in fast_stats.fallbacks()["CPU_MLA"]
    assert set(stats[False].fallbacks()) == {"TRITON_MLA", "CPU_MLA", "INDEXER"}


class ToyBuilder(DraftUpdatable[ToyMeta[ToyDecode]]):
    draft_spec = toy_spec()


def _toy_group(name: str, state: DraftState, builder: object | None = None,
               **changes: Any) -> AttentionGroup:
    meta = toy_metadata(state)
    for key, value in changes.items():
        setattr(meta, key, value)
    group: AttentionGroup = toy_group(name, state, builder or ToyBuilder(), metadata=meta)
    return group


def test_fallback_reasons_are_recorded_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    state = random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=16,
                         max_model_len=512, steps=6)
    groups = [
        _toy_group("capable", state),
        _toy_group("prefilling", state, num_prefills=1),
        _toy_group("plain", state, builder=object()),
    ]
    with caplog.at_level(logging.INFO, logger="draftmeta.loop"):
        stats = DraftLoop(groups, state).run(lambda i, m: None, 6)
    assert stats.groups["capable"].updates == 5 and stats.groups["capable"].reason is None
    assert stats.groups["prefilling"].rebuilds == 5 and stats.groups["prefilling"].updates == 0
    assert stats.fallbacks()["prefilling"].startswith("precondition 'decode_only' failed")
    assert "object declares no draft-update capability" in stats.fallbacks()["plain"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("prefilling" in m for m in messages) == 2  # the first decision, then the fallback
    assert sum("plain" in m for m in messages) == 1


def test_a_dcp_state_falls_back_for_a_spec_without_dcp() -> None:
    state = random_state(torch.Generator().manual_seed(1), batch_size=3, block_size=16,
                         max_model_len=512, steps=4)
    state.dcp_world_size, state.dcp_local_seq_lens = 2, torch.zeros_like(state.seq_lens)
    spec = toy_spec(preconditions=[Equals("state.dcp_world_size", 1, name="no_dcp")])
    group = AttentionGroup("mla", SpecBuilder(spec), toy_metadata(state),
                           lambda s, i: "rebuilt")
    stats = DraftLoop([group], state).run(lambda i, m: None, 3)
    assert stats.fallbacks()["mla"].startswith("precondition 'no_dcp' failed")


def test_an_unsupported_spec_rebuilds_with_its_reason() -> None:
    state = random_state(torch.Generator().manual_seed(2), batch_size=3, block_size=16,
                         max_model_len=512, steps=4)
    spec = builder_spec("FLASHMLA_SPARSE", dcp=True)
    group = AttentionGroup("fa", SpecBuilder(spec), None, lambda s, i: "rebuilt")
    loop = DraftLoop([group], state)
    assert "sparse MLA under DCP is not declared by draftmeta" in loop.stats.fallbacks()["fa"]
    loop.run(lambda i, m: None, 3)
    assert loop.groups[0].metadata == "rebuilt"


def test_state_guards_name_the_field() -> None:
    state = random_state(torch.Generator().manual_seed(3), batch_size=3, block_size=16,
                         max_model_len=64, steps=2)
    bad = state.clone()
    bad.seq_lens = bad.seq_lens.float()
    with pytest.raises(ValueError, match=r"state\.seq_lens is torch\.float32"):
        validate_state(bad)
    bad = state.clone()
    bad.block_table = bad.block_table.to("meta")
    with pytest.raises(ValueError, match=r"state\.block_table is on meta"):
        validate_state(bad)
    bad = state.clone()
    bad.max_seq_len = 65
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        validate_state(bad)
    bad = state.clone()
    bad.dcp_world_size = 2
    with pytest.raises(ValueError, match="dcp_local_seq_lens is None"):
        validate_state(bad)
    with pytest.raises(ValueError, match="unique"):
        DraftLoop([_toy_group("a", state), _toy_group("a", state)], state)


def test_capture_needs_cuda() -> None:
    state = random_state(torch.Generator().manual_seed(4), batch_size=3, block_size=16,
                         max_model_len=64, steps=2)
    loop = DraftLoop([_toy_group("toy", state)], state, host_bound="frozen")
    with pytest.raises(CaptureError, match="capture needs CUDA"):
        loop.capture(lambda i, m: None, 4)
