"""What ``draftmeta audit`` checks only on a GPU: kernel schedules, FlashMLA's decode, capture.

On a CUDA device the audit (:mod:`draftmeta.integrations.vllm.tools.audit`) builds every builder
that
constructs there with vLLM's CUDA kernels, so what a CPU leaves empty is computed and compared:

* **kernel schedules.** FA3's ahead-of-time scheduler metadata (``FLASH_ATTN_MLA``'s
  ``decode.scheduler_metadata``, ``FLASH_ATTN``'s ``scheduler_metadata``) is a kernel's
  output, compared on the entries FA3's kernels read (:func:`fa3_read_entries`); FlashMLA's FP8
  tile schedule on the fields its decode reads (:data:`FP8_TILE_FIELDS`); the indexer's
  DeepGEMM schedule exactly where DeepGEMM is installed (:func:`compare_on_cuda`).
* **FlashMLA's decode.** FlashMLA's bf16 scheduler object is filled lazily by its kernel, so
  comparing the object says little: the decode kernel runs on random queries and cache with
  the hook's metadata and with the rebuild's, and the outputs must be equal
  (:class:`FlashMLAKernel`).
* **capture and replay.** The hook (and FlashMLA's decode after it) is captured once in a CUDA
  graph, the inputs advanced, the graph replayed, and the result compared with a rebuild at
  the new lengths (:func:`capture`): what vLLM's captured draft loop relies on.
* **lengths placed across a scheduler tile.** A stale schedule shows only where a length
  enters a new tile of the kernel's scheduler during the loop; every
  :data:`CROSSING_EVERY`-th batch, and every batch of a stale-schedule negative control, is
  placed so that each request (under DCP, each rank's share) enters a new :data:`TILE`-token
  tile at the loop's first advance (:func:`crossing_lengths`).

Importing this module imports neither vLLM nor CUDA; its functions that need them import them
when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from draftmeta.compare import Mismatch, compare_metadata

__all__ = [
    "CROSSING_EVERY",
    "FA3_SCHEDULES",
    "FP8_TILES",
    "FP8_TILE_FIELDS",
    "TILE",
    "FlashMLAKernel",
    "capture",
    "compare_on_cuda",
    "crossing_lengths",
    "deep_gemm_installed",
    "fa3_read_entries",
    "fa3_schedule",
]

TILE = 256
"""A multiple of every power-of-two tile of the kernels' schedulers (FlashMLA's 64-token
blocks, FA3's n-blocks): a length that is a multiple of it enters a new tile of each of them at
the next step (``ceil(length / tile)`` goes up by one)."""

CROSSING_EVERY = 4
"""Every 4th batch of a GPU row (seed ``s`` with ``s % 4 == 3``) is placed across a tile."""

FA3_SCHEDULES = ("decode.scheduler_metadata", "scheduler_metadata")
"""Where FA3's ahead-of-time scheduler metadata sits: FlashAttn-MLA's decode part, and
standard FlashAttention's metadata (compared as FA3's layout where the field is a tensor)."""

FP8_TILES = "decode.scheduler_metadata.tile_scheduler_metadata"
"""FlashMLA's FP8 tile schedule."""

FP8_TILE_FIELDS = 5
"""FlashMLA's FP8 tile metadata rows have 8 slots (``TileSchedulerMetaDataSize``); its
scheduler kernel writes the first 5 (begin/end request and block, first split) and leaves 5..7
as ``torch.empty`` gave them, in vLLM's rebuild as in an update; its decode kernel reads the
first 5."""

DEEP_GEMM_SCHEDULE = "decode.schedule_metadata"
"""The indexer's DeepGEMM schedule: computed on CUDA where DeepGEMM is installed, else left as
``torch.empty`` gave it (then compared by shape and dtype only)."""


