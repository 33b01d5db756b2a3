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
from collections.abc import Callable, Iterator
from typing import Any

from draftmeta.advance import advance_spec
from draftmeta.spec import DraftSpec

__all__ = ["SPECS", "closest_names", "get_spec", "recorded_classes"]


def _flashmla_fp8() -> DraftSpec[Any]:
    from draftmeta.backends.mla import MLASpec, mla_spec
    from draftmeta.integrations.vllm.catalogue import current_release

    factory = current_release().entry("FLASHMLA").spec
    assert isinstance(factory, MLASpec)
    return mla_spec(factory, name="FLASHMLA", fp8_kv_cache=True, num_q_tokens_per_head_k=128)


def _specs() -> dict[str, Callable[[], DraftSpec[Any]]]:
    from draftmeta.integrations.vllm.catalogue import current_release

    specs: dict[str, Callable[[], DraftSpec[Any]]] = {
        "state.wrap": lambda: advance_spec("wrap"),
        "state.clamp": lambda: advance_spec("clamp"),
        "state.clamp.frozen": lambda: advance_spec("clamp", "frozen"),
        "state.dcp": lambda: advance_spec("clamp", "advance", True),
        "FLASHMLA.fp8": _flashmla_fp8,
    }
    for entry in current_release().builders:
        specs[entry.name] = lambda e=entry: e.make_spec()  # type: ignore[misc]
        specs[f"{entry.name}.dcp"] = lambda e=entry: e.make_spec(dcp=True)  # type: ignore[misc]
    return dict(sorted(specs.items()))


SPECS: dict[str, Callable[[], DraftSpec[Any]]] = _specs()
"""Spec factories by name: the source advance (``state.*``) and every catalogued builder."""


def get_spec(name: str) -> DraftSpec[Any]:
    """The spec called ``name``.

    Raises:
        KeyError: no such spec; the message lists the names.
    """
    try:
        factory = SPECS[name]
    except KeyError:
        raise KeyError(f"no spec {name!r}; choose one of: {', '.join(SPECS)}") from None
    return factory()


def closest_names(name: str, limit: int = 3) -> list[str]:
    """The spec names closest to a mistyped ``name`` (for a did-you-mean), best first."""
    by_folded = {n.casefold(): n for n in SPECS}
    found = difflib.get_close_matches(name.casefold(), list(by_folded), n=limit, cutoff=0.6)
    return [by_folded[n] for n in found]


def _clear_spec_caches() -> None:
    from draftmeta.backends.indexer import indexer_spec, kpool_tail_spec
    from draftmeta.backends.mla import mla_spec
    from draftmeta.backends.vllm_classes import load_metadata_class

    for cached in (load_metadata_class, mla_spec, indexer_spec, kpool_tail_spec):
        cached.cache_clear()


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
    _clear_spec_caches()
    try:
        yield True
    finally:
        if previous is None:
            del os.environ["DRAFTMETA_VLLM_CLASSES"]
        else:
            os.environ["DRAFTMETA_VLLM_CLASSES"] = previous
        _clear_spec_caches()
