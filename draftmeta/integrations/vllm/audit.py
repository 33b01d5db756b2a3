"""``draftmeta audit``: every draft hook of the installed vLLM against vLLM's own rebuild.

vLLM's new model runner updates attention metadata between draft steps with each builder's
``update_draft_decode_metadata`` hook; upstream writes those hooks by hand, and a wrong one
fails silently (stale lengths, a stale kernel schedule). The audit finds every builder whose
hook vLLM would call (vLLM's own, and those draftmeta's plugin gives a hook) and drives each
the way vLLM 0.34's runner drives it in its fused draft loop, over random decode batches:

1. a builder builds the first draft step's metadata from the runner's persistent inputs
   (sequence lengths, positions, slot mapping, block table: a draft state whose tensors the
   common metadata views), with the host ``max_seq_len`` at the loop's upper bound
   (``min(longest + K, max_model_len)``), as the runner passes it;
2. at every later step the inputs advance in place (positions and lengths + 1, slots from the
   block table, lengths clamped at ``max_model_len``: the runner's ``update_draft_inputs`` and
   ``compute_slot_mappings``; under decode context parallelism the rank's local lengths too),
   then the builder's hook runs on the metadata;
3. the metadata is compared field by field with what a second builder (its own buffers)
   builds from a copy of the inputs taken before the hook, and the inputs with that copy: a
   hook that writes into a runner buffer is reported as well.

The host ``max_seq_len`` is an upper bound, not an exact value: the runner passes
``min(longest + K, max_model_len)`` for a whole loop, and a captured graph keeps the value it
was captured with. A hook may keep either bound: where the metadata differs from the rebuild
under the runner's bound, it is compared with a rebuild under ``max_model_len`` (what
draftmeta's hooks keep), and passes if that one is equal in every field, values a builder
derives from the bound (AMX's split count, a DCP rank's share) included.

Batches mix lengths just before block boundaries and near ``max_model_len``, padded rows and
block sizes; K runs from 2 to 8. Builders that construct only on a GPU are listed with why they
were not run. :data:`CONTROLS` are the negative controls: vLLM's own indexer hook made to skip
one refresh, or to write a wrong value into a buffer, must each be reported with the field.

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
import torch

from draftmeta.integrations.vllm.plan import CoveredBy
from draftmeta.protocol import spec_of

__all__ = [
    "CONTROLS",
    "WORKSPACES",
    "AuditReport",
    "AuditRow",
    "Control",
    "ControlResult",
    "audit",
    "audit_table",
    "hooked_builders",
]

Owner = CoveredBy
"""Whose ``update_draft_decode_metadata`` vLLM's runner calls for a builder: vLLM's own, the
one draftmeta's plugin installed, or none (the builder's flag is off: vLLM rebuilds)."""

Verdict = Literal["equal", "mismatch", "not run"]

HookWrapper = Callable[[Callable[[Any, Any], None]], Callable[[Any, Any], None]]
"""Turns a builder class's hook into another (the negative controls' deliberate bugs)."""

_SHOWN = 3  # mismatches kept per row (the count says how many there were)


@attrs.frozen
class HookedBuilder:
    """A builder of the installed vLLM whose draft hook the audit knows of.

    Attributes:
        name: vLLM's attention-backend name (the catalogue's name where it has one).
        builder: the builder class's qualified name.
        owner: whose hook vLLM would call, as far as the class tells (an instance may still
            turn its flag off: under DCP, without full CUDA graphs).
        runs_here: ``None`` where the audit builds it on this machine, else why not.
        dcp: audit it under decode context parallelism (2 ranks) too: draftmeta's hook serves
            it there, where vLLM declares none.
        standard: a standard-attention backend outside the catalogue, built for a tiny Llama
            (:func:`~draftmeta.integrations.vllm.testing.harness.make_attention_builder`);
            where it does not construct on a CPU, its row says why.
    """

    name: str
    builder: str
    owner: Owner
    runs_here: str | None
    dcp: bool = False
    standard: bool = False


@attrs.frozen
class AuditRow:
    """What the audit found for one builder (and one DCP setting).

    Attributes:
        backend: vLLM's attention-backend name, with `` (DCP 2)`` for the DCP row.
        builder: the builder class's qualified name.
        owner: whose hook ran (``none``: the builder's flag was off, so vLLM rebuilds and no
            hook was audited).
        batches: random batches driven.
        steps: hook calls compared with a rebuild.
        mismatched_steps: steps where anything differed.
        mismatches: the first few, as ``seed S step K: path: detail``.
        verdict: ``equal``, ``mismatch`` or ``not run``.
        note: why it was not run, or what the owner means here.
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


