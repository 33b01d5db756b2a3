"""Rules of host values: scalars computed each step (:class:`HostAdvance`,
:class:`HostUpperBound`, :class:`HostDerive`, :class:`HostSet`) or kept
(:class:`HostConstant`), and host objects replaced (:class:`Reset`) or dropped
(:class:`Invalidate`) every step."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import attrs

from draftmeta.fields import FieldInfo, FieldKind
from draftmeta.rules.base import (
    Emitter,
    Rule,
    Target,
    _as_refs,
    _identifier,
    _positive,
    _refs,
    _text,
)

__all__ = [
    "HostAdvance",
    "HostConstant",
    "HostDerive",
    "HostSet",
    "HostUpperBound",
    "Invalidate",
    "Reset",
    "copy_of",
    "same_value",
]


def same_value(value: object) -> object:
    """The value itself: a :class:`HostDerive` with this function and one input is a plain copy
    (``copy_of``), which the code generator writes as an assignment, without a call."""
    return value


def copy_of(ref: str) -> HostDerive:
    """A host field that mirrors another host value each step (``max_seq_len`` from the
    draft state's)."""
    return HostDerive(same_value, (ref,), formula=ref)



@attrs.frozen
class Reset(Rule):
    """A lazily filled host object is replaced by a fresh one each step.

    FlashMLA's scheduler object caches its tile schedule on first use and may only be reused
    while the sequence lengths are unchanged, so every draft step needs a new one. Bound to a
    nested record, it covers every field of that record.

    Whether a captured CUDA graph can replay it depends on who fills the object. In general it
    cannot: the replacement happens on the host, once, while the graph is captured. With
    ``filled_on_device=True`` the rule states that the object's consumer fills it with device
    work only, at its first use in each step (FlashMLA's dense decode: the first layer's
    kernel call computes the tile schedule from the sequence-length buffer and stores the
    result tensors on the object; later layers reuse them). Then each draft step captured
    after the reset records its own schedule computation, and every replay recomputes it from
    the current lengths, so the rule is capture-safe.

    Attributes:
        factory: makes the fresh object (called with no arguments).
        label: how the factory is shown in the generated source.
        filled_on_device: the consumer fills the fresh object with device work alone (no
            host read of device values), so a captured graph replays the fill.
    """

    kind: ClassVar[str] = "reset"
    target: ClassVar[Target] = "object"
    writes: ClassVar[bool] = True
    covers_record: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True
    factory: Callable[[], object] = attrs.field(validator=attrs.validators.is_callable())
    label: str = attrs.field(default="", validator=_text)
    filled_on_device: bool = attrs.field(default=False,
                                         validator=attrs.validators.instance_of(bool))

    def describe(self) -> str:
        name = self.label or getattr(self.factory, "__qualname__", repr(self.factory))
        filled = ", filled on the device by its consumer" if self.filled_on_device else ""
        return f"reset: replaced by a fresh {name}(){filled}"

    def capture_problem(self) -> str | None:
        if self.filled_on_device:
            return None
        return ("is replaced by a host object every step (Reset), which a captured graph "
                "cannot replay")

    def lower_host(self, em: Emitter, path: str) -> str:
        return f"{em.bind(self.factory, 'new')}()"


@attrs.frozen
class Invalidate(Rule):
    """An optional, lazily filled field is set back to ``None`` so its consumer refills it.

    FlashInfer-MLA fills its flattened block table and sequence lengths on first use in the
    forward pass; they depend on the sequence lengths, so each draft step drops them. Only an
    optional field may be invalidated; a captured CUDA graph cannot replay it.
    """

    kind: ClassVar[str] = "invalidate"
    target: ClassVar[Target] = "any"
    writes: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True

    def describe(self) -> str:
        return "invalidate: set to None, refilled lazily by its consumer"

    def field_problem(self, info: FieldInfo) -> tuple[str, str] | None:
        if info.optional:
            return None
        return (f"rule invalidate sets it to None, but its annotation ({info.annotation}) does "
                "not allow None", "invalidate only optional, lazily filled fields")

    def capture_problem(self) -> str | None:
        return ("is replaced by a host object every step (Invalidate), which a captured graph "
                "cannot replay")

    def lower_host(self, em: Emitter, path: str) -> str:
        return "None"

    def lower_host_check(self, em: Emitter, path: str, local: str) -> None:
        pass  # None is what the field's consumer expects


@attrs.frozen
class HostConstant(Rule):
    """A host scalar that keeps its value for the whole draft loop (num_reqs, max_query_len)."""

    kind: ClassVar[str] = "host constant"
    target: ClassVar[Target] = "host"
    writes: ClassVar[bool] = False

    def describe(self) -> str:
        return "host constant"


@attrs.frozen
class HostAdvance(Rule):
    """A host int grows by ``by`` each step, clamped to ``state.<clamp>`` if given.

    Attributes:
        clamp: the draft-state scalar that bounds the value, or ``None`` for no bound.
        by: the increment per step.
    """

    kind: ClassVar[str] = "host advance"
    target: ClassVar[Target] = "int"
    writes: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True
    relative: ClassVar[bool] = True
    clamp: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_identifier)
    )
    by: int = attrs.field(default=1, validator=_positive)

    def bounds(self) -> tuple[str, ...]:
        return (self.clamp,) if self.clamp else ()

    def describe(self) -> str:
        bound = f", clamped to state.{self.clamp}" if self.clamp else ""
        return f"host advance: += {self.by}{bound}"

    def lower_host(self, em: Emitter, path: str) -> str:
        value = f"{em.ref(path)} + {self.by}"
        return f"min({value}, state.{self.clamp})" if self.clamp else value


