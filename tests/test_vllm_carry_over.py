"""The older proposer's carry-over: a draft loop's index-1 metadata, refreshed in place for the
next loop, equals vLLM's fresh build (real vLLM builders on CPU)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import torch

from draftmeta import Advance, DraftSpec, Wrap, advance_state
from draftmeta.integrations.vllm import plugin
from draftmeta.integrations.vllm.catalogue import current_release
from draftmeta.integrations.vllm.plugin.carry_over import (
    CARRY_OVER_ENV,
    CarryOver,
    spec_refuses,
    unchanged_values,
)
from draftmeta.integrations.vllm.testing import harness
from draftmeta.integrations.vllm.testing.equivalence import random_case
from draftmeta.state import DraftState
from draftmeta.testing import compare_metadata, random_state

pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")

RELEASE = current_release()
CARRIED = sorted(e.name for e in RELEASE.builders
                 if e.carry_over is not None and e.harness is not None)
pytestmark = pytest.mark.skipif(
    "older_proposer" not in RELEASE.paths,
    reason=f"vLLM {RELEASE.version} has no older proposer (build_for_drafting)",
)


@pytest.fixture(autouse=True)
def carry_over_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Carry-over is opt-in; these tests turn it on (the last one shows the default is off)."""
    monkeypatch.setenv(CARRY_OVER_ENV, "1")


