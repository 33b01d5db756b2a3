"""Every spec draftmeta ships, by name (what ``draftmeta explain`` accepts).

Builder specs are named after the builder's catalogue entry (vLLM's attention-backend name,
``TRITON_MLA``), from the installed vLLM release's catalogue (0.33's where vLLM is not
installed); ``NAME.dcp`` is its DCP > 1 variant. The source advance is ``state.*``.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from collections.abc import Iterator
from typing import Any, Protocol

from draftmeta import spec_cache
from draftmeta.advance import HostBound, OverflowPolicy, advance_spec
from draftmeta.spec import DraftSpec

__all__ = [
    "NamedSpecFactory",
    "SPECS",
    "clear_spec_caches",
    "closest_names",
    "get_spec",
    "recorded_classes",
]


class NamedSpecFactory(Protocol):
    """Declares the spec a name of :data:`SPECS` stands for: with the name's own host bound, or
    with ``host_bound``. (A catalogued builder's factory, which also takes the live builder, is
    :class:`~draftmeta.integrations.vllm.catalogue.model.BuilderSpecFactory`.)"""

    def __call__(self, host_bound: HostBound | None = None) -> DraftSpec[Any]:
        """The spec (``host_bound``: ``"advance"`` or ``"frozen"``; default: the name's)."""
        ...


def _advance(overflow: OverflowPolicy, dcp: bool = False) -> NamedSpecFactory:
    def make(host_bound: HostBound | None = None) -> DraftSpec[Any]:
        return advance_spec(overflow, host_bound or "advance", dcp)

    return make


def _clamp_frozen(host_bound: HostBound | None = None) -> DraftSpec[Any]:
    if host_bound not in (None, "frozen"):
        raise ValueError(f"state.clamp.frozen is the frozen host bound; for host bound "
                         f"{host_bound} name state.clamp")
    return advance_spec("clamp", "frozen")


def _builder(entry: Any, dcp: bool = False) -> NamedSpecFactory:
    def make(host_bound: HostBound | None = None) -> DraftSpec[Any]:
        spec: DraftSpec[Any] = entry.make_spec(host_bound=host_bound or "advance", dcp=dcp)
        return spec

    return make


def _flashmla_fp8(host_bound: HostBound | None = None) -> DraftSpec[Any]:
    from draftmeta.integrations.vllm.catalogue import current_release
    from draftmeta.integrations.vllm.specs.mla import MLASpec, installed_mla_spec

    factory = current_release().entry("FLASHMLA").spec
    assert isinstance(factory, MLASpec)
    return installed_mla_spec(factory, name="FLASHMLA", fp8_kv_cache=True,
                              num_q_tokens_per_head_k=128, host_bound=host_bound or "advance")


def _specs() -> dict[str, NamedSpecFactory]:
    """The grammar of spec names, in one place: ``state.wrap``, ``state.clamp``,
    ``state.clamp.frozen`` and ``state.dcp`` (the source advance); ``NAME`` and ``NAME.dcp``
    for every builder of the release in use; ``FLASHMLA.fp8``."""
    from draftmeta.integrations.vllm.catalogue import current_release

    specs: dict[str, NamedSpecFactory] = {
        "state.wrap": _advance("wrap"),
        "state.clamp": _advance("clamp"),
        "state.clamp.frozen": _clamp_frozen,
        "state.dcp": _advance("clamp", dcp=True),
        "FLASHMLA.fp8": _flashmla_fp8,
    }
    for entry in current_release().builders:
        specs[entry.name] = _builder(entry)
        specs[f"{entry.name}.dcp"] = _builder(entry, dcp=True)
    return dict(sorted(specs.items()))


SPECS: dict[str, NamedSpecFactory] = _specs()
"""Spec factories by name: the source advance (``state.*``) and every catalogued builder."""


def get_spec(name: str, host_bound: HostBound | None = None) -> DraftSpec[Any]:
    """The spec called ``name``, with its own host bound or with ``host_bound``.

    Raises:
        KeyError: no such spec; the message lists the names.
        ValueError: the name fixes another host bound than ``host_bound``
            (``state.clamp.frozen`` with ``"advance"``).
    """
    try:
        factory = SPECS[name]
    except KeyError:
        raise KeyError(f"no spec {name!r}; choose one of: {', '.join(SPECS)}") from None
    return factory(host_bound)


def closest_names(name: str, limit: int = 3) -> list[str]:
    """The spec names closest to a mistyped ``name`` (for a did-you-mean), best first."""
    by_folded = {n.casefold(): n for n in SPECS}
    found = difflib.get_close_matches(name.casefold(), list(by_folded), n=limit, cutoff=0.6)
    return [by_folded[n] for n in found]


def clear_spec_caches() -> None:
    """Forget every loaded metadata class and declared spec (each cache registered with
    :func:`draftmeta.spec_cache.spec_cache` where it is made), so that the next declaration
    loads the classes afresh."""
    spec_cache.clear()


@contextlib.contextmanager
def recorded_classes() -> Iterator[bool]:
    """Declare specs inside against the recorded class lists of the installed release
    (``DRAFTMETA_VLLM_CLASSES=recorded``), so that nothing imports vLLM; yields whether it did.

    Where vLLM is already imported in this process nothing changes (the real classes have the
    same fields, so the specs are the same) and it yields False. Otherwise the cached specs and
    classes are cleared on entry and on exit, so stand-ins declared inside never reach a caller
    outside that later imports vLLM.
    """
    if "vllm" in sys.modules:
        yield False
        return
    previous = os.environ.get("DRAFTMETA_VLLM_CLASSES")
    os.environ["DRAFTMETA_VLLM_CLASSES"] = "recorded"
    clear_spec_caches()
    try:
        yield True
    finally:
        if previous is None:
            del os.environ["DRAFTMETA_VLLM_CLASSES"]
        else:
            os.environ["DRAFTMETA_VLLM_CLASSES"] = previous
        clear_spec_caches()
