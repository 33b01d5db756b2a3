"""One random batch through one builder's draft hook, as vLLM's runners drive it: the audit's
three criteria on a CPU or a CUDA device.

:func:`drive` builds the batch's builders with vLLM's own code (the harness,
:mod:`draftmeta.integrations.vllm.testing.harness`) and runs two passes over the same inputs:

1. **update == rebuild** (vLLM 0.34's fused loop): a builder builds the first draft step's
   metadata from the runner's persistent inputs, with the host ``max_seq_len`` at the loop's
   upper bound (``min(longest + K, max_model_len)``); at every later step the inputs advance
   in place (positions and lengths + 1, slots from the block table, lengths clamped at
   ``max_model_len``; under DCP the rank's local lengths too) and the hook runs; the metadata
   is compared field by field with what a second builder builds from a copy of the inputs
   taken before the hook, and the inputs with that copy (a hook that writes into a runner
   buffer is reported). The host ``max_seq_len`` is a bound: where the metadata differs from
   the rebuild under the runner's bound, it may equal one under ``max_model_len`` instead
   (what draftmeta's hooks keep), values derived from the bound included.
2. **first step, then idempotent at every step** (vLLM's next loop: the hook at the start of
   every draft step, the first included, on the objects it captured): a third builder builds
   for capture from the runner's capture inputs
   (:func:`~draftmeta.integrations.vllm.tools.audit_criteria.write_capture_inputs`), the real first
   step's inputs are written into the same buffers and the hook runs once: the metadata must
   equal the rebuild at the first step. Then at that step and every later one the hook runs
   twice, and the second call must change nothing (compared with a
   :func:`~draftmeta.integrations.vllm.tools.audit_criteria.snapshot` taken after the first).

On CUDA (:mod:`draftmeta.integrations.vllm.tools.audit_gpu`) comparisons read kernel schedules the
way their kernels do, FlashMLA's decode runs on both sides, every :data:`CROSSING_EVERY`-th
batch is placed across a scheduler tile, and the first pass ends with the hook captured in a
CUDA graph and replayed one step further.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs
import torch

from draftmeta.compare import Mismatch
from draftmeta.integrations.vllm.catalogue import HarnessRecipe
from draftmeta.integrations.vllm.plugin.plan import CoveredBy
from draftmeta.integrations.vllm.tools.audit_criteria import (
    INPUTS,
    copy_inputs,
    snapshot,
    write_capture_inputs,
)
from draftmeta.integrations.vllm.tools.audit_gpu import CROSSING_EVERY
from draftmeta.protocol import spec_of
from draftmeta.state import DraftState

__all__ = ["WORKSPACES", "BatchFindings", "Found", "NotConstructed", "Target", "drive"]

Device = Literal["cpu", "cuda"]
"""Where the audit builds and drives builders."""

WORKSPACES = frozenset({"softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum"})
"""Metadata fields that are scratch, not values: buffers a builder allocates with
``torch.empty`` and hands to the kernel to write (the segment outputs of vLLM's Triton
attention's 3-D kernel); the audit compares their shape and dtype only."""


@attrs.frozen
class Target:
    """How to build the builders of one audited row.

    Attributes:
        name: vLLM's attention-backend name (``INDEXER``, ``KPOOL_TAIL``).
        device: where the builders and the inputs live.
        dcp_world: decode context parallelism: ranks of a stand-in group (1: off); batch
            ``s`` is built for rank ``s % dcp_world``, interleave 1 or 8 in turn.
        kv_cache_dtype: the KV cache's dtype (``fp8``: FlashMLA's FP8 cache).
        standard: a standard-attention backend, built for a tiny Llama.
        recipe: how the harness builds it where its catalogue entry says not (a backend of
            vLLM's registry outside the catalogue, or one without a recipe there).
        flashmla: FlashMLA's dense decode checks the schedule (on CUDA).
    """

    name: str
    device: Device = "cpu"
    dcp_world: int = 1
    kv_cache_dtype: str = "auto"
    standard: bool = False
    recipe: HarnessRecipe | None = None
    flashmla: bool = False


@attrs.frozen
class Found:
    """One difference the audit found.

    Attributes:
        step: the draft step (1: the first).
        path: the metadata field, ``runner input NAME``, or ``after replay``.
        detail: how it differs.
    """

    step: int
    path: str
    detail: str


@attrs.define
class BatchFindings:
    """What one batch showed.

    Attributes:
        owner: whose hook ran (``none``: the builder's flag was off; nothing was driven).
        steps: hook calls compared with a rebuild (K - 1).
        equal: differences from vLLM's rebuild, in the first pass (and after replay).
        first_step: differences from vLLM's rebuild at the first step, from the metadata built
            for capture.
        idempotent: differences a second call made.
        replayed: the hook was captured in a CUDA graph and replayed.
        crossing: the batch was placed so that every request enters a new scheduler tile at
            the first advance.
        schedule_changed: whether vLLM's rebuilt FA3 schedule ever differed from the first
            step's within the loop (``None``: no FA3 schedule); a stale schedule is wrong, and
            a stale-schedule control informative, only where it did.
    """

    owner: CoveredBy
    steps: int = 0
    equal: list[Found] = attrs.Factory(list)
    first_step: list[Found] = attrs.Factory(list)
    idempotent: list[Found] = attrs.Factory(list)
    replayed: bool = False
    crossing: bool = False
    schedule_changed: bool | None = None


class NotConstructed(Exception):
    """A batch's builders did not construct or build here (a kernel missing, no GPU): the
    message says vLLM's reason."""


def owner_of(builder: Any) -> CoveredBy:
    """Whose hook vLLM's runner would call for this built builder."""
    if spec_of(builder) is not None:  # the plugin bound a spec (hook.bind)
        return "draftmeta"
    return "vllm" if getattr(builder, "supports_draft_decode_metadata_update", False) else "none"


def _written(before: DraftState, after: DraftState, step: int) -> list[Found]:
    """The runner inputs the hook changed (``before``: a copy taken just before it ran)."""
    found = []
    for name in INPUTS:
        a, b = getattr(before, name), getattr(after, name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not torch.equal(a, b):
            found.append(Found(step, f"runner input {name}", "written by the hook"))
    return found


def _runner_view(state: DraftState) -> Any:
    """vLLM's common metadata over ``state``'s buffers as the runner describes a padded batch:
    padding rows count as requests (``num_reqs`` is the padded count; their lengths are 0 and
    their slots -1), while the advance moves only the real ones."""
    from draftmeta.integrations.vllm.testing import harness

    return harness.common_metadata_for(attrs.evolve(state, num_reqs=state.seq_lens.shape[0]))


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


@attrs.define
class _Batch:
    """One batch's inputs, the way to make its builders, and its comparison."""

    target: Target
    seed: int
    steps: int
    upper: int
    max_model_len: int
    block_size: int
    crossing: bool
    state: DraftState
    make: Callable[[], Any]
    compare: Callable[[Any, Any], list[Mismatch]]
    local_lens: Callable[[torch.Tensor], torch.Tensor] | None

    def rebuild(self, rebuilder: Any, before: DraftState, metadata: Any
                ) -> tuple[Any, list[Mismatch]]:
        """vLLM's rebuild of ``before`` compared with ``metadata``: under the runner's bound,
        else under ``max_model_len`` (the other bound a hook may keep); the rebuild that
        differs in fewer fields and its differences (none where either is equal)."""
        from draftmeta.integrations.vllm.testing import harness

        if self.local_lens is not None:  # the rebuild's local lengths from vLLM's function
            before.dcp_local_seq_lens = self.local_lens(before.seq_lens)
        rebuilt = harness.build_metadata(rebuilder, _runner_view(before))
        differ = self.compare(metadata, rebuilt)
        if differ:  # equal under the other bound a hook may keep: max_model_len
            before.max_seq_len = self.max_model_len
            at_limit = harness.build_metadata(rebuilder, _runner_view(before))
            other = self.compare(metadata, at_limit)
            if len(other) < len(differ):
                return at_limit, other
            # the first rebuild's buffers were rebuilt under the other bound: build it again
            before.max_seq_len = self.upper
            rebuilt = harness.build_metadata(rebuilder, _runner_view(before))
        return rebuilt, differ

    def advance(self, state: DraftState) -> None:
        """The runner's advance between draft steps; the host bound stays the loop's."""
        from draftmeta.advance import advance_state

        advance_state(state, "clamp")
        state.max_seq_len = self.upper


def _local_lens(world: int, rank: int, interleave: int
                ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """One DCP rank's share of the lengths by vLLM's own function (``None`` without DCP)."""
    if world == 1:
        return None
    from draftmeta.integrations.vllm.testing import harness

    def local(seq_lens: torch.Tensor) -> torch.Tensor:
        return harness.dcp_local_seq_lens(seq_lens, world, rank, interleave).to(seq_lens.device)

    return local


def _make_batch(target: Target, seed: int, placed: bool) -> _Batch:
    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.integrations.vllm.testing.equivalence import compare_on_cpu, random_case
    from draftmeta.integrations.vllm.tools.audit_gpu import (
        compare_on_cuda,
        crossing_lengths,
        deep_gemm_installed,
    )
    from draftmeta.testing import random_state, state_for_lengths

    world = target.dcp_world
    rank, interleave = seed % world, 1 if (seed // world) % 2 == 0 else 8
    local_lens = _local_lens(world, rank, interleave)
    if target.standard:  # block sizes 16 and 64, as TRITON_MLA's cases draw them
        case = attrs.evolve(random_case("TRITON_MLA", seed), builder=target.name)
    else:
        case = random_case(target.name, seed, recipe=target.recipe)
    crossing = target.device == "cuda" and (placed or seed % CROSSING_EVERY == CROSSING_EVERY - 1)
    max_model_len = 4096 if crossing else case.max_model_len

    def make() -> Any:
        if target.standard:
            return harness.make_attention_builder(
                target.name, max_model_len=max_model_len, block_size=case.block_size,
                cudagraph_mode="FULL_DECODE_ONLY", device=target.device)
        config = harness.cached_vllm_config(
            max_model_len=max_model_len, block_size=case.block_size, dcp_world_size=world,
            dcp_interleave=interleave, cudagraph_mode="FULL_DECODE_ONLY",
            kv_cache_dtype=target.kv_cache_dtype)
        kwargs: dict[str, Any] = {"block_size": case.block_size, "dcp_rank": rank,
                                  "device": target.device, "recipe": target.recipe}
        if target.name == "INDEXER":
            kwargs["block_table_width"] = -(-max_model_len // case.block_size)
        return harness.make_builder(target.name, config, **kwargs)

    g = torch.Generator().manual_seed(seed)
    if crossing:
        lengths = crossing_lengths(g, case.batch_size, max_model_len, case.steps, local_lens)
        state = state_for_lengths(g, lengths, block_size=case.block_size,
                                  max_model_len=max_model_len, num_padded=case.num_padded,
                                  device=target.device)
    else:
        state = random_state(g, batch_size=case.batch_size, block_size=case.block_size,
                             max_model_len=max_model_len, steps=case.steps,
                             num_padded=case.num_padded, device=target.device)
    upper = min(state.max_seq_len + case.steps, max_model_len)  # the runner's bound
    state.max_seq_len = upper
    if local_lens is not None:
        state.dcp_world_size, state.dcp_rank, state.dcp_interleave = world, rank, interleave
        state.dcp_local_seq_lens = local_lens(state.seq_lens)
    rows = state.seq_lens.shape[0]
    compare: Callable[[Any, Any], list[Mismatch]]
    if target.device == "cuda":
        deep_gemm = deep_gemm_installed()

        def compare(a: Any, b: Any) -> list[Mismatch]:
            return compare_on_cuda(a, b, batch=rows, workspaces=WORKSPACES, deep_gemm=deep_gemm)
    else:
        def compare(a: Any, b: Any) -> list[Mismatch]:
            return compare_on_cpu(a, b, workspaces=WORKSPACES)
    return _Batch(target, seed, case.steps, upper, max_model_len, case.block_size, crossing,
                  state, make, compare, local_lens)


def _kernel(batch: _Batch, builder: Any) -> Callable[[Any], torch.Tensor] | None:
    """FlashMLA's decode over this batch, where the target is FlashMLA on CUDA."""
    if not (batch.target.flashmla and batch.target.device == "cuda"):
        return None
    from draftmeta.integrations.vllm.tools.audit_gpu import FlashMLAKernel

    heads = int(builder.vllm_config.model_config.hf_text_config.num_attention_heads)
    return FlashMLAKernel(batch.state.block_table, batch.block_size,
                          fp8=batch.target.kv_cache_dtype.startswith("fp8"), heads=heads,
                          seed=batch.seed)


def _kernel_differs(kernel: Callable[[Any], torch.Tensor], metadata: Any, rebuilt: Any,
                    step: int, real: int) -> list[Found]:
    """FlashMLA's decode with both metadata, compared on the ``real`` requests' rows (a padded
    row's output is whatever the kernel leaves for a sequence of length 0)."""
    a, b = kernel(metadata)[:real], kernel(rebuilt)[:real]
    if torch.equal(a, b):
        return []
    diff = (a.float() - b.float()).abs().max().item()
    return [Found(step, "decode.scheduler_metadata",
                  f"FlashMLA's decode output differs from the rebuild's (max {diff:.3g})")]


def _schedule_changed(first: torch.Tensor | None, rebuilt: Any, rows: int) -> bool:
    from draftmeta.integrations.vllm.tools.audit_gpu import fa3_schedule

    if first is None:
        return False
    now = fa3_schedule(rebuilt, rows)
    return now is None or now.shape != first.shape or not torch.equal(now, first)


def drive(target: Target, seed: int, *, placed: bool = False) -> BatchFindings:
    """Drive one random batch (from ``seed``) through ``target``'s hook: both passes.

    ``placed``: place the lengths across a scheduler tile whatever the seed (CUDA only: the
    stale-schedule controls).

    Raises:
        NotConstructed: the builders do not construct, or their first build fails, here.
    """
    from draftmeta.integrations.vllm.testing import harness

    try:
        batch = _make_batch(target, seed, placed)
        updater, rebuilder, capturer = batch.make(), batch.make(), batch.make()
        initial = batch.state.clone()
        metadata = harness.build_metadata(updater, _runner_view(batch.state))
    except Exception as exc:  # a kernel or library missing here: vLLM's reason, as it said it
        raise NotConstructed(_said(exc)) from exc
    owner = owner_of(updater)
    findings = BatchFindings(owner, crossing=batch.crossing)
    if owner == "none":
        return findings
    _first_pass(batch, findings, updater, rebuilder, metadata)
    _second_pass(batch, findings, capturer, rebuilder, initial)
    return findings


def _first_pass(batch: _Batch, findings: BatchFindings, updater: Any, rebuilder: Any,
                metadata: Any) -> None:
    from draftmeta.integrations.vllm.tools.audit_gpu import fa3_schedule

    state, rows = batch.state, batch.state.seq_lens.shape[0]
    kernel = _kernel(batch, updater)
    if kernel is not None:
        kernel(metadata)  # step 1's attention fills the scheduler object, as in the engine
    cuda = batch.target.device == "cuda"
    first = fa3_schedule(metadata, rows) if cuda else None
    changed = False
    for step in range(2, batch.steps + 1):
        batch.advance(state)
        before = state.clone()
        updater.update_draft_decode_metadata(metadata)
        findings.equal += _written(before, state, step)
        rebuilt, differ = batch.rebuild(rebuilder, before, metadata)
        findings.equal += [Found(step, m.path, m.detail) for m in differ]
        changed |= _schedule_changed(first, rebuilt, rows)
        if kernel is not None:
            findings.equal += _kernel_differs(kernel, metadata, rebuilt, step, state.num_reqs)
    findings.steps = batch.steps - 1
    if cuda:
        changed |= _replay(batch, findings, updater, rebuilder, metadata, kernel, first)
    findings.schedule_changed = changed if first is not None else None


def _replay(batch: _Batch, findings: BatchFindings, updater: Any, rebuilder: Any,
            metadata: Any, kernel: Callable[[Any], torch.Tensor] | None,
            first: torch.Tensor | None) -> bool:
    """Capture the hook (and FlashMLA's decode) at the last step, advance, replay, compare
    with the rebuild one step further; whether the rebuilt FA3 schedule changed."""
    from draftmeta.integrations.vllm.tools.audit_gpu import capture

    step, state = batch.steps + 1, batch.state
    try:
        graph, out = capture(lambda: updater.update_draft_decode_metadata(metadata),
                             None if kernel is None else lambda: kernel(metadata))
    except Exception as exc:  # vLLM's runner would fail to capture it the same way
        findings.equal.append(Found(step, "after replay",
                                    f"the hook does not capture in a CUDA graph: {_said(exc)}"))
        return False
    batch.advance(state)
    graph.replay()
    torch.cuda.synchronize()
    findings.replayed = True
    rebuilt, differ = batch.rebuild(rebuilder, state.clone(), metadata)
    if kernel is not None:
        real = state.num_reqs  # a padded row's output is whatever the kernel leaves
        if not torch.equal(out[0][:real], kernel(rebuilt)[:real]):
            findings.equal.append(Found(step, "after replay", "FlashMLA's decode output of the "
                                        "replayed graph differs from the rebuild's"))
    else:
        findings.equal += [Found(step, f"after replay: {m.path}", m.detail) for m in differ]
    return _schedule_changed(first, rebuilt, state.seq_lens.shape[0])


def _second_pass(batch: _Batch, findings: BatchFindings, capturer: Any, rebuilder: Any,
                 initial: DraftState) -> None:
    from draftmeta.integrations.vllm.testing import harness

    state, real = initial.clone(), initial
    write_capture_inputs(state, local_lens=batch.local_lens)
    metadata = harness.build_for_capture(capturer, _runner_view(state))
    kernel = _kernel(attrs.evolve(batch, state=real), capturer)
    if kernel is not None:
        kernel(metadata)  # the captured attention fills the scheduler object, as vLLM's does
    copy_inputs(state, real)
    before = state.clone()
    capturer.update_draft_decode_metadata(metadata)
    findings.first_step += _written(before, state, 1)
    _, differ = batch.rebuild(rebuilder, before, metadata)
    findings.first_step += [Found(1, m.path, m.detail) for m in differ]
    for step in range(1, batch.steps + 1):
        if step > 1:
            batch.advance(state)
            capturer.update_draft_decode_metadata(metadata)
        once = snapshot(metadata)
        before = state.clone()
        capturer.update_draft_decode_metadata(metadata)
        findings.idempotent += _written(before, state, step)
        findings.idempotent += [Found(step, m.path, m.detail)
                                for m in batch.compare(metadata, once)]
