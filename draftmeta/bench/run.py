"""Running a benchmark: every configuration of a :class:`~draftmeta.bench.config.BenchConfig`
on its device, with a progress count."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from draftmeta.bench.config import BenchConfig, Sample
from draftmeta.bench.cpu import cpu_samples
from draftmeta.bench.cuda import cuda_samples

__all__ = ["run_bench"]


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """A tick per configuration: a tqdm bar on stderr (elapsed, rate, time left), cleared when
    the run ends; a count without tqdm; nothing when not ``enabled``."""
    if not enabled:
        yield lambda: None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        done = [0]

        def tick() -> None:
            done[0] += 1
            print(f"\rdraftmeta bench: {done[0]}/{total} configurations",
                  end="" if done[0] < total else "\n", file=sys.stderr, flush=True)

        yield tick
        return
    with tqdm(total=total, desc="draftmeta bench", unit="config", leave=False) as bar:
        yield lambda: bar.update(1) and None


def run_bench(config: BenchConfig, *, progress: bool = True) -> list[Sample]:
    """Measure every configuration; returns the raw samples."""
    total = (len(config.backends) if config.device == "cpu" else 1) * len(
        config.batch_sizes) * len(config.steps)
    source = cpu_samples if config.device == "cpu" else cuda_samples
    with _progress(total, progress) as tick:
        return list(source(config, tick))
