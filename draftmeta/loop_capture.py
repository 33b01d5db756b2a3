"""Whole-loop CUDA-graph capture: steps 1..K-1 of a draft loop recorded in one CUDA graph.

:func:`capture_loop` (what :meth:`DraftLoop.capture <draftmeta.loop.DraftLoop.capture>` runs)
first proves the loop capture-safe, then records it:

* every group updates in place and its spec is capture-safe (the spec says why not);
* warm-up iterations run eagerly under ``torch.cuda.set_sync_debug_mode("error")``, so a step
  that synchronises with the device raises;
* every tensor the state and the metadata reference keeps its address, and every host value of
  the metadata keeps its value after the first iteration (a captured graph bakes both).

A violation raises :class:`CaptureError` naming the group, field or step. A :class:`CapturedLoop`
replays the graph for the batch shape it was captured for.

The capture reads a loop through :class:`CapturableLoop` (its state, groups and statistics, its
``refresh`` and ``metadata``), which :class:`~draftmeta.loop.DraftLoop` satisfies: the loop calls
the capture, and the capture never imports the loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import attrs
import torch

from draftmeta.errors import DraftMetaError
from draftmeta.protocol import spec_of
from draftmeta.record_walk import host_leaves, tensor_leaves
from draftmeta.state import DraftState

__all__ = ["CapturableLoop", "CaptureError", "CapturedLoop", "LoopFallbacks", "LoopGroup",
           "capture_loop"]


class CaptureError(DraftMetaError):
    """The draft loop cannot be captured in a CUDA graph; the message names the culprit."""


class LoopGroup(Protocol):
    """What the capture reads of one group of a loop (an
    :class:`~draftmeta.loop.AttentionGroup` is one)."""

    @property
    def name(self) -> str:
        """The group's name, in messages."""

    @property
    def builder(self) -> object:
        """The metadata builder: its spec (:func:`~draftmeta.protocol.spec_of`) must be
        capture-safe."""

    @property
    def metadata(self) -> Any:
        """The group's metadata: every tensor in it must keep its address."""


class LoopFallbacks(Protocol):
    """What the capture reads of a loop's statistics (a :class:`~draftmeta.loop.LoopStats`)."""

    def fallbacks(self) -> Mapping[str, str]:
        """``{group: reason}`` for every group that rebuilds."""


class CapturableLoop(Protocol):
    """What the capture reads and runs of a draft loop: :class:`~draftmeta.loop.DraftLoop` is
    one. The capture depends on this, not on the loop's class, so the loop can call it."""

    @property
    def state(self) -> DraftState:
        """The draft state the loop advances: its buffers are the graph's."""

    @property
    def groups(self) -> Sequence[LoopGroup]:
        """The loop's attention groups."""

    @property
    def stats(self) -> LoopFallbacks:
        """The loop's statistics: which groups rebuild."""

    def refresh(self, draft_index: int) -> None:
        """Advance the state once and update each group's metadata."""

    def metadata(self) -> Mapping[str, Any]:
        """The current metadata of every group, by name."""


@attrs.define(eq=False)
class CapturedLoop:
    """Steps 1..K-1 of a draft loop recorded in one CUDA graph.

    Attributes:
        graph: the CUDA graph.
        loop: the loop it was captured from (its state and metadata are the graph's buffers).
        num_steps: the draft steps the graph covers, the first (eager) one included.
        batch_size: the batch shape (rows of the state's buffers) it was captured for.
    """

    graph: torch.cuda.CUDAGraph
    loop: CapturableLoop
    num_steps: int
    batch_size: int

    def replay(self, state: DraftState | None = None) -> None:
        """Replay steps 1..K-1. ``state``, if given, must be the captured state.

        Raises:
            CaptureError: ``state`` has another batch shape, or is not the captured state's
                buffers: fall back to :meth:`DraftLoop.run <draftmeta.loop.DraftLoop.run>`.
        """
        if state is not None:
            if state.batch_size != self.batch_size:
                raise CaptureError(
                    f"batch of {state.batch_size} rows, but the graph was captured for "
                    f"{self.batch_size}; run the loop eagerly or capture this shape"
                )
            if state.seq_lens.data_ptr() != self.loop.state.seq_lens.data_ptr():
                raise CaptureError("the state's buffers are not the captured ones")
        self.graph.replay()


