"""Generate the golden texts (``python -m tests.golden.regenerate`` rewrites them).

Everything is generated on the CPU: ``explain`` of every name in
:data:`draftmeta.registry.SPECS` (kept in ``draftmeta/explained/``, shipped with the package),
and the fused kernel source of the shipped group pair (TRITON_MLA + INDEXER on the clamped
source advance) through
:func:`draftmeta.fused.fused_source`, which neither compiles nor launches it.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftmeta import explained

GOLDEN = Path(__file__).parent
EXPLAIN = explained.FOLDER
"""``explain`` texts: shipped with the package (``draftmeta explain`` prints them as they are)."""
FUSED = GOLDEN / "fused"
RELEASE = explained.RELEASE
"""The vLLM release the golden texts are generated against (its catalogue names the specs)."""

REGENERATE = "python -m tests.golden.regenerate  (or: pytest tests/test_golden.py --update-golden)"


def explain_texts(
    specs: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, str]:
    """``explain`` of every shipped spec (or of ``specs``), by golden file name."""
    from draftmeta.codegen import explain
    from draftmeta.registry import SPECS

    return {f"{name}.txt": explain(factory()) for name, factory in (specs or SPECS).items()}


def fused_groups() -> tuple[Any, list[Any]]:
    """A small CPU decode batch and ``(spec, metadata)`` of TRITON_MLA and INDEXER built for it
    by vLLM's own builders, with the shipped specs."""
    import torch

    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.integrations.vllm.testing.equivalence import BUILDERS
    from draftmeta.testing import random_state

    block, max_len = 16, 256
    state = random_state(torch.Generator().manual_seed(0), batch_size=4, block_size=block,
                         max_model_len=max_len, steps=4)
    config = harness.cached_vllm_config(max_model_len=max_len, block_size=block)
    groups = []
    for name in ("TRITON_MLA", "INDEXER"):
        width = -(-max_len // block) if name == "INDEXER" else None
        builder = harness.make_builder(name, config, block_size=block, block_table_width=width)
        cad = harness.common_metadata_for(state)
        metadata = harness.build_metadata(builder, cad, draft_index=1)
        groups.append((BUILDERS[name].make_spec(), metadata))
    return state, groups


def fused_texts() -> dict[str, str]:
    """The fused kernel source of the shipped groups, by golden file name."""
    from draftmeta.fused import fused_source

    state, groups = fused_groups()
    source = fused_source(state, groups, policy="clamp", host_bound="advance")
    return {"TRITON_MLA+INDEXER.clamp.advance.txt": source}


def differences(folder: Path, texts: dict[str, str]) -> list[str]:
    """Unified diffs (golden -> generated) of every text that differs from its golden file,
    and of golden files no longer generated; empty when all match."""
    out = []
    for name, text in sorted(texts.items()):
        path = folder / name
        old = path.read_text() if path.exists() else ""
        if old != text:
            out.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), text.splitlines(keepends=True),
                f"golden/{folder.name}/{name}", f"generated/{folder.name}/{name}",
            )) or f"golden/{folder.name}/{name}: differs\n")
    for path in sorted(folder.iterdir()):
        if path.name not in texts:
            out.append(f"golden/{folder.name}/{path.name}: no longer generated (delete it)\n")
    return out


def write(folder: Path, texts: dict[str, str]) -> list[str]:
    """Rewrite ``folder`` to hold exactly ``texts``; returns the names changed."""
    changed = changed_names(folder, texts)
    for path in folder.iterdir():
        if path.name not in texts:
            path.unlink()
    for name, text in texts.items():
        (folder / name).write_text(text)
    return changed


def changed_names(folder: Path, texts: dict[str, str]) -> list[str]:
    """Names in ``texts`` whose golden file is missing or differs, and stale golden files."""
    names = [n for n, t in texts.items()
             if not (folder / n).exists() or (folder / n).read_text() != t]
    return names + [p.name for p in folder.iterdir() if p.name not in texts]


def installed_release_matches() -> bool:
    """Whether the installed vLLM is the release the golden texts describe."""
    from draftmeta.integrations.vllm.catalogue import current_release

    return current_release().version == RELEASE


def main() -> int:
    """Rewrite every golden file; prints what changed."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ["DRAFTMETA_VLLM_PLUGIN"] = "0"
    from draftmeta.integrations.vllm.catalogue.classes import ensure_platform_environment

    ensure_platform_environment()
    if not installed_release_matches():
        print(f"the golden texts describe vLLM {RELEASE}; install it to regenerate them",
              file=sys.stderr)
        return 2
    changed = write(EXPLAIN, explain_texts()) + write(FUSED, fused_texts())
    print("\n".join(f"rewrote {n}" for n in changed) or "golden texts unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
