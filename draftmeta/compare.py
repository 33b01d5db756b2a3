"""Field-by-field comparison of updated metadata with rebuilt metadata.

Part of the run-time core: shadow mode (:mod:`draftmeta.shadow`) compares with it in production,
and the test support (:mod:`draftmeta.testing`, which re-exports its names) in the suite and
``draftmeta verify``.

:func:`compare_metadata` walks two metadata objects (nested dataclasses and attrs classes
included) and reports every field that differs, by path, with the first differing index and
both values. A fixed-capacity buffer whose tail is unspecified (FlashInfer's ``kv_indices``,
valid only up to ``kv_indptr[-1]``) is compared over its valid prefix only (``valid_prefix=``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import attrs
import torch

from draftmeta.fields import record_items

__all__ = ["Mismatch", "assert_same_metadata", "compare_metadata"]


@attrs.frozen
class Mismatch:
    """One field that differs between two metadata objects.

    Attributes:
        path: the dotted field path.
        detail: how it differs.
        index: the first differing element of a tensor field (``None`` for a field that differs
            as a whole: a host value, a dtype, a shape).
        expected: the rebuilt value (at ``index`` for a tensor; the dtype or shape when those
            differ).
        got: the updated value, in the same terms.
    """

    path: str
    detail: str
    index: tuple[int, ...] | None = None
    expected: object = None
    got: object = None

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


def _compare_tensors(
    path: str, a: torch.Tensor, b: torch.Tensor, prefix: int | None = None
) -> Iterator[Mismatch]:
    if a.dtype != b.dtype:
        yield Mismatch(path, f"dtype {a.dtype} != {b.dtype}", None, b.dtype, a.dtype)
    elif prefix is None and a.shape != b.shape:
        yield Mismatch(
            path, f"shape {tuple(a.shape)} != {tuple(b.shape)}", None, tuple(b.shape),
            tuple(a.shape),
        )
    elif a.device != b.device:
        yield Mismatch(path, f"device {a.device} != {b.device}", None, b.device, a.device)
    elif prefix is not None:
        yield from _compare_prefix(path, a, b, prefix)
    elif not torch.equal(a, b):
        yield _first_difference(path, a, b, "")


def _first_difference(path: str, a: torch.Tensor, b: torch.Tensor, where: str) -> Mismatch:
    diff = (a != b).nonzero()
    index = tuple(int(i) for i in diff[0]) if diff.numel() else ()
    got, expected = a[index].item(), b[index].item()
    return Mismatch(
        path,
        f"values differ{where} at {diff.shape[0]} element(s), first at {index}: "
        f"{got!r} != {expected!r}",
        index,
        expected,
        got,
    )


def _compare_prefix(path: str, a: torch.Tensor, b: torch.Tensor, n: int) -> Iterator[Mismatch]:
    """Compare the leading ``n`` elements (along dim 0) of two fixed-capacity buffers."""
    if a.dim() == 0 or b.dim() == 0 or a.shape[1:] != b.shape[1:]:
        yield Mismatch(
            path,
            f"shape {tuple(a.shape)} != {tuple(b.shape)} (a valid prefix compares leading rows, "
            "so every dimension after the first must match)",
            None, tuple(b.shape), tuple(a.shape),
        )
    elif n < 0:
        yield Mismatch(path, f"the valid prefix is {n} elements long; it must be >= 0", None,
                       n, None)
    elif a.shape[0] < n:
        yield Mismatch(
            path,
            f"the updated buffer holds {a.shape[0]} element(s) along dim 0, fewer than the "
            f"{n} that are valid in the rebuilt one: allocate it at its full capacity",
            None, n, a.shape[0],
        )
    elif b.shape[0] < n:
        yield Mismatch(
            path,
            f"the rebuilt buffer holds {b.shape[0]} element(s) along dim 0, fewer than its "
            f"declared valid prefix of {n}: check the ValidPrefix declaration of this field",
            None, n, b.shape[0],
        )
    elif not torch.equal(a[:n], b[:n]):
        yield _first_difference(path, a[:n], b[:n], f" in the valid prefix [:{n}]")


def compare_metadata(
    updated: object,
    rebuilt: object,
    *,
    path: str = "",
    ignore: Callable[[str], bool] = lambda _: False,
    opaque: Callable[[object], bool] = lambda _: False,
    valid_prefix: Mapping[str, int] | None = None,
) -> list[Mismatch]:
    """Every field where ``updated`` and ``rebuilt`` differ (empty when they are equal).

    Tensors compare by dtype, shape, device and value; nested dataclasses and attrs classes
    field by field; other objects with ``==``, except those ``opaque`` accepts, which only need
    the same type (a lazily filled scheduler object compares as "a fresh one of the same type").
    ``ignore`` skips paths.

    ``valid_prefix`` maps a tensor field's path to the number of its leading elements (along the
    first dimension) that are meaningful: only those are compared, the rest of the buffer may
    hold anything and the two buffers may differ in capacity (both must hold the prefix).
    :class:`~draftmeta.testing.ValidPrefix` (test support) declares such lengths by reference
    (``kv_indptr[-1]``, ``num_reqs``) for :func:`~draftmeta.testing.check_spec`.

    Example:
        >>> import torch
        >>> compare_metadata(torch.tensor([1, 2, 7]), torch.tensor([1, 2, 9]), path="kv_indices",
        ...                  valid_prefix={"kv_indices": 2})
        []
    """
    out: list[Mismatch] = []
    _Walker(ignore, opaque, dict(valid_prefix or {}), out).walk(updated, rebuilt, path)
    return out


@attrs.define
class _Walker:
    ignore: Callable[[str], bool]
    opaque: Callable[[object], bool]
    prefixes: dict[str, int]
    out: list[Mismatch]

    def walk(self, a: object, b: object, path: str) -> None:
        name = path or "<root>"
        if self.ignore(path):
            return
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                self.out.append(Mismatch(name, f"{type(a).__name__} != {type(b).__name__}",
                                         None, type(b).__name__, type(a).__name__))
            else:
                self.out.extend(_compare_tensors(name, a, b, self.prefixes.get(path)))
            return
        if type(a) is not type(b):
            self.out.append(Mismatch(name, f"type {type(a).__name__} != {type(b).__name__}",
                                     None, type(b).__name__, type(a).__name__))
            return
        if self.opaque(a):
            return
        items_a, items_b = record_items(a), record_items(b)
        if items_a is not None and items_b is not None:
            for (key, va), (_, vb) in zip(items_a, items_b):
                self.walk(va, vb, f"{path}.{key}" if path else key)
            self._extra_attributes(a, b, {key for key, _ in items_a}, path)
            return
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                self.out.append(Mismatch(name, f"length {len(a)} != {len(b)}", None, len(b),
                                         len(a)))
                return
            for i, (va, vb) in enumerate(zip(a, b)):
                self.walk(va, vb, f"{path}[{i}]")
            return
        try:
            equal = bool(a == b)
        except Exception as exc:  # an object whose == is not a bool (numpy arrays, ...)
            try:
                import numpy as np

                equal = bool(np.array_equal(a, b))  # type: ignore[arg-type]
            except Exception:
                self.out.append(Mismatch(name, f"cannot compare: {exc}"))
                return
        if not equal:
            self.out.append(Mismatch(name, f"{a!r} != {b!r}", None, b, a))

    def _extra_attributes(self, a: object, b: object, fields: set[str], path: str) -> None:
        """Compare attributes set on the instances outside their class's fields (vLLM's AMX
        builder attaches some after construction): one missing on either side is a mismatch."""
        extra_a = {k: v for k, v in getattr(a, "__dict__", {}).items() if k not in fields}
        extra_b = {k: v for k, v in getattr(b, "__dict__", {}).items() if k not in fields}
        for key in sorted(extra_a.keys() | extra_b.keys()):
            sub = f"{path}.{key}" if path else key
            if key not in extra_a or key not in extra_b:
                side = "updated" if key in extra_a else "rebuilt"
                if not self.ignore(sub):
                    self.out.append(Mismatch(sub, f"attribute set only on the {side} object"))
                continue
            self.walk(extra_a[key], extra_b[key], sub)


def assert_same_metadata(updated: object, rebuilt: object, *, context: str = "") -> None:
    """Raise ``AssertionError`` listing every differing field path, with ``context`` (a seed)."""
    mismatches = compare_metadata(updated, rebuilt)
    if mismatches:
        lines = "\n  ".join(str(m) for m in mismatches)
        raise AssertionError(f"updated metadata differs from rebuilt {context}:\n  {lines}")
