"""The capability protocol: a metadata builder that can update its metadata in place.

A builder *declares* the capability by carrying a spec. The one obvious way is to subclass
:class:`DraftUpdatable` and set ``draft_spec``; the generated update is installed as
``update_draft_metadata`` when the class is created, so ``isinstance(builder,
SupportsDraftUpdate)`` holds and mypy sees the method's precise type:

>>> import dataclasses, torch
>>> from draftmeta import DraftSpec, DraftUpdatable, SupportsDraftUpdate, Alias, HostAdvance
>>> @dataclasses.dataclass
... class Meta:
...     seq_lens: torch.Tensor
...     max_seq_len: int
>>> class Builder(DraftUpdatable[Meta]):
...     draft_spec = DraftSpec(Meta, {
...         "seq_lens": Alias("seq_lens"), "max_seq_len": HostAdvance(clamp="max_model_len")})
>>> isinstance(Builder(), SupportsDraftUpdate)
True

:func:`install_draft_update` does the same for a class one does not own. The vLLM plugin binds
a spec per builder *instance* instead (:func:`draftmeta.integrations.vllm.plugin.hook.bind`): where
its
spec is bound, a patched vLLM builder satisfies :class:`SupportsDraftUpdate`, :func:`spec_of`
returns that spec, and vLLM's ``supports_draft_decode_metadata_update`` is set from the same
fact; where none is bound (a spec refused, a subclass, an engine without full CUDA graphs),
``spec_of`` returns ``None`` and the builder keeps vLLM's behaviour.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = [
    "DraftUpdatable",
    "SpecBuilder",
    "SupportsDraftUpdate",
    "install_draft_update",
    "spec_of",
    "why_not_in_place",
]

M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)
T = TypeVar("T", bound=type)


@runtime_checkable
class SupportsDraftUpdate(Protocol[M_contra]):
    """A metadata builder that can update its metadata of type ``M`` in place between steps.

    ``update_draft_metadata`` refreshes ``metadata`` for the draft step described by ``state``
    (already advanced by the loop). It raises :class:`~draftmeta.errors.PreconditionFailed`
    or :class:`~draftmeta.errors.UpdateError` *before* writing anything when it cannot; the
    draft loop then rebuilds instead.
    """

    def update_draft_metadata(self, metadata: M_contra, state: DraftState, /) -> None:
        """Update ``metadata`` in place for the step ``state`` describes."""


_SPEC_ATTR = "draft_spec"


class DraftUpdatable(Generic[M]):
    """Base class giving a builder the capability from its ``draft_spec`` class attribute.

    Subclasses set ``draft_spec``; the generated update function is compiled when the subclass
    is created (so a malformed spec fails at import, not mid-loop) and serves as the
    ``update_draft_metadata`` method.
    """

    draft_spec: ClassVar[DraftSpec[Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get(_SPEC_ATTR)
        if spec is not None:
            if not isinstance(spec, DraftSpec):
                raise TypeError(
                    f"{cls.__qualname__}.draft_spec must be a DraftSpec, got {spec!r}"
                )
            spec.update  # noqa: B018 - compile now so errors surface at class creation

    def update_draft_metadata(self, metadata: M, state: DraftState, /) -> None:
        """Update ``metadata`` in place for one draft step, as ``draft_spec`` declares."""
        spec = getattr(type(self), _SPEC_ATTR, None)
        if spec is None:
            raise TypeError(
                f"{type(self).__qualname__} subclasses DraftUpdatable but sets no draft_spec"
            )
        spec.update(metadata, state)


def _installed_update(self: object, metadata: object, state: DraftState, /) -> None:
    """Update ``metadata`` in place for one draft step, as the class's draft_spec declares."""
    spec: DraftSpec[object] = getattr(type(self), _SPEC_ATTR)
    spec.update(metadata, state)


def install_draft_update(cls: T, spec: DraftSpec[Any]) -> T:
    """Give ``cls`` the capability: set ``draft_spec`` and install ``update_draft_metadata``.

    For classes one does not own; subclass :class:`DraftUpdatable` for one's own. Returns
    ``cls``, so it also works as ``@install_draft_update.__get__``-free decorator helper:
    ``install_draft_update(Builder, spec)``.
    """
    if not isinstance(spec, DraftSpec):
        raise TypeError(f"install_draft_update needs a DraftSpec, got {spec!r}")
    spec.update  # noqa: B018 - compile now so a malformed spec fails here
    setattr(cls, _SPEC_ATTR, spec)
    cls.update_draft_metadata = _installed_update  # type: ignore[attr-defined]
    return cls


class SpecBuilder(Generic[M]):
    """A capable builder made from a spec held by the instance (and, optionally, the builder
    it stands for): for draft loops over builders whose spec is chosen per instance.

    Attributes:
        draft_spec: the spec whose generated update ``update_draft_metadata`` runs.
        builder: the builder it stands for, if any.
    """

    def __init__(self, spec: DraftSpec[M], builder: object = None) -> None:
        self.draft_spec = spec
        self.builder = builder

    def update_draft_metadata(self, metadata: M, state: DraftState, /) -> None:
        """Update ``metadata`` in place for one draft step, as ``draft_spec`` declares."""
        self.draft_spec.update(metadata, state)


def spec_of(builder: object) -> DraftSpec[Any] | None:
    """The spec a builder (or builder class) declares, or ``None``.

    For a vLLM builder the plugin patched: the spec bound to that instance, or ``None`` where
    none is (the plugin's log says why: a spec refused, a subclass, an engine without full
    CUDA graphs)."""
    spec = getattr(builder, _SPEC_ATTR, None)
    return spec if isinstance(spec, DraftSpec) else None


def why_not_in_place(spec: DraftSpec[Any], *, captured: bool = False) -> str | None:
    """Why ``spec`` cannot update metadata in place, or ``None`` where it can: the one
    engine-neutral statement of the decision "update in place, or rebuild and say why" made
    before any step runs.

    :class:`~draftmeta.loop.DraftLoop` asks it for each capable group's spec; the vLLM plugin's
    hook path asks it with ``captured=True`` (vLLM captures the hook in a CUDA graph) before it
    binds a spec to a builder. What fails at a step (a precondition, a structure check) is
    decided where the step runs.

    Args:
        spec: the spec a builder declares or would be bound.
        captured: the update is replayed by a captured CUDA graph, so the spec must also be
            capture-safe (:attr:`~draftmeta.spec.DraftSpec.capture_safe`).
    """
    if not spec.supported:
        reasons = "; ".join(f"{p}: {r}" for p, r in spec.unsupported_reasons)
        return f"spec {spec.name!r} is unsupported ({reasons})"
    if captured and not spec.capture_safe:
        return f"spec {spec.name!r} is not capture-safe ({spec.capture_unsafe_reason})"
    return None
