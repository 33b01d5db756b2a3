"""Which vLLM MLA / indexer builders draftmeta covers, which vLLM covers itself, and why.

For the installed vLLM, each builder of :data:`draftmeta.backends.mla.MLA_VARIANTS` and the
DeepSeek-V3.2 indexer is listed with:

* ``draftmeta``: draftmeta's spec updates it in place (the plugin installs it where vLLM has no
  hook of its own, and on request where it has);
* ``upstream``: vLLM 0.33 ships its own ``update_draft_decode_metadata`` for it;
* ``neither``: it is rebuilt every draft step, with the reason.
"""

from __future__ import annotations

import attrs

from draftmeta.backends.indexer import (
    INDEXER_BUILDER,
    KPOOL_TAIL_BUILDER,
    indexer_spec,
    kpool_tail_spec,
)
from draftmeta.backends.mla import MLA_VARIANTS, mla_spec

__all__ = ["Coverage", "coverage", "coverage_table"]


@attrs.frozen
class Coverage:
    """One builder's coverage.

    Attributes:
        name: draftmeta's name for the variant.
        builder: ``module:Class`` of the vLLM builder.
        upstream: what vLLM's own hook does (``none``, ``no-op``, ``refresh``).
        covered_by: ``draftmeta``, ``upstream`` or ``neither``.
        reason: why (an unsupported spec's reason, or what upstream does).
    """

    name: str
    builder: str
    upstream: str
    covered_by: str
    reason: str


def coverage() -> list[Coverage]:
    """The coverage of every MLA variant and the indexer for the installed vLLM."""
    rows = []
    for name, v in MLA_VARIANTS.items():
        spec = mla_spec(name)
        if spec.supported:
            covered, reason = "draftmeta", f"spec {spec.name}"
            if v.upstream != "none":
                covered = "upstream"
                reason = (f"vLLM's own hook ({v.upstream}); draftmeta's spec {spec.name} "
                          "installs only on request")
        elif v.upstream != "none":
            covered, reason = "upstream", f"vLLM's own hook ({v.upstream})"
        else:
            covered = "neither"
            reason = "; ".join(r for _, r in spec.unsupported_reasons)
        rows.append(Coverage(name, str(v.builder), v.upstream, covered, reason))
    spec = indexer_spec()
    rows.append(Coverage(
        "indexer", str(INDEXER_BUILDER), "refresh", "upstream",
        f"vLLM's own hook (refresh, DCP=1 only); draftmeta's spec {spec.name} adds DCP > 1 "
        "and installs on request",
    ))
    spec = kpool_tail_spec()
    rows.append(Coverage(
        "kpool_tail", str(KPOOL_TAIL_BUILDER), "refresh", "upstream",
        f"vLLM's own hook (refresh); draftmeta's spec {spec.name} serves the older proposer",
    ))
    return rows


def coverage_table() -> str:
    """:func:`coverage` as a plain-text table."""
    rows = coverage()
    lines = [f"{'variant':<22} {'covered by':<10} {'upstream':<8} reason"]
    for r in rows:
        lines.append(f"{r.name:<22} {r.covered_by:<10} {r.upstream:<8} {r.reason}")
    return "\n".join(lines)
