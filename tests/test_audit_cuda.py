"""``draftmeta audit`` on a GPU: every hook whose builder constructs there, its kernel schedules,
FlashMLA's decode, capture and replay, and the stale-schedule controls (skipped without CUDA).

Each test runs the command in a fresh process: vLLM keeps one platform per process, and the
rest of the suite puts this one's on the CPU. Run alone on a GPU machine with vLLM installed:
``pytest tests/test_audit_cuda.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("vllm", reason="needs vLLM (pip install -e '.[vllm]')")

ROOT = Path(__file__).resolve().parent.parent
GPU_HOOKS = ("FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")
IN_A_ONE_RANK_WORLD = ("TRITON_MLA (DCP 2)", "FLASHMLA (DCP 2)", "FLASHMLA (FP8, DCP 2)",
                      "FLASH_ATTN_MLA (DCP 2)", "FLASH_ATTN_MLA_SPARSE", "FLASHINFER_MLA_SPARSE",
                      "FLASH_ATTN_MLA_SPARSE_FA4")
"""Rows that did not construct on an H100 with vLLM 0.34 for want of vLLM's distributed state
(a stand-in DCP group without ``cpu_group``; no tensor-parallel group for sparse MLA)."""


def _audit(*args: str) -> tuple[dict[str, Any], int]:
    """The audit's JSON and exit code, from a fresh process on CUDA (draftmeta's GPU hooks
    installed even where no committed GPU run proved them for this vLLM)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DRAFTMETA_VLLM_UNPROVEN": "1"}
    done = subprocess.run([sys.executable, "-m", "draftmeta", "audit", "--device", "cuda",
                           "--json", "--quiet", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    data: dict[str, Any] = json.loads(done.stdout)
    return data, done.returncode


def test_the_hopper_mla_hooks_are_audited_on_the_gpu_captured_replayed_and_placed() -> None:
    data, code = _audit(*GPU_HOOKS, "--batches", "4", "--negative-control")
    assert data["device"].startswith("cuda: ") and data["device"] != "cuda: "
    rows = {r["backend"]: r for r in data["rows"]}
    assert {"FLASH_ATTN_MLA", "FLASHMLA", "FLASHMLA (FP8)", "TRITON_MLA", "FLASHMLA (DCP 2)",
            "FLASH_ATTN_MLA (DCP 2)"} <= rows.keys()
    for row in rows.values():
        assert row["device"] == "cuda" and row["verdict"] == "equal", row
        assert row["replayed"] == row["batches"] == 4 and row["crossing_batches"] == 1, row
        assert (row["idempotent"], row["first_step"]) == ("yes", "equal"), row
    assert rows["FLASHMLA (FP8)"]["kv_cache_dtype"] == "fp8"
    gpu = [c for c in data["controls"] if c["backend"] in ("FLASH_ATTN_MLA", "FLASHMLA")
           and "stale" in c["control"]]
    assert len(gpu) == 3 and all(c["caught"] and c["informative"] >= 1 for c in gpu), gpu
    assert code == 0 and data["ok"] is True


def test_every_hook_that_constructs_on_the_gpu_is_audited_and_the_others_say_why() -> None:
    data, _ = _audit("--batches", "2")
    assert data["rows"]
    rows = {r["backend"]: r for r in data["rows"]}
    stuck = {n: rows[n]["note"] for n in IN_A_ONE_RANK_WORLD
             if n in rows and rows[n]["note"].startswith("does not construct here")}
    assert not stuck, stuck
    for row in data["rows"]:
        if row["verdict"] == "not run":
            assert row["note"].startswith(("does not construct here (", "does not import here (",
                                           "vLLM's registry does not load it here")), row
        assert "owed" not in row["note"] and "--device cuda" not in row["note"], row
