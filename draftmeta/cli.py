"""The ``draftmeta`` command: explain, verify, coverage, audit, bench, e2e, infer.

This module is the command line itself: its parser (every command's options and help, the
commands grouped on :mod:`draftmeta.commands` by role, ``e2e`` and ``infer`` adding their own),
:func:`main` and the site's generated reference of it (:func:`markdown_reference`).

Exit codes: 0 success, 1 a check failed (``verify`` found a mismatch), 2 a user mistake (bad
arguments, an unknown name, an output folder that is a file: one line on stderr), 130 Ctrl-C,
141 the output's reader went away (``| head``), silently.

vLLM's log lines and torch's and vLLM's warnings are kept off the terminal unless ``-v`` is
given; commands that take longer than a few seconds show what they are doing on stderr
(:mod:`draftmeta.commands.terminal`).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from draftmeta.arguments import (
    DEFAULT_OUT,
    FORCE_HELP,
    OUT_HELP,
    integer_in,
    positive,
    seed,
)
from draftmeta.commands.checks import run_audit, run_infer, run_verify
from draftmeta.commands.inspection import run_coverage, run_explain
from draftmeta.commands.measurement import run_bench
from draftmeta.commands.terminal import UsageError, quiet_imports

__all__ = ["BENCH_MAX_BATCH_SIZE", "HelpFormatter", "main", "markdown_reference", "parser",
           "version"]


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
    e.set_defaults(run=run_explain)

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
    v.set_defaults(run=run_verify)

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
    c.set_defaults(run=run_coverage)

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
    a.set_defaults(run=run_audit)

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
    b.set_defaults(run=run_bench)

    from draftmeta.integrations.vllm.tools.e2e.cli import add_parser as add_e2e
    from draftmeta.integrations.vllm.tools.infer_cli import add_parser as add_infer

    _add_common(add_e2e(sub))
    i = add_infer(sub)
    _add_common(i)
    i.set_defaults(run=run_infer)
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
        with quiet_imports(args.verbose, preload_torch=args.command != "explain"):
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
