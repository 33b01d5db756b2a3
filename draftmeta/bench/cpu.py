"""The CPU benchmark: vLLM's real builders, rebuild versus draftmeta's in-place update.

For each vLLM builder that runs on CPU, at each batch size and number of draft steps K, the
metadata is built once, then for steps 2..K the draft state is advanced (timed on its own: the
same work on both paths) and the metadata is either rebuilt with vLLM's ``build_for_drafting`` or
updated in place by draftmeta's generated function; the rebuild runs a second time as the A/A
control, and the three take turns run by run (:func:`draftmeta.measure.noise.alternating`). Needs
vLLM,
imported only when run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from draftmeta.advance import advance_state
from draftmeta.bench.config import BenchConfig, Sample
from draftmeta.bench.states import bench_state, reset_state
from draftmeta.measure.noise import alternating

__all__ = ["PATHS", "TIMED", "cpu_samples"]

TIMED = ("rebuild", "update", "rebuild (A/A)")
"""The paths timed in turn: vLLM's rebuild, draftmeta's update, and the rebuild again as the
A/A control (:data:`draftmeta.bench.config.CONTROLS`)."""
PATHS = ("advance", *TIMED)
"""Every path a CPU configuration gives a sample of: the shared advance (timed on the update's
runs) and :data:`TIMED`."""


def cpu_samples(config: BenchConfig, tick: Callable[[], None]) -> Iterator[Sample]:
    """Per backend, batch size and K: one sample per path of :data:`PATHS`, their runs
    taking turns (one warm-up run first); a run is ``loops_per_run`` draft loops, its time per
    step the median of their steps; ``tick`` is called after each configuration."""
    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.integrations.vllm.testing.equivalence import BUILDERS

    for backend in config.backends:
        block = 64 if backend == "INDEXER" else config.block_size
        cfg = harness.cached_vllm_config(max_model_len=config.max_model_len, block_size=block,
                                         max_num_seqs=max(config.batch_sizes))
        spec = BUILDERS[backend].make_spec()
        for batch in config.batch_sizes:
            for k in config.steps:
                state = bench_state(batch, k, block, config.max_model_len, seed=batch * 100 + k)
                start = state.clone()
                kwargs: dict[str, Any] = {"block_size": block}
                if backend == "INDEXER":
                    kwargs["block_table_width"] = state.block_table.shape[1]
                builder = harness.make_builder(backend, cfg, **kwargs)
                cad = harness.common_metadata_for(state)
                metadata = harness.build_metadata(builder, cad, draft_index=1)
                times: dict[str, list[float]] = {p: [] for p in PATHS}
                runs: dict[str, list[float]] = {p: [] for p in PATHS}
                # one warm-up run, then the paths in turn (rule 1 of draftmeta.measure.noise)
                for repeat, path in alternating(TIMED, config.repeats + 1):
                    run: dict[str, list[float]] = {path: [], "advance": []}
                    for _ in range(config.loops_per_run):
                        reset_state(state, start)
                        cad.max_seq_len = state.max_seq_len
                        for step in range(2, k + 1):
                            t0 = time.perf_counter_ns()
                            advance_state(state)
                            t1 = time.perf_counter_ns()
                            if path != "update":  # the rebuild, or the rebuild again (A/A)
                                cad.max_seq_len = state.max_seq_len
                                t1 = time.perf_counter_ns()
                                harness.build_metadata(builder, cad, draft_index=step)
                            else:
                                spec.update(metadata, state)
                            t2 = time.perf_counter_ns()
                            run[path].append((t2 - t1) / 1e3)
                            if path == "update":
                                run["advance"].append((t1 - t0) / 1e3)
                    if repeat:
                        for name, values in run.items():
                            if values:
                                times[name] += values
                                runs[name].append(statistics.median(values))
                for path in PATHS:
                    yield Sample(backend, path, batch, k, tuple(times[path]),
                                 run_us=tuple(runs[path]))
                tick()