@pytest.fixture
def active(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register()
    try:
        yield
    finally:
        plugin.unregister()


CAPACITY = 64
"""Rows of the persistent buffers: every loop's batch is a view of their leading rows."""


def _into(buffers: DraftState, fresh: DraftState) -> DraftState:
    """Write a new batch into the leading rows of the persistent buffers, as vLLM's runner does
    between loops, and return the draft state over views of them."""
    n = fresh.num_reqs
    views = {name: getattr(buffers, name)[: n + 1 if name == "query_start_loc" else n]
             for name in ("positions", "seq_lens", "slot_mapping", "block_table",
                          "query_start_loc")}
    for name, view in views.items():
        view.copy_(getattr(fresh, name))
    return attrs.evolve(fresh, **views)


def _draft_loop(builder: Any, state: DraftState, steps: int, policy: str) -> list[Any]:
    """One older-proposer draft loop: a new common metadata over the same buffers, then
    ``build_for_drafting`` at indices 1..steps with the shared advance between them."""
    cad = harness.common_metadata_for(state)
    out = [builder.build_for_drafting(cad, 1)]
    for index in range(2, steps + 1):
        advance_state(state, policy)  # type: ignore[arg-type]
        cad.max_seq_len = state.max_seq_len
        out.append(builder.build_for_drafting(cad, index))
    return out


def _builders(name: str, max_model_len: int, block_size: int) -> tuple[Any, Any, Any]:
    config = harness.cached_vllm_config(max_model_len=max_model_len, block_size=block_size)
    patched = harness.make_builder(name, config, block_size=block_size)
    reference = harness.make_builder(name, config, block_size=block_size)
    original = type(patched).build_for_drafting.__wrapped__
    return patched, reference, original


def _run_loops(name: str, seed: int, loops: int, *, batch_sizes: list[int] | None = None,
               steps: int | None = None) -> Iterator[tuple[list[Any], list[str]]]:
    """``loops`` draft loops of unrelated batches on one patched builder; yields, per loop,
    its metadata objects and how its last step differs from vLLM's fresh build (compared
    before the next loop writes the buffers the metadata views)."""
    case = random_case(name, seed)
    if steps is not None:
        case = attrs.evolve(case, steps=steps)
    g = torch.Generator().manual_seed(seed)
    sizes = batch_sizes or [case.batch_size] * loops
    patched, reference, original = _builders(name, case.max_model_len, case.block_size)
    buffers = random_state(g, batch_size=CAPACITY, block_size=case.block_size,
                           max_model_len=case.max_model_len, steps=case.steps)
    for size in sizes:
        state = _into(buffers, random_state(g, batch_size=size, block_size=case.block_size,
                                            max_model_len=case.max_model_len, steps=case.steps))
        check = state.clone()
        steps = _draft_loop(patched, state, case.steps, case.overflow)
        for _ in range(case.steps - 1):
            advance_state(check, case.overflow)  # type: ignore[arg-type]
        want = original(reference, harness.common_metadata_for(check), case.steps)
        diff = compare_metadata(steps[-1], want, ignore=lambda p: p == "decode.schedule_metadata")
        yield steps, [str(m) for m in diff]


@pytest.mark.parametrize("name", CARRIED)
def test_metadata_carried_over_to_an_unrelated_batch_equals_vllms_fresh_build(
    name: str, active: None
) -> None:
    plugin.reset_stats()
    carried = 0
    for seed in range(40):  # 40 seeds x 5 loops: 160 carried-over loops per builder
        first = None
        for loop, (steps, diff) in enumerate(_run_loops(name, seed, loops=5)):
            first = first or steps[0]
            assert all(m is first for m in steps), (seed, loop, "one object for every loop")
            assert diff == [], (seed, loop, diff)
        carried += 4
    assert plugin.stats()[name]["carried_over"] == carried


@pytest.mark.parametrize("name", CARRIED)
def test_a_loop_with_another_batch_size_builds_afresh_and_then_carries_that_over(
    name: str, active: None
) -> None:
    plugin.reset_stats()
    runs = list(_run_loops(name, 7, loops=4, batch_sizes=[3, 3, 5, 5]))
    objects = [steps[0] for steps, _ in runs]
    assert objects[1] is objects[0] and objects[2] is not objects[1] and objects[3] is objects[2]
    assert [diff for _, diff in runs] == [[], [], [], []]
    assert plugin.stats()[name]["carried_over"] == 2


def test_a_carry_over_declaration_that_forgets_the_views_leaves_stale_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control of the two tests above: the snapshot's checks are what keeps a
    carried-over object right when the batch changes."""
    entry = RELEASE.entry("CPU_MLA")
    assert entry.carry_over is not None
    careless = attrs.evolve(entry, carry_over=CarryOver(views=(), values=(), contents=()))
    builders = tuple(careless if e.name == "CPU_MLA" else e for e in RELEASE.builders)
    broken = attrs.evolve(RELEASE, builders=builders)
    from draftmeta.integrations.vllm.plugin import plan

    monkeypatch.setattr(plan, "release", lambda version: broken)
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register()
    try:
        runs = list(_run_loops("CPU_MLA", 7, loops=3, batch_sizes=[3, 5, 5]))
    finally:
        plugin.unregister()
    assert runs[1][0][0] is runs[0][0][0]  # carried over across a batch-size change
    assert runs[0][1] == [] and any("num_reqs" in line for line in runs[1][1])


def test_a_spec_with_a_step_by_step_rule_is_never_carried_over() -> None:
    spec = RELEASE.entry("CPU_MLA").make_spec()
    assert spec_refuses(spec) is None
    rules = {**spec.rules, "decode.seq_lens": Advance(Wrap("max_model_len"))}
    stepping = DraftSpec(spec.cls, rules, nested=spec.nested, preconditions=spec.preconditions,
                         name="stepping")
    assert spec_refuses(stepping) == "decode.seq_lens is Advance: it moves one step at a time"


def _stepping(*, name: str, host_bound: Any, dcp: bool = False, builder: Any = None) -> Any:
    """CPU_MLA's spec with ``decode.seq_lens`` advanced step by step (a spec whose update
    cannot refresh another loop's metadata)."""
    spec = RELEASE.entry("CPU_MLA").make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
    rules = {**spec.rules, "decode.seq_lens": Advance(Wrap("max_model_len"))}
    return DraftSpec(spec.cls, rules, nested=spec.nested, preconditions=spec.preconditions,
                     name="stepping")


def test_a_builder_whose_spec_cannot_carry_over_says_why_once_and_builds_each_loop(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord],
) -> None:
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register(spec_overrides={"CPU_MLA": _stepping})
    try:
        list(_run_loops("CPU_MLA", 0, loops=3))
        assert plugin.stats()["CPU_MLA"]["carried_over"] == 0
    finally:
        plugin.unregister()
    said = [r.getMessage() for r in vllm_log if "builds at every draft loop's index 1" in
            r.getMessage()]
    assert said == ["draftmeta: CPU_MLA builds at every draft loop's index 1: "
                    "decode.seq_lens is Advance: it moves one step at a time"]


