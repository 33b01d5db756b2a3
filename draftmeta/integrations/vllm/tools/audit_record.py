"""What an audit's JSON records of its run: the commit, the device, the date.

``draftmeta audit --json`` (and ``--out``) puts these at the top level beside vLLM's version and
the command line, so that a committed result says what produced it:
:func:`commit` (``git describe --always --dirty`` of the checkout draftmeta runs from, else
draftmeta's version), :func:`device_name` (the CPU's model or the GPU's name) and :func:`now`.
"""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

__all__ = ["commit", "device_name", "now"]


def commit() -> str:
    """``git describe --always --dirty`` of the checkout draftmeta is imported from, or
    ``draftmeta X.Y.Z`` (its version) where it is not a checkout (an installed wheel) or git
    is missing."""
    import draftmeta

    root = Path(draftmeta.__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root,
                                  capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            pass
        else:
            if done.stdout.strip():
                return done.stdout.strip()
    return f"draftmeta {draftmeta.__version__}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    """The device an audit ran on: the GPU's name for ``cuda`` (the first visible one), else
    the CPU's model (``/proc/cpuinfo``, else what Python's ``platform`` says)."""
    if device == "cuda":
        import torch

        return str(torch.cuda.get_device_name())
    return _cpu_model()


def now() -> str:
    """The current UTC time, ``2026-12-07T14:03:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
