"""``draftmeta audit``: every draft hook of the installed vLLM against vLLM's own rebuild.

vLLM's new model runner updates attention metadata between draft steps with each builder's
``update_draft_decode_metadata`` hook; upstream writes those hooks by hand, and a wrong one
fails silently (stale lengths, a stale kernel schedule). The audit finds every builder whose
hook vLLM would call (vLLM's own, and those draftmeta's plugin gives a hook), builds each with
vLLM's own code on this machine's device (a CPU, or a CUDA GPU where there is one) and drives
its hook over random decode batches (:func:`~draftmeta.integrations.vllm.tools.audit_drive.drive`)
against three criteria, each a verdict of the row:

1. **update == rebuild** (``verdict``), as vLLM 0.34's fused draft loop drives it: the first
   step built from the runner's persistent inputs, then at every later step the inputs
   advanced in place and the hook run, the metadata compared field by field with a second
   builder's rebuild of a copy of the inputs (and the inputs with that copy: a hook that
   writes into a runner buffer is reported). The host ``max_seq_len`` is a bound: a hook may
   keep the runner's (``min(longest + K, max_model_len)``) or ``max_model_len``.
2. **idempotent** (``idempotent``): the hook applied twice for one draft step leaves the
   metadata as once, field by field, kernel schedules included.
3. **first step** (``first_step``): from the metadata as the runner builds it for capture
   (``build_for_cudagraph_capture`` over its dummy inputs), the hook alone reproduces vLLM's
   rebuild at the first draft step: vLLM's next draft loop calls the hook at the start of
   every draft step, the first included, on the objects it captured
   (:mod:`~draftmeta.integrations.vllm.tools.audit_criteria`).

On a GPU (:mod:`~draftmeta.integrations.vllm.tools.audit_gpu`) kernel schedules are compared as
their kernels read them, FlashMLA's decode runs on both sides, every 4th batch is placed
across a scheduler tile, and each batch ends with the hook captured in a CUDA graph and
replayed. A builder that needs another device, a kernel this machine lacks, or that does not
construct here is a row saying why (on a CPU, with the command to run on a GPU).
:mod:`~draftmeta.integrations.vllm.tools.audit_controls` holds the negative controls, which must
each be reported with their field. :func:`audit` returns an :class:`AuditReport` whose JSON
records the run (command, commit, device, vLLM's version, date).

>>> report = audit(["INDEXER"], batches=4)  # doctest: +SKIP
>>> report.ok  # doctest: +SKIP
True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import attrs

from draftmeta.integrations.vllm.plugin.plan import CoveredBy
from draftmeta.integrations.vllm.tools.audit_builders import (
    HookedBuilder,
    gpu_command,
    hooked_builders,
    registry_backend,
)
from draftmeta.integrations.vllm.tools.audit_controls import (
    CONTROLS,
    GPU_CONTROLS,
    Control,
    ControlResult,
    HookWrapper,
    matches,
)
from draftmeta.integrations.vllm.tools.audit_drive import (
    WORKSPACES,
    BatchFindings,
    Device,
    Found,
    NotConstructed,
    Target,
    drive,
)

__all__ = [
    "CONTROLS",
    "GPU_CONTROLS",
    "WORKSPACES",
    "AuditReport",
    "AuditRow",
    "Control",
    "ControlResult",
    "HookedBuilder",
    "audit",
    "audit_table",
    "gpu_command",
    "hooked_builders",
]

Owner = CoveredBy
"""Whose ``update_draft_decode_metadata`` vLLM's runner calls for a builder: vLLM's own, the
one draftmeta's plugin installed, or none (the builder's flag is off: vLLM rebuilds)."""

Verdict = Literal["equal", "mismatch", "not run", "error"]
"""Update == rebuild: ``error`` where driving the hook raised (the note says what)."""

Idempotent = Literal["yes", "no", "not run"]
"""Whether a second call of the hook for one draft step changed nothing."""

FirstStep = Literal["equal", "mismatch", "not run"]
"""Whether the hook alone turned the metadata built for capture into the first step's."""

_SHOWN = 3  # findings kept per row and criterion (the counts say how many there were)


