"""The code generator's entry points, from a spec to its functions: :func:`compile_spec` and
:func:`compile_sealed` generate, compile and register them (through ``_compile``, the one
compile path), and :func:`explain` shows the update's source with what each global holds.
"""

from __future__ import annotations

import types
from typing import TypeVar, cast

from draftmeta.codegen.phases import generate
from draftmeta.codegen.product import Part, SealFunction, StepFunction, UpdateFunction
from draftmeta.codegen.spec_view import SpecView

__all__ = ["compile_sealed", "compile_spec", "explain"]

M = TypeVar("M")


def explain(spec: SpecView[M]) -> str:
    """The source of the update function generated for ``spec`` (the same spec, the same text),
    after a header of comments saying what every global it uses holds, so the text stands
    alone (:meth:`GeneratedUpdate.explain <draftmeta.codegen.product.GeneratedUpdate.explain>`
    of :func:`~draftmeta.codegen.phases.generate`)."""
    return generate(spec).explain()


def compile_spec(
    spec: SpecView[M], part: Part = "full", skip: frozenset[str] = frozenset()
) -> UpdateFunction[M]:
    """Generate, compile and register the update function of ``spec``.

    ``part="check"`` gives a function running only the preconditions and structure checks;
    ``part="finish"`` one running the rest, without the tensor writes of the paths in ``skip``
    (done by a fused kernel). Prefer :attr:`DraftSpec.update <draftmeta.spec.DraftSpec.update>`
    for the whole update, which compiles once and caches the result.
    """
    return cast("UpdateFunction[M]", _compile(spec, part, skip))


def compile_sealed(spec: SpecView[M]) -> tuple[SealFunction[M], StepFunction[M]]:
    """Generate, compile and register the seal and step functions of ``spec`` (see
    :attr:`DraftSpec.sealed <draftmeta.spec.DraftSpec.sealed>`, which compiles once and
    caches them)."""
    return (cast("SealFunction[M]", _compile(spec, "seal")),
            cast("StepFunction[M]", _compile(spec, "step")))


def _compile(spec: SpecView[M], part: Part, skip: frozenset[str] = frozenset()
             ) -> types.FunctionType:
    """The one compile path of every generated function (``benchmarks/e2e_floor.py
    --phases`` replaces it to time the phases)."""
    return generate(spec, part, skip).compile()
