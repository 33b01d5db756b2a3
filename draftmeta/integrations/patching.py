"""Class attributes of an engine replaced and later restored exactly.

The vLLM plugin patches builder classes for the life of a process (until ``unregister``);
``draftmeta e2e`` patches vLLM's proposer for the length of one run. Both use :class:`Patches`.
"""

from __future__ import annotations

from types import TracebackType

import attrs

__all__ = ["Patches"]

_MISSING = object()


@attrs.define
class _Saved:
    owner: type
    name: str
    original: object  # the class's own attribute, or _MISSING when it was inherited


@attrs.define
class Patches:
    """A stack of class-attribute replacements; a context manager that undoes them on exit.

    Restoring puts back the class's own attribute, or deletes the replacement when the
    attribute was inherited, so the class ends exactly as it was.
    """

    _saved: list[_Saved] = attrs.field(factory=list, init=False)

    def replace(self, owner: type, name: str, value: object) -> None:
        """Set ``owner.name`` to ``value`` until :meth:`restore`.

        Raises:
            AttributeError: ``owner`` has no attribute ``name`` (own or inherited): the
                installed engine release is not the one the caller was written against.
        """
        if not hasattr(owner, name):
            raise AttributeError(
                f"{owner.__module__}.{owner.__qualname__} has no attribute {name!r}; the "
                "installed engine is not the release draftmeta was written against"
            )
        self._saved.append(_Saved(owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def restore(self) -> None:
        """Undo every replacement, newest first."""
        while self._saved:
            saved = self._saved.pop()
            if saved.original is _MISSING:
                delattr(saved.owner, saved.name)
            else:
                setattr(saved.owner, saved.name, saved.original)

    def __enter__(self) -> Patches:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()
