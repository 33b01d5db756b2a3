"""The release catalogues: one per supported vLLM release, each builder declared once."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from draftmeta.integrations.vllm.catalogue import release, releases, supported_range
from draftmeta.integrations.vllm.catalogue.model import Release


def test_the_supported_releases_are_0_32_to_0_34_oldest_first() -> None:
    assert [r.version for r in releases()] == ["0.32", "0.33", "0.34"]
    assert supported_range() == "0.32 to 0.34"


def test_the_vllm_extra_admits_exactly_the_catalogued_releases() -> None:
    tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11's tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    (requirement,) = pyproject["project"]["optional-dependencies"]["vllm"]
    low, high = re.fullmatch(r"vllm>=([\d.]+),<([\d.]+)", requirement).groups()  # type: ignore[union-attr]
    first, last = releases()[0].version, releases()[-1].version
    assert low == first
    assert high == f"0.{int(last.split('.')[1]) + 1}"


@pytest.mark.parametrize(("installed", "catalogue"), [
    ("0.32.0", "0.32"), ("0.33.0", "0.33"), ("0.33.2", "0.33"), ("0.34.0", "0.34"),
    ("0.34.1+cpu", "0.34"),
])
def test_an_installed_version_finds_its_release(installed: str, catalogue: str) -> None:
    assert release(installed).version == catalogue


def test_an_unsupported_version_is_refused_with_the_supported_list() -> None:
    with pytest.raises(LookupError, match=r"vLLM 0\.35\.0 is not a supported release .*0\.32, "
                                          r"0\.33, 0\.34"):
        release("0.35.0")
    with pytest.raises(LookupError):
        release("0.3")


def test_only_0_34_lacks_the_older_proposer() -> None:
    assert {r.version: r.paths for r in releases()} == {
        "0.32": ("older_proposer", "hook"),
        "0.33": ("older_proposer", "hook"),
        "0.34": ("hook",),
    }


def test_every_builder_has_one_name_and_its_builder_class_once() -> None:
    for r in releases():
        assert len(set(r.names)) == len(r.names)
        builders = [str(b.builder) for b in r.builders]
        assert len(set(builders)) == len(builders), r.version


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
