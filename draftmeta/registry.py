"""Every spec draftmeta ships, by name (what ``draftmeta explain`` accepts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftmeta.advance import advance_spec
from draftmeta.backends.indexer import indexer_spec, kpool_tail_spec
from draftmeta.backends.mla import MLA_VARIANTS, mla_spec
from draftmeta.spec import DraftSpec

__all__ = ["SPECS", "get_spec"]


def _specs() -> dict[str, Callable[[], DraftSpec[Any]]]:
    specs: dict[str, Callable[[], DraftSpec[Any]]] = {
        "state.wrap": lambda: advance_spec("wrap"),
        "state.clamp": lambda: advance_spec("clamp"),
        "state.clamp.frozen": lambda: advance_spec("clamp", "frozen"),
        "state.dcp": lambda: advance_spec("clamp", "advance", True),
        "indexer": lambda: indexer_spec(),
        "indexer.dcp": lambda: indexer_spec(dcp=True),
        "indexer.kpool_tail": lambda: kpool_tail_spec(),
        "mla.flashmla.fp8": lambda: mla_spec(
            "flashmla", fp8_kv_cache=True, num_q_tokens_per_head_k=128
        ),
    }
    for name in MLA_VARIANTS:
        specs[f"mla.{name}"] = lambda name=name: mla_spec(name)  # type: ignore[misc]
        specs[f"mla.{name}.dcp"] = lambda name=name: mla_spec(name, dcp=True)  # type: ignore[misc]
    return dict(sorted(specs.items()))


SPECS: dict[str, Callable[[], DraftSpec[Any]]] = _specs()
"""Spec factories by name: the source advance (``state.*``), MLA variants, the indexer."""


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
