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
from draftmeta.integrations.vllm.catalogue.model import BuilderEntry, Measured, Release
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

H200_EQUIVALENCE = "benchmarks/results/hook-equivalence.json"
"""The committed H200 run of ``benchmarks/h200/hook_equivalence.py`` (vLLM 0.34): the hooks of
``FLASH_ATTN_MLA`` and ``FLASHMLA`` equal to vLLM's real builders' rebuild, captured and
replayed too."""


def _measured_on_h200(name: str, batch1: str, batch8: str) -> BuilderEntry:
    """``name``'s entry with what its hook measured in vLLM 0.34's GPU engine on an H200
    (``benchmarks/results/e2e-cuda.json``: tiny MTP model, K = 3, plugin on over off), proven
    there by :data:`H200_EQUIVALENCE`."""
    return attrs.evolve(v0_33.RELEASE.entry(name), measured=(Measured("hook", slower=False, figure=(
        f"vLLM takes its captured draft loop: {batch1} tok/s at batch 1, {batch8} at batch "
        "8, tiny MTP model, K = 3, one H200, draftmeta e2e --device cuda")),),
        proven_on_gpu=H200_EQUIVALENCE)


RELEASE: Release = v0_33.RELEASE.evolve(
    version="0.34",
    paths=("hook",),
    notes=("pip install -e '.[vllm]' vllm==0.33.0, then pip install --no-deps vllm==0.34.0 "
           "(0.34 pins a FlashInfer release some registries lack; draftmeta never imports it)"),
    replace={
        **{name: _with_shardq(v0_33.RELEASE.entry(name)) for name in _SPARSE},
        "FLASH_ATTN_MLA": _measured_on_h200("FLASH_ATTN_MLA", "1.42x", "1.27x"),
        "FLASHMLA": _measured_on_h200("FLASHMLA", "1.15x", "1.24x"),
    },
)
"""vLLM 0.34's builders."""
