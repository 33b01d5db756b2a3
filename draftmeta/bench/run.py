"""Running a benchmark: every configuration of a :class:`~draftmeta.bench.config.BenchConfig`
on its device, with a progress count."""

from __future__ import annotations

from collections.abc import Callable

from draftmeta.bench.config import BenchConfig, Sample
from draftmeta.bench.cpu import cpu_samples
from draftmeta.bench.cuda import cuda_samples

__all__ = ["run_bench"]


def _progress(total: int, enabled: bool) -> Callable[[], None]:
    if not enabled:
        return lambda: None
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="draftmeta bench", unit="config", leave=False)
        return lambda: bar.update(1) and None
    except ImportError:
        done = [0]

        def tick() -> None:
            done[0] += 1
            print(f"\r{done[0]}/{total}", end="" if done[0] < total else "\n", flush=True)

        return tick


def run_bench(config: BenchConfig, *, progress: bool = True) -> list[Sample]:
    """Measure every configuration; returns the raw samples."""
    total = (len(config.backends) if config.device == "cpu" else 1) * len(
        config.batch_sizes) * len(config.steps)
    tick = _progress(total, progress)
    source = cpu_samples if config.device == "cpu" else cuda_samples
    return list(source(config, tick))
