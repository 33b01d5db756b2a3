"""The rule vocabulary: how one metadata field changes between two draft steps.

A spec binds exactly one rule to every field of a metadata class. Rules are immutable values;
the code generator turns each into a few lines of the generated update function.

Names that a rule reads are *references*:

* ``"state.NAME"`` reads field ``NAME`` of the :class:`~draftmeta.state.DraftState` that the
  draft loop advances once per step (positions, seq_lens, slot_mapping, max_model_len, ...);
* any other string is a dotted path into the metadata object itself (``"decode.seq_lens"``).

Bounds of overflow policies and host rules name host scalars of the draft state
(``"max_model_len"``), without the ``state.`` prefix.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal

import attrs

from draftmeta.derivations import Derivation, RecomputeHook

__all__ = [
    "Advance",
    "Alias",
    "Clamp",
    "Derive",
    "HostAdvance",
    "HostConstant",
    "HostDerive",
    "HostSet",
    "HostUpperBound",
    "Invalidate",
    "Overflow",
    "Recompute",
    "Reset",
    "Rule",
    "Target",
    "Unchanged",
    "Unsupported",
    "Wrap",
    "WrittenBy",
    "copy_of",
    "same_value",
]

Target = Literal["tensor", "int tensor", "host", "int", "object", "any"]
"""What kind of field a rule may be bound to."""


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


def _identifier(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value.isidentifier():
        raise ValueError(
            f"{attribute.name} must name a draft-state field (a Python identifier), got {value!r}"
        )


def _refs(_: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    for ref in value:
        if not isinstance(ref, str) or not all(p.isidentifier() for p in ref.split(".")):
            raise ValueError(
                f"{attribute.name} must hold dotted field paths such as 'decode.seq_lens' or "
                f"'state.positions', got {ref!r}"
            )


def _as_refs(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(
            f"inputs must be a list of references, got the bare string {value!r} (which would "
            f"be read as its characters); write ({value!r},)"
        )
    return tuple(value)


def _int(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int:
        raise TypeError(f"{attribute.name} must be an int, got {value!r}")


def _text(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be a str, got {value!r}")


def _path(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not all(p.isidentifier() for p in value.split(".")):
        raise ValueError(
            f"{attribute.name} must be a dotted field path such as 'decode.tile_metadata', "
            f"got {value!r}"
        )


def _instance(kind: type) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, type) and issubclass(value, kind):
            raise TypeError(
                f"{attribute.name} must be a {kind.__name__} instance, got the class "
                f"{value.__qualname__}; write {value.__qualname__}()"
            )
        if not isinstance(value, kind):
            raise TypeError(f"{attribute.name} must be a {kind.__name__}, got {value!r}")
        for name in ("name", "formula"):
            text = getattr(value, name, None)
            if not isinstance(text, str) or not text:
                raise TypeError(
                    f"{attribute.name}: {type(value).__qualname__} has no {name} (a non-empty "
                    f"str); set the class attribute {name} = '...'"
                )

    return check


def same_value(value: object) -> object:
    """The value itself: a :class:`HostDerive` with this function and one input is a plain copy
    (``copy_of``), which the code generator writes as an assignment, without a call."""
    return value


def copy_of(ref: str) -> HostDerive:
    """A host field that mirrors another host value each step (``max_seq_len`` from the
    draft state's)."""
    return HostDerive(same_value, (ref,), formula=ref)


class Rule(abc.ABC):
    """Base class of every rule.

    Attributes:
        kind: the rule's name as shown by ``explain`` and in errors.
        target: which kind of field the rule fits.
        writes: whether the rule writes the field (mutating rules must be ordered).
    """

    kind: ClassVar[str]
    target: ClassVar[Target]
    writes: ClassVar[bool]

    def reads(self) -> tuple[str, ...]:
        """The references (``state.X`` or metadata paths) the rule reads."""
        return ()

    def bounds(self) -> tuple[str, ...]:
        """The host scalars of the draft state that the rule uses as bounds."""
        return ()

    @abc.abstractmethod
    def describe(self) -> str:
        """A one-line description, used as a comment in the generated source."""


@attrs.frozen
class Unchanged(Rule):
    """The field keeps its value across draft steps (block tables, counts, ``None`` parts).

    Bound to a nested record, it covers every field of that record.
    """

    kind: ClassVar[str] = "unchanged"
    target: ClassVar[Target] = "any"
    writes: ClassVar[bool] = False

    def describe(self) -> str:
        return "unchanged"


@attrs.frozen
class Alias(Rule):
    """The field is a view of a persistent draft-state buffer that the loop already advances.

    Nothing is written; the update checks, before any write, that the field still shares
    storage with ``state.<source>`` (a copy would silently go stale). A pair of tensor objects
    checked once is remembered (the generated function keeps a reference to the last pair), so
    in the steady state the check is two identity tests; swapping a tensor's storage with
    ``set_()`` behind the update's back is not detected.

    Attributes:
        source: the draft-state tensor the field is a view of, e.g. ``"seq_lens"``.
    """

    kind: ClassVar[str] = "alias"
    target: ClassVar[Target] = "tensor"
    writes: ClassVar[bool] = False
    source: str = attrs.field(validator=_identifier)

    def reads(self) -> tuple[str, ...]:
        return (f"state.{self.source}",)

    def describe(self) -> str:
        return f"alias: a view of state.{self.source}, advanced by the loop"


@attrs.frozen
class Clamp:
    """Overflow policy of the new model runner: values stop at ``state.<bound> + offset``.

    Positions use ``Clamp("max_model_len", -1)``, sequence lengths ``Clamp("max_model_len")``.
    """

    kind: ClassVar[str] = "clamp"
    bound: str = attrs.field(validator=_identifier)
    offset: int = attrs.field(default=0, validator=_int)


@attrs.frozen
class Wrap:
    """Overflow policy of the older proposer: a value past ``state.<bound> + offset`` restarts.

    A value that would pass the limit restarts at ``restart`` (positions restart at 0, sequence
    lengths at 1; the slot-mapping derivation then pads the row with -1).
    """

    kind: ClassVar[str] = "wrap"
    bound: str = attrs.field(validator=_identifier)
    offset: int = attrs.field(default=0, validator=_int)
    restart: int = attrs.field(default=0, validator=_int)


Overflow = Clamp | Wrap
"""An overflow policy: :class:`Clamp` or :class:`Wrap`."""


@attrs.frozen
class Advance(Rule):
    """An integer tensor grows by ``by`` in place each step, with an explicit overflow policy.

    Attributes:
        overflow: what happens at the limit (:class:`Clamp` or :class:`Wrap`).
        by: the increment per step (a positive int).
        rows: a host int of the draft state (``"num_reqs"``): only that many leading rows
            advance and the rest (padding) keep their values, as vLLM's runners leave padded
            rows at 0; ``None`` advances every row.
    """

    kind: ClassVar[str] = "advance"
    target: ClassVar[Target] = "int tensor"
    writes: ClassVar[bool] = True
    overflow: Overflow = attrs.field(validator=attrs.validators.instance_of((Clamp, Wrap)))
    by: int = attrs.field(default=1, validator=_positive)
    rows: str | None = attrs.field(default=None, validator=attrs.validators.optional(_identifier))

    def __attrs_post_init__(self) -> None:
        if isinstance(self.overflow, Wrap) and self.overflow.restart < 0:
            raise ValueError(f"Wrap.restart must be >= 0, got {self.overflow.restart}")

    def bounds(self) -> tuple[str, ...]:
        return (self.overflow.bound,) + ((self.rows,) if self.rows else ())

    def describe(self) -> str:
        o = self.overflow
        limit = f"state.{o.bound}{o.offset:+d}" if o.offset else f"state.{o.bound}"
        rows = f" (rows < state.{self.rows}; the rest stay)" if self.rows else ""
        if isinstance(o, Clamp):
            return f"advance: += {self.by}, clamped to {limit}{rows}"
        return f"advance: += {self.by}, past {limit} restarts at {o.restart}{rows}"


@attrs.frozen
class Derive(Rule):
    """The field is recomputed every step from other fields by a formula, never incremented.

    Attributes:
        derivation: the formula (an in-place, allocation-free torch implementation).
        inputs: references the formula reads, in the order it takes them.
    """

    kind: ClassVar[str] = "derive"
    target: ClassVar[Target] = "tensor"
    writes: ClassVar[bool] = True
    derivation: Derivation = attrs.field(validator=_instance(Derivation))
    inputs: tuple[str, ...] = attrs.field(converter=_as_refs, validator=_refs)

    def reads(self) -> tuple[str, ...]:
        return self.inputs

    def describe(self) -> str:
        return f"derive: {self.derivation.formula}"


@attrs.frozen
class Recompute(Rule):
    """A backend kernel refills a persistent buffer of fixed shape (a scheduler's metadata).

    Attributes:
        hook: the backend hook; it writes into the field's tensor in place.
        inputs: references the hook reads.
    """

    kind: ClassVar[str] = "recompute"
    target: ClassVar[Target] = "tensor"
    writes: ClassVar[bool] = True
    hook: RecomputeHook = attrs.field(validator=_instance(RecomputeHook))
    inputs: tuple[str, ...] = attrs.field(converter=_as_refs, validator=_refs)
    also: tuple[str, ...] = attrs.field(default=(), converter=_as_refs, validator=_refs)

    def reads(self) -> tuple[str, ...]:
        return self.inputs

    def describe(self) -> str:
        extra = f" (and {', '.join(self.also)})" if self.also else ""
        return f"recompute: {self.hook.name} refills the buffer in place{extra}"


@attrs.frozen
class WrittenBy(Rule):
    """The field is refilled by the recompute hook of another field (one kernel, two outputs).

    FlashMLA's scheduler computes the tile metadata and ``num_splits`` in one call: the first
    field carries ``Recompute(hook, inputs, also=("...num_splits",))`` and the second
    ``WrittenBy("...tile_scheduler_metadata")``.

    Attributes:
        owner: the path of the field whose :class:`Recompute` rule writes this one.
    """

    kind: ClassVar[str] = "written by"
    target: ClassVar[Target] = "tensor"
    writes: ClassVar[bool] = False
    owner: str = attrs.field(validator=_path)

    def describe(self) -> str:
        return f"written by the recompute hook of {self.owner}"


@attrs.frozen
class Reset(Rule):
    """A lazily filled host object is replaced by a fresh one each step.

    FlashMLA's scheduler object caches its tile schedule on first use and may only be reused
    while the sequence lengths are unchanged, so every draft step needs a new one.

    Attributes:
        factory: makes the fresh object (called with no arguments).
        label: how the factory is shown in the generated source.
    """

    kind: ClassVar[str] = "reset"
    target: ClassVar[Target] = "object"
    writes: ClassVar[bool] = True
    factory: Callable[[], object] = attrs.field(validator=attrs.validators.is_callable())
    label: str = attrs.field(default="", validator=_text)

    def describe(self) -> str:
        name = self.label or getattr(self.factory, "__qualname__", repr(self.factory))
        return f"reset: replaced by a fresh {name}()"


@attrs.frozen
class Invalidate(Rule):
    """An optional, lazily filled field is set back to ``None`` so its consumer refills it.

    FlashInfer-MLA fills its flattened block table and sequence lengths on first use in the
    forward pass; they depend on the sequence lengths, so each draft step drops them.
    """

    kind: ClassVar[str] = "invalidate"
    target: ClassVar[Target] = "any"
    writes: ClassVar[bool] = True

    def describe(self) -> str:
        return "invalidate: set to None, refilled lazily by its consumer"


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
    clamp: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_identifier)
    )
    by: int = attrs.field(default=1, validator=_positive)

    def bounds(self) -> tuple[str, ...]:
        return (self.clamp,) if self.clamp else ()

    def describe(self) -> str:
        bound = f", clamped to state.{self.clamp}" if self.clamp else ""
        return f"host advance: += {self.by}{bound}"