def capture_loop(
    loop: CapturableLoop, step_fn: Callable[[int, Mapping[str, Any]], None], num_steps: int,
    *, warmup: int = 1,
) -> CapturedLoop:
    """Capture ``num_steps`` refresh-and-step iterations of ``loop`` in one CUDA graph,
    calling ``step_fn(draft_index, metadata_by_group)`` (the loop's
    :data:`~draftmeta.loop.StepFunction`) once per iteration.

    Every group must update in place. Before capture, ``warmup + 1`` (at least two) eager
    iterations run under ``torch.cuda.set_sync_debug_mode("error")`` (a device sync raises);
    every tensor the metadata and the state reference must keep its address throughout,
    and every host field its value after the first iteration (a captured graph bakes both).

    Raises:
        CaptureError: a group rebuilds, the state is not on CUDA, a step syncs, a buffer
            moves or a host value changes between steps; the message names it.
    """
    if not loop.state.device.type == "cuda":
        raise CaptureError(f"the draft state is on {loop.state.device}; capture needs CUDA")
    rebuilding = loop.stats.fallbacks()
    if rebuilding:
        raise CaptureError(f"groups that rebuild cannot be captured: {rebuilding}")
    for group in loop.groups:
        spec = spec_of(group.builder)
        if spec is not None and not spec.capture_safe:
            raise CaptureError(f"group {group.name}: {spec.capture_unsafe_reason}")
    before = _addresses(loop)
    host_before: dict[str, object] | None = None
    stream = getattr(torch.cuda, "Stream")()  # noqa: B009 - typed loosely across releases
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # host values may settle in the first step (a bound frozen at max_model_len);
        # from then on they must not move
        for i in range(max(2, warmup + 1)):
            with _sync_debug_error():
                try:
                    loop.refresh(1 + i)
                    step_fn(1 + i, loop.metadata())
                except RuntimeError as exc:
                    raise CaptureError(
                        f"a draft step synchronizes with the device: {exc}"
                    ) from exc
            if loop.stats.fallbacks():
                raise CaptureError(f"a group fell back in warm-up: {loop.stats.fallbacks()}")
            _same_addresses(loop, before)
            if host_before is None:
                host_before = _host_values(loop)
            else:
                _same_host_values(loop, host_before)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for index in range(1, num_steps):
            loop.refresh(index)
            step_fn(index, loop.metadata())
    _same_addresses(loop, before)
    return CapturedLoop(graph, loop, num_steps, loop.state.batch_size)


# -- capture-safety checks --------------------------------------------------------------------


def _tensors(loop: CapturableLoop) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor a captured graph would read: the state's buffers, then each group's."""
    for name in ("positions", "seq_lens", "slot_mapping", "block_table", "query_start_loc",
                 "dcp_local_seq_lens"):
        t = getattr(loop.state, name)
        if isinstance(t, torch.Tensor):
            yield f"state.{name}", t
    for group in loop.groups:
        yield from tensor_leaves(group.metadata, group.name)


def _addresses(loop: CapturableLoop) -> dict[str, int]:
    return {path: t.data_ptr() for path, t in _tensors(loop)}


def _first_change(
    before: Mapping[str, object], after: Mapping[str, object]
) -> tuple[str, object] | None:
    """The first path whose value differs between two snapshots, with its old value."""
    for path, value in before.items():
        if after.get(path) != value:
            return path, value
    return None


def _same_addresses(loop: CapturableLoop, before: Mapping[str, int]) -> None:
    changed = _first_change(before, _addresses(loop))
    if changed is not None:
        path = changed[0]
        raise CaptureError(
            f"{path} moved between steps (its buffer was replaced); a captured graph "
            "would read the old address. Declare it with a rule that writes in place"
        )


def _host_values(loop: CapturableLoop) -> dict[str, object]:
    values: dict[str, object] = {"state.max_seq_len": loop.state.max_seq_len}
    for group in loop.groups:
        values.update(host_leaves(group.metadata, group.name))
    return values


def _same_host_values(loop: CapturableLoop, before: Mapping[str, object]) -> None:
    after = _host_values(loop)
    changed = _first_change(before, after)
    if changed is not None:
        path, value = changed
        raise CaptureError(
            f"host value {path} changes between steps ({value!r} -> {after.get(path)!r});"
            " a captured graph bakes host values: use host_bound='frozen'"
        )


@contextlib.contextmanager
def _sync_debug_error() -> Iterator[None]:
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