@attrs.frozen
class HostUpperBound(Rule):
    """A host int frozen at a worst-case bound (``max_model_len``), as CUDA-graph capture needs.

    Attributes:
        bound: the draft-state scalar whose value the field takes.
    """

    kind: ClassVar[str] = "host upper bound"
    target: ClassVar[Target] = "int"
    writes: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True
    bound: str = attrs.field(validator=_identifier)

    def bounds(self) -> tuple[str, ...]:
        return (self.bound,)

    def describe(self) -> str:
        return f"host upper bound: frozen at state.{self.bound}"

    def lower_host(self, em: Emitter, path: str) -> str:
        return f"state.{self.bound}"


@attrs.frozen
class HostDerive(Rule):
    """A host scalar computed from other host scalars each step.

    ``fn`` receives the values of ``inputs`` in order and returns the new value. Inputs must be
    host values: reading a device tensor on the host would wait for the device. A float field
    must not become NaN; an int field must get an exact int.

    Attributes:
        fn: the function computing the value.
        inputs: references it reads (host scalars only).
        formula: how the computation is shown in the generated source.
    """

    kind: ClassVar[str] = "host derive"
    target: ClassVar[Target] = "host"
    writes: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True
    fn: Callable[..., object] = attrs.field(validator=attrs.validators.is_callable())
    inputs: tuple[str, ...] = attrs.field(converter=_as_refs, validator=_refs)
    formula: str = attrs.field(default="", validator=_text)

    def reads(self) -> tuple[str, ...]:
        return self.inputs

    def describe(self) -> str:
        if self.formula:
            return f"host derive: = {self.formula}"
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"host derive: {name}({', '.join(self.inputs)})"

    def reference_problem(self, ref: str, kind: FieldKind, what: str) -> tuple[str, str] | None:
        if kind is not FieldKind.TENSOR:
            return None
        return (f"host rule reads the tensor {ref!r}, which would wait for the device",
                "read host scalars only (state.max_seq_len, ...), or make the field a tensor "
                "rule")

    def lower_host(self, em: Emitter, path: str) -> str:
        if self.fn is same_value:
            return em.ref(self.inputs[0])  # a plain copy: no call
        fn = em.bind(self.fn, getattr(self.fn, "__name__", "fn"))
        return f"{fn}({', '.join(em.ref(r) for r in self.inputs)})"

    def lower_host_check(self, em: Emitter, path: str, local: str) -> None:
        if em.field(path).kind is FieldKind.FLOAT:
            em.emit(f"if {local} != {local}:")
            em.error(path, repr("would become NaN"), 1)
        else:
            super().lower_host_check(em, path, local)


def _literal(_: object, attribute: attrs.Attribute[object], value: object) -> None:
    ok = value is None or type(value) in (bool, int, str) or (
        isinstance(value, float) and type(value) is float and math.isfinite(value))
    if not ok:
        raise TypeError(
            f"{attribute.name} must be None, a bool, an int, a finite float or a str (written "
            f"into the generated source as a literal), got {value!r}; use HostDerive or Reset "
            "for other values"
        )


@attrs.frozen
class HostSet(Rule):
    """A host field set to the same constant every step (FlashMLA's scheduler flag
    ``have_initialized = False``), written into the generated source as a literal.

    An int constant needs no run-time type check; any other value bound to an int field gets
    one (it fails every step, as it should).

    Attributes:
        value: the constant: None, a bool, an int, a finite float or a str.
    """

    kind: ClassVar[str] = "host set"
    target: ClassVar[Target] = "host"
    writes: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True
    value: object = attrs.field(validator=_literal)

    def literal(self) -> str:
        """The value as Python source."""
        return repr(self.value)

    def describe(self) -> str:
        return f"host set: = {self.literal()}"

    def lower_host(self, em: Emitter, path: str) -> str:
        return self.literal()

    def lower_host_check(self, em: Emitter, path: str, local: str) -> None:
        if type(self.value) is not int:  # an int literal is an int: nothing to check
            super().lower_host_check(em, path, local)


