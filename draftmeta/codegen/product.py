"""What code generation produces: a :class:`GeneratedUpdate` (a function's source, the globals
it reads, the field of each line) and, once it is compiled, the functions a spec gives, typed
by their signatures (:class:`UpdateFunction`, :class:`SealFunction`, :class:`StepFunction`).

:meth:`GeneratedUpdate.compile` is the one place generated source becomes a function: it is
compiled with its globals and registered with :mod:`linecache` under a name that says which
part of which spec it is, so tracebacks and debuggers show the generated lines. The compiled
function carries its :class:`GeneratedUpdate` (``__draftmeta_generated__``) and its source
(``__draftmeta_source__``).
"""

from __future__ import annotations

import hashlib
import linecache
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from draftmeta.codegen.describe import header
from draftmeta.state import DraftState

__all__ = ["GeneratedUpdate", "Part", "SealFunction", "StepFunction", "UpdateFunction"]

M_contra = TypeVar("M_contra", contravariant=True)

Part = Literal["full", "check", "finish", "seal", "step"]
"""Which phases a generated function runs: all of them; only the checks (phases 0-3); or
everything after the checks (phases 3-5) minus the tensor writes done elsewhere (fused);
``"seal"``: the full update (every check, then the writes), returning a seal of what the
checks that depend only on the object's structure and the tensors it holds (phases 0, 1, 2 and
3c) verified; ``"step"``: the update of a sealed object, with phases 2 and 3c replaced by a
comparison with its seal (identity of every record and tensor verified; a state buffer that is
a new object must lie in the same memory)."""


class UpdateFunction(Protocol[M_contra]):
    """The signature of a generated update: ``update(metadata, state) -> None``."""

    def __call__(self, metadata: M_contra, state: DraftState, /) -> None:
        """Update ``metadata`` in place for the step ``state`` describes."""


class SealFunction(Protocol[M_contra]):
    """The signature of a generated seal: ``seal(metadata, state) -> seal``."""

    def __call__(self, metadata: M_contra, state: DraftState, /) -> tuple[object, ...]:
        """Update ``metadata`` in place with every check; return what its structure checks
        verified."""


class StepFunction(Protocol[M_contra]):
    """The signature of a generated step: ``step(metadata, state, seal) -> bool``."""

    def __call__(
        self, metadata: M_contra, state: DraftState, seal: tuple[object, ...], /
    ) -> bool:
        """Update a sealed ``metadata`` in place; ``False``, writing nothing, if it changed."""


@dataclass(frozen=True)
class GeneratedUpdate:
    """One generated function, before it is compiled: what
    :func:`~draftmeta.codegen.compiler.explain` prints, :meth:`compile` compiles and
    :class:`~draftmeta.fused.FusedStep` runs around its kernel.

    The same spec, part and ``skip`` always give an equal source, line map and global names.
    """

    spec: str
    """The name of the spec it was generated from."""
    part: Part
    """Which function of the spec it is (:data:`Part`)."""
    skip: frozenset[str]
    """The paths whose tensor writes it leaves to a fused kernel."""
    function_name: str
    """The name of the function its source defines (``draft_update_<spec>``, ...)."""
    source: str
    """The function's source: the ``def`` is line 1."""
    globals: Mapping[str, object]
    """What the generated module's globals start as: each name the source reads that is not a
    builtin. The memos among them are filled by the function's calls, so compile a result once
    (:func:`~draftmeta.codegen.phases.generate` makes new ones)."""
    bound: tuple[str, ...]
    """The names among :attr:`globals` bound from the spec (its classes, formulas, memos), in
    the order they were bound; the rest are draftmeta's own (:meth:`explain` lists both)."""
    fields_by_line: Mapping[int, str]
    """Which field each line written for a rule belongs to (line numbers of :attr:`source`):
    its structure and formula checks, its new host value and its check and store, its tensor
    write. A write that raises is reported as :class:`~draftmeta.errors.WriteFailed` naming
    the field at the line the exception left the function at (the global ``_FIELD_AT_LINE``
    is this map)."""

    @property
    def filename(self) -> str:
        """The file name tracebacks and :mod:`linecache` show for the compiled function: the
        part (``update`` for the full update), the spec and a digest of the source."""
        digest = hashlib.sha1(self.source.encode()).hexdigest()[:10]
        part = "update" if self.part == "full" else self.part
        return f"<draftmeta generated {part} {self.spec} {digest}>"

    def explain(self) -> str:
        """The source after a header of comments saying what every global it reads holds, so
        the text stands alone (:func:`~draftmeta.codegen.describe.header`)."""
        return header(self.spec, self.source, self.globals, self.bound) + self.source

    def compile(self) -> types.FunctionType:
        """Compile the source into a function whose globals are :attr:`globals`, and register
        the source with :mod:`linecache` under :attr:`filename` so tracebacks and debuggers
        show its lines. The function's ``__draftmeta_generated__`` is this result and its
        ``__draftmeta_source__`` the source."""
        namespace = dict(self.globals)
        exec(compile(self.source, self.filename, "exec"), namespace)
        linecache.cache[self.filename] = (len(self.source), None,
                                          self.source.splitlines(True), self.filename)
        fn = namespace[self.function_name]
        assert isinstance(fn, types.FunctionType)
        fn.__module__ = "draftmeta.generated"
        fn.__draftmeta_generated__ = self  # type: ignore[attr-defined]
        fn.__draftmeta_source__ = self.source  # type: ignore[attr-defined]
        return fn
