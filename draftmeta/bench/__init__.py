"""``draftmeta bench``: host and device time per draft step, rebuild versus in-place update.

CPU (the default, with vLLM installed): for each vLLM builder that runs on CPU, at each batch
size and number of draft steps K, the metadata is built once, then for steps 2..K the draft
state is advanced (timed on its own: the same work on both paths) and the metadata is either
rebuilt with vLLM's ``build_for_drafting`` or updated in place by draftmeta's generated function.

CUDA (``--device cuda``, no vLLM needed): the Triton-MLA and DeepSeek-V3.2 indexer specs as two
groups over one draft state, metadata made by :mod:`draftmeta.testing.reference_builds`; paths: the
plain-torch rebuild, the eager generated updates, the fused one-launch step, and the captured
whole loop (graph replay), with CUDA events for device time and the profiler's count of kernel
launches per step.

After a warm-up run the paths take turns, run by run (A B C, then C B A, ...), and the baseline
(the rebuild) is timed twice, the second time as an A/A control; run ``i`` of each path makes pair
``i``. Reported: medians and p90 per path, and each comparison's ratio per pair (median, min-max)
with the verdict of :mod:`draftmeta.measure.noise`. Raw numbers go to JSON with the machine, its
load,
torch and vLLM versions; a PNG plots time per step against batch size, one line per path, and
the pair ratios with their min-max as error bars.

Modules, one job each:

* :mod:`draftmeta.bench.config`: what to measure (:class:`BenchConfig`) and one measurement
  (:class:`Sample`);
* :mod:`draftmeta.bench.states`: the draft states a run starts from, and their reset;
* :mod:`draftmeta.bench.cpu`: the CPU benchmark against vLLM's real builders;
* :mod:`draftmeta.bench.cuda`: the CUDA benchmark (events, launch counts, captured loop);
* :mod:`draftmeta.bench.run`: :func:`run_bench`, every configuration on its device;
* :mod:`draftmeta.bench.report`: the summary, its text and Markdown tables, JSON and PNG files.
"""

from __future__ import annotations

from draftmeta.bench.config import BenchConfig, Sample
from draftmeta.bench.report import markdown_table, summarize, table, write_results
from draftmeta.bench.run import run_bench

__all__ = [
    "BenchConfig",
    "Sample",
    "markdown_table",
    "run_bench",
    "summarize",
    "table",
    "write_results",
]