@attrs.frozen
class AuditRow:
    """What the audit found for one builder (one KV cache, one DCP setting).

    Attributes:
        backend: vLLM's attention-backend name, with `` (FP8)`` for an FP8 KV cache and
            `` (DCP N)`` under decode context parallelism.
        builder: the builder class's qualified name.
        owner: whose hook ran (``none``: the builder's flag was off, so vLLM rebuilds and no
            hook was audited).
        batches: random batches driven.
        steps: hook calls compared with a rebuild.
        mismatched_steps: steps where anything differed from the rebuild.
        mismatches: the first few, as ``seed S step K: path: detail``.
        verdict: update == rebuild: ``equal``, ``mismatch``, ``not run`` or ``error``.
        note: why it was not run, what raised, or what the owner means here.
        idempotent: ``yes``, ``no`` or ``not run``.
        idempotence_failures: the first few differences a second call made.
        first_step: ``equal``, ``mismatch`` or ``not run``.
        first_step_mismatches: the first few differences from the first step's rebuild.
        device: ``cpu`` or ``cuda``.
        kv_cache_dtype: the KV cache's dtype (``auto``: the model's).
        replayed: batches whose hook was captured in a CUDA graph and replayed.
        crossing_batches: batches placed so that every request enters a new scheduler tile
            at the first advance.
    """

    backend: str
    builder: str
    owner: Owner
    batches: int = 0
    steps: int = 0
    mismatched_steps: int = 0
    mismatches: tuple[str, ...] = ()
    verdict: Verdict = "not run"
    note: str = ""
    idempotent: Idempotent = "not run"
    idempotence_failures: tuple[str, ...] = ()
    first_step: FirstStep = "not run"
    first_step_mismatches: tuple[str, ...] = ()
    device: str = "cpu"
    kv_cache_dtype: str = "auto"
    replayed: int = 0
    crossing_batches: int = 0

    @property
    def failed(self) -> tuple[str, ...]:
        """The criteria this row failed (``update == rebuild``, ``idempotent``, ``first
        step``; ``error`` where driving it raised)."""
        return tuple(name for name, bad in (
            ("update == rebuild", self.verdict == "mismatch"), ("error", self.verdict == "error"),
            ("idempotent", self.idempotent == "no"),
            ("first step", self.first_step == "mismatch")) if bad)


