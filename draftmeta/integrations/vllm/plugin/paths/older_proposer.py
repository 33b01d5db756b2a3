"""The older proposer path (vLLM 0.32 and 0.33): ``build_for_drafting`` at every draft index.

vLLM's V1 proposer rebuilds every attention group's metadata at every draft index. The plan
decides per builder (draftmeta's in-place update where the spec is supported, or a rebuild:
vLLM has no update of its own on this path); on a builder class draftmeta covers, the plugin
installs the ``build_for_drafting`` of
:mod:`~draftmeta.integrations.vllm.plugin.older_proposer`, which keeps the metadata built at
index 1 and updates it in place at the later indices of the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from draftmeta.integrations.vllm.catalogue import BuilderEntry
from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory
from draftmeta.integrations.vllm.plugin import older_proposer
from draftmeta.integrations.vllm.plugin.plan import (
    CoveredBy,
    Decision,
    DraftPathKind,
    _older_proposer,
)
from draftmeta.step_policy import StepRecord

__all__ = ["PATH"]


def _install(decision: Decision, overrides: Mapping[str, BuilderSpecFactory] | None,
             counters: StepRecord) -> dict[str, Callable[..., Any]]:
    """``build_for_drafting``: vLLM's build at draft index 1, the in-place update after it,
    counted in the builder's counters (the plugin's
    :class:`~draftmeta.integrations.vllm.plugin.older_proposer.BuilderStats`)."""
    assert isinstance(counters, older_proposer.BuilderStats)
    return {"build_for_drafting": older_proposer.replacement_build_for_drafting(
        decision, overrides, counters)}


def _without_plugin(entry: BuilderEntry) -> CoveredBy:
    """Rebuilt at every draft index: vLLM has no update of its own on this path."""
    return "none"


PATH = DraftPathKind(
    name="older_proposer",
    words="older proposer",
    needs=("build_for_drafting",),
    decide=_older_proposer,
    install=_install,
    without_plugin=_without_plugin,
    engines=(
        "the older_proposer rows covered by draftmeta apply to engines that draft K >= 3 tokens "
        "per step (num_speculative_tokens); at K <= 2 no draft step follows index 1, so each "
        "builder keeps vLLM's build_for_drafting (unless DRAFTMETA_CARRY_OVER=1, which "
        "refreshes index 1)"
    ),
)
"""The older proposer path: the plugin decides per builder instance, at its first draft loop,
from its engine's K (which the class-level plan cannot see), whether the in-place update
serves it."""
