"""Memory-layout checks for in-place writes: run before the first write, cached per tensor set.

An in-place update is only safe when every tensor it writes owns the memory it writes: no
element of a written tensor may alias another element of it (an ``expand``-ed tensor), alias a
tensor the same formula reads (a destination overlapping its source), alias another tensor the
update writes, or alias a buffer of the draft state (the update would corrupt the state every
group reads). The loop's own advance writes the state's positions, sequence lengths, slot
mapping and DCP-local lengths, so a field declared :class:`~draftmeta.rules.Unchanged` that
shares memory with one of them is not unchanged at all.

:class:`LayoutGuard` checks all of this in the generated update's structure phase. The checks
are exact for overlapping byte ranges (whichever storage objects hold them: two storages over
one memory are caught too) and conservative for interleaved strided views (two views whose
ranges interleave without sharing an element are refused too). A set of tensor objects that
passed is remembered (the guard holds strong references to them), so in the steady state a check
costs one ``id`` per tensor and a list comparison; new tensor objects (new views of the same
buffers, or new tensors, as vLLM makes every draft loop) are verified afresh, which reads the
address, size and contiguity of each (a memo of their layout read more of each tensor than the
verdict does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from draftmeta.derivations import InPlaceFunction

__all__ = ["LayoutGuard", "Written", "has_internal_overlap", "overlaps"]

STATE_BUFFERS = (
    "positions",
    "seq_lens",
    "slot_mapping",
    "block_table",
    "query_start_loc",
    "dcp_local_seq_lens",
)
"""The draft state's tensors, in the order the generated code passes them to a guard."""

ADVANCED = frozenset({"positions", "seq_lens", "slot_mapping", "dcp_local_seq_lens"})
"""State buffers the loop's shared advance writes every step."""


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (an expanded or otherwise self-overlapping
    view; conservative for exotic strides)."""
    reach = 0
    for size, stride in sorted(
        ((s, st) for s, st in zip(t.shape, t.stride()) if s > 1), key=lambda p: p[1]
    ):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


Span = tuple[int, int] | None
"""``(first byte, end byte)`` of a tensor's elements in memory, ``None`` if it has none."""


def _span(t: torch.Tensor) -> Span:
    """Where ``t``'s elements lie: a contiguous tensor (the common case) costs three calls."""
    nbytes = t.nbytes
    if nbytes == 0:
        return None
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + nbytes
    reach = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    return start, start + reach * t.element_size()


