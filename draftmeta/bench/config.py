"""What ``draftmeta bench`` measures (:class:`BenchConfig`) and what one measurement is
(:class:`Sample`)."""

from __future__ import annotations

import attrs

__all__ = ["BASELINES", "CONTROLS", "BenchConfig", "Pairing", "Sample"]


@attrs.frozen
class BenchConfig:
    """What to measure.

    Attributes:
        device: ``"cpu"`` (vLLM's real builders) or ``"cuda"``.
        batch_sizes: batch sizes to measure.
        steps: numbers of draft steps K.
        repeats: measured runs per configuration (after one warm-up run); on CPU each path's
            runs take turns with the other paths', run ``i`` of each making pair ``i``.
        loops_per_run: on CPU, the draft loops (steps 2..K each) one run times: its time per
            step is the median over them, so one preempted step (a busy machine) cannot make a
            run's figure.
        block_size: KV block size for the MLA builders (the indexer always uses 64).
        max_model_len: the context limit; batches have mixed lengths up to it.
        backends: CPU builders to measure (``CPU_MLA``, ``TRITON_MLA``, ``INDEXER``).
    """

    device: str = "cpu"
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    steps: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    repeats: int = 12
    loops_per_run: int = 10
    block_size: int = 64
    max_model_len: int = 4096
    backends: tuple[str, ...] = ("CPU_MLA", "TRITON_MLA", "INDEXER")


@attrs.frozen
class Sample:
    """One measured path at one configuration: per-step times in microseconds.

    Attributes:
        backend: the builder (CPU) or the builders measured together (CUDA).
        path: what was timed (``rebuild``, ``update``, ...).
        batch_size: requests in the batch.
        steps: K, the draft steps of the loop (steps 2..K are timed).
        host_us: host time of every timed step (CPU), or per step of every run (CUDA).
        device_us: device time per step of every run (CUDA only).
        launches_per_step: kernel launches per step (CUDA only).
        run_us: per measured run, the time per step that run took on average (host time on
            CPU, device time on CUDA): run ``i`` of every path of one configuration ran in turn
            with the others (:func:`draftmeta.measure.noise.alternating`), so they make pair ``i``.
    """

    backend: str
    path: str
    batch_size: int
    steps: int
    host_us: tuple[float, ...]
    device_us: tuple[float, ...] = ()
    launches_per_step: float | None = None
    run_us: tuple[float, ...] = ()


@attrs.frozen
class Pairing:
    """One comparison of a bench run: ``candidate`` against ``baseline``, pair by pair."""

    candidate: str
    baseline: str


BASELINES: dict[str, tuple[Pairing, ...]] = {
    "cpu": (Pairing("update", "rebuild"),),
    "cuda": (Pairing("update (eager)", "rebuild (reference)"),
             Pairing("advance + update (fused)", "advance + update (eager)"),
             Pairing("captured loop (replay)", "advance + update (fused)")),
}
"""What each device's bench compares: draftmeta's update against vLLM's rebuild on CPU; on
CUDA the eager update against the reference rebuild, the fused step against the eager one, and
the captured loop against the fused step."""

CONTROLS: dict[str, Pairing] = {
    "cpu": Pairing("rebuild (A/A)", "rebuild"),
    "cuda": Pairing("rebuild (A/A)", "rebuild (reference)"),
}
"""Each device's A/A control: the rebuild timed again, in turn with the others, against itself
(:mod:`draftmeta.measure.noise`, rule 2)."""
