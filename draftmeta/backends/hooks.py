"""Recompute hooks that refill a backend's scheduler buffers in place between draft steps.

Each hook calls a *compute* function that returns the kernel's result for the current sequence
lengths and copies it into the persistent buffer the metadata references, zeroing any tail (so
stale entries from a larger batch are never read). The DeepGEMM and FlashMLA hooks' ``check``
refuses, before the update writes anything, every buffer ``apply`` could not fill: a wrong
dtype or rank, a buffer on another device than the lengths, a ``num_splits`` shorter than the
batch; their ``apply`` checks all of a kernel's results against their buffers before writing
any.

The kernels are handed in: this module imports no engine. The vLLM binding
(:mod:`draftmeta.integrations.vllm.specs`) hands in vLLM's own (DeepGEMM, FlashMLA,
FlashAttention 3); tests and machines without those kernels hand in a reference implementation
instead (:mod:`draftmeta.testing.reference_schedules`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import attrs
import torch

from draftmeta.derivations import RecomputeHook
from draftmeta.workspace import Workspace

__all__ = [
    "DeepGemmPagedMqaSchedule",
    "FlashAttnCompute",
    "FlashAttnSchedule",
    "FlashMLAFp8TileSchedule",
    "PagedMqaCompute",
    "PagedMqaKernel",
    "TileCompute",
]

PagedMqaCompute = Callable[[torch.Tensor, int, int], torch.Tensor]
"""``compute(context_lens (B, next_n) int32, block_kv, num_sms) -> int32 [num_sms + 1, 2]``."""

PagedMqaKernel = Callable[[torch.Tensor], PagedMqaCompute | None]
"""``kernel(buffer) -> compute or None``: the schedule function for a buffer on its device, or
``None`` where this machine has none (the buffer is then left as it is). Asked at each refill,
so that declaring a spec loads no kernel."""

TileCompute = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
"""``compute(seq_lens int32 [B], num_q_tokens_per_head_k) -> (tile metadata, num_splits)``."""

FlashAttnCompute = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]
"""``compute(seq_lens [B], query_start_loc [B+1], max_seq_len, max_num_splits) -> scheduler
metadata``."""


def _misfit(out: torch.Tensor, result: torch.Tensor, what: str) -> str | None:
    """Why the kernel's ``result`` cannot be copied into the persistent buffer ``out``, or
    ``None``: it must have at most as many rows and the same trailing shape."""
    if result.shape[0] > out.shape[0] or result.shape[1:] != out.shape[1:]:
        return (f"{what}: the kernel returned {tuple(result.shape)}, which does not fit the "
                f"persistent buffer {tuple(out.shape)}; capture with a larger buffer")
    return None


def _copy_rows(out: torch.Tensor, result: torch.Tensor, what: str) -> None:
    problem = _misfit(out, result, what)
    if problem is not None:
        raise RuntimeError(problem)
    rows = result.shape[0]
    out[:rows].copy_(result)
    if rows < out.shape[0]:
        out[rows:].zero_()


def _lengths_problem(seq_lens: object, out: torch.Tensor, what: str) -> str | None:
    """What is wrong with the sequence lengths a schedule kernel reads (int32, on the buffer's
    device), or ``None``."""
    if not isinstance(seq_lens, torch.Tensor):
        return f"seq_lens must be a tensor, got {type(seq_lens).__qualname__}"
    if seq_lens.dtype is not torch.int32:
        return f"seq_lens must be int32 (the kernel's input), got {seq_lens.dtype}"
    if seq_lens.device != out.device:
        return (f"seq_lens are on {seq_lens.device} but the {what} on {out.device}; keep the "
                "persistent buffer on the device of the lengths")
    return None


@attrs.frozen
class DeepGemmPagedMqaSchedule(RecomputeHook):
    """The DeepSeek-V3.2 indexer's DeepGEMM paged-MQA schedule, int32 ``[slots + 1, 2]``.

    Inputs: the decode ``seq_lens`` ``(B, 1)``. The number of SM slots is read off the
    persistent buffer's shape (``slots + 1`` rows), so the captured shape is kept.

    With neither ``compute`` nor ``kernel`` the buffer is left as it is, as vLLM's builder does
    on a machine without DeepGEMM. The vLLM binding hands in a ``kernel`` that picks DeepGEMM
    for a buffer on CUDA where it is installed, and nothing elsewhere (vLLM's
    ``is_cuda() and has_deep_gemm()``).

    Attributes:
        block_kv: the indexer cache's block size (64 for DeepSeek-V3.2).
        compute: the schedule function, used for every buffer.
        kernel: where ``compute`` is ``None``: picks the schedule function for the buffer at
            each refill (:data:`PagedMqaKernel`).
    """

    name: ClassVar[str] = "deep_gemm_paged_mqa_schedule"
    formula: ClassVar[str] = "get_paged_mqa_logits_metadata(seq_lens, block_kv, slots)"
    block_kv: int = 64
    compute: PagedMqaCompute | None = None
    kernel: PagedMqaKernel | None = attrs.field(default=None, repr=False)

    def check(
        self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
    ) -> str | None:
        if also:
            return ("the paged-MQA schedule has one output, but the rule lists "
                    f"{len(also)} more in also=; remove also=")
        if out.dtype is not torch.int32 or out.dim() != 2 or out.shape[1] != 2:
            return (f"schedule buffer must be int32 [slots + 1, 2], got {out.dtype} "
                    f"{tuple(out.shape)}")
        if out.shape[0] < 2:
            return (f"schedule buffer has {out.shape[0]} row(s), but the kernel needs at least "
                    "one SM slot ([slots + 1, 2] with slots >= 1)")
        problem = _lengths_problem(inputs[0] if inputs else None, out, "schedule")
        if problem is not None:
            return problem
        seq_lens = inputs[0]
        assert isinstance(seq_lens, torch.Tensor)
        if seq_lens.dim() not in (1, 2) or (seq_lens.dim() == 2 and seq_lens.shape[1] == 0):
            return f"seq_lens must be [B] or [B, next_n], got {tuple(seq_lens.shape)}"
        return None

    def _compute(self, out: torch.Tensor) -> PagedMqaCompute | None:
        if self.compute is not None:
            return self.compute
        if self.kernel is not None:
            return self.kernel(out)
        return None

    def apply(
        self,
        out: torch.Tensor,
        *inputs: object,
        workspace: Workspace,
        also: tuple[torch.Tensor, ...] = (),
    ) -> None:
        compute = self._compute(out)
        if compute is None:
            return
        seq_lens = inputs[0]
        assert isinstance(seq_lens, torch.Tensor)
        lens = seq_lens if seq_lens.dim() == 2 else seq_lens.view(-1, 1)
        _copy_rows(out, compute(lens, self.block_kv, out.shape[0] - 1), self.name)


@attrs.frozen
class FlashMLAFp8TileSchedule(RecomputeHook):
    """FlashMLA's dense FP8 tile-scheduler metadata ``[parts, 8]`` and ``num_splits [B + 1]``.

    Bound to ``decode.scheduler_metadata.tile_scheduler_metadata`` with
    ``also=("decode.scheduler_metadata.num_splits",)``: one kernel call refills both persistent
    buffers, as vLLM's FlashMLA builder does for full CUDA graphs.

    Attributes:
        num_q_tokens_per_head_k: query tokens per KV head (``max_query_len * num_q_heads``).
        compute: the schedule function (the vLLM binding hands in FlashMLA's kernel); ``None``
            until one is handed in: every update then refuses in its check, before anything is
            written.
    """

    name: ClassVar[str] = "flashmla_fp8_tile_schedule"
    formula: ClassVar[str] = "get_mla_metadata_dense_fp8(seq_lens, q_tokens_per_head_k, 1)"
    num_q_tokens_per_head_k: int
    compute: TileCompute | None = None

    def check(
        self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
    ) -> str | None:
        if self.compute is None:
            return ("no FlashMLA tile-schedule kernel is handed in: declare the hook with "
                    "compute= (the vLLM binding hands in FlashMLA's get_mla_metadata_dense_fp8)")
        if len(also) != 1 or not isinstance(also[0], torch.Tensor):
            return "the FP8 path needs both tile_scheduler_metadata and num_splits buffers"
        if out.dim() != 2 or out.shape[1] != 8 or out.dtype != torch.int32:
            return f"tile metadata must be int32 [parts, 8], got {out.dtype} {tuple(out.shape)}"
        if out.shape[0] < 1:
            return "tile metadata has no rows; the kernel writes one per SM part"
        problem = _lengths_problem(inputs[0] if inputs else None, out, "tile metadata")
        if problem is not None:
            return problem
        seq_lens, splits = inputs[0], also[0]
        assert isinstance(seq_lens, torch.Tensor)
        if seq_lens.dim() != 1:
            return f"seq_lens must be [B], got {tuple(seq_lens.shape)}"
        if splits.dtype != torch.int32 or splits.dim() != 1:
            return f"num_splits must be int32 [B + 1], got {splits.dtype} {tuple(splits.shape)}"
        if splits.device != out.device:
            return (f"num_splits is on {splits.device} but the tile metadata on {out.device}; "
                    "keep both persistent buffers on one device")
        if splits.shape[0] < seq_lens.shape[0] + 1:
            return (f"num_splits has {splits.shape[0]} entries, fewer than batch + 1 = "
                    f"{seq_lens.shape[0] + 1}; capture with a buffer of max_num_seqs + 1")
        return None

    def apply(
        self,
        out: torch.Tensor,
        *inputs: object,
        workspace: Workspace,
        also: tuple[torch.Tensor, ...] = (),
    ) -> None:
        seq_lens = inputs[0]
        assert isinstance(seq_lens, torch.Tensor)
        if self.compute is None:  # check() refused it before any write
            raise RuntimeError("no FlashMLA tile-schedule kernel is handed in")
        tiles, splits = self.compute(seq_lens, self.num_q_tokens_per_head_k)
        # both results are checked against their buffers before either is written, so a kernel
        # whose output does not fit leaves both buffers as they were
        out_splits, splits = also[0].view(-1, 1), splits.view(-1, 1)
        problem = (_misfit(out, tiles, self.name)
                   or _misfit(out_splits, splits, self.name + ".num_splits"))
        if problem is not None:
            raise RuntimeError(problem)
        _copy_rows(out, tiles, self.name)
        _copy_rows(out_splits, splits, self.name + ".num_splits")


@attrs.frozen
class FlashAttnSchedule(RecomputeHook):
    """FlashAttention 3's ahead-of-time scheduler metadata, refilled with a zeroed tail.

    The scheduler's arguments include the builder's head configuration (query heads, head
    dimensions, page size), so the spec is declared without it and bound to each live builder
    (the vLLM binding's
    :func:`~draftmeta.integrations.vllm.specs.mla.flash_attn_compute_of`; the vLLM plugin
    binds every builder's at its ``__init__``). An unbound schedule refuses every update in its
    check, before anything is written.

    Runs inside a captured CUDA graph: FA3's scheduler launches one kernel over the device
    sequence lengths and the copy is a device copy (vLLM's own FlashAttention hook refreshes
    the same metadata the same way).

    Attributes:
        compute: the scheduler function bound to the builder's head configuration (vLLM's
            ``get_scheduler_metadata`` with the builder's arguments); ``None`` until bound.
    """

    name: ClassVar[str] = "flash_attn_scheduler"
    formula: ClassVar[str] = ("get_scheduler_metadata(seq_lens, query_start_loc, max_seq_len, "
                              "max_num_splits)")
    compute: FlashAttnCompute | None = None

    def check(
        self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
    ) -> str | None:
        if self.compute is None:
            return ("FA3's scheduler is not bound to a builder's head configuration: declare "
                    "the spec with builder=<the FlashAttnMLAMetadataBuilder> (catalogue "
                    "entry.make_spec(builder=...); the vLLM plugin binds each builder's)")
        if out.dtype != torch.int32 or out.dim() != 1 or out.shape[0] < 1:
            return (f"scheduler metadata must be int32 [n >= 1], got {out.dtype} "
                    f"{tuple(out.shape)}")
        seq_lens, query_start_loc = inputs[0], inputs[1]
        problem = _lengths_problem(seq_lens, out, self.name)
        if problem is not None:
            return problem
        assert isinstance(seq_lens, torch.Tensor)
        if (not isinstance(query_start_loc, torch.Tensor)
                or query_start_loc.dtype is not torch.int32 or query_start_loc.dim() != 1
                or query_start_loc.shape[0] != seq_lens.shape[0] + 1):
            shown = (f"{query_start_loc.dtype} {tuple(query_start_loc.shape)}"
                     if isinstance(query_start_loc, torch.Tensor)
                     else type(query_start_loc).__qualname__)
            return (f"query_start_loc must be int32 [batch + 1] = [{seq_lens.shape[0] + 1}] "
                    f"(FA3's cu_seqlens_q), got {shown}")
        if query_start_loc.device != out.device:
            return (f"query_start_loc is on {query_start_loc.device} but the scheduler "
                    f"metadata on {out.device}")
        return None

    def apply(
        self,
        out: torch.Tensor,
        *inputs: object,
        workspace: Workspace,
        also: tuple[torch.Tensor, ...] = (),
    ) -> None:
        seq_lens, query_start_loc, max_seq_len, max_num_splits = inputs[:4]
        assert isinstance(seq_lens, torch.Tensor) and isinstance(query_start_loc, torch.Tensor)
        assert isinstance(max_seq_len, int) and isinstance(max_num_splits, int)
        if self.compute is None:  # check() refused it before any write
            raise RuntimeError("FA3's scheduler is not bound to a builder")
        result = self.compute(seq_lens, query_start_loc, max_seq_len, max_num_splits)
        _copy_rows(out.view(-1, 1), result.view(-1, 1), self.name)