def fa3_read_entries(schedule: torch.Tensor, batch: int) -> torch.Tensor:
    """The entries of FA3's scheduler metadata that its kernels read.

    FA3 (``hopper/flash_api.cpp``, ``mha_fwd_get_scheduler_metadata``) lays the metadata out as
    prepared vectors of ``round_up(batch, 4)`` entries each (dynamic splits, m-blocks, batch
    order, head swizzle), then the tile-count semaphore; each vector's entries past ``batch``
    are rounding padding that FA3 allocates with ``torch::empty`` and never writes or reads, in
    vLLM's own rebuild as much as in an update. Those are left out; everything else is kept.

    Raises:
        ValueError: the metadata does not have that layout for ``batch`` rows.
    """
    rounded = -(-batch // 4) * 4
    n = schedule.shape[0]
    if n == 1 or (n - 1) % rounded:
        raise ValueError(f"FA3 scheduler metadata of {n} entries for batch {batch}: not the "
                         f"layout this check knows (vectors of {rounded}, then a semaphore)")
    index = [v * rounded + i for v in range((n - 1) // rounded) for i in range(batch)]
    return schedule[torch.tensor([*index, n - 1], device=schedule.device)]


def _at(metadata: object, path: str) -> object:
    value = metadata
    for part in path.split("."):
        value = getattr(value, part, None)
    return value


def fa3_schedule(metadata: object, batch: int) -> torch.Tensor | None:
    """A copy of the entries of ``metadata``'s FA3 schedule that the kernels read, or ``None``
    where it has none (not FA3, or FA3 without its ahead-of-time schedule)."""
    for path in FA3_SCHEDULES:
        value = _at(metadata, path)
        if isinstance(value, torch.Tensor):
            return fa3_read_entries(value, batch).clone()
    return None


def deep_gemm_installed() -> bool:
    """Whether vLLM runs on CUDA here and finds DeepGEMM: the indexer's condition for
    computing its schedule."""
    try:
        from vllm.platforms import current_platform
        from vllm.utils.deep_gemm import has_deep_gemm
    except ImportError:
        return False
    return bool(current_platform.is_cuda() and has_deep_gemm())


def compare_on_cuda(metadata: object, rebuilt: object, *, batch: int,
                    workspaces: frozenset[str] = frozenset(), deep_gemm: bool = True
                    ) -> list[Mismatch]:
    """Every field where ``metadata`` differs from vLLM's ``rebuilt`` one on CUDA: field by
    field, FA3's schedule on the entries its kernels read (``batch``: the rows it was computed
    for), FlashMLA's FP8 tiles on the fields its decode reads, the given ``workspaces`` (scratch
    a kernel writes) and, without DeepGEMM, the indexer's schedule by shape and dtype only."""
    shape_only = set(workspaces) | (set() if deep_gemm else {DEEP_GEMM_SCHEDULE})
    special = {p for p in FA3_SCHEDULES if isinstance(_at(metadata, p), torch.Tensor)}
    fp8 = isinstance(_at(metadata, FP8_TILES), torch.Tensor) or isinstance(
        _at(rebuilt, FP8_TILES), torch.Tensor)
    if fp8:
        special.add(FP8_TILES)
    skipped = shape_only | special
    found = compare_metadata(metadata, rebuilt, ignore=skipped.__contains__)
    for path in sorted(shape_only):
        a, b = _at(metadata, path), _at(rebuilt, path)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if (a.shape, a.dtype) != (b.shape, b.dtype):
                found.append(Mismatch(path, f"{tuple(a.shape)} {a.dtype} != "
                                            f"{tuple(b.shape)} {b.dtype}"))
        elif (a is None) != (b is None):
            found.append(Mismatch(path, f"{type(a).__name__} != {type(b).__name__}"))
    for path in sorted(special - {FP8_TILES}):
        found += _compare_fa3(path, _at(metadata, path), _at(rebuilt, path), batch)
    if fp8:
        found += _compare_fp8_tiles(_at(metadata, FP8_TILES), _at(rebuilt, FP8_TILES))
    return found


def _compare_fa3(path: str, ours: object, theirs: object, batch: int) -> list[Mismatch]:
    if not (isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor)):
        return [Mismatch(path, f"{type(ours).__name__} != {type(theirs).__name__}")]
    if ours.shape != theirs.shape:
        return [Mismatch(path, f"shape {tuple(ours.shape)} != {tuple(theirs.shape)}")]
    try:
        a, b = fa3_read_entries(ours, batch), fa3_read_entries(theirs, batch)
    except ValueError as exc:
        return [Mismatch(path, str(exc))]
    if torch.equal(a, b):
        return []
    return [Mismatch(path, f"{int((a != b).sum())} of the {a.numel()} entries FA3's kernels "
                           "read differ")]


def _compare_fp8_tiles(ours: object, theirs: object) -> list[Mismatch]:
    if not (isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor)):
        return [Mismatch(FP8_TILES, f"{type(ours).__name__} != {type(theirs).__name__}")]
    if ours.shape != theirs.shape:
        return [Mismatch(FP8_TILES, f"shape {tuple(ours.shape)} != {tuple(theirs.shape)}")]
    if torch.equal(ours[:, :FP8_TILE_FIELDS], theirs[:, :FP8_TILE_FIELDS]):
        return []
    return [Mismatch(FP8_TILES, f"the {FP8_TILE_FIELDS} fields FlashMLA's decode reads differ")]


def crossing_lengths(generator: torch.Generator, batch: int, max_model_len: int, steps: int,
                     local_lens: Callable[[torch.Tensor], torch.Tensor] | None = None
                     ) -> torch.Tensor:
    """``batch`` context lengths at which every request's length (under DCP its rank's share,
    by ``local_lens``: vLLM's own function) is a positive multiple of :data:`TILE` and grows
    at the loop's first advance: every request enters a new tile of the kernels' schedulers
    there, so a schedule left stale differs from the rebuild's from the first step on.

    Raises:
        ValueError: no length up to ``max_model_len - steps`` does that (raise the limit).
    """
    lengths = torch.arange(TILE, max(TILE, max_model_len - steps + 1), dtype=torch.int32)
    local, after = lengths, lengths + 1
    if local_lens is not None:
        local, after = local_lens(lengths).cpu(), local_lens(lengths + 1).cpu()
    fits = lengths[(local % TILE == 0) & (local > 0) & (after == local + 1)]
    if not len(fits):
        raise ValueError(f"no length up to {max_model_len - steps} enters a new {TILE}-token "
                         "tile at the first step: raise max_model_len")
    return fits[torch.randint(len(fits), (batch,), generator=generator)]


class FlashMLAKernel:
    """FlashMLA's dense decode on random queries over a random paged cache: what a FlashMLA
    row's metadata is *used* for (bf16, or FP8 with the query quantized as vLLM does)."""

    def __init__(self, block_table: torch.Tensor, block_size: int, *, fp8: bool, heads: int,
                 seed: int) -> None:
        g = torch.Generator(device=block_table.device).manual_seed(seed)
        num_blocks = int(block_table.max()) + 1
        self.fp8 = fp8
        cache = torch.randn(num_blocks, block_size, 1, 576, generator=g,
                            device=block_table.device, dtype=torch.bfloat16) / 4
        self.cache = cache.to(torch.float8_e4m3fn) if fp8 else cache
        rows = block_table.shape[0]
        q = torch.randn(rows, 1, heads, 576, generator=g, device=block_table.device,
                        dtype=torch.bfloat16) / 4
        self.q = q.to(torch.float8_e4m3fn) if fp8 else q
        self.scale = 576 ** -0.5

    def __call__(self, metadata: Any) -> torch.Tensor:
        """The decode's output for ``metadata``'s lengths, block table and schedule."""
        decode = metadata.decode
        sched = decode.scheduler_metadata
        if self.fp8:
            from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache_fp8

            one = torch.ones(1, device=self.q.device, dtype=torch.float32)
            out, _ = flash_mla_with_kvcache_fp8(
                self.q, self.cache, decode.block_table, decode.seq_lens, 512,
                sched.tile_scheduler_metadata, sched.num_splits, softmax_scale=self.scale,
                causal=True, descale_q=one, descale_k=one)
        else:
            from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache

            out, _ = flash_mla_with_kvcache(
                self.q, self.cache, decode.block_table, decode.seq_lens, 512, sched,
                softmax_scale=self.scale, causal=True)
        result: torch.Tensor = out.clone()
        return result


def capture(hook: Callable[[], None], kernel: Callable[[], torch.Tensor] | None
            ) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
    """Capture ``hook`` (and ``kernel`` after it) in one CUDA graph, as vLLM's runner captures
    its draft loop: run once on a side stream first (allocations and lazy set-up outside the
    capture), then captured. Returns the graph and, where ``kernel`` is given, the tensor its
    replays write."""
    graph = torch.cuda.CUDAGraph()
    out: list[torch.Tensor] = []
    stream = getattr(torch.cuda, "Stream")()  # noqa: B009 - typed loosely across releases
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        hook()
        if kernel is not None:
            kernel()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        hook()
        if kernel is not None:
            out.append(kernel())
    return graph, out
