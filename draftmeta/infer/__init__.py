"""Infer a draft spec from a metadata builder: probe, classify, emit, verify.

>>> from draftmeta.infer import infer_spec  # doctest: +SKIP
>>> inference = infer_spec(PagedDecodeMetadata, build, block_size=16)  # doctest: +SKIP
>>> print(inference.source())  # doctest: +SKIP

:mod:`~draftmeta.infer.probe` builds at successive and perturbed draft states,
:mod:`~draftmeta.infer.classify` turns the evidence into a rule per field,
:mod:`~draftmeta.infer.emit` writes the spec as Python source with the evidence as comments, and
:mod:`~draftmeta.infer.verify` checks update against rebuild over random batches.
:mod:`~draftmeta.integrations.vllm.tools.infer` adapts vLLM's builders through the catalogue's
harness
recipes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, for type checkers and the API reference
    from draftmeta.infer.classify import TodoHook, Verdict
    from draftmeta.infer.core import Inference, infer_spec
    from draftmeta.infer.probe import ProbeCase, default_cases
    from draftmeta.infer.verify import Verification, verify_generic

__all__ = [
    "Inference",
    "ProbeCase",
    "TodoHook",
    "Verdict",
    "Verification",
    "default_cases",
    "infer_spec",
    "verify_generic",
]

_EXPORTS: dict[str, str] = {
    "Inference": "draftmeta.infer.core",
    "ProbeCase": "draftmeta.infer.probe",
    "TodoHook": "draftmeta.infer.classify",
    "Verdict": "draftmeta.infer.classify",
    "Verification": "draftmeta.infer.verify",
    "default_cases": "draftmeta.infer.probe",
    "infer_spec": "draftmeta.infer.core",
    "verify_generic": "draftmeta.infer.verify",
}
"""Where each public name is defined: imported on first use, so that the command line can
read ``draftmeta infer``'s arguments without importing torch."""

if not TYPE_CHECKING:
    from draftmeta._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
    del lazy_exports
