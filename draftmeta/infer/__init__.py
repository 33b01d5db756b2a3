"""Infer a draft spec from a metadata builder: probe, classify, emit, verify.

>>> from draftmeta.infer import infer_spec  # doctest: +SKIP
>>> inference = infer_spec(PagedDecodeMetadata, build, block_size=16)  # doctest: +SKIP
>>> print(inference.source())  # doctest: +SKIP

:mod:`~draftmeta.infer.probe` builds at successive and perturbed draft states,
:mod:`~draftmeta.infer.classify` turns the evidence into a rule per field,
:mod:`~draftmeta.infer.emit` writes the spec as Python source with the evidence as comments, and
:mod:`~draftmeta.infer.verify` checks update against rebuild over random batches.
:mod:`~draftmeta.infer.vllm` adapts vLLM's builders through the catalogue's harness recipes.
"""

from __future__ import annotations

from draftmeta.infer.classify import TodoHook, Verdict
from draftmeta.infer.core import Inference, infer_spec
from draftmeta.infer.probe import ProbeCase, default_cases
from draftmeta.infer.verify import Verification, verify_generic, verify_vllm

__all__ = [
    "Inference",
    "ProbeCase",
    "TodoHook",
    "Verdict",
    "Verification",
    "default_cases",
    "infer_spec",
    "verify_generic",
    "verify_vllm",
]
