"""A decode-only batch described to vLLM and its metadata built with vLLM's own code: the one
adapter's common metadata (:mod:`draftmeta.integrations.vllm.plugin.common_metadata`) after
:func:`~draftmeta.integrations.vllm.testing.harness.environment.prepare_environment`, and a
builder's ``build()``, ``build_for_drafting()`` or capture build."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from draftmeta.integrations.vllm.plugin import common_metadata
from draftmeta.integrations.vllm.testing.harness.environment import prepare_environment

if TYPE_CHECKING:
    from vllm.v1.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata

__all__ = ["build_for_capture", "build_metadata", "common_metadata_for", "make_common_metadata"]


_F = TypeVar("_F", bound=Callable[..., Any])


def _after_prepare_environment(fn: _F) -> _F:
    """``fn`` (which imports vLLM on first use) run after :func:`prepare_environment`."""

    @functools.wraps(fn)
    def prepared(*args: Any, **kwargs: Any) -> Any:
        prepare_environment()
        return fn(*args, **kwargs)

    return cast("_F", prepared)


make_common_metadata = _after_prepare_environment(common_metadata.make_common_metadata)
"""Describe a decode-only batch to vLLM: the one adapter's
:func:`~draftmeta.integrations.vllm.plugin.common_metadata.make_common_metadata`, after
:func:`prepare_environment`."""

common_metadata_for = _after_prepare_environment(common_metadata.common_metadata_of)
"""vLLM's common metadata over a draft state's buffers (aliased): the one adapter's
:func:`~draftmeta.integrations.vllm.plugin.common_metadata.common_metadata_of`, after
:func:`prepare_environment`."""


def build_for_capture(builder: AttentionMetadataBuilder[Any], cad: CommonAttentionMetadata
                      ) -> Any:
    """Build metadata for ``cad`` as vLLM's runner does before it captures a full CUDA graph
    (``build_for_cudagraph_capture``: a builder may set up what a captured kernel reads, or
    fill the lengths with dummies); ``build()`` where the release has no such method."""
    capture = getattr(builder, "build_for_cudagraph_capture", None)
    if capture is None:
        return builder.build(common_prefix_len=0, common_attn_metadata=cad)
    return capture(cad)


def build_metadata(
    builder: AttentionMetadataBuilder[Any],
    cad: CommonAttentionMetadata,
    *,
    draft_index: int | None = None,
) -> Any:
    """Build attention metadata for ``cad`` with vLLM's own code.

    Calls ``builder.build(common_prefix_len=0, common_attn_metadata=cad)``, or, when
    ``draft_index`` is given, ``builder.build_for_drafting(cad, draft_index)`` (what vLLM's V1
    proposer calls on every draft step; the base implementation is ``build(...,
    fast_build=True)``). No vLLM config needs to be current.
    """
    if draft_index is None:
        return builder.build(common_prefix_len=0, common_attn_metadata=cad)
    build_for_drafting = getattr(builder, "build_for_drafting", None)
    if build_for_drafting is None:  # vLLM 0.34 removed it with the older proposer
        return builder.build(common_prefix_len=0, common_attn_metadata=cad, fast_build=True)
    return build_for_drafting(cad, draft_index)
