"""The draft loop: advance the shared state once per step, then refresh each group's metadata.

A *group* is an attention metadata builder with the metadata it built for the first draft step.
Per step the loop advances the :class:`~draftmeta.state.DraftState` once for all groups, then
dispatches on each builder's declared capability:

* a builder that satisfies :class:`~draftmeta.protocol.SupportsDraftUpdate`, whose spec is
  supported and covers the metadata it built, and whose preconditions hold, has its metadata
  updated in place;
* any other builder is rebuilt through the ``rebuild`` callable of its group (for vLLM,
  ``build_for_drafting(common_metadata, draft_index)``).

That decision, and the update or the rebuild, is each group's
:class:`~draftmeta.step_policy.StepPolicy`: the same policy as the vLLM plugin's older-proposer
path, so the same failure gives the same reason on both. The path each group takes and the
reason for a fallback are kept in :class:`LoopStats` and logged once per group, not per step. A
group whose update fails (a precondition, a structure check) is rebuilt from then on; the failed
update wrote nothing.

On CUDA, :meth:`DraftLoop.capture` records steps 1..K-1 (updates and the caller's step
function) in one CUDA graph after checking that they are capture-safe
(:mod:`draftmeta.loop_capture`, which defines :class:`CaptureError` and :class:`CapturedLoop`,
re-exported here). The state is checked once, when the loop is made
(:func:`~draftmeta.state_validation.validate_state`).

Shadow mode (``DRAFTMETA_SHADOW=N`` or ``shadow=N``, :mod:`draftmeta.shadow`): every Nth run of
the loop also rebuilds each in-place group after every update and compares field by field; a
group whose metadata is found stale is logged once, switched to rebuilding for the rest of the
process, and continues with the rebuilt metadata.

Thread safety: a loop, its state and its groups' metadata belong to one thread at a time. Two
loops over distinct states and metadata objects may run in two threads; one metadata object
must never be updated from two threads at once (the generated update is not locked).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from draftmeta.advance import HostBound, OverflowPolicy, advance_spec, check_policy
from draftmeta.errors import DraftMetaError
from draftmeta.loop_capture import CapturedLoop, CaptureError, capture_loop
from draftmeta.protocol import spec_of
from draftmeta.shadow import Sentinel, sentinel_for
from draftmeta.state import DraftState
from draftmeta.state_validation import validate_state
from draftmeta.step_policy import StepPolicy

__all__ = [
    "AttentionGroup",
    "CaptureError",
    "CapturedLoop",
    "DraftLoop",
    "GroupStats",
    "LoopStats",
    "StepFunction",
]

logger = logging.getLogger("draftmeta.loop")

Rebuild = Callable[[DraftState, int], Any]
"""``rebuild(state, draft_index) -> metadata``: build the group's metadata from scratch."""

StepFunction = Callable[[int, Mapping[str, Any]], None]
"""``step_fn(draft_index, metadata_by_group)``: one draft-model forward (and sampling)."""

Path = Literal["update", "rebuild"]


@attrs.define(eq=False)
class AttentionGroup:
    """An attention metadata builder and the metadata it built for the first draft step.

    Attributes:
        name: the group's name in statistics and logs.
        builder: the metadata builder; capable when it satisfies ``SupportsDraftUpdate``.
        metadata: the metadata the step function reads; updated in place or replaced.
        rebuild: builds the metadata from scratch for a state and draft index (read once, when
            the loop is made: the group's policy keeps it).
    """

    name: str
    builder: object
    metadata: Any
    rebuild: Rebuild


@attrs.define
class GroupStats:
    """What happened to one group (its :class:`~draftmeta.step_policy.StepPolicy`'s record).

    Attributes:
        reason: why the group rebuilds (``None`` while it updates).
        updates: in-place updates done.
        rebuilds: rebuilds done.
        shadow_checks: shadow-mode comparisons of an update with a rebuild.
    """

    reason: str | None = None
    updates: int = 0
    rebuilds: int = 0
    shadow_checks: int = 0

    @property
    def path(self) -> Path:
        """``"update"`` (in place) or ``"rebuild"``, as decided last."""
        return "update" if self.reason is None else "rebuild"


