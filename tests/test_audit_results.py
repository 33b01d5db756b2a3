"""The committed audit and GPU-proof results say what the catalogue and the docs claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftmeta.integrations.vllm.catalogue import releases

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.parametrize("version", ["0.32", "0.33", "0.34"])
def test_the_committed_audit_found_every_cpu_hook_equal_and_caught_every_control(
    version: str,
) -> None:
    data = json.loads((RESULTS / f"audit-vllm-{version}.json").read_text())
    assert data["release"] == version and data["plugin"] is True and data["ok"] is True
    ran = {r["backend"]: r for r in data["rows"] if r["verdict"] != "not run"}
    assert set(ran) >= {"CPU_MLA", "AMX_MLA", "TRITON_MLA", "TRITON_MLA (DCP 2)", "INDEXER",
                        "KPOOL_TAIL", "TRITON_ATTN", "FLASH_ATTN"}
    assert all(r["verdict"] == "equal" and r["batches"] == 16 for r in ran.values())
    assert len(data["controls"]) == 4 and all(c["caught"] for c in data["controls"])


def test_every_gpu_proof_the_catalogue_names_is_a_committed_run_without_a_mismatch() -> None:
    named = [(r.version, e) for r in releases() for e in r.builders if e.proven_on_gpu]
    assert named  # 0.34's FLASH_ATTN_MLA and FLASHMLA
    for version, entry in named:
        assert entry.proven_on_gpu is not None
        rows = json.loads((ROOT / entry.proven_on_gpu).read_text())
        mine = [row for row in rows if row["builder"] == entry.name]
        assert mine, f"{version} {entry.name}: not in {entry.proven_on_gpu}"
        assert all(row["batches"] > 0 and row["mismatched"] == 0 for row in mine), mine
