"""The source writer: lines of Python written one at a time, each remembered with the field
whose rule it was written for, and the names those lines use.

A :class:`SourceWriter` appends lines at an indentation depth, holds back lines that only make
sense if another follows (a phase's header: :meth:`SourceWriter.defer`), and keeps a map from
each line number to the field being written (:meth:`SourceWriter.owning`), from which a write
that raises is named. A :class:`Namespace` gives every name the generated code uses, including
the globals it binds, so that a name derived from user text never shadows another. User text
reaches the source only through :func:`one_line` (comments, docstrings), :func:`fstring_text`
(an f-string's literal part) or ``repr``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from draftmeta.codegen import runtime
from draftmeta.errors import PreconditionFailed, UpdateError, WriteFailed
from draftmeta.refs import identifier

__all__ = ["FIXED_NAMES", "Namespace", "SourceWriter", "fstring_text", "one_line"]


def one_line(text: object) -> str:
    """``text`` safe inside a comment or docstring of generated code: one line, no quotes that
    could end a docstring, escapes instead of control characters. User text (names, formulas,
    reasons) goes through here or through ``repr``, never into code as written."""
    return repr(str(text))[1:-1].replace('"', '\\"')


def fstring_text(value: str) -> str:
    """User text as the literal part of an f-string inside a repr: braces doubled, quotes and
    control characters escaped."""
    return repr(value.replace("{", "{{").replace("}", "}}"))[1:-1]


FIXED_NAMES: tuple[str, ...] = (
    "_SPEC", "_PreconditionFailed", "_UpdateError", "_WriteFailed", "_bool", "_pair", "_problem",
    "_exc", "_raised", "_int", "_FIELD_AT_LINE", "_Tensor")
"""The names generated code always uses (the globals every generated module starts with, and
its fixed locals): :meth:`Namespace.fresh` never gives them out."""


class Namespace:
    """The generated module's globals and every name the generated code uses: one registry,
    so a name derived from user text (a nested record called ``pair``) never shadows another
    (it gets a suffix, as torch.fx does)."""

    def __init__(self, spec_name: str) -> None:
        self.values: dict[str, object] = {
            "_SPEC": spec_name,
            "_PreconditionFailed": PreconditionFailed,
            "_UpdateError": UpdateError,
            "_WriteFailed": WriteFailed,
            "_bool": torch.bool,
            "_Tensor": torch.Tensor,
            "_raised": runtime.raised,
            "_int": int,
        }
        self.taken: set[str] = set(FIXED_NAMES)
        self._names: dict[int, str] = {}
        self.bound: list[str] = []  # names bound by bind(), in order

    def fresh(self, hint: str) -> str:
        """A new name from ``hint`` (``_`` prefixed), suffixed only on collision."""
        base = "_" + identifier(hint)
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name)
        return name

    def bind(self, obj: object, hint: str = "obj") -> str:
        """A global holding ``obj`` (one per object), named after ``hint``: the name depends
        only on the hint and the names bound before it, never on a counter."""
        name = self._names.get(id(obj))
        if name is None:
            name = self.fresh(hint)
            self._names[id(obj)] = name
            self.values[name] = obj
            self.bound.append(name)
        return name


class SourceWriter:
    """Writes one function's source, line by line, with the field each line is written for.

    Attributes:
        ns: the names the source uses and the globals it binds.
        lines: the lines written so far (the ``def`` is line 1).
        pending: lines written only if a line follows them (a phase's header, a rule's
            preamble), each with the field it is written for.
        owner: the field whose rule the lines being written are for (``None``: none).
        fields_by_line: line number (the ``def`` is 1) -> the field it was written for.
    """

    def __init__(self, spec_name: str) -> None:
        self.ns = Namespace(spec_name)
        self.lines: list[str] = []
        self.pending: list[tuple[str, str | None]] = []
        self.owner: str | None = None
        self.fields_by_line: dict[int, str] = {}

    def _append(self, line: str, owner: str | None) -> None:
        self.lines.append(line)
        if owner is not None:
            self.fields_by_line[len(self.lines)] = owner

    def emit(self, line: str = "", depth: int = 1) -> None:
        """Write ``line`` at ``depth`` (four spaces a level; an empty line unindented), after
        the deferred lines pending, each for the field it was deferred for."""
        for deferred, owner in self.pending:
            self._append(deferred, owner)
        self.pending.clear()
        self._append(("    " * depth + line) if line else "", self.owner)

    def defer(self, line: str, depth: int = 1) -> None:
        """Write ``line`` only if another line is written after it (before :meth:`drop`)."""
        self.pending.append(("    " * depth + line, self.owner))

    def drop(self, keep: int = 0) -> bool:
        """Forget deferred lines past the first ``keep``; whether none were pending (all that
        were deferred got written)."""
        written = not self.pending
        del self.pending[keep:]
        return written

    @contextlib.contextmanager
    def owning(self, path: str) -> Iterator[None]:
        """Lines written inside are ``path``'s: the line map names it for each of them."""
        self.owner = path
        try:
            yield
        finally:
            self.owner = None

    def comment(self, text: str, depth: int = 1) -> None:
        """Write ``text`` as a comment line (made safe by :func:`one_line`)."""
        self.emit(f"# {one_line(text)}", depth)

    def source(self) -> str:
        """The lines written, as the function's source text."""
        return "\n".join(self.lines) + "\n"
