"""Testing helpers: compare updated metadata with rebuilt metadata, field by field.

Backend authors prove a spec with the invariant that matters most: after any number of draft
steps, the metadata updated in place equals the metadata rebuilt from scratch for the same state.
:func:`compare_metadata` walks two metadata objects (nested dataclasses and attrs classes
included) and reports every field that differs, by path; :func:`random_state` makes random
decode batches with the edge cases that matter (a batch of one, requests crossing a block
boundary, positions reaching ``max_model_len``, padded rows, mixed lengths).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
import torch

from draftmeta.fields import record_items
from draftmeta.state import DraftState

__all__ = ["Mismatch", "assert_same_metadata", "compare_metadata", "random_state"]


@attrs.frozen
class Mismatch:
    """One field that differs between two metadata objects.

    Attributes:
        path: the dotted field path.
        detail: how it differs.
    """

    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


def _compare_tensors(path: str, a: torch.Tensor, b: torch.Tensor) -> Iterator[Mismatch]:
    if a.dtype != b.dtype:
        yield Mismatch(path, f"dtype {a.dtype} != {b.dtype}")
    elif a.shape != b.shape:
        yield Mismatch(path, f"shape {tuple(a.shape)} != {tuple(b.shape)}")
    elif a.device != b.device:
        yield Mismatch(path, f"device {a.device} != {b.device}")
    elif not torch.equal(a, b):
        diff = (a != b).nonzero()
        where = tuple(int(i) for i in diff[0]) if diff.numel() else ()
        yield Mismatch(
            path,
            f"values differ at {diff.shape[0]} element(s), first at {where}: "
            f"{a[where].item()!r} != {b[where].item()!r}",
        )


def compare_metadata(
    updated: object,
    rebuilt: object,
    *,
    path: str = "",
    ignore: Callable[[str], bool] = lambda _: False,
    opaque: Callable[[object], bool] = lambda _: False,
) -> list[Mismatch]:
    """Every field where ``updated`` and ``rebuilt`` differ (empty when they are equal).

    Tensors compare by dtype, shape, device and value; nested dataclasses and attrs classes
    field by field; other objects with ``==``, except those ``opaque`` accepts, which only need
    the same type (a lazily filled scheduler object compares as "a fresh one of the same type").
    ``ignore`` skips paths.
    """
    out: list[Mismatch] = []
    _walk(updated, rebuilt, path, ignore, opaque, out)
    return out


def _walk(
    a: object,
    b: object,
    path: str,
    ignore: Callable[[str], bool],
    opaque: Callable[[object], bool],
    out: list[Mismatch],
) -> None:
    name = path or "<root>"
    if ignore(path):
        return
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            out.append(Mismatch(name, f"{type(a).__name__} != {type(b).__name__}"))
        else:
            out.extend(_compare_tensors(name, a, b))
        return
    if type(a) is not type(b):
        out.append(Mismatch(name, f"type {type(a).__name__} != {type(b).__name__}"))
        return
    if opaque(a):
        return
    items_a, items_b = record_items(a), record_items(b)
    if items_a is not None and items_b is not None:
        for (key, va), (_, vb) in zip(items_a, items_b):
            _walk(va, vb, f"{path}.{key}" if path else key, ignore, opaque, out)
        _walk_extra_attributes(a, b, {key for key, _ in items_a}, path, ignore, opaque, out)
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.append(Mismatch(name, f"length {len(a)} != {len(b)}"))
            return
        for i, (va, vb) in enumerate(zip(a, b)):
            _walk(va, vb, f"{path}[{i}]", ignore, opaque, out)
        return
    try:
        equal = bool(a == b)
    except Exception as exc:  # an object whose == is not a bool (numpy arrays, ...)
        try:
            import numpy as np

            equal = bool(np.array_equal(a, b))  # type: ignore[arg-type]
        except Exception:
            out.append(Mismatch(name, f"cannot compare: {exc}"))
            return
    if not equal:
        out.append(Mismatch(name, f"{a!r} != {b!r}"))


def _walk_extra_attributes(
    a: object,
    b: object,
    fields: set[str],
    path: str,
    ignore: Callable[[str], bool],
    opaque: Callable[[object], bool],
    out: list[Mismatch],
) -> None:
    """Compare attributes set on the instances outside their class's fields (vLLM's AMX builder
    attaches some after construction): one missing on either side is a mismatch too."""
    extra_a = {k: v for k, v in getattr(a, "__dict__", {}).items() if k not in fields}
    extra_b = {k: v for k, v in getattr(b, "__dict__", {}).items() if k not in fields}
    for key in sorted(extra_a.keys() | extra_b.keys()):
        sub = f"{path}.{key}" if path else key
        if key not in extra_a or key not in extra_b:
            side = "updated" if key in extra_a else "rebuilt"
            if not ignore(sub):
                out.append(Mismatch(sub, f"attribute set only on the {side} object"))
            continue
        _walk(extra_a[key], extra_b[key], sub, ignore, opaque, out)


def assert_same_metadata(updated: object, rebuilt: object, *, context: str = "") -> None:
    """Raise ``AssertionError`` listing every differing field path, with ``context`` (a seed)."""
    mismatches = compare_metadata(updated, rebuilt)
    if mismatches:
        lines = "\n  ".join(str(m) for m in mismatches)
        raise AssertionError(f"updated metadata differs from rebuilt {context}:\n  {lines}")


def random_state(
    generator: torch.Generator,
    *,
    batch_size: int,
    block_size: int,
    max_model_len: int,
    steps: int,
    num_padded: int = 0,
    device: torch.device | str = "cpu",
    near_limit: float = 0.2,
    near_boundary: float = 0.3,
) -> DraftState:
    """A random decode batch as a draft state, before its first in-place step.

    Context lengths are mixed: some requests end just before a block boundary (so drafting
    crosses it), some are within ``steps`` of ``max_model_len`` (so drafting reaches it), the rest
    are uniform. Block ids are a random permutation, so a wrong block lookup shows. ``num_padded``
    rows are appended as padding (slot -1, sequence length 0).
    """
    g = generator
    n = batch_size
    width = -(-max_model_len // block_size)
    seq = torch.randint(2, max_model_len + 1, (n,), generator=g)
    kind = torch.rand(n, generator=g)
    for i in range(n):
        if kind[i] < near_limit:
            seq[i] = max_model_len - int(torch.randint(0, steps + 1, (1,), generator=g))
        elif kind[i] < near_limit + near_boundary:
            blocks = max(1, int(seq[i]) // block_size)
            seq[i] = blocks * block_size - int(torch.randint(0, steps + 1, (1,), generator=g))
    seq = seq.clamp(2, max_model_len)
    rows = n + num_padded
    seq_lens = torch.zeros(rows, dtype=torch.int32)
    seq_lens[:n] = seq.to(torch.int32)
    positions = (seq_lens.to(torch.int64) - 1).clamp(min=0)
    perm = torch.randperm(rows * width, generator=g).to(torch.int32) + 1
    block_table = perm.view(rows, width)
    blk = block_table.gather(1, (positions // block_size).clamp(max=width - 1).view(-1, 1))
    slot = blk.view(-1).to(torch.int64) * block_size + positions % block_size
    slot[n:] = -1
    state = DraftState(
        positions=positions,
        seq_lens=seq_lens,
        slot_mapping=slot,
        block_table=block_table,
        query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
        num_reqs=n,
        max_seq_len=int(seq_lens.max()),
        max_model_len=max_model_len,
        block_size=block_size,
    )
    return state.to(device) if str(device) != "cpu" else state
