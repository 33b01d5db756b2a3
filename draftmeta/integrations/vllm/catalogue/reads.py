"""What a builder's decode-only build reads of vLLM's common metadata, declared per catalogue
entry (:class:`CarryOver`), and what one draft loop showed of it (:class:`Snapshot`): the
declarations the plugin's carry-over (:mod:`draftmeta.integrations.vllm.plugin.carry_over`)
checks before it carries a draft loop's index-1 metadata over to the next loop."""

from __future__ import annotations

from typing import Any

import attrs
import torch

__all__ = ["CarryOver", "Snapshot"]


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
