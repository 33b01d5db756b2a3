"""The hook path (vLLM's new model runner, 0.33 on): ``update_draft_decode_metadata``.

vLLM calls a builder's ``update_draft_decode_metadata`` between draft steps, inside its captured
draft loop, where every group's builder sets ``supports_draft_decode_metadata_update``. The plan
decides per builder (vLLM's own hook, draftmeta's generated one where the spec is supported and
capture-safe, or none); on a builder class draftmeta covers, the plugin installs the two
replacements of :mod:`~draftmeta.integrations.vllm.plugin.hook`: an ``__init__`` that binds the
spec to each new builder, and the generated refresh as ``update_draft_decode_metadata``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from draftmeta.integrations.vllm.catalogue import BuilderEntry
from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory
from draftmeta.integrations.vllm.plugin import hook
from draftmeta.integrations.vllm.plugin.plan import (
    CoveredBy,
    Decision,
    DraftPathKind,
    _hook,
)
from draftmeta.step_policy import StepRecord

__all__ = ["PATH"]


def _install(decision: Decision, overrides: Mapping[str, BuilderSpecFactory] | None,
             counters: StepRecord) -> dict[str, Callable[..., Any]]:
    """``__init__`` (the spec bound to each new builder) and ``update_draft_decode_metadata``
    (the bound spec's refresh); the hook path counts nothing."""
    return {"__init__": hook.replacement_init(decision, overrides),
            "update_draft_decode_metadata": hook.replacement_update(decision)}


def _without_plugin(entry: BuilderEntry) -> CoveredBy:
    """vLLM's own hook where the builder has one, else a rebuild at every draft step."""
    return "vllm" if entry.hook != "none" else "none"


PATH = DraftPathKind(
    name="hook",
    words="hook",
    needs=("update_draft_decode_metadata", "supports_draft_decode_metadata_update"),
    decide=_hook,
    install=_install,
    without_plugin=_without_plugin,
    engines=(
        "hook rows covered by draftmeta apply to engines that capture full CUDA graphs (vLLM's "
        "default on a GPU); in an engine without them (enforce_eager=True, cudagraph_mode NONE "
        "or PIECEWISE) every builder keeps vLLM's behaviour (docs/e2e-cuda.md: engines without "
        "CUDA graphs)"
    ),
    captured=True,
    audited=True,
)
"""The hook path: the plugin decides per builder instance, from its engine's
``cudagraph_mode`` (which the class-level plan cannot see), whether the hook serves it
(:func:`~draftmeta.integrations.vllm.plugin.hook.without_full_cudagraphs`)."""