@attrs.define
class LoopStats:
    """Per-group paths, fallback reasons and counts, plus the steps run.

    Attributes:
        groups: statistics by group name.
        steps: draft steps run (the first, built before the loop, included).
        advances: source-state advances (one per step after the first, for all groups).
    """

    groups: dict[str, GroupStats] = attrs.field(factory=dict)
    steps: int = 0
    advances: int = 0

    def fallbacks(self) -> dict[str, str]:
        """``{group: reason}`` for every group that rebuilds."""
        return {n: g.reason for n, g in self.groups.items() if g.reason is not None}


def _log_fallback(name: str, reason: str, for_good: bool) -> None:
    """The loop's :data:`~draftmeta.step_policy.Report`: one line when a group starts
    rebuilding."""
    logger.info("draft group %s: metadata rebuilt every step (%s)", name, reason)


class DraftLoop:
    """Runs draft steps for a set of attention groups over one shared draft state.

    Args:
        groups: the attention groups, each with metadata built for the state as given.
        state: the draft state (source buffers); advanced in place once per step.
        policy: overflow policy of the source advance (``"wrap"`` or ``"clamp"``).
        host_bound: how the host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        fused: one Triton launch per step (default: on CUDA with Triton).
        shadow: shadow every Nth run (:mod:`draftmeta.shadow`); default ``DRAFTMETA_SHADOW``,
            0 is off.

    Raises:
        ValueError: two groups share a name, or the state is malformed (dtypes, devices,
            shapes, host ints), with the field and the fix.
        SpecError: a group's spec advances a field with another overflow policy than the loop.
    """

    def __init__(
        self,
        groups: Sequence[AttentionGroup],
        state: DraftState,
        *,
        policy: OverflowPolicy = "clamp",
        host_bound: HostBound = "advance",
        fused: bool | None = None,
        shadow: int | None = None,
    ) -> None:
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"attention group names must be unique, got {names}")
        validate_state(state)
        for group in groups:
            spec = spec_of(group.builder)
            if spec is not None:
                check_policy(spec, policy)
        self.groups = list(groups)
        self.state = state
        self.policy: OverflowPolicy = policy
        self.host_bound: HostBound = host_bound
        self._advance = advance_spec(policy, host_bound, state.dcp_world_size > 1).update
        if fused is None:
            from draftmeta.fused import triton_available

            fused = state.device.type == "cuda" and triton_available()
        elif fused and state.device.type != "cuda":
            raise ValueError(f"fused=True needs the state on CUDA, it is on {state.device}")
        self._fused_enabled = fused
        self._fused: Any = None  # the StepGraph (fused kernel), built on the first refresh
        self._fused_groups: list[AttentionGroup] = []
        self._fused_names: set[str] = set()
        self.stats = LoopStats()
        self.sentinels: dict[str, Sentinel] = {
            g.name: sentinel_for(g.name, shadow) for g in self.groups
        }
        self._shadowed: list[AttentionGroup] = []  # groups shadowed in the current run
        self.policies: dict[str, StepPolicy] = {}
        """Each group's update-or-rebuild policy, by name (decided here, once)."""
        for group in self.groups:
            record = self.stats.groups[group.name] = GroupStats()
            step_policy = StepPolicy(group.name, group.builder, record, group.rebuild,
                                     report=_log_fallback)
            self.policies[group.name] = step_policy
            first_mismatch = self.sentinels[group.name].first_mismatch
            if first_mismatch is not None:  # shadow mode found it stale earlier
                step_policy.stale(first_mismatch)
            spec = spec_of(group.builder)
            if step_policy.in_place and spec is not None:
                step_policy.check_object(spec, group.metadata)
            if step_policy.in_place:
                logger.info("draft group %s: metadata updated in place", group.name)

    def metadata(self) -> dict[str, Any]:
        """The current metadata of every group, by name."""
        return {g.name: g.metadata for g in self.groups}

    @property
    def fused_source(self) -> str | None:
        """The fused kernel's generated Triton source, once built (``None`` unfused)."""
        return None if self._fused is None else str(self._fused.source)

    def _refresh_fused(self, draft_index: int) -> bool:
        """The fused path; False (having written nothing) if a check failed."""
        if self._fused is None:  # the groups fused and the kernel are decided once
            from draftmeta.step_graph import StepGraph

            self._fused_groups = [
                g for g in self.groups
                if self.stats.groups[g.name].path == "update" and spec_of(g.builder) is not None
            ]
            self._fused_names = {g.name for g in self._fused_groups}
            # the fused kernel, its launch cached in a per-step CUDA graph (host time per step
            # below vLLM's own step on the H200; launched directly inside an enclosing capture)
            self._fused = StepGraph(
                self.state,
                [(spec_of(g.builder), g.metadata) for g in self._fused_groups],  # type: ignore[misc]
                policy=self.policy,
                host_bound=self.host_bound,
            )
        try:
            self._fused.check()
        except DraftMetaError:
            self._fused_enabled = False  # the eager path finds and records the failing group
            self._fused = None
            logger.info("fused draft step disabled: a check failed; refreshing eagerly")
            return False
        self._fused.launch()
        self._fused.finish()
        self.stats.advances += 1
        for group in self._fused_groups:
            self.stats.groups[group.name].updates += 1
        self._refresh_groups(draft_index, skip=self._fused_names)
        if self._shadowed:
            self._shadow_check(draft_index)
        return True

    def refresh(self, draft_index: int) -> None:
        """Advance the shared state once, then update or rebuild each group's metadata.

        On CUDA with Triton (``fused``), one generated kernel applies the elementwise rules
        of the advance and of every group with a spec; the rest of each spec runs after it.
        """
        if self._fused_enabled and self._refresh_fused(draft_index):
            return
        self._advance(self.state, self.state)
        self.stats.advances += 1
        self._refresh_groups(draft_index)
        if self._shadowed:
            self._shadow_check(draft_index)

    def _shadow_check(self, draft_index: int) -> None:
        """Shadow mode: rebuild each shadowed group that updated in place and compare."""
        for group in self._shadowed:
            stats = self.stats.groups[group.name]
            if stats.path != "update":
                continue
            sentinel = self.sentinels[group.name]
            rebuilt = group.rebuild(self.state, draft_index)
            stats.shadow_checks += 1
            mismatch = sentinel.compare(group.metadata, rebuilt)
            if mismatch is None:
                continue
            self.policies[group.name].stale(mismatch)
            group.metadata = rebuilt  # continue with correct metadata
            if group.name in self._fused_names:  # the kernel is bound to the old buffers
                self._fused_enabled, self._fused = False, None
        self._shadowed = [g for g in self._shadowed if self.stats.groups[g.name].path == "update"]

    def _refresh_groups(self, draft_index: int, skip: set[str] | None = None) -> None:
        state, policies = self.state, self.policies
        for group in self.groups:
            if skip and group.name in skip:
                continue
            group.metadata = policies[group.name].step(group.metadata, state, state, draft_index)

    def run(self, step_fn: StepFunction, num_steps: int) -> LoopStats:
        """Run draft steps ``0 .. num_steps - 1`` of the loop (the first uses the metadata as
        built), calling ``step_fn(draft_index, metadata_by_group)`` once per step."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self._shadowed = [
            g for g in self.groups
            if self.stats.groups[g.name].path == "update" and self.sentinels[g.name].should_check()
        ]
        for index in range(num_steps):
            if index:
                self.refresh(index)
            step_fn(index, self.metadata())
            self.stats.steps += 1
        return self.stats

    def capture(
        self, step_fn: StepFunction, num_steps: int, *, warmup: int = 1
    ) -> CapturedLoop:
        """Capture ``num_steps`` refresh-and-step iterations in one CUDA graph.

        Every group must update in place. Before capture, ``warmup + 1`` (at least two) eager
        iterations run under ``torch.cuda.set_sync_debug_mode("error")`` (a device sync raises);
        every tensor the metadata and the state reference must keep its address throughout,
        and every host field its value after the first iteration (a captured graph bakes both).
        The checks and the capture live in :mod:`draftmeta.loop_capture`.

        Raises:
            CaptureError: a group rebuilds, the state is not on CUDA, a step syncs, a buffer
                moves or a host value changes between steps; the message names it.
        """
        return capture_loop(self, step_fn, num_steps, warmup=warmup)