@attrs.frozen
class AuditReport:
    """The audit of one vLLM installation.

    Attributes:
        vllm_version: the installed ``vllm.__version__``.
        release: the draftmeta catalogue used.
        plugin: whether draftmeta's plugin was active (its hooks audited too).
        rows: one per builder, KV cache and DCP setting.
        controls: the negative controls' results (empty unless asked for).
        command: the command line that ran it.
        commit: ``git describe --always --dirty`` of draftmeta's checkout, else its version.
        device: the CPU's model or the GPU's name.
        date: when it ran (UTC).
    """

    vllm_version: str
    release: str
    plugin: bool
    rows: tuple[AuditRow, ...]
    controls: tuple[ControlResult, ...] = ()
    command: str = ""
    commit: str = ""
    device: str = ""
    date: str = ""

    @property
    def ok(self) -> bool:
        """No audited hook failed a criterion or raised, and every negative control that ran
        was caught."""
        return (not any(r.failed for r in self.rows)
                and all(c.caught for c in self.controls if c.ran))

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON-ready object (``draftmeta audit --json``)."""
        return {**attrs.asdict(self, recurse=True), "ok": self.ok}


@contextlib.contextmanager
def _hook_replaced(backend: str, wrap: HookWrapper) -> Iterator[None]:
    from draftmeta.integrations.patching import Patches
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.catalogue.classes import import_class

    name = "update_draft_decode_metadata"
    release = current_release()
    cls = (import_class(release.entry(backend).builder) if backend in release.names
           else registry_backend(backend).get_builder_cls())
    with Patches() as patches:  # restored exactly, an inherited hook included
        patches.replace(cls, name, wrap(getattr(cls, name)))
        yield


def _label(name: str, kv_cache_dtype: str, dcp_world: int) -> str:
    said = [*(["FP8"] if kv_cache_dtype.startswith("fp8") else []),
            *([f"DCP {dcp_world}"] if dcp_world > 1 else [])]
    return f"{name} ({', '.join(said)})" if said else name


def _shown(seed: int, found: list[Found]) -> list[str]:
    return [f"seed {seed} step {f.step}: {f.path}: {f.detail}" for f in found]


_STANDARD_ON_CPU = ("built for a tiny Llama on a CPU: what the builder computes only on CUDA "
                    "(FA3's ahead-of-time schedule) is absent on both sides; on a GPU machine "
                    "run {command}")


def _target(hooked: HookedBuilder, device: Device, kv_cache_dtype: str, dcp_world: int
            ) -> Target:
    return Target(hooked.name, device, dcp_world, kv_cache_dtype, hooked.standard,
                  hooked.recipe, hooked.flashmla)


def _audit_one(hooked: HookedBuilder, batches: int, seed: int, device: Device,
               kv_cache_dtype: str = "auto", dcp_world: int = 1) -> AuditRow:
    label = _label(hooked.name, kv_cache_dtype, dcp_world)
    row = AuditRow(label, hooked.builder, hooked.owner, device=device,
                   kv_cache_dtype=kv_cache_dtype)
    if hooked.runs_here is not None:
        return attrs.evolve(row, note=hooked.runs_here)
    target = _target(hooked, device, kv_cache_dtype, dcp_world)
    results: list[tuple[int, BatchFindings]] = []
    for s in range(seed, seed + batches):
        try:
            results.append((s, drive(target, s)))
        except NotConstructed as exc:
            if s == seed:
                where = "on a CPU" if device == "cpu" else "here"
                rerun = f"; on a GPU machine run {gpu_command(hooked.name)}" if \
                    device == "cpu" else ""
                return attrs.evolve(row, note=f"does not construct {where} ({exc}){rerun}")
            return attrs.evolve(row, verdict="error", batches=len(results),
                                note=f"seed {s}: its builders did not construct ({exc})")
        except Exception as exc:  # the hook or vLLM's build raised: the row says so
            said = (str(exc).splitlines() or [""])[0]
            return attrs.evolve(row, verdict="error", batches=len(results),
                                note=f"seed {s}: {type(exc).__name__}: {said}")
    return _row_of(row, hooked, results, device)


def _row_of(row: AuditRow, hooked: HookedBuilder, results: list[tuple[int, BatchFindings]],
            device: Device) -> AuditRow:
    owners = {f.owner for _, f in results}
    owner = owners.pop() if len(owners) == 1 else hooked.owner
    if owner == "none":
        return attrs.evolve(row, owner="none", batches=len(results),
                            note="its flag is off on this machine's builders: vLLM rebuilds")
    equal = [line for s, f in results for line in _shown(s, f.equal)]
    idem = [line for s, f in results for line in _shown(s, f.idempotent)]
    first = [line for s, f in results for line in _shown(s, f.first_step)]
    notes = [f"{len(equal)} differences" if equal else "",
             f"{len(idem)} differences on a second call" if idem else "",
             f"{len(first)} differences at the first step" if first else ""]
    if hooked.standard and device == "cpu":
        notes.append(_STANDARD_ON_CPU.format(command=gpu_command(hooked.name)))
    return attrs.evolve(
        row, owner=owner, batches=len(results), steps=sum(f.steps for _, f in results),
        mismatched_steps=sum(len({x.step for x in f.equal}) for _, f in results),
        mismatches=tuple(equal[:_SHOWN]), verdict="mismatch" if equal else "equal",
        note="; ".join(filter(None, notes)), idempotent="no" if idem else "yes",
        idempotence_failures=tuple(idem[:_SHOWN]),
        first_step="mismatch" if first else "equal", first_step_mismatches=tuple(first[:_SHOWN]),
        replayed=sum(f.replayed for _, f in results),
        crossing_batches=sum(f.crossing for _, f in results))


def _findings(found: BatchFindings, control: Control) -> list[Found]:
    if control.criterion == "idempotent":
        return found.idempotent
    return found.first_step if control.criterion == "first step" else found.equal


def _run_control(control: Control, batches: int, seed: int, device: Device = "cpu"
                 ) -> ControlResult:
    """Drive ``control``'s buggy hook over ``batches`` batches and say whether the audit
    reported its field under its criterion."""
    from draftmeta.integrations.vllm.catalogue import current_release

    release = current_release()
    standard = control.backend not in release.names
    flashmla = not standard and getattr(release.entry(control.backend).spec, "family",
                                        None) == "flashmla"
    target = Target(control.backend, device, 1, control.kv_cache_dtype, standard,
                    flashmla=flashmla)
    result = ControlResult(control.name, control.backend, control.field, False, (),
                           control.criterion)
    reported: dict[str, None] = {}
    informative = missed = ran = 0
    with _hook_replaced(control.backend, control.wrap):
        for s in range(seed, seed + batches):
            try:
                found = drive(target, s, placed=control.placed)
            except NotConstructed as exc:
                return attrs.evolve(result, note=f"its builder does not construct here ({exc})")
            except Exception as exc:  # the buggy hook raised: a control that ran, not caught
                said = (str(exc).splitlines() or [""])[0]
                return attrs.evolve(result, batches=ran + 1, informative=informative,
                                    missed=missed, reported=tuple(reported),
                                    note=f"seed {s}: {type(exc).__name__}: {said}")
            if found.owner == "none":
                return attrs.evolve(result, note="its builder has no hook here to put a bug in "
                                    "(its flag is off; with draftmeta's plugin off?)")
            ran += 1
            paths = [f.path for f in _findings(found, control)]
            reported.update(dict.fromkeys(paths))
            if found.schedule_changed is not False:  # FA3's right schedule kept: no evidence
                informative += 1
                missed += not any(matches(p, control.field) for p in paths)
    hit = any(matches(p, control.field) for p in reported)
    caught = informative > 0 and missed == 0 if control.placed else hit
    return attrs.evolve(result, caught=caught, reported=tuple(reported), batches=ran,
                        informative=informative, missed=missed)


@contextlib.contextmanager
def _plugin_as_configured(plugin: bool | None) -> Iterator[bool]:
    """draftmeta's plugin registered in this process where ``plugin`` (``None``: as
    ``DRAFTMETA_VLLM_PLUGIN`` says, on by default), unregistered afterwards if this put it
    there; the harness's environment set up first."""
    from draftmeta.integrations.vllm import plugin as vllm_plugin
    from draftmeta.integrations.vllm.plugin.plan import DISABLE_ENV
    from draftmeta.integrations.vllm.testing import harness

    active = vllm_plugin.enabled_by_environment() if plugin is None else plugin
    said = os.environ.get(DISABLE_ENV)
    os.environ[DISABLE_ENV] = "1" if active else "0"
    harness.prepare_environment()
    was = vllm_plugin.installed() is not None
    try:
        if active:
            vllm_plugin.register()
        elif was:
            raise RuntimeError("draftmeta's plugin is registered in this process; call "
                               "plugin.unregister() before auditing vLLM without it")
        yield active
    finally:
        if active and not was:
            vllm_plugin.unregister()
        if said is None:
            os.environ.pop(DISABLE_ENV, None)
        else:
            os.environ[DISABLE_ENV] = said


