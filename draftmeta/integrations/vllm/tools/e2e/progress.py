"""What a long end-to-end run is doing, on stderr: each engine start and each generate, with the
time elapsed and an estimate of the time left, and never a long silence.

:class:`RunProgress` takes the run's plan (one kind per unit of work, in order: ``engine``,
``generate b4`` ...) before it starts. Each unit says when it begins (:meth:`RunProgress.step`),
which ends the one before; the time left is each remaining unit's kind's mean measured duration
(a kind not measured yet counts as its family's mean, ``generate b4`` as ``generate b1``'s; until
every family left has been measured once, it says it is estimating), so an engine start, which
takes many generates' time, does not skew the estimate of the generates after it.

On a terminal it is a tqdm bar, redrawn every second (the elapsed time moves while a unit runs);
elsewhere (a log file, nox's output, a pipe) every unit is one plain line, and a unit that runs
longer than :data:`HEARTBEAT_SECONDS` prints a line again, so that no minute passes without one.
Without tqdm the plain lines serve the terminal too.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["HEARTBEAT_SECONDS", "RunProgress", "clock"]

HEARTBEAT_SECONDS = 30.0
"""Away from a terminal, a unit of work running this long prints its line again."""


def clock(seconds: float) -> str:
    """``1:05`` (minutes and seconds) or ``1:02:05``, as tqdm writes times."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RunProgress:
    """Progress of a run of ``len(plan)`` units of work; see the module docs.

    Args:
        plan: the kind of each unit, in the order they run.
        enabled: ``False`` prints nothing (``--quiet``).
        stream: where to write (stderr).
        label: what each line starts with.
        heartbeat: away from a terminal, the seconds after which a unit still running prints
            its line again.
        bar: draw a tqdm bar (default: where ``stream`` is a terminal and tqdm is installed).
    """

    def __init__(self, plan: Sequence[str], *, enabled: bool = True,
                 stream: TextIO | None = None, label: str = "draftmeta e2e",
                 heartbeat: float = HEARTBEAT_SECONDS, bar: bool | None = None) -> None:
        self.plan = list(plan)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.heartbeat = heartbeat
        self.done = 0
        self.started = time.monotonic()
        self.what = ""
        self._kind = ""
        self._unit_started = self.started
        self._last_line = self.started
        self._durations: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        if enabled and (bar if bar is not None else self.stream.isatty()):
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=len(self.plan), file=self.stream, leave=False,
                                 desc=label, mininterval=0, dynamic_ncols=True,
                                 bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| "
                                            "[{elapsed} elapsed{postfix}]")

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._thread = threading.Thread(target=self._tick, daemon=True,
                                            name="draftmeta-e2e-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._bar is not None:
                self._bar.close()

    @property
    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def left(self) -> float | None:
        """The estimated seconds left (module docs); ``None`` until a unit of every family still
        to run (``engine``, ``generate``) has finished."""
        if not self._durations:
            return None
        means = {kind: statistics.fmean(values) for kind, values in self._durations.items()}
        families: dict[str, list[float]] = {}
        for kind, values in self._durations.items():
            families.setdefault(kind.split(" ")[0], []).extend(values)
        remaining = self.plan[self.done:]
        if any(kind.split(" ")[0] not in families for kind in remaining):
            return None  # an engine start and a generate differ too much to guess one

        def expected(kind: str) -> float:
            if kind in means:
                return means[kind]
            return statistics.fmean(families[kind.split(" ")[0]])

        pending = sum(expected(kind) for kind in self.plan[self.done + 1:])
        if self.what and self.done < len(self.plan):
            running = time.monotonic() - self._unit_started
            pending += max(0.0, expected(self.plan[self.done]) - running)
        return pending

    def step(self, kind: str, what: str) -> None:
        """The plan's next unit, of ``kind``, begins, doing ``what``; the one before it ends."""
        with self._lock:
            self._end_unit()
            self.what, self._kind = what, kind
            self._unit_started = time.monotonic()
            self._show()

    def finish(self) -> None:
        """The last unit ends."""
        with self._lock:
            self._end_unit()
            if self._bar is not None:
                self._bar.n = self.done
                self._bar.refresh()

    def _end_unit(self) -> None:
        """Count the unit running, if any, as done (with the lock held)."""
        if self.what:
            self._durations.setdefault(self._kind, []).append(
                time.monotonic() - self._unit_started)
            self.done += 1
            self.what = ""

    def line(self, text: str) -> None:
        """A line of its own (a result, a warning) that does not break the bar."""
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.write(f"{self.label}: {text}", file=self.stream)
            else:
                print(f"{self.label}: {text}", file=self.stream, flush=True)
            self._last_line = time.monotonic()

    def status(self) -> str:
        """``[3/58, 0:41 elapsed, ~5:10 left]`` for the unit now running."""
        left = self.left()
        estimate = "estimating what is left" if left is None else f"~{clock(left)} left"
        return (f"[{min(self.done + 1, len(self.plan))}/{len(self.plan)}, "
                f"{clock(self.elapsed)} elapsed, {estimate}]")

    def _show(self) -> None:
        """Draw the bar, or print the unit's line (with the lock held)."""
        if not self.enabled:
            return
        if self._bar is not None:
            left = self.left()
            self._bar.n = self.done
            self._bar.set_description_str(f"{self.label}: {self.what}", refresh=False)
            self._bar.set_postfix_str("estimating what is left" if left is None
                                      else f"~{clock(left)} left", refresh=False)
            self._bar.refresh()
            return
        running = time.monotonic() - self._unit_started
        still = f" (still running, {clock(running)} so far)" if running >= self.heartbeat else ""
        print(f"{self.label}: {self.status()} {self.what}{still}", file=self.stream, flush=True)
        self._last_line = time.monotonic()

    def _tick(self) -> None:
        interval = 1.0 if self._bar is not None else min(1.0, self.heartbeat / 4)
        while not self._stop.wait(interval):
            with self._lock:
                if not self.what:
                    continue
                if self._bar is not None or time.monotonic() - self._last_line >= self.heartbeat:
                    self._show()