@attrs.frozen
class Control:
    """A negative control: one builder's hook with a deliberate bug the audit must report.

    Attributes:
        name: what the bug is, in a few words.
        backend: the builder whose hook is changed.
        field: the metadata (or runner input) path the audit must name.
        wrap: makes the buggy hook from the builder class's own.
    """

    name: str
    backend: str
    field: str
    wrap: HookWrapper


@attrs.frozen
class ControlResult:
    """What the audit said of a negative control.

    Attributes:
        control: the control's name.
        backend: the builder it changed.
        field: the path that had to be reported.
        caught: whether a mismatch named ``field``.
        reported: the distinct paths the audit reported.
    """

    control: str
    backend: str
    field: str
    caught: bool
    reported: tuple[str, ...]


@attrs.frozen
class AuditReport:
    """The audit of one vLLM installation.

    Attributes:
        vllm_version: the installed ``vllm.__version__``.
        release: the draftmeta catalogue used.
        plugin: whether draftmeta's plugin was active (its hooks audited too).
        rows: one per builder (and DCP setting).
        controls: the negative controls' results (empty unless asked for).
    """

    vllm_version: str
    release: str
    plugin: bool
    rows: tuple[AuditRow, ...]
    controls: tuple[ControlResult, ...] = ()

    @property
    def ok(self) -> bool:
        """No audited hook mismatched, and every negative control was caught."""
        return (all(r.verdict != "mismatch" for r in self.rows)
                and all(c.caught for c in self.controls))

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON-ready object (``draftmeta audit --json``)."""
        return {**attrs.asdict(self, recurse=True), "ok": self.ok}


def _skip_refresh(field: str) -> HookWrapper:
    """A hook that runs vLLM's, then puts ``field`` back as it was: the refresh skipped."""
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def skipping(builder: Any, metadata: Any) -> None:
            target = _field(metadata, field)
            before = target.clone()
            hook(builder, metadata)
            target.copy_(before)
        return skipping
    return wrap


