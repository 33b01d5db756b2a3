"""Walk a metadata record tree: the ``(path, value)`` leaves of nested dataclass/attrs records.

A metadata object is a record (a dataclass or attrs instance) whose fields may be records in
turn. These walkers yield the leaves a caller asks for, by dotted path under a prefix (the
group's name), and descend into every field that is itself a record. Used by the capture-safety
checks (:mod:`draftmeta.loop_capture`) to snapshot tensor addresses and host values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from draftmeta.fields import record_items

__all__ = ["host_leaves", "leaves", "tensor_leaves"]


def leaves(obj: object, prefix: str, keep: Callable[[object], bool]
           ) -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of every field of a record tree that ``keep`` accepts.

    A field ``keep`` accepts is yielded and not descended into; a field it rejects is descended
    into when it is a record, and skipped otherwise.
    """
    for name, value in record_items(obj) or ():
        path = f"{prefix}.{name}"
        if keep(value):
            yield path, value
        elif record_items(value):
            yield from leaves(value, path, keep)


def tensor_leaves(obj: object, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` of every tensor field of a record tree."""
    return leaves(obj, prefix, lambda v: isinstance(v, torch.Tensor))


def host_leaves(obj: object, prefix: str) -> Iterator[tuple[str, object]]:
    """``(path, value)`` of every host scalar (``int``, ``float``, ``bool``) of a record tree."""
    return leaves(obj, prefix, lambda v: isinstance(v, (int, float, bool)))