def audit(
    names: Sequence[str] | None = None,
    *,
    batches: int = 16,
    seed: int = 0,
    plugin: bool | None = None,
    negative_control: bool = False,
    echo: Callable[[str], None] | None = None,
    device: Device | None = None,
    dcp: Sequence[int] = (1, 2),
    command: str = "",
    controls: Sequence[Control] | None = None,
) -> AuditReport:
    """Audit the draft hooks of the installed vLLM (see the module's description).

    Args:
        names: the builders to audit (vLLM's backend names, ``INDEXER``); ``None``: every one
            :func:`hooked_builders` finds.
        batches: random batches per builder.
        seed: the first batch's seed (batch ``i`` uses ``seed + i``).
        plugin: audit with draftmeta's plugin active (its hooks too) or not; ``None``: as
            ``DRAFTMETA_VLLM_PLUGIN`` says (on unless set to 0).
        negative_control: also run :data:`CONTROLS` (and, on CUDA, :data:`GPU_CONTROLS`),
            each over ``batches`` batches.
        echo: called with what the audit does next (progress).
        device: where vLLM builds and the hooks run: ``cpu`` or ``cuda``; ``None``: where the
            harness points vLLM (:func:`~draftmeta.integrations.vllm.testing.harness.use_device`;
            the CPU unless told). vLLM keeps one platform per process.
        dcp: decode context parallelism: 1 audits every hook without it; N > 1 the hooks that
            serve DCP, for one rank of a stand-in group of N ranks (rank ``seed % N``).
        command: the command line to record (the JSON's ``command``).
        controls: the negative controls ``negative_control`` runs (default: :data:`CONTROLS`,
            and on CUDA :data:`GPU_CONTROLS`); those marked ``cuda`` run only there.

    Raises:
        ValueError: ``names`` has a builder without a hook here (the message lists those with
            one), ``batches`` or a DCP size is below 1.
        RuntimeError: vLLM is not installed, its release has no draft hook path, or vLLM
            already resolved another device's platform in this process.
    """
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.integrations.vllm.tools.audit_record import commit, device_name, now
    from draftmeta.integrations.vllm.versions import installed_version

    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    if not dcp or min(dcp) < 1:
        raise ValueError(f"DCP sizes must be at least 1 (1: without DCP), got {list(dcp)}")
    where: Device = device if device is not None else (
        "cuda" if harness.target_device() == "cuda" else "cpu")
    harness.use_device(where)
    started = now()
    with _plugin_as_configured(plugin) as active:
        found = hooked_builders(plugin=active, device=where)
        if names is not None:
            by_name = {h.name: h for h in found}
            unknown = [n for n in names if n not in by_name]
            if unknown:
                raise ValueError(f"no draft hook to audit for {', '.join(unknown)} in this "
                                 f"vLLM; builders with one: {', '.join(by_name)}")
            found = tuple(by_name[n] for n in dict.fromkeys(names))
        worlds = list(dict.fromkeys(dcp))
        work = [(h, kv, world) for h in found for kv in h.kv_cache_dtypes for world in worlds
                if world == 1 or h.dcp]
        rows: list[AuditRow] = []
        for i, (hooked, kv, world) in enumerate(work, 1):
            if echo is not None and hooked.runs_here is None:
                echo(f"auditing {_label(hooked.name, kv, world)} on {where}, {batches} batches "
                     f"({i}/{len(work)})")
            rows.append(_audit_one(hooked, batches, seed, where, kv, world))
        results = []
        chosen = [c for c in (controls if controls is not None else (*CONTROLS, *GPU_CONTROLS))
                  if not c.cuda or where == "cuda"]
        for control in chosen if negative_control else ():
            if echo is not None:
                echo(f"negative control: {control.backend}: {control.name}")
            results.append(_run_control(control, batches, seed, where))
    return AuditReport(str(installed_version()), current_release().version, active,
                       tuple(rows), tuple(results), command=command, commit=commit(),
                       device=f"{where}: {device_name(where)}", date=started)