def _write_wrong(field: str) -> HookWrapper:
    """A hook that runs vLLM's, then adds 1 to the first entry of ``field``'s buffer."""
    def wrap(hook: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def writing(builder: Any, metadata: Any) -> None:
            hook(builder, metadata)
            _field(metadata, field).view(-1)[0] += 1
        return writing
    return wrap


def _field(metadata: Any, path: str) -> torch.Tensor:
    value = metadata
    for part in path.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{path} is a {type(value).__name__}, not a tensor")
    return value


CONTROLS: tuple[Control, ...] = (
    Control("the hook skips its slot_mapping refresh", "KPOOL_TAIL", "slot_mapping",
            _skip_refresh("slot_mapping")),
    Control("the hook writes a wrong value into decode.block_table", "INDEXER",
            "decode.block_table", _write_wrong("decode.block_table")),
    Control("the hook writes a wrong value into the runner's slot mapping", "INDEXER",
            "slot_mapping", _write_wrong("slot_mapping")),
    Control("the no-op hook writes a wrong value into the runner's sequence lengths",
            "TRITON_ATTN", "seq_lens", _write_wrong("seq_lens")),
)
"""The negative controls of ``draftmeta audit --negative-control``: vLLM's own hooks of the
GLM K-pool tail and the DeepSeek-V3.2 indexer (``refresh`` hooks whose builders construct on a
CPU) and of Triton attention (a no-op, built for a tiny Llama) with one deliberate bug each;
the audit must name the field each one leaves wrong."""


_PLUGIN_HOOKS = "draftmeta.integrations.vllm.hook"
"""The module whose functions the plugin installs as hooks."""


def _declares_hook(cls: type) -> bool:
    """Whether vLLM's own code gives ``cls`` a hook: the nearest definition in its class
    hierarchy that is not draftmeta's (the plugin's replacement serves only the exact class it
    patched, and the catalogue lists those) is not the base class's."""
    from vllm.v1.attention.backend import AttentionMetadataBuilder

    for klass in cls.__mro__:
        hook = klass.__dict__.get("update_draft_decode_metadata")
        if hook is None or getattr(hook, "__module__", "") == _PLUGIN_HOOKS:
            continue
        return klass is not AttentionMetadataBuilder
    return False


def _registry_builders() -> dict[str, type | str]:
    """vLLM's attention backends by name: the builder class, or why it does not load here."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    found: dict[str, type | str] = {}
    for member in AttentionBackendEnum:
        try:
            found[member.name] = member.get_class().get_builder_cls()
        except Exception as exc:  # a backend that does not load here: said in its row
            said = (str(exc).splitlines() or [""])[0]
            found[member.name] = f"{type(exc).__name__}: {said}"
    return found


def hooked_builders(*, plugin: bool = True) -> tuple[HookedBuilder, ...]:
    """Every builder of the installed vLLM with a draft hook: the catalogue's builders whose
    class declares one or to which draftmeta's plan (with ``plugin`` active) gives one, then
    every other backend of vLLM's registry whose builder class declares one."""
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.plan import make_plan
    from draftmeta.integrations.vllm.release import installed_version

    version = installed_version()
    if version is None:
        raise RuntimeError("vLLM is not installed")
    release = current_release()
    if "hook" not in release.paths:
        raise RuntimeError(f"vLLM {version} has no draft hook (update_draft_decode_metadata): "
                           "its draft loop rebuilds or takes the older proposer's path, so "
                           "there is no hook to audit")
    plan = make_plan(version)
    rows: list[HookedBuilder] = []
    for decision in plan.on("hook"):
        entry, cls = decision.entry, decision.cls
        ours = plugin and decision.covered_by == "draftmeta"
        # vLLM's own hook: its class declares one, or (a class that does not import here)
        # the catalogue says it does
        theirs = _declares_hook(cls) if cls is not None else entry.hook != "none"
        if not (ours or theirs or (plugin and decision.dcp_only)):
            continue
        if entry.harness is not None:
            runs_here = None
        elif cls is None:
            runs_here = f"does not import here ({decision.reason})"
        else:
            runs_here = "its builder constructs only on a GPU (owed on a GPU machine)"
        rows.append(HookedBuilder(entry.name, entry.builder.qualname,
                                  "draftmeta" if ours else "vllm", runs_here,
                                  dcp=plugin and decision.dcp_only and runs_here is None))
    known = set(release.names)
    for name, loaded in _registry_builders().items():
        if name in known or isinstance(loaded, str):  # a str: it does not load here
            continue
        if not _declares_hook(loaded):
            continue
        backend = _registry_backend(name)
        standard = backend is not None and not backend.is_mla()
        rows.append(HookedBuilder(
            name, loaded.__qualname__, "vllm",
            None if standard else "an MLA backend outside draftmeta's catalogue: no recipe to "
            "build it on a CPU (owed on a GPU machine)", standard=standard))
    return tuple(rows)


def _registry_backend(name: str) -> Any:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    try:
        return AttentionBackendEnum[name].get_class()
    except Exception:  # does not load here: the caller lists it as not run
        return None


@contextlib.contextmanager
def _hook_replaced(backend: str, wrap: HookWrapper) -> Iterator[None]:
    from draftmeta.integrations.patching import Patches
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.classes import import_class

    name = "update_draft_decode_metadata"
    release = current_release()
    cls = (import_class(release.entry(backend).builder) if backend in release.names
           else _registry_backend(backend).get_builder_cls())
    with Patches() as patches:  # restored exactly, an inherited hook included
        patches.replace(cls, name, wrap(getattr(cls, name)))
        yield


def _owner(builder: Any) -> Owner:
    if spec_of(builder) is not None:  # the plugin bound a spec (hook.bind)
        return "draftmeta"
    return "vllm" if getattr(builder, "supports_draft_decode_metadata_update", False) else "none"


_INPUTS = ("positions", "seq_lens", "slot_mapping", "block_table", "query_start_loc",
           "dcp_local_seq_lens")


def _inputs_written(before: Any, after: Any) -> list[str]:
    """The runner inputs the hook changed (``before``: a copy taken just before it ran)."""
    written = []
    for name in _INPUTS:
        a, b = getattr(before, name), getattr(after, name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not torch.equal(a, b):
            written.append(name)
    return written


def _runner_view(state: Any) -> Any:
    """vLLM's common metadata over ``state``'s buffers as vLLM 0.34's runner describes a padded
    batch: padding rows count as requests (``num_reqs`` is the padded count; their lengths are
    0 and their slots -1), while the advance moves only the real ones."""
    from draftmeta.integrations.vllm.testing import harness

    return harness.common_metadata_for(attrs.evolve(state, num_reqs=state.seq_lens.shape[0]))


def _drive(name: str, seed: int, *, dcp_world: int = 1, standard: bool = False
           ) -> tuple[Owner, int, list[tuple[int, str, str]]]:
    """One random batch through ``name``'s hook: its owner, the steps compared, and every
    ``(step, path, detail)`` that differed."""
    from draftmeta.advance import advance_state
    from draftmeta.integrations.vllm.testing import harness
    from draftmeta.integrations.vllm.testing.equivalence import compare_on_cpu, random_case
    from draftmeta.testing import random_state

    rank = seed % dcp_world
    if standard:  # block sizes 16 and 64, as TRITON_MLA's cases draw them
        case = attrs.evolve(random_case("TRITON_MLA", seed), builder=name)
        updater, rebuilder = (harness.make_attention_builder(
            name, max_model_len=case.max_model_len, block_size=case.block_size)
            for _ in range(2))
    else:
        case = random_case(name, seed)
        config = harness.cached_vllm_config(
            max_model_len=case.max_model_len, block_size=case.block_size,
            dcp_world_size=dcp_world, cudagraph_mode="FULL_DECODE_ONLY")
        kwargs: dict[str, Any] = {"block_size": case.block_size, "dcp_rank": rank}
        if name == "INDEXER":
            kwargs["block_table_width"] = -(-case.max_model_len // case.block_size)
        updater = harness.make_builder(name, config, **kwargs)
        rebuilder = harness.make_builder(name, config, **kwargs)
    owner = _owner(updater)
    if owner == "none":
        return owner, 0, []
    g = torch.Generator().manual_seed(seed)
    state = random_state(g, batch_size=case.batch_size, block_size=case.block_size,
                         max_model_len=case.max_model_len, steps=case.steps,
                         num_padded=case.num_padded)
    upper = min(state.max_seq_len + case.steps, case.max_model_len)  # the runner's bound
    state.max_seq_len = upper
    if dcp_world > 1:
        state.dcp_world_size, state.dcp_rank = dcp_world, rank
        state.dcp_local_seq_lens = harness.dcp_local_seq_lens(state.seq_lens, dcp_world, rank, 1)
    metadata = harness.build_metadata(updater, _runner_view(state))
    found: list[tuple[int, str, str]] = []
    for step in range(2, case.steps + 1):
        advance_state(state, "clamp")
        state.max_seq_len = upper  # the host value stays the loop's upper bound
        before = state.clone()
        updater.update_draft_decode_metadata(metadata)
        found += [(step, f"runner input {n}", "written by the hook")
                  for n in _inputs_written(before, state)]
        if dcp_world > 1:  # the rebuild's local lengths from vLLM's own function
            before.dcp_local_seq_lens = harness.dcp_local_seq_lens(before.seq_lens, dcp_world,
                                                                    rank, 1)
        differ = compare_on_cpu(metadata, harness.build_metadata(rebuilder, _runner_view(before)),
                                workspaces=WORKSPACES)
        if differ:  # equal under the other bound a hook may keep: max_model_len
            before.max_seq_len = case.max_model_len
            at_limit = harness.build_metadata(rebuilder, _runner_view(before))
            differ = differ if compare_on_cpu(metadata, at_limit, workspaces=WORKSPACES) else []
        found += [(step, m.path, m.detail) for m in differ]
    return owner, case.steps - 1, found


def _audit_one(hooked: HookedBuilder, batches: int, seed: int, dcp_world: int = 1
               ) -> AuditRow:
    label = hooked.name if dcp_world == 1 else f"{hooked.name} (DCP {dcp_world})"
    if hooked.runs_here is not None:
        return AuditRow(label, hooked.builder, hooked.owner, note=hooked.runs_here)
    owners: set[Owner] = set()
    steps = bad_steps = 0
    shown: list[str] = []
    for s in range(seed, seed + batches):
        try:
            owner, compared, found = _drive(hooked.name, s, dcp_world=dcp_world,
                                            standard=hooked.standard)
        except Exception as exc:
            if not hooked.standard or s != seed:
                raise
            said = (str(exc).splitlines() or [""])[0]  # vLLM's reason, as it said it
            return AuditRow(label, hooked.builder, hooked.owner,
                            note=f"does not construct on a CPU ({type(exc).__name__}: {said}); "
                            "owed on a GPU machine")
        owners.add(owner)
        steps += compared
        bad_steps += len({step for step, _, _ in found})
        shown += [f"seed {s} step {step}: {path}: {detail}" for step, path, detail in found]
    owner = owners.pop() if len(owners) == 1 else hooked.owner
    if owner == "none":
        return AuditRow(label, hooked.builder, "none", batches,
                        note="its flag is off on this machine's builders: vLLM rebuilds")
    note = f"{len(shown)} differences" if shown else ""
    if hooked.standard:
        note = "; ".join(filter(None, (note, _STANDARD_ON_CPU)))
    return AuditRow(label, hooked.builder, owner, batches, steps, bad_steps,
                    tuple(shown[:_SHOWN]), "mismatch" if shown else "equal", note=note)


WORKSPACES = frozenset({"softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum"})
"""Metadata fields that are scratch, not values: buffers a builder allocates with
``torch.empty`` and hands to the kernel to write (the segment outputs of vLLM's Triton
attention's 3-D kernel); the audit compares their shape and dtype only."""

_STANDARD_ON_CPU = ("built for a tiny Llama on a CPU: what the builder computes only on CUDA "
                    "(FA3's ahead-of-time schedule) is absent on both sides, owed on a GPU "
                    "machine")


def _run_control(control: Control, batches: int, seed: int) -> ControlResult:
    reported: dict[str, None] = {}
    from draftmeta.integrations.vllm.catalogue import current_release

    standard = control.backend not in current_release().names
    with _hook_replaced(control.backend, control.wrap):
        for s in range(seed, seed + batches):
            _, _, found = _drive(control.backend, s, standard=standard)
            reported.update(dict.fromkeys(path for _, path, _ in found))
    named = {control.field, f"runner input {control.field}"}
    return ControlResult(control.name, control.backend, control.field,
                         bool(named & reported.keys()), tuple(reported))


@contextlib.contextmanager
def _plugin_as_configured(plugin: bool | None) -> Iterator[bool]:
    """draftmeta's plugin registered in this process where ``plugin`` (``None``: as
    ``DRAFTMETA_VLLM_PLUGIN`` says, on by default), unregistered afterwards if this put it
    there; the harness's environment set up first."""
    from draftmeta.integrations.vllm import plugin as vllm_plugin
    from draftmeta.integrations.vllm.plan import DISABLE_ENV
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
) -> AuditReport:
    """Audit the draft hooks of the installed vLLM (see the module's description).

    Args:
        names: the builders to audit (vLLM's backend names, ``INDEXER``); ``None``: every one
            :func:`hooked_builders` finds.
        batches: random batches per builder.
        seed: the first batch's seed (batch ``i`` uses ``seed + i``).
        plugin: audit with draftmeta's plugin active (its hooks too) or not; ``None``: as
            ``DRAFTMETA_VLLM_PLUGIN`` says (on unless set to 0).
        negative_control: also run :data:`CONTROLS`, each over ``batches`` batches.
        echo: called with what the audit does next (progress).

    Raises:
        ValueError: ``names`` has a builder without a hook here; the message lists those with.
        RuntimeError: vLLM is not installed, or its release has no draft hook path.
    """
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.release import installed_version

    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    with _plugin_as_configured(plugin) as active:
        found = hooked_builders(plugin=active)
        if names is not None:
            by_name = {h.name: h for h in found}
            unknown = [n for n in names if n not in by_name]
            if unknown:
                raise ValueError(f"no draft hook to audit for {', '.join(unknown)} in this "
                                 f"vLLM; builders with one: {', '.join(by_name)}")
            found = tuple(by_name[n] for n in dict.fromkeys(names))
        work = [(h, world) for h in found for world in ((1, 2) if h.dcp else (1,))]
        rows: list[AuditRow] = []
        for i, (hooked, world) in enumerate(work, 1):
            if echo is not None and hooked.runs_here is None:
                dcp = f" (DCP {world})" if world > 1 else ""
                echo(f"auditing {hooked.name}{dcp}, {batches} batches ({i}/{len(work)})")
            rows.append(_audit_one(hooked, batches, seed, world))
        controls = []
        for control in CONTROLS if negative_control else ():
            if echo is not None:
                echo(f"negative control: {control.backend}: {control.name}")
            controls.append(_run_control(control, batches, seed))
    return AuditReport(str(installed_version()), current_release().version, active,
                       tuple(rows), tuple(controls))


def audit_table(report: AuditReport, *, width: int = 100) -> str:
    """:class:`AuditReport` as plain text: one row per builder, then the negative controls and
    the verdict."""
    import textwrap

    head = f"{'backend':<30} {'hook':<9} {'batches':>7} {'steps':>6} {'mismatched':>10}  "
    lines = [f"vLLM {report.vllm_version} (catalogue {report.release}); draftmeta's plugin "
             f"{'active' if report.plugin else 'off'}", "", head + "verdict"]
    indent = " " * 4
    for r in report.rows:
        counts = (f"{r.batches:>7} {r.steps:>6} {r.mismatched_steps:>10}" if r.verdict !=
                  "not run" else f"{'-':>7} {'-':>6} {'-':>10}")
        lines.append(f"{r.backend:<30} {r.owner:<9} {counts}  {r.verdict}")
        said = [*r.mismatches, *([r.note] if r.note else [])]
        for text in said:
            lines.extend(textwrap.wrap(text, width, initial_indent=indent,
                                       subsequent_indent=indent + "  ",
                                       break_long_words=False, break_on_hyphens=False))
    if report.controls:
        lines += ["", "negative controls (a deliberate bug in a hook; the audit must name the "
                  "field):"]
        for c in report.controls:
            verdict = "caught" if c.caught else "MISSED"
            lines.append(f"  {verdict:<7} {c.backend}: {c.control} (reported: "
                         f"{', '.join(c.reported) or 'nothing'})")
    audited = [r for r in report.rows if r.verdict != "not run"]
    bad = [r.backend for r in audited if r.verdict == "mismatch"]
    missed = [c.control for c in report.controls if not c.caught]
    lines.append("")
    if bad or missed:
        lines.append("audit: FAILED: " + "; ".join(
            ([f"mismatches in {', '.join(bad)}"] if bad else [])
            + ([f"controls missed: {', '.join(missed)}"] if missed else [])))
    else:
        lines.append(f"audit: {len(audited)} hooks equal to vLLM's rebuild"
                     + (", every negative control caught" if report.controls else "")
                     + f"; {len(report.rows) - len(audited)} not run here")
    return "\n".join(lines)
