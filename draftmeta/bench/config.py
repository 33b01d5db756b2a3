"""What ``draftmeta bench`` measures (:class:`BenchConfig`) and what one measurement is
(:class:`Sample`)."""

from __future__ import annotations

import attrs

__all__ = ["BenchConfig", "Sample"]


@attrs.frozen
class BenchConfig:
    """What to measure.

    Attributes:
        device: ``"cpu"`` (vLLM's real builders) or ``"cuda"``.
        batch_sizes: batch sizes to measure.
        steps: numbers of draft steps K.
        repeats: measured runs per configuration (after one warm-up run).
        block_size: KV block size for the MLA builders (the indexer always uses 64).
        max_model_len: the context limit; batches have mixed lengths up to it.
        backends: CPU builders to measure (``CPU_MLA``, ``TRITON_MLA``, ``INDEXER``).
    """

    device: str = "cpu"
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    steps: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    repeats: int = 12
    block_size: int = 64
    max_model_len: int = 4096
    backends: tuple[str, ...] = ("CPU_MLA", "TRITON_MLA", "INDEXER")


@attrs.frozen
class Sample:
    """One measured path at one configuration: per-step times in microseconds."""

    backend: str
    path: str
    batch_size: int
    steps: int
    host_us: tuple[float, ...]
    device_us: tuple[float, ...] = ()
    launches_per_step: float | None = None
