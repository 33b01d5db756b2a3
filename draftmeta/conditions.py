"""Preconditions: what must hold for an in-place update to be valid.

A spec lists preconditions (decode-only batch, query length 1, no DCP, ...). The generated update
checks every one of them before it writes anything; when one fails it raises
:class:`~draftmeta.errors.PreconditionFailed` naming it, and the draft loop rebuilds instead.

Each precondition renders itself as a Python expression over references (``state.X`` or
metadata paths), so the checks appear verbatim in the generated source. User text (names,
values, descriptions) never becomes code: values go through ``repr`` (or are bound as
constants), and the literal parts of failure messages have their braces escaped.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import attrs

__all__ = ["Equals", "IsNone", "IsNotNone", "Precondition", "SameValue", "Satisfies"]

Render = Callable[[str], str]
"""Turns a reference into the Python expression that reads it in generated code."""

Bind = Callable[[object, str], str]
"""Binds an object (with a name hint) into the generated module's globals; returns its name."""

_LITERALS = (int, bool, float, str, type(None))


def _literal(_: object, attribute: attrs.Attribute[object], value: object) -> None:
    if type(value) not in _LITERALS:  # exact types: a numpy int or str subclass has another repr
        raise ValueError(
            f"{attribute.name} must be an int, bool, float, str or None literal, got {value!r} "
            f"({type(value).__qualname__})"
        )
    if isinstance(value, float) and value != value:
        raise ValueError(
            f"{attribute.name} is NaN, which equals nothing: the check could never hold"
        )


def _ref(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not all(p.isidentifier() for p in value.split(".")):
        raise ValueError(
            f"{attribute.name} must be a dotted field path such as 'num_prefills' or "
            f"'state.dcp_world_size', got {value!r}"
        )


def _name(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty str, got {value!r}")


def _as_refs(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(
            f"refs must be a list of field paths, got the bare string {value!r} (which would be "
            f"read as its characters); write ({value!r},)"
        )
    return tuple(value)


def _refs(_: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    for ref in value:
        _ref(_, attribute, ref)


def _text(value: str) -> str:
    """``value`` as the literal part of an f-string body: braces doubled, so never evaluated."""
    return value.replace("{", "{{").replace("}", "}}")


def _value(value: object, bind: Bind) -> str:
    """A Python expression for a literal: its ``repr`` where that evaluates back to it, else a
    bound constant (``inf`` has no literal)."""
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return bind(value, "inf")
    return repr(value)


class Precondition(abc.ABC):
    """Base class of preconditions.

    Attributes:
        name: the name reported when the precondition fails (``"decode_only"``).
        host_only: the check compares values on the host, so every reference must be a host
            value (reading a device tensor there would wait for the device); checked when the
            spec is declared.
    """

    name: str
    host_only: ClassVar[bool] = False

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

    ref: str = attrs.field(validator=_ref)
    value: object = attrs.field(validator=_literal)
    host_only: ClassVar[bool] = True
    name: str = attrs.field(validator=_name)

    @name.default
    def _default_name(self) -> str:
        return f"{self.ref} == {self.value!r}"

    def reads(self) -> tuple[str, ...]:
        return (self.ref,)

    def expression(self, render: Render, bind: Bind) -> str:
        op = "is" if self.value is None or isinstance(self.value, bool) else "=="
        return f"{render(self.ref)} {op} {_value(self.value, bind)}"

    def observed(self, render: Render) -> str:
        return f"{self.ref} is {{{render(self.ref)}!r}}, expected {_text(repr(self.value))}"


@attrs.frozen
class IsNone(Precondition):
    """The referenced field is ``None`` (no prefill part, no DCP totals, ...)."""

    ref: str = attrs.field(validator=_ref)
    name: str = attrs.field(validator=_name)

    @name.default
    def _default_name(self) -> str:
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

    ref: str = attrs.field(validator=_ref)
    name: str = attrs.field(validator=_name)

    @name.default
    def _default_name(self) -> str:
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

    left: str = attrs.field(validator=_ref)
    right: str = attrs.field(validator=_ref)
    host_only: ClassVar[bool] = True
    name: str = attrs.field(validator=_name)

    @name.default
    def _default_name(self) -> str:
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

    host_only: ClassVar[bool] = True
    name: str = attrs.field(validator=_name)
    fn: Callable[..., bool] = attrs.field(validator=attrs.validators.is_callable())
    refs: tuple[str, ...] = attrs.field(converter=_as_refs, validator=_refs)
    description: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    def reads(self) -> tuple[str, ...]:
        return self.refs

    def expression(self, render: Render, bind: Bind) -> str:
        return f"{bind(self.fn, self.name)}({', '.join(render(r) for r in self.refs)})"

    def observed(self, render: Render) -> str:
        values = ", ".join(f"{r}={{{render(r)}!r}}" for r in self.refs)
        return f"{_text(self.description or self.name)} is false for {values}"
