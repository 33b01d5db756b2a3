"""Preconditions: what must hold for an in-place update to be valid.

A spec lists preconditions (decode-only batch, query length 1, no DCP, ...). The generated update
checks every one of them before it writes anything; when one fails it raises
:class:`~draftmeta.errors.PreconditionFailed` naming it, and the draft loop rebuilds instead.

Each precondition renders itself as a Python expression over references (``state.X`` or
metadata paths), so the checks appear verbatim in the generated source.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable

import attrs

__all__ = ["Equals", "IsNone", "IsNotNone", "Precondition", "SameValue", "Satisfies"]

Render = Callable[[str], str]
"""Turns a reference into the Python expression that reads it in generated code."""

Bind = Callable[[object, str], str]
"""Binds an object (with a name hint) into the generated module's globals; returns its name."""

_LITERALS = (int, bool, float, str, type(None))


def _literal(_: object, attribute: attrs.Attribute[object], value: object) -> None:
    if not isinstance(value, _LITERALS):
        raise ValueError(
            f"{attribute.name} must be an int, bool, float, str or None literal, got {value!r}"
        )


def _as_refs(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


class Precondition(abc.ABC):
    """Base class of preconditions.

    Attributes:
        name: the name reported when the precondition fails (``"decode_only"``).
    """

    name: str

    @abc.abstractmethod
    def reads(self) -> tuple[str, ...]:
        """The references the check reads."""

    @abc.abstractmethod
    def expression(self, render: Render, bind: Bind) -> str:
        """A Python expression that is true when the precondition holds."""

    @abc.abstractmethod
    def observed(self, render: Render) -> str:
        """An f-string body describing what was observed when it fails."""


@attrs.frozen
class Equals(Precondition):
    """``ref == value`` for a host value.

    Attributes:
        ref: the reference (``"num_prefills"`` or ``"state.dcp_world_size"``).
        value: the literal it must equal.
        name: the reported name (defaults to ``"<ref> == <value>"``).
    """

    ref: str
    value: object = attrs.field(validator=_literal)
    name: str = attrs.field()

    @name.default
    def _name(self) -> str:
        return f"{self.ref} == {self.value!r}"

    def reads(self) -> tuple[str, ...]:
        return (self.ref,)

    def expression(self, render: Render, bind: Bind) -> str:
        op = "is" if self.value is None or isinstance(self.value, bool) else "=="
        return f"{render(self.ref)} {op} {self.value!r}"

    def observed(self, render: Render) -> str:
        return f"{self.ref} is {{{render(self.ref)}!r}}, expected {self.value!r}"


@attrs.frozen
class IsNone(Precondition):
    """The referenced field is ``None`` (no prefill part, no DCP totals, ...)."""

    ref: str
    name: str = attrs.field()

    @name.default
    def _name(self) -> str:
        return f"{self.ref} is None"

    def reads(self) -> tuple[str, ...]:
        return (self.ref,)

    def expression(self, render: Render, bind: Bind) -> str:
        return f"{render(self.ref)} is None"

    def observed(self, render: Render) -> str:
        return f"{self.ref} is a {{type({render(self.ref)}).__name__}}, expected None"


@attrs.frozen
class IsNotNone(Precondition):
    """The referenced field is present (a decode part exists, ...)."""

    ref: str
    name: str = attrs.field()

    @name.default
    def _name(self) -> str:
        return f"{self.ref} is not None"

    def reads(self) -> tuple[str, ...]:
        return (self.ref,)

    def expression(self, render: Render, bind: Bind) -> str:
        return f"{render(self.ref)} is not None"

    def observed(self, render: Render) -> str:
        return f"{self.ref} is None"


@attrs.frozen
class SameValue(Precondition):
    """Two host values are equal (``num_decodes == num_decode_tokens``)."""

    left: str
    right: str
    name: str = attrs.field()

    @name.default
    def _name(self) -> str:
        return f"{self.left} == {self.right}"

    def reads(self) -> tuple[str, ...]:
        return (self.left, self.right)

    def expression(self, render: Render, bind: Bind) -> str:
        return f"{render(self.left)} == {render(self.right)}"

    def observed(self, render: Render) -> str:
        return (
            f"{self.left} is {{{render(self.left)}!r}} but {self.right} is "
            f"{{{render(self.right)}!r}}"
        )


@attrs.frozen
class Satisfies(Precondition):
    """A custom predicate over host values: ``fn(*values of refs)`` must be true.

    Attributes:
        name: the reported name.
        fn: the predicate.
        refs: references whose values ``fn`` receives, in order (host values only).
        description: what the predicate states, for messages.
    """

    name: str
    fn: Callable[..., bool] = attrs.field(validator=attrs.validators.is_callable())
    refs: tuple[str, ...] = attrs.field(converter=_as_refs)
    description: str = ""

    def reads(self) -> tuple[str, ...]:
        return self.refs

    def expression(self, render: Render, bind: Bind) -> str:
        return f"{bind(self.fn, self.name)}({', '.join(render(r) for r in self.refs)})"

    def observed(self, render: Render) -> str:
        values = ", ".join(f"{r}={{{render(r)}!r}}" for r in self.refs)
        return f"{self.description or self.name} is false for {values}"
