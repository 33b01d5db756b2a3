"""vLLM 0.34: the new runner's hook is the only draft path.

Read from the released wheel: the V1 runner and its proposer (``vllm/v1/spec_decode/``) and
``build_for_drafting`` are gone; ``update_draft_decode_metadata`` keeps its signature and
contract (capture-safe work only) and the same builders have it. Every sparse-MLA metadata
class gained ``shardq`` (Ulysses prefill sharding; ``None`` in a decode-only batch) and
``topk_start`` (``0`` there): both host constants while drafting, required to hold those values.
"""

from __future__ import annotations

import attrs

from draftmeta.conditions import Equals, IsNone
from draftmeta.integrations.vllm.catalogue import v0_33
from draftmeta.integrations.vllm.catalogue.model import (
    BuilderEntry,
    Install,
    Measured,
    RecordedRun,
    Release,
)
from draftmeta.integrations.vllm.specs.mla import MLASpec
from draftmeta.rules import HostConstant, Unchanged

__all__ = ["RELEASE"]

_SHARDQ_RULES = (("shardq", Unchanged()), ("topk_start", HostConstant()))
_SHARDQ_CONDITIONS = (
    IsNone("shardq", name="no_shardq_prefill_split"),
    Equals("topk_start", 0, name="topk_from_start"),
)


def _with_shardq(entry: BuilderEntry) -> BuilderEntry:
    spec = entry.spec
    if not isinstance(spec, MLASpec):
        raise TypeError(f"{entry.name}: expected an MLA spec factory, got {spec!r}")
    return attrs.evolve(entry, spec=attrs.evolve(
        spec,
        extra_rules=spec.extra_rules + _SHARDQ_RULES,
        extra_preconditions=spec.extra_preconditions + _SHARDQ_CONDITIONS,
    ))


_SPARSE = ("FLASHMLA_SPARSE", "FLASH_ATTN_MLA_SPARSE", "FLASHINFER_MLA_SPARSE",
           "FLASHINFER_MLA_SPARSE_SM120")

HOOK_EQUIVALENCE_RUNS = (
    RecordedRun(result="benchmarks/results/hook-equivalence.json",
                command="python3 benchmarks/h200/hook_equivalence.py --batches 24",
                commit="ee454d2", device="NVIDIA H200", vllm="0.34.0", on_gpu=True,
                log="benchmarks/results/h200-hook-equivalence.log"),
    RecordedRun(result="benchmarks/results/hook-equivalence-h100-41410c2.json",
                command="python3 benchmarks/h200/hook_equivalence.py --batches 30",
                commit="41410c2", device="NVIDIA H100 80GB HBM3", vllm="0.34.0", on_gpu=True,
                log="benchmarks/results/h100-hook-equivalence-41410c2.log"),
)
"""The committed GPU runs of ``benchmarks/h200/hook_equivalence.py`` against vLLM 0.34: the hooks
of ``FLASH_ATTN_MLA`` and ``FLASHMLA`` equal to vLLM's real builders' rebuild, captured and
replayed too (``tests/test_audit_results.py`` reads each run's result and log)."""


def _measured_on_h100(name: str, batch1: str, batch8: str) -> BuilderEntry:
    """``name``'s entry with what its hook measured in vLLM 0.34's GPU engine on an H100
    (``benchmarks/results/e2e-cuda-tiny-limit-h100.json``: tiny MTP model, K = 3, plugin on
    over off, the median of two engine pairs), proven by :data:`HOOK_EQUIVALENCE_RUNS`."""
    return attrs.evolve(v0_33.RELEASE.entry(name), measured=(Measured("hook", slower=False, figure=(
        f"vLLM takes its captured draft loop: {batch1} tok/s at batch 1, {batch8} at batch "
        "8 (the median of two engine pairs, their range in brackets), tiny MTP model, K = 3, "
        "one H100, draftmeta e2e --device cuda (e2e-cuda-tiny-limit-h100.json)")),),
        proven_by=HOOK_EQUIVALENCE_RUNS)


RELEASE: Release = v0_33.RELEASE.evolve(
    version="0.34",
    paths=("hook",),
    install=Install(
        requirements_of="0.33.0",
        about=(
            "Where your package index serves vLLM 0.34.0 and its pins, install vLLM as its own "
            "documentation says (`pip install vllm==0.34.0`) and add draftmeta [as for the vLLM "
            "you already run](#into-the-vllm-you-already-run). vLLM 0.34.0 pins a FlashInfer "
            "release (`flashinfer-python==0.7.3`) that some registries, this project's among "
            "them, do not serve; the commands below are this project's CI workaround for that, "
            "not vLLM's install: 0.33's requirements first, then 0.34 without its dependencies, "
            "which leaves FlashInfer one release behind what vLLM 0.34 pins (nothing draftmeta "
            "or its tests run imports the newer FlashInfer)."
        ),
    ),
    replace={
        **{name: _with_shardq(v0_33.RELEASE.entry(name)) for name in _SPARSE},
        "FLASH_ATTN_MLA": _measured_on_h100("FLASH_ATTN_MLA", "1.28x (1.25-1.30)",
                                            "1.26x (1.25-1.27)"),
        "FLASHMLA": _measured_on_h100("FLASHMLA", "1.23x (1.22-1.24)", "1.19x (1.19-1.20)"),
    },
)
"""vLLM 0.34's builders."""
