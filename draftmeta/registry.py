"""Every spec draftmeta ships, by name (what ``draftmeta explain`` accepts).

Builder specs are named after the builder's catalogue entry (vLLM's attention-backend name,
``TRITON_MLA``), from the installed vLLM release's catalogue (0.33's where vLLM is not
installed); ``NAME.dcp`` is its DCP > 1 variant. The source advance is ``state.*``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftmeta.advance import advance_spec
from draftmeta.spec import DraftSpec

__all__ = ["SPECS", "get_spec"]


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
