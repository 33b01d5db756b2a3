"""The checks: metadata updated in place against vLLM's rebuild, exit 1 where they differ.
``draftmeta verify`` (every backend that runs here), ``draftmeta audit`` (every draft hook of the
installed vLLM) and ``draftmeta infer`` (a spec inferred from a builder, then verified)."""

from __future__ import annotations

import argparse
import contextlib
import sys

from draftmeta.arguments import folder_problem, stdout_to_stderr
from draftmeta.commands.terminal import Progress, UsageError

__all__ = ["run_audit", "run_infer", "run_verify"]


def run_verify(args: argparse.Namespace) -> int:
    """``draftmeta verify``: update against rebuild over random batches for every backend that
    runs on ``--device`` (what it skips listed first, with why); 1 on any mismatch."""
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


def run_audit(args: argparse.Namespace) -> int:
    """``draftmeta audit``: every draft hook of the installed vLLM against vLLM's own rebuild on
    the device ``--device`` resolves to; the table (or ``--json``) on stdout, and in ``--out``
    its JSON; 1 on any failure or an uncaught negative control."""
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


def run_infer(args: argparse.Namespace) -> int:
    """``draftmeta infer``: :func:`draftmeta.integrations.vllm.tools.infer_cli.run` with its
    progress on stderr."""
    from draftmeta.integrations.vllm.tools.infer_cli import run

    with Progress("infer", enabled=not args.quiet) as progress:
        progress.update(f"inferring and verifying {args.builder}")
        with progress.stdout():
            return run(args)