def test_a_field_kept_unchanged_within_a_loop_keeps_its_builder_from_carrying_over(
    active: None,
) -> None:
    """AMX keeps its request-pool indices unchanged within one loop (its block-table expansion
    is recomputed at every call); another loop's batch could leave them stale, so the check
    names them (and the catalogue leaves AMX building)."""
    assert RELEASE.entry("AMX_MLA").carry_over is None
    builder, _, _ = _builders("AMX_MLA", 1024, 32)
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=32,
                         max_model_len=1024, steps=3)
    metadata = builder.build_for_drafting(harness.common_metadata_for(state), 1)
    spec = RELEASE.entry("AMX_MLA").make_spec(builder=builder)
    assert unchanged_values(spec)(metadata) == "decode.req_pool_indices"
    cpu = RELEASE.entry("CPU_MLA").make_spec()
    assert unchanged_values(cpu)(metadata) is None  # its unchanged fields are all None here


@pytest.mark.parametrize("extra", [True, False], ids=["uncovered-attribute", "control"])
def test_a_carried_object_is_checked_for_attributes_its_spec_has_no_rule_for_before_its_first_carry(
    extra: bool, active: None,
) -> None:
    """With one draft step per loop (K = 2: no in-place step ever checks the built object),
    the first carry-over checks it: one carrying an attribute the spec has no rule for rules
    the builder out, and every loop builds afresh (the control, without it: carried over)."""
    name = "CPU_MLA"
    plugin.reset_stats()
    g = torch.Generator().manual_seed(5)
    patched, _, _ = _builders(name, 1024, 16)
    buffers = random_state(g, batch_size=CAPACITY, block_size=16, max_model_len=1024, steps=1)
    firsts = []
    for loop in range(3):
        state = _into(buffers, random_state(g, batch_size=3, block_size=16, max_model_len=1024,
                                            steps=1))
        (first,) = _draft_loop(patched, state, 1, "wrap")
        firsts.append(first)
        if loop == 0 and extra:
            first.decode.kernel_hint = torch.zeros(3)  # what a newer vLLM might add
    assert (firsts[1] is firsts[0], firsts[2] is firsts[1]) == (not extra, not extra)
    assert plugin.stats()[name]["carried_over"] == (0 if extra else 2)


def _stale_max_seq_len(
    *, name: str, host_bound: Any, dcp: bool = False, builder: Any = None,
) -> Any:
    """CPU_MLA's spec with its host ``max_seq_len`` frozen: deliberately stale."""
    from draftmeta import HostConstant

    good = RELEASE.entry("CPU_MLA").make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
    return DraftSpec(good.cls, {**good.rules, "max_seq_len": HostConstant()}, name="stale",
                     nested=good.nested, preconditions=good.preconditions)


def _stale_loops(monkeypatch: pytest.MonkeyPatch, shadow: str, *, stale: bool = True
                 ) -> tuple[list[list[str]], Any, int]:
    """Three loops of index 1 only (K = 2: only a carry-over can go stale) with the stale
    spec (or, ``stale=False``, the shipped one); returns each loop's differences from vLLM's
    build, the plugin's counts and how many steps shadow mode checked."""
    from draftmeta.shadow import reset_sentinels, sentinel_for

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setenv("DRAFTMETA_SHADOW", shadow)
    reset_sentinels()
    plugin.unregister()
    plugin.register(spec_overrides={"CPU_MLA": _stale_max_seq_len} if stale else None)
    try:
        diffs = [diff for _, diff in _run_loops("CPU_MLA", 3, loops=3, steps=1)]
        return diffs, plugin.stats()["CPU_MLA"], sentinel_for("CPU_MLA").checks
    finally:
        plugin.unregister()
        reset_sentinels()