@attrs.frozen
class HostUpperBound(Rule):
    """A host int frozen at a worst-case bound (``max_model_len``), as CUDA-graph capture needs.

    Attributes:
        bound: the draft-state scalar whose value the field takes.
    """

    kind: ClassVar[str] = "host upper bound"
    target: ClassVar[Target] = "int"
    writes: ClassVar[bool] = True
    bound: str = attrs.field(validator=_identifier)

    def bounds(self) -> tuple[str, ...]:
        return (self.bound,)

    def describe(self) -> str:
        return f"host upper bound: frozen at state.{self.bound}"


@attrs.frozen
class HostDerive(Rule):
    """A host scalar computed from other host scalars each step.

    ``fn`` receives the values of ``inputs`` in order and returns the new value. Inputs must be
    host values: reading a device tensor on the host would wait for the device.

    Attributes:
        fn: the function computing the value.
        inputs: references it reads (host scalars only).
        formula: how the computation is shown in the generated source.
    """

    kind: ClassVar[str] = "host derive"
    target: ClassVar[Target] = "host"
    writes: ClassVar[bool] = True
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

    Attributes:
        value: the constant: None, a bool, an int, a finite float or a str.
    """

    kind: ClassVar[str] = "host set"
    target: ClassVar[Target] = "host"
    writes: ClassVar[bool] = True
    value: object = attrs.field(validator=_literal)

    def literal(self) -> str:
        """The value as Python source."""
        return repr(self.value)

    def describe(self) -> str:
        return f"host set: = {self.literal()}"


@attrs.frozen
class Unsupported(Rule):
    """The field cannot be updated in place: builders with this spec always rebuild.

    Attributes:
        reason: why, reported by the draft loop as the fallback reason.
    """

    kind: ClassVar[str] = "unsupported"
    target: ClassVar[Target] = "any"
    writes: ClassVar[bool] = False
    reason: str = attrs.field(validator=attrs.validators.and_(_text, attrs.validators.min_len(1)))

    def describe(self) -> str:
        return f"unsupported: {self.reason}"
