"""The hook path (vLLM's new model runner, 0.33 on): ``update_draft_decode_metadata``.

For a builder vLLM leaves without the hook, the plugin installs two replacements made here:
:func:`replacement_init` makes the ``__init__`` that runs vLLM's ``__init__`` and then binds
the spec (:func:`bind`) to the builder where the spec is supported and capture-safe and the
catalogue does not refuse the instance; :func:`replacement_update` makes the
``update_draft_decode_metadata`` that runs the generated full refresh from the buffers the
metadata views, called inside vLLM's captured draft loop.

A bound builder satisfies :class:`~draftmeta.protocol.SupportsDraftUpdate` and
:func:`~draftmeta.protocol.spec_of` returns its spec; vLLM's flag
``supports_draft_decode_metadata_update`` is derived from that same fact, in :func:`bind`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from draftmeta.errors import DraftMetaError, UpdateError
from draftmeta.integrations.vllm.catalogue.model import BuilderSpecFactory
from draftmeta.integrations.vllm.plugin.log import LOGGER_NAME, fallback
from draftmeta.integrations.vllm.plugin.plan import DISABLE_ENV, Decision, spec_for
from draftmeta.protocol import SupportsDraftUpdate, spec_of, why_not_in_place
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = ["bind", "replacement_init", "replacement_update", "without_full_cudagraphs"]

logger = logging.getLogger(LOGGER_NAME)


def without_full_cudagraphs(builder: Any) -> str | None:
    """Why the builder's engine gets no hook, where it captures no full CUDA graphs
    (``cudagraph_mode`` ``NONE``, as ``enforce_eager`` gives, or ``PIECEWISE``), else ``None``
    (also where the builder does not say). vLLM would then call the hook on the host at every
    draft step after building at the first: FA3's scheduler metadata is no persistent buffer
    there (its engine failed to start on the H200) and at K = 2 the hook cost more than the
    rebuild (docs/e2e-cuda.md, engines without CUDA graphs). Said at DEBUG only: a CPU engine
    never captures, and takes the older proposer path anyway."""
    compilation = getattr(getattr(builder, "vllm_config", None), "compilation_config", None)
    mode = getattr(compilation, "cudagraph_mode", None)
    has_full = getattr(mode, "has_full_cudagraphs", None)
    if not callable(has_full) or has_full():
        return None
    return (f"this engine captures no full CUDA graphs (cudagraph_mode "
            f"{getattr(mode, 'name', mode)}), where the hook would run on the host")


def bind(builder: Any, spec: DraftSpec[Any] | None) -> None:
    """The one place a patched builder's capability is decided: bind ``spec`` to ``builder``
    (``None``: none is bound, and the builder keeps vLLM's behaviour).

    A bound builder satisfies :class:`~draftmeta.protocol.SupportsDraftUpdate` (its
    ``update_draft_metadata`` is the spec's generated update) and
    :func:`~draftmeta.protocol.spec_of` returns ``spec``; vLLM's
    ``supports_draft_decode_metadata_update`` is then set from that fact, so the flag vLLM
    reads and the capability cannot disagree. Unbound, the builder carries neither, and the flag
    stays what vLLM's ``__init__`` or class set (TRITON_MLA's own, for instance).
    ``_draftmeta_spec`` is what :func:`replacement_update` reads at every step.
    """
    builder._draftmeta_spec = spec
    if spec is None:
        return
    builder.draft_spec = spec
    builder.update_draft_metadata = spec.update
    capable = spec_of(builder) is spec and isinstance(builder, SupportsDraftUpdate)
    if capable:  # the flag vLLM reads follows the capability
        builder.supports_draft_decode_metadata_update = True


def _exactly(obj: Any, cls: type) -> bool:
    """Whether ``obj`` is an instance of ``cls`` itself, not of a subclass."""
    return type(obj) is cls


def replacement_init(
    decision: Decision, overrides: Mapping[str, BuilderSpecFactory] | None
) -> Callable[..., None]:
    """The replacement of ``decision``'s builder class's ``__init__``: vLLM's, then the spec
    bound to the new builder and the hook flag set where it may be captured."""
    cls, entry = decision.cls, decision.entry
    assert cls is not None
    original: Callable[..., None] = getattr(cls, "__init__")  # noqa: B009

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not _exactly(self, cls):
            return
        dcp = getattr(self, "dcp_world_size", 1) > 1
        if decision.dcp_only and not dcp:  # vLLM's own hook serves this builder
            bind(self, None)
            return
        eager = without_full_cudagraphs(self)
        if eager is not None:  # the hook serves captured draft loops: vLLM's behaviour here
            bind(self, None)
            logger.debug("draftmeta: %s keeps vLLM's behaviour: %s", entry.name, eager)
            return
        self._draftmeta_states = _StateCache()
        try:
            spec = spec_for(entry, overrides, host_bound="frozen", dcp=dcp, builder=self)
        except DraftMetaError as exc:  # fail closed: this builder keeps vLLM's behaviour
            bind(self, None)
            fallback(entry.name, "draftmeta: %s keeps vLLM's behaviour: its spec bound to "
                     "this builder does not fit (%s)", entry.name, exc)
            return
        # the spec bound to this builder (FA3's head configuration, FlashMLA's FP8 cache) is
        # decided here: vLLM captures the hook, so a bound spec must be capture-safe too
        refusal = entry.refuses_instance(self)
        if refusal is not None or why_not_in_place(spec, captured=True) is not None:
            # vLLM's behaviour exactly: its own hook flag (TRITON_MLA's, under the override)
            # and method stay, and a builder without one rebuilds
            bind(self, None)
            if refusal is not None:
                fallback(entry.name, "draftmeta: %s keeps vLLM's behaviour: %s", entry.name,
                         refusal)
            return
        bind(self, spec)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


class _StateCache:
    """Draft states over the buffers of the metadata objects one builder's hook has seen,
    held by weak reference to the metadata (never by ``id()``), at most 16 of them."""

    def __init__(self) -> None:
        self.entries: list[tuple[weakref.ref[Any], DraftState]] = []

    def get(self, metadata: Any) -> DraftState | None:
        for ref, state in self.entries:
            if ref() is metadata:
                return state
        return None

    def put(self, metadata: Any, state: DraftState) -> None:
        self.entries = [(r, s) for r, s in self.entries if r() is not None][-15:]
        self.entries.append((weakref.ref(metadata), state))


def replacement_update(decision: Decision) -> Callable[..., None]:
    """The replacement of ``decision``'s builder class's ``update_draft_decode_metadata``:
    the bound spec's full refresh, or vLLM's own method where no spec is bound."""
    cls, entry = decision.cls, decision.entry
    assert cls is not None
    original: Callable[..., None] = getattr(cls, "update_draft_decode_metadata")  # noqa: B009

    def update_draft_decode_metadata(self: Any, metadata: Any) -> None:
        spec: DraftSpec[Any] | None = self.__dict__.get("_draftmeta_spec")
        if spec is None or not _exactly(self, cls):  # not bound (a subclass, a spec refused)
            original(self, metadata)
            return
        if getattr(metadata, "num_decode_tokens", 1) == 0:
            return
        cache: _StateCache = self._draftmeta_states
        state = cache.get(metadata)
        if state is None:
            uncovered = spec.uncovered(metadata)
            if uncovered:  # the runner already chose in-place updates: stop loudly
                raise UpdateError(
                    spec.name, uncovered[0].split(" ")[0],
                    f"the metadata {entry.name} built carries {uncovered[0]}, which the spec "
                    f"has no rule for, so an in-place update would leave it stale; set "
                    f"{DISABLE_ENV}=0 to let vLLM rebuild, and report the vLLM version",
                )
            state = entry.hook_state(self, metadata)
            cache.put(metadata, state)
        spec.update(metadata, state)

    update_draft_decode_metadata.__qualname__ = f"{cls.__qualname__}.update_draft_decode_metadata"
    update_draft_decode_metadata.__doc__ = (
        "draftmeta's generated full refresh of the metadata from the buffers it views."
    )
    return update_draft_decode_metadata