def test_shadow_mode_checks_carried_over_loops_and_switches_a_stale_spec_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    with caplog.at_level(logging.WARNING, logger="draftmeta.shadow"):
        diffs, counts, _ = _stale_loops(monkeypatch, "1")
    assert diffs == [[], [], []]  # the mismatch returned vLLM's build, then rebuilt
    assert counts == {"in_place": 0, "rebuilt": 1, "carried_over": 0}
    lines = [r.getMessage() for r in caplog.records if r.name == "draftmeta.shadow"]
    assert len(lines) == 1 and "builder CPU_MLA: field max_seq_len is stale" in lines[0]


def test_a_shadowed_carry_over_that_matches_vllms_build_counts_as_carried_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the shipped spec, shadow mode checks every carried-over loop, finds it equal to
    vLLM's build and keeps the carried-over metadata: counted as carried over, not rebuilt."""
    diffs, counts, checks = _stale_loops(monkeypatch, "1", stale=False)
    assert diffs == [[], [], []] and checks == 2
    assert counts == {"in_place": 0, "rebuilt": 0, "carried_over": 2}


def test_without_shadow_mode_a_stale_carried_over_field_goes_unnoticed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control of the test above: the spec really is stale across loops."""
    diffs, counts, _ = _stale_loops(monkeypatch, "0")
    assert diffs[0] == [] and all(any("max_seq_len" in d for d in diff) for diff in diffs[1:])
    assert counts == {"in_place": 0, "rebuilt": 0, "carried_over": 2}


def test_carry_over_is_off_unless_the_environment_turns_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CARRY_OVER_ENV)
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register()
    try:
        runs = list(_run_loops("CPU_MLA", 7, loops=3))
        assert plugin.stats()["CPU_MLA"]["carried_over"] == 0
    finally:
        plugin.unregister()
    assert runs[1][0][0] is not runs[0][0][0] and [d for _, d in runs] == [[], [], []]



@pytest.mark.parametrize("name", CARRIED)
@pytest.mark.parametrize("k", [2, 4])
def test_with_k_known_a_builder_that_carries_over_keeps_the_plugins_build_and_carries_over(
    name: str, k: int, active: None
) -> None:
    """Without carry-over a builder at K = 2 gets vLLM's build_for_drafting back, and one at
    K >= 3 builds and keeps on a short path at indices 0 and 1; with carry-over, which
    refreshes index 1 itself, it takes neither: its loops after the first reuse one object,
    equal to vLLM's fresh build at the loop's last index."""
    plugin.reset_stats()
    case = random_case(name, 3)
    patched, reference, original = _builders(name, case.max_model_len, case.block_size)
    harness.say_draft_tokens(patched, k)
    g = torch.Generator().manual_seed(3)
    buffers = random_state(g, batch_size=CAPACITY, block_size=case.block_size,
                           max_model_len=case.max_model_len, steps=k)
    loops = []
    for _ in range(3):
        state = _into(buffers, random_state(g, batch_size=4, block_size=case.block_size,
                                            max_model_len=case.max_model_len, steps=k))
        loops.append(_draft_loop(patched, state, k - 1, case.overflow))
        want = original(reference, harness.common_metadata_for(state.clone()), k - 1)
        assert compare_metadata(loops[-1][-1], want,
                                ignore=lambda p: p == "decode.schedule_metadata") == []
    assert "build_for_drafting" not in patched.__dict__
    assert all(m is loops[0][0] for steps in loops for m in steps)
    assert plugin.stats()[name] == {"in_place": 3 * (k - 2), "rebuilt": 0, "carried_over": 2}
