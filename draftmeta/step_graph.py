"""A cheap eager draft step: the fused step's kernel replayed from a cached one-node CUDA graph.

Outside a captured loop, an eager draft step pays for its launches on the host: the generated
advance and update issue about a dozen torch ops, and the fused step (one Triton kernel) still
goes through Triton's Python launcher, which binds and checks every argument each time.
:class:`StepGraph` keeps the fused step's split (host checks, one elementwise kernel, host
values and the rest of each spec) but records the kernel launch once in a CUDA graph and
replays it every later step, so the per-step host work is the generated checks, one
``graph.replay()`` and the generated finish functions.

The graph bakes the kernel's arguments: the addresses of the state's and the metadata's
buffers and the host scalars the kernel reads (``num_reqs``, ``block_size``, the overflow
bounds). Before every replay :class:`StepGraph` compares both with what it captured; if either
changed, it launches the kernel directly for that step and captures a new graph (it stops
capturing after :data:`MAX_RECAPTURES` changes in a row and stays on direct launches). Inside a
CUDA-graph capture (a whole loop being recorded) or under ``torch.cuda`` sync-debug mode it
never captures or replays: it launches the kernel directly, so an enclosing graph records the
kernel itself. An enclosing graph replays device work only, so a step whose groups' specs are
not capture-safe (:attr:`~draftmeta.spec.DraftSpec.capture_safe`: a host object replaced every
step, an unsafe recompute hook) refuses to run inside one (:attr:`StepGraph.capture_unsafe_reason`).

Usage mirrors :class:`~draftmeta.fused.FusedStep` (``check()``, ``launch()``, ``finish()``,
or call it for all three)::

    step = StepGraph(state, [(spec, metadata)], policy="clamp")
    for index in range(1, K):
        step()              # advance + every group's update, one graph replay
        run_draft_model(metadata)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftmeta.advance import HostBound, OverflowPolicy
from draftmeta.fused import FusedStep
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = ["MAX_RECAPTURES", "StepGraph"]

MAX_RECAPTURES = 3
"""Changes of the kernel's arguments in a row after which :class:`StepGraph` stops capturing."""


class StepGraph:
    """The fused draft step with its kernel launch cached in a CUDA graph.

    Args:
        state: the draft state, on CUDA (its buffers are the kernel's arguments).
        groups: ``(spec, metadata)`` of every group that updates in place.
        policy: the source advance's overflow policy.
        host_bound: how the host ``max_seq_len`` moves.

    Attributes:
        captures: CUDA graphs captured so far.
        replays: steps whose kernel ran as a graph replay.
        direct_launches: steps whose kernel was launched directly (the first step, steps after
            an argument changed, steps inside an enclosing capture).

    Raises:
        ValueError: the state is not on CUDA.
        RuntimeError: a step runs inside an enclosing CUDA-graph capture although a group's
            spec is not capture-safe (:attr:`capture_unsafe_reason`).
    """

    def __init__(
        self,
        state: DraftState,
        groups: Sequence[tuple[DraftSpec[Any], Any]],
        *,
        policy: OverflowPolicy = "clamp",
        host_bound: HostBound = "advance",
    ) -> None:
        if state.device.type != "cuda":
            raise ValueError(
                f"StepGraph needs the draft state on CUDA, it is on {state.device}; "
                "use the eager update (DraftLoop with fused=False) elsewhere"
            )
        self.state = state
        self._capture_unsafe = next(
            (f"spec {spec.name!r}: {spec.capture_unsafe_reason}"
             for spec, _ in groups if not spec.capture_safe),
            None,
        )
        self._fused = FusedStep(state, groups, policy=policy, host_bound=host_bound)
        # the kernel's arguments, as FusedStep binds them (see draftmeta.fused)
        self._tensors: list[torch.Tensor] = list(self._fused._tensors)
        self._scalar_fns = [fn for _, fn in self._fused._scalars]
        self._graph: torch.cuda.CUDAGraph | None = None
        self._key: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._changes = 0
        self.captures = 0
        self.replays = 0
        self.direct_launches = 0

    @property
    def source(self) -> str:
        """The fused kernel's generated Triton source."""
        return self._fused.source

    @property
    def capture_unsafe_reason(self) -> str | None:
        """Why an enclosing CUDA graph (:meth:`~draftmeta.loop.DraftLoop.capture`) cannot record
        this step (the first group whose spec is not capture-safe), or ``None``. The step's own
        graph holds the elementwise kernel only and is unaffected."""
        return self._capture_unsafe

    def _refuse_enclosing_capture(self) -> None:
        if self._capture_unsafe is not None and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"a draft step is being recorded into a CUDA graph, but {self._capture_unsafe}; "
                "a replay would skip that host work: run the step eagerly"
            )

    @property
    def graphing(self) -> bool:
        """Whether later steps still try to replay (False after too many argument changes)."""
        return self._changes <= MAX_RECAPTURES

    def check(self) -> None:
        """Every part's preconditions and structure checks (raise before any write)."""
        self._fused.check()

    def _arguments(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (
            tuple(t.data_ptr() for t in self._tensors),
            tuple(int(fn(self.state)) for fn in self._scalar_fns),
        )

    def launch(self) -> None:
        """The step's elementwise writes: a graph replay when the arguments are the captured
        ones, else a direct launch (followed by a new capture while :attr:`graphing`)."""
        if torch.cuda.is_current_stream_capturing() or torch.cuda.get_sync_debug_mode() != 0:
            self._fused.launch()
            self.direct_launches += 1
            return
        key = self._arguments()
        if self._graph is not None and key == self._key:
            self._graph.replay()
            self.replays += 1
            self._changes = 0
            return
        self._fused.launch()  # the real write of this step (and Triton's compile, the first time)
        self.direct_launches += 1
        if self._graph is not None:
            self._changes += 1
        self._graph = None
        if self.graphing:
            self._capture(key)

    def _capture(self, key: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
        """Record one launch of the kernel (recording runs nothing on the device)."""
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        side = getattr(torch.cuda, "Stream")()  # noqa: B009 - typed loosely across releases
        side.wait_stream(current)
        with torch.cuda.stream(side):
            graph.capture_begin()
            try:
                self._fused.launch()
            finally:
                graph.capture_end()
        current.wait_stream(side)
        self._graph = graph
        self._key = key
        self.captures += 1

    def finish(self) -> None:
        """Host values, recompute hooks and other non-fused writes, part by part."""
        self._refuse_enclosing_capture()
        self._fused.finish()

    def __call__(self) -> None:
        """One whole step: checks, the kernel (replayed), then the rest."""
        self._refuse_enclosing_capture()
        self._fused.check()
        self.launch()
        self._fused.finish()
