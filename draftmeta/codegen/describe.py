"""What :func:`~draftmeta.codegen.compiler.explain` shows before a generated function's source:
a header of comments saying what every global the source reads holds, so the text stands alone
and is the same in every process (no address, no counter).
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping

from draftmeta.codegen.writer import one_line
from draftmeta.layout import LayoutGuard

__all__ = ["FIXED_TEXT", "describe_bound", "header"]

FIXED_TEXT: dict[str, str | None] = {
    "_SPEC": None,  # its value, the spec's name
    "_PreconditionFailed": "draftmeta.errors.PreconditionFailed",
    "_UpdateError": "draftmeta.errors.UpdateError",
    "_WriteFailed": "draftmeta.errors.WriteFailed",
    "_raised": "(exc) -> 'ExcType: message', for an error raised inside a formula",
    "_FIELD_AT_LINE": "{line of this function: the field whose rule wrote it}, naming the "
                      "field of a write that raised",
    "_int": "int",
    "_bool": "torch.bool",
    "_Tensor": "torch.Tensor",
}
"""What :func:`header` says of each global draftmeta binds into every generated module
(:data:`~draftmeta.codegen.writer.FIXED_NAMES`): ``None`` for ``_SPEC``, whose value is the spec's
name."""


def describe_bound(obj: object) -> str:
    """One line saying what a global bound into generated code holds, with no address or other
    process-dependent text (for :func:`header`)."""
    text = getattr(obj, "__draftmeta_describe__", None)
    if isinstance(text, str):
        return text
    if isinstance(obj, list):
        return f"memo, initially {obj!r}"
    if isinstance(obj, frozenset):
        return "{" + ", ".join(repr(x) for x in sorted(obj, key=repr)) + "}"
    if isinstance(obj, LayoutGuard):
        written = [e.path for e in obj._entries if not e.unchanged]
        kept = [e.path for e in obj._entries if e.unchanged]
        return (f"the memory check (once per tensor set): {', '.join(written) or 'nothing'} "
                "own their memory" + (f"; unchanged {', '.join(kept)} must not overlap a "
                                      "moved buffer" if kept else ""))
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    describe = getattr(obj, "describe", None)
    if callable(describe) and not isinstance(obj, type):
        try:
            described = describe()
        except TypeError:
            described = None
        if isinstance(described, str):
            return f"{type(obj).__qualname__}: {described}"
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return f"function {obj.__module__}.{obj.__qualname__}"
    what = type(obj).__qualname__
    formula = getattr(obj, "formula", None)
    if isinstance(formula, str):
        return f"{what}: {formula}"
    name = getattr(obj, "name", None)
    return f"{what} {name!r}" if isinstance(name, str) else what


def header(spec: str, source: str, globals_: Mapping[str, object], bound: tuple[str, ...]
           ) -> str:
    """The comment lines (each ending in a newline) saying what each global ``source`` reads
    holds: draftmeta's own that it uses (:data:`FIXED_TEXT`; ``_SPEC`` is ``spec``, the spec's
    name), then those bound from the spec, in the order they were bound."""
    lines = ["# globals of the generated function's module:"]
    for name, fixed in FIXED_TEXT.items():
        if re.search(rf"\b{name}\b", source):
            value = repr(spec) if name == "_SPEC" else fixed
            lines.append(f"#   {name} = {one_line(value)}")
    for name in bound:
        lines.append(f"#   {name} = {one_line(describe_bound(globals_[name]))}")
    return "\n".join(lines) + "\n"