def audit_table(report: AuditReport, *, width: int = 100) -> str:
    """:class:`AuditReport` as plain text: one row per builder with its three verdicts, what
    each failure found, then the negative controls and the verdict."""
    import textwrap

    head = (f"{'backend':<28} {'hook':<9} {'batches':>7} {'steps':>5}  {'update==rebuild':<15} "
            f"{'idempotent':<10} first step")
    lines = [f"vLLM {report.vllm_version} (catalogue {report.release}) on {report.device}; "
             f"draftmeta's plugin {'active' if report.plugin else 'off'}", "", head]
    indent = " " * 4
    for r in report.rows:
        counts = (f"{r.batches:>7} {r.steps:>5}" if r.verdict not in ("not run",)
                  else f"{'-':>7} {'-':>5}")
        lines.append(f"{r.backend:<28} {r.owner:<9} {counts}  {r.verdict:<15} "
                     f"{r.idempotent:<10} {r.first_step}")
        said = [*r.mismatches, *(f"second call: {m}" for m in r.idempotence_failures),
                *(f"first step: {m}" for m in r.first_step_mismatches),
                *([r.note] if r.note else [])]
        for text in said:
            lines.extend(textwrap.wrap(text, width, initial_indent=indent,
                                       subsequent_indent=indent + "  ",
                                       break_long_words=False, break_on_hyphens=False))
    if report.controls:
        lines += ["", "negative controls (a deliberate bug in a hook; the audit must name the "
                  "field under its criterion):"]
        for c in report.controls:
            verdict = "caught" if c.caught else ("not run" if not c.ran else "MISSED")
            shown = (f"reported: {', '.join(c.reported) or 'nothing'}" if c.ran else c.note)
            if c.ran and c.informative != c.batches:
                shown += f"; {c.informative} of {c.batches} batches could show it"
            lines.extend(textwrap.wrap(
                f"{verdict:<7} {c.backend} [{c.criterion}]: {c.control} ({shown})", width,
                initial_indent="  ", subsequent_indent=" " * 10, break_long_words=False,
                break_on_hyphens=False))
    audited = [r for r in report.rows if r.verdict != "not run"]
    missed = [c.control for c in report.controls if c.ran and not c.caught]
    failing = [f"{r.backend} ({', '.join(r.failed)})" for r in report.rows if r.failed]
    lines.append("")
    if failing or missed:
        lines.append("audit: FAILED: " + "; ".join(
            ([f"hooks failing: {', '.join(failing)}"] if failing else [])
            + ([f"controls missed: {', '.join(missed)}"] if missed else [])))
    else:
        caught = [c for c in report.controls if c.ran]
        lines.append(f"audit: {len(audited)} hook{'s' * (len(audited) != 1)} equal to vLLM's "
                     "rebuild, idempotent, and equal at the first step"
                     + (f", {len(caught)} negative controls caught" if caught else "")
                     + f"; {len(report.rows) - len(audited)} not run here")
    return "\n".join(lines)
