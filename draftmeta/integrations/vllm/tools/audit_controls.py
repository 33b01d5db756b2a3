"""The audit's negative controls: hooks with a deliberate bug each, which it must report.

A :class:`Control` takes one builder's hook (vLLM's own, or draftmeta's where the plugin
installed it), wraps it with a bug (:data:`HookWrapper`), and names the field the audit must
then report under one criterion: ``equal`` (update == rebuild), ``idempotent`` or ``first
step`` (:mod:`draftmeta.integrations.vllm.tools.audit_criteria`). :data:`CONTROLS` run wherever
their
builder constructs (a CPU included); :data:`GPU_CONTROLS`, a schedule left stale on batches
placed across a scheduler tile, only on CUDA. :func:`matches` says whether a reported path
names the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs
import torch

__all__ = [
    "CONTROLS",
    "GPU_CONTROLS",
    "Control",
    "ControlResult",
    "Criterion",
    "HookWrapper",
    "increment",
    "matches",
    "skip_refresh",
    "write_wrong",
]

HookWrapper = Callable[[Callable[[Any, Any], None]], Callable[[Any, Any], None]]
"""Turns a builder class's hook into another (the negative controls' deliberate bugs)."""

Criterion = Literal["equal", "idempotent", "first step"]
"""What a control's bug must fail: update == rebuild, a second call changing nothing, or the
first step from the metadata built for capture."""


@attrs.frozen
class Control:
    """A negative control: one builder's hook with a deliberate bug the audit must report.

    Attributes:
        name: what the bug is, in a few words.
        backend: the builder whose hook is changed.
        field: the metadata (or runner input) path the audit must name.
        wrap: makes the buggy hook from the builder class's own.
        criterion: the criterion whose findings must name ``field``.
        kv_cache_dtype: the KV cache the builder is built with (``fp8``: FlashMLA's FP8 row).
        cuda: runs only on a CUDA device (a kernel schedule).
        placed: every batch's lengths are placed so that each request enters a new scheduler
            tile at the first advance, and every batch where the right schedule changes within
            the loop must report ``field`` (not only one of them).
    """

    name: str
    backend: str
    field: str
    wrap: HookWrapper
    criterion: Criterion = "equal"
    kv_cache_dtype: str = "auto"
    cuda: bool = False
    placed: bool = False


@attrs.frozen
class ControlResult:
    """What the audit said of a negative control.

    Attributes:
        control: the control's name.
        backend: the builder it changed.
        field: the path that had to be reported.
        caught: whether the audit reported ``field`` under the control's criterion (for a
            ``placed`` control: in every informative batch, and there was one).
        reported: the distinct paths the audit reported under that criterion.
        criterion: the criterion the control tests.
        batches: batches driven (0: not run here).
        informative: batches in which the bug could show (for FA3's schedule: those whose
            rebuilt schedule changed within the loop; one request, or requests all crossing
            together, can keep FA3's splits and order, and a stale schedule is then right).
        missed: informative batches that did not report ``field``.
        note: why it did not run here, where it did not.
    """

    control: str
    backend: str
    field: str
    caught: bool
    reported: tuple[str, ...]
    criterion: Criterion = "equal"
    batches: int = 0
    informative: int = 0
    missed: int = 0
    note: str = ""

    @property
    def ran(self) -> bool:
        """Whether the control ran here (its builder constructed)."""
        return self.batches > 0


def matches(path: str, field: str) -> bool:
    """Whether a reported ``path`` names ``field``: the field itself, one of its parts
    (``decode.scheduler_metadata.num_splits`` names ``decode.scheduler_metadata``), the runner
    input of that name, or either after a CUDA graph replay."""
    path = path.removeprefix("after replay: ").removeprefix("runner input ")
    return path == field or path.startswith(field + ".")


def _parent(metadata: Any, path: str) -> tuple[Any, str]:
    *head, last = path.split(".")
    value = metadata
    for part in head:
        value = getattr(value, part)
    return value, last


def _field(metadata: Any, path: str) -> torch.Tensor:
    parent, name = _parent(metadata, path)
    value = getattr(parent, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{path} is a {type(value).__name__}, not a tensor")
    return value


def _kept(value: Any) -> tuple[Any, Any]:
    """What :func:`skip_refresh` puts back: the object a field held, and a tensor's values or
    a record's fields kept the same way."""
    from draftmeta.fields import record_items

    if isinstance(value, torch.Tensor):
        return value, value.clone()
    return value, [(name, _kept(v)) for name, v in record_items(value) or ()]


def _put_back(parent: Any, name: str, kept: tuple[Any, Any]) -> None:
    original, inner = kept
    object.__setattr__(parent, name, original)  # the object it held (a hook may replace it)
    if isinstance(original, torch.Tensor):
        original.copy_(inner)  # in place: a captured kernel reads the same buffer
        return
    for field_name, field_kept in inner:
        _put_back(original, field_name, field_kept)


def skip_refresh(field: str) -> HookWrapper:
    """A hook that runs the original, then puts ``field`` back as it was: the refresh skipped.
    A tensor gets its values back in place; an object (FlashMLA's scheduler) is put back, its
    fields too (a flag reset, a tensor refilled or replaced)."""
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def skipping(builder: Any, metadata: Any) -> None:
            parent, name = _parent(metadata, field)
            kept = _kept(getattr(parent, name))
            hook(builder, metadata)
            _put_back(parent, name, kept)
        return skipping
    return wrap


def write_wrong(field: str) -> HookWrapper:
    """A hook that runs the original, then adds 1 to the first entry of ``field``'s buffer."""
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def writing(builder: Any, metadata: Any) -> None:
            hook(builder, metadata)
            _field(metadata, field).view(-1)[0] += 1
        return writing
    return wrap


def increment(field: str) -> HookWrapper:
    """A hook that runs the original but moves ``field`` on by one from what it held, instead
    of refreshing it from the runner's buffers: right once per step where every length grows
    by one, wrong when called twice."""
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def incrementing(builder: Any, metadata: Any) -> None:
            target = _field(metadata, field)
            held = target.clone()
            hook(builder, metadata)
            target.copy_(held + 1)
        return incrementing
    return wrap


CONTROLS: tuple[Control, ...] = (
    Control("the hook skips its slot_mapping refresh", "KPOOL_TAIL", "slot_mapping",
            skip_refresh("slot_mapping")),
    Control("the hook writes a wrong value into decode.block_table", "INDEXER",
            "decode.block_table", write_wrong("decode.block_table")),
    Control("the hook writes a wrong value into the runner's slot mapping", "INDEXER",
            "slot_mapping", write_wrong("slot_mapping")),
    Control("the no-op hook writes a wrong value into the runner's sequence lengths",
            "TRITON_ATTN", "seq_lens", write_wrong("seq_lens")),
    Control("the hook increments decode.seq_lens instead of refreshing it", "INDEXER",
            "decode.seq_lens", increment("decode.seq_lens"), criterion="idempotent"),
    Control("the hook refreshes all but decode.seq_lens_i64", "AMX_MLA",
            "decode.seq_lens_i64", skip_refresh("decode.seq_lens_i64"), criterion="first step"),
)
"""The negative controls of ``draftmeta audit --negative-control`` that run on a CPU too:
vLLM's own hooks of the GLM K-pool tail and the DeepSeek-V3.2 indexer (``refresh`` hooks whose
builders construct on a CPU) and of Triton attention (a no-op, built for a tiny Llama), and
draftmeta's hook of ``AMX_MLA`` (whose ``decode.seq_lens_i64`` is a builder buffer the hook
refills), with one deliberate bug each; the audit must name the field each one leaves wrong,
under its criterion."""

_STALE = "decode.scheduler_metadata"

GPU_CONTROLS: tuple[Control, ...] = (
    Control("the hook leaves FA3's schedule stale", "FLASH_ATTN_MLA", _STALE,
            skip_refresh(_STALE), cuda=True, placed=True),
    Control("the hook leaves FlashMLA's scheduler stale", "FLASHMLA", _STALE,
            skip_refresh(_STALE), cuda=True, placed=True),
    Control("the hook leaves FlashMLA's FP8 tile schedule stale", "FLASHMLA", _STALE,
            skip_refresh(_STALE), kv_cache_dtype="fp8", cuda=True, placed=True),
)
"""The negative controls that run on CUDA only, as ``benchmarks/h200/hook_equivalence.py``
had them: each hook with its scheduler left as it was, on batches whose requests all enter a
new scheduler tile at the first advance; every batch whose right schedule changed within the
loop must report it (FlashMLA's always does; FA3's may keep its splits and order for one
request, or requests all crossing together), and at least one must."""