def _share(a: torch.Tensor, sa: Span, b: torch.Tensor, sb: Span) -> bool:
    """Whether two tensors' byte ranges intersect in one device's memory (the devices are
    read only where the addresses meet; a meta tensor has no memory)."""
    if sa is None or sb is None or not (sa[0] < sb[1] and sb[0] < sa[1]):
        return False
    return a.device == b.device and a.device.type != "meta"


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges of ``a`` and ``b`` in memory intersect."""
    return _share(a, _span(a), b, _span(b))


@attrs.frozen
class Written:
    """One tensor an update writes (or declares unchanged), as the guard sees it.

    Attributes:
        path: the field path, for messages.
        inputs: how many arguments after the field's own are its formula's inputs.
        fn: the formula (to ask whether the write is a no-op copy onto itself), if any.
        unchanged: the field is declared unchanged (only its overlap with buffers the
            shared advance writes is checked).
    """

    path: str
    inputs: int = 0
    fn: InPlaceFunction | None = None
    unchanged: bool = False


class LayoutGuard:
    """Checks the memory layout of one spec's written tensors before the first write.

    The generated code calls ``check(state, *args)`` where ``args`` are, for every
    :class:`Written` entry in order, the field's tensor followed by its formula's inputs.

    Args:
        entries: the written (and unchanged) tensor fields, in the order of the arguments.
        owns_state: the spec updates the draft state itself (the loop's advance), so its
            fields are compared with each other, not with the state.
    """

    __slots__ = ("_entries", "_held", "_ids", "_owns_state")

    def __init__(self, entries: Sequence[Written], *, owns_state: bool = False) -> None:
        self._entries = tuple(entries)
        self._owns_state = owns_state
        self._ids: list[int] = []
        self._held: tuple[object, ...] = ()

    @property
    def entries(self) -> tuple[Written, ...]:
        """The written (and unchanged) tensor fields it checks, in the order of the arguments."""
        return self._entries

    def check(self, state: object, *args: object) -> tuple[str, str] | None:
        """``None`` if every write is safe, else ``(path, problem)``. Writes nothing."""
        for a in args:
            if a is not None:
                break
        else:  # no tensor written or declared unchanged here (a loop, not all(): no generator)
            return None
        if self._owns_state:
            buffers: tuple[object, ...] = ()
        else:
            s: Any = state  # the six buffers, in STATE_BUFFERS order, without a generator
            buffers = (s.positions, s.seq_lens, s.slot_mapping, s.block_table, s.query_start_loc,
                       s.dcp_local_seq_lens)
        held = args + buffers
        ids = list(map(id, held))
        if ids == self._ids:
            return None
        # New tensor objects (vLLM makes new views of its persistent buffers, and CPU builders
        # new tensors, every draft loop): verified afresh, which reads three properties of
        # each contiguous tensor (an address-independent memo of the layout read more)
        problem = self._verify(args, buffers)
        if problem is None:
            self._ids, self._held = ids, held  # strong references: the ids stay unique
        return problem

    def _verify(
        self, args: tuple[object, ...], buffers: tuple[object, ...]
    ) -> tuple[str, str] | None:
        written: list[tuple[str, torch.Tensor, Span]] = []
        unchanged: list[tuple[str, torch.Tensor]] = []
        i = 0
        for entry in self._entries:
            out, inputs = args[i], args[i + 1 : i + 1 + entry.inputs]
            i += 1 + entry.inputs
            if not isinstance(out, torch.Tensor):
                if entry.unchanged or out is None:
                    continue
                return entry.path, f"is a {type(out).__qualname__}, expected a tensor"
            if entry.unchanged:
                unchanged.append((entry.path, out))
                continue
            if entry.fn is not None and entry.fn.is_noop(out, *inputs):
                continue  # a copy onto itself: nothing is written
            if not out.is_contiguous() and has_internal_overlap(out):
                return entry.path, (
                    f"has elements sharing memory (strides {out.stride()} for shape "
                    f"{tuple(out.shape)}, an expanded view?); an in-place write would be "
                    "undefined: make it a real buffer"
                )
            span = _span(out)
            for k, src in enumerate(inputs):
                if isinstance(src, torch.Tensor) and _share(out, span, src, _span(src)):
                    return entry.path, (
                        f"overlaps the memory of its input {k} (a destination may not share "
                        "memory with its source): write into a separate buffer"
                    )
            written.append((entry.path, out, span))
        if not written and not unchanged:
            return None
        state = [(name, buf, _span(buf)) for name, buf in zip(STATE_BUFFERS, buffers)
                 if isinstance(buf, torch.Tensor)]
        for j, (path, out, span) in enumerate(written):
            for other, other_out, other_span in written[:j]:
                if _share(out, span, other_out, other_span):
                    return path, (
                        f"shares memory with {other!r}, which this update also writes: give "
                        "each written field its own buffer"
                    )
            for name, buf, buf_span in state:
                if _share(out, span, buf, buf_span):
                    return path, (
                        f"shares memory with state.{name}, so writing it would corrupt the "
                        f"draft state; declare it Alias({name!r}) if it is a view of that "
                        "buffer, or give it its own buffer"
                    )
        for path, t in unchanged:
            t_span = _span(t)
            for name, buf, buf_span in state:
                if name in ADVANCED and _share(t, t_span, buf, buf_span):
                    return path, (
                        f"is declared unchanged but shares memory with state.{name}, which "
                        f"the loop advances every step; declare it Alias({name!r})"
                    )
        return None
