"""What generated code calls at run time, bound into its globals: an exception's message for
a draftmeta error (:func:`raised`), whether a state buffer moved since the seal (:func:`moved`),
and why phase 0 refused an object (:func:`why_uncovered_for` makes it for a spec).

Each is small and called only where a check failed or a buffer is a new object; the generated
function's hot path reads nothing here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from draftmeta.codegen.spec_view import SpecView

__all__ = ["moved", "raised", "why_uncovered_for"]


def raised(exc: BaseException) -> str:
    """The message of an exception raised inside a formula, for a draftmeta error."""
    return f"{type(exc).__name__}: {exc}"


def moved(buffer: object, sealed: object) -> bool:
    """Whether a state ``buffer``, another object than the ``sealed`` one, lies elsewhere:
    ``False`` only for two tensors of one dtype on the same storage with the same offset,
    sizes and strides (``Tensor.is_set_to``: one call where comparing addresses, shapes and
    strides would take ten). The seal holds the sealed tensor, so its storage stays alive."""
    if not isinstance(buffer, torch.Tensor) or not isinstance(sealed, torch.Tensor):
        return True
    return buffer.dtype is not sealed.dtype or not buffer.is_set_to(sealed)


moved.__draftmeta_describe__ = (  # type: ignore[attr-defined]
    "(buffer, sealed) -> whether buffer lies elsewhere than the sealed tensor (dtype, storage, "
    "offset, sizes, strides)"
)


def why_uncovered_for(spec: SpecView[Any]) -> Callable[[object], str]:
    """``why_uncovered(metadata)`` for ``spec``: why phase 0 refused an object: it is not
    exactly the spec's class, or it (or a nested record) carries something the spec has no rule
    for. Called only after the check failed."""
    cls = spec.cls

    def why_uncovered(metadata: object) -> str:
        if type(metadata) is not cls:
            what = "None" if metadata is None else f"a {type(metadata).__qualname__}"
            return (f"the metadata object is {what}, not the spec's {cls.__qualname__} (an "
                    "update of another class would leave its extra fields stale)")
        problems = spec.uncovered(metadata)
        return ("the metadata object carries state the spec has no rule for, which would "
                f"go stale: {'; '.join(problems) or 'an attribute outside its fields'}; "
                "declare it with attributes= or rebuild")

    why_uncovered.__draftmeta_describe__ = (  # type: ignore[attr-defined]
        f"(metadata) -> what phase 0 refused: not exactly a {cls.__qualname__}, or an "
        "attribute the spec has no rule for"
    )
    return why_uncovered
