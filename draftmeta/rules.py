"""The rule vocabulary: how one metadata field changes between two draft steps.

A spec binds exactly one rule to every field of a metadata class. Rules are immutable values,
and each rule *lowers itself*: it owns its checks, its host computation, its tensor write, its
optional Triton emission and its properties (what it may be bound to, whether it covers a
nested record, whether a CUDA graph can replay it, whether the fused kernel can apply it).
:mod:`draftmeta.codegen` only drives the phases of the generated update function and asks each
rule for its lines through the ``lower_*`` methods of :class:`Rule` and an :class:`Emitter`;
:mod:`draftmeta.fused`, :mod:`draftmeta.spec` and the draft loop ask the rule's properties.
A new rule kind is therefore one subclass of :class:`Rule`: nothing else changes.

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
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Literal, Protocol

import attrs
import torch

from draftmeta.derivations import Derivation, InPlaceFunction, RecomputeHook, TritonKernel
from draftmeta.fields import FieldInfo, FieldKind, class_fields
from draftmeta.layout import Written
from draftmeta.state import DraftState

__all__ = [
    "Advance",
    "Alias",
    "Clamp",
    "Derive",
    "Emitter",
    "HostAdvance",
    "HostConstant",
    "HostDerive",
    "HostSet",
    "HostUpperBound",
    "Invalidate",
    "Memory",
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


_STATE_FIELDS: dict[str, FieldInfo] = {f.name: f for f in class_fields(DraftState)}

Memory = tuple[Written, tuple[str, ...]]
"""One entry of the memory check: what a rule writes (or keeps) and the expressions of the
tensors involved, the field first (see :class:`~draftmeta.layout.LayoutGuard`)."""


class Emitter(Protocol):
    """The generated function being written, as a rule's ``lower_*`` methods see it.

    Lines are indented relative to the phase the rule is lowered in (``depth=0`` is the phase's
    own level). The generated module provides, besides what :meth:`bind` adds: ``_Tensor``
    (``torch.Tensor``), ``_bool`` (``torch.bool``), ``_int`` (``int``), ``_raised(exc)`` (the
    message of an exception raised inside a formula), ``_UpdateError`` and ``_SPEC``; the locals
    ``_pair`` and ``_problem`` are free for a rule's checks.
    """

    def emit(self, line: str = "", depth: int = 0) -> None:
        """Write one line of code, ``depth`` levels below the phase's indentation."""

    def comment(self, text: str, depth: int = 0) -> None:
        """Write ``text`` as a one-line comment (user text is escaped)."""

    def error(self, path: str, detail: str, depth: int = 0) -> None:
        """Write ``raise _UpdateError(_SPEC, path, detail)``; ``detail`` is a Python expression
        (a ``repr``-ed string, or an f-string over locals)."""

    def ref(self, ref: str) -> str:
        """The expression reading a reference (``state.X``, a metadata path) at this point of
        the function: a new host value computed this step, a nested record's local, or the
        attribute chain."""

    def bind(self, obj: object, hint: str) -> str:
        """A global of the generated module holding ``obj`` (one per object), named after
        ``hint`` (suffixed only on collision); ``explain`` lists what it holds."""

    def fresh(self, hint: str) -> str:
        """A new local name made from ``hint``."""

    def field(self, path: str) -> FieldInfo:
        """What the spec knows of the field at ``path`` (its kind, optionality, dtype)."""

    def optional(self, path: str) -> bool:
        """Whether the field at ``path`` may be ``None``."""

    def readable(self, path: str) -> bool:
        """Whether ``path`` can be read without first checking an optional record on the way
        (top-level, or its record is a checked local of the function)."""


def _plus(expr: str, offset: int) -> str:
    if offset > 0:
        return f"{expr} + {offset}"
    if offset < 0:
        return f"{expr} - {-offset}"
    return expr


def _bound_name(bound: str, offset: int) -> str:
    """A kernel argument name for ``state.<bound> + offset`` (``max_model_len_minus_1``)."""
    if offset == 0:
        return bound
    return f"{bound}_{'plus' if offset > 0 else 'minus'}_{abs(offset)}"


def _shares_storage(view: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether ``view`` starts at ``buffer``'s address or lies in the same storage."""
    return view.data_ptr() == buffer.data_ptr() or (
        view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    )


_shares_storage.__draftmeta_describe__ = (  # type: ignore[attr-defined]
    "(view, buffer) -> whether view starts at buffer's address or lies in its storage"
)


def _require_tensor(em: Emitter, path: str) -> None:
    """An optional field that a tensor rule reads must hold a tensor this step."""
    if em.optional(path):
        expr = em.ref(path)
        em.emit(f"if {expr} is None:")
        em.error(path, repr("is None, expected a tensor"), 1)


def _formula_check(em: Emitter, path: str, call: tuple[str, str]) -> None:
    """``check`` of a formula or hook: its problem, or an exception it raised, as an
    :class:`~draftmeta.errors.UpdateError` of ``path``."""
    name, args = call
    em.emit("try:")
    em.emit(f"_problem = {name}.check({args})", 1)
    em.emit("except Exception as _exc:")
    em.emit(f"raise _UpdateError(_SPEC, {path!r}, _raised(_exc)) from _exc", 1)
    em.emit("if _problem is not None:")
    em.error(path, "_problem", 1)


class Rule(abc.ABC):
    """Base class of every rule: what it is, what it may be bound to, and how it lowers.

    A rule kind is one subclass. Its class attributes and properties answer the spec's
    declaration-time questions; its ``lower_*`` methods write its lines of the generated update
    function, phase by phase (each default writes nothing):

    1. :meth:`lower_structure`: checks before any write (the field is a tensor, an alias still
       shares storage, ...);
    2. :meth:`state_operands`: host ints of the draft state the rule needs in range;
    3. :meth:`lower_host` (rules with :attr:`stores_host_value`): the new host value, computed
       before any write, then :meth:`lower_host_check` on it;
    4. :meth:`lower_formula_check`: checks that may read this step's new host values;
    5. :meth:`memory`: what the memory check must know of the tensors it writes;
    6. :meth:`lower_write`: the in-place tensor write;
    7. :meth:`lower_triton`: the same write in the fused Triton kernel (rules that are
       :attr:`fusable`).

    Attributes:
        kind: the rule's name as shown by ``explain`` and in errors.
        target: which kind of field the rule fits.
        writes: whether the rule writes the field (mutating rules must be ordered).
        covers_record: bound to a nested record, the rule covers every field inside it.
        inspects: the update reads the field to check it although it writes nothing.
        stores_host_value: the rule computes a new host value each step (:meth:`lower_host`)
            that the update stores into the field after every write (the record must be
            mutable).
    """

    kind: ClassVar[str]
    target: ClassVar[Target]
    writes: ClassVar[bool]
    covers_record: ClassVar[bool] = False
    inspects: ClassVar[bool] = False
    stores_host_value: ClassVar[bool] = False

    def reads(self) -> tuple[str, ...]:
        """The references (``state.X`` or metadata paths) the rule reads."""
        return ()

    def bounds(self) -> tuple[str, ...]:
        """The host scalars of the draft state that the rule uses as bounds."""
        return ()

    @abc.abstractmethod
    def describe(self) -> str:
        """A one-line description, used as a comment in the generated source."""

    # -- properties asked at declaration --------------------------------------------------------

    @property
    def touches_field(self) -> bool:
        """Whether the generated update reads or writes the field (nested records on the way
        are then loaded and checked)."""
        return self.writes or self.inspects

    @property
    def unsupported_reason(self) -> str | None:
        """Why the field cannot be updated in place, or ``None`` (the spec then rebuilds)."""
        return None

    @property
    def written_by(self) -> str | None:
        """The path of the field whose rule writes this one too, or ``None``."""
        return None

    def also_writes(self) -> tuple[str, ...]:
        """Other fields the rule's write refills (each bound to ``WrittenBy`` this field)."""
        return ()

    @property
    def in_place_function(self) -> InPlaceFunction | None:
        """The formula or hook the rule applies to its :meth:`reads` (checked against their
        kinds at declaration), or ``None``."""
        return None

    def field_problem(self, info: FieldInfo) -> tuple[str, str] | None:
        """``(problem, fix)`` if the rule cannot be bound to this field beyond what
        :attr:`target` says, else ``None``."""
        return None

    def reference_problem(self, ref: str, kind: FieldKind, what: str) -> tuple[str, str] | None:
        """``(problem, fix)`` if the rule cannot read ``ref``, a field of kind ``kind``
        (``what`` describes it for messages), else ``None``."""
        return None

    def capture_problem(self) -> str | None:
        """Why a CUDA graph cannot replay the rule's update, as a clause following the field's
        path (``"is replaced by ..."``), or ``None`` if it can."""
        return None

    @property
    def capture_safe(self) -> bool:
        """Whether a captured CUDA graph replays the rule's update faithfully."""
        return self.capture_problem() is None

    @property
    def fusable(self) -> bool:
        """Whether the fused Triton kernel can apply the rule (:meth:`lower_triton`)."""
        return False

    def state_operands(self) -> tuple[tuple[str, int], ...]:
        """``(name, least)`` of every host int of the draft state the update needs to be an
        exact int ``>= least`` before it writes anything (default: each bound, at least 1)."""
        return tuple((b, 1) for b in self.bounds())

    # -- lowering --------------------------------------------------------------------------------

    def lower_structure(self, em: Emitter, path: str) -> None:
        """Write the checks that run before any write and before new host values exist."""
        return None  # by default the rule writes no line in this phase

    def lower_host(self, em: Emitter, path: str) -> str:
        """The expression of the field's new host value (write no lines; the generator
        assigns it to a local, checks it with :meth:`lower_host_check` and stores it after
        every write). Only called when :attr:`stores_host_value` is set."""
        raise NotImplementedError(
            f"{type(self).__qualname__} sets stores_host_value but defines no lower_host"
        )

    def lower_host_check(self, em: Emitter, path: str, local: str) -> None:
        """Write the checks of the new host value held in ``local`` (default: an int field
        must get an exact int)."""
        if em.field(path).kind is FieldKind.INT:
            em.emit(f"if type({local}) is not _int:")
            em.error(path, f"f'would become {{{local}!r}}, not an int'", 1)

    def lower_formula_check(self, em: Emitter, path: str) -> None:
        """Write the checks that run after the new host values are computed (a formula's
        inputs may be among them), before any write."""
        return None  # by default the rule writes no line in this phase

    def memory(self, em: Emitter, path: str) -> Sequence[Memory]:
        """What the memory check must verify before the first write: the tensors the rule
        writes own their memory (or, for a field said to stay, overlap no moved buffer)."""
        return ()

    def lower_write(self, em: Emitter, path: str) -> None:
        """Write the in-place tensor write, in declaration order with the other rules'
        (an exception raised there is reported as a :class:`~draftmeta.errors.WriteFailed`)."""
        return None  # by default the rule writes no line in this phase

    def lower_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        """Write the rule's update into the fused Triton kernel; ``out`` is the field's tensor,
        ``inputs`` the values of :meth:`reads`, ``names`` the argument names of the field and
        its inputs. Only called when :attr:`fusable`."""
        raise NotImplementedError(
            f"{type(self).__qualname__} says it is fusable but defines no lower_triton"
        )


@attrs.frozen
class Unchanged(Rule):
    """The field keeps its value across draft steps (block tables, counts, ``None`` parts).

    Bound to a nested record, it covers every field of that record. A tensor field said to
    stay must not be a view of a buffer the draft loop's advance moves (the memory check).
    """

    kind: ClassVar[str] = "unchanged"
    target: ClassVar[Target] = "any"
    writes: ClassVar[bool] = False
    covers_record: ClassVar[bool] = True

    def describe(self) -> str:
        return "unchanged"

    def memory(self, em: Emitter, path: str) -> Sequence[Memory]:
        if em.field(path).kind is FieldKind.TENSOR and em.readable(path):
            return ((Written(path, 0, None, unchanged=True), (em.ref(path),)),)
        return ()


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
    inspects: ClassVar[bool] = True
    source: str = attrs.field(validator=_identifier)

    def reads(self) -> tuple[str, ...]:
        return (f"state.{self.source}",)

    def describe(self) -> str:
        return f"alias: a view of state.{self.source}, advanced by the loop"

    def reference_problem(self, ref: str, kind: FieldKind, what: str) -> tuple[str, str] | None:
        if kind is FieldKind.TENSOR:
            return None
        return (f"is an alias of {ref}, which is {what}, not a tensor buffer",
                f"alias a tensor of the draft state; for a host value use copy_of({ref!r})")

    def lower_structure(self, em: Emitter, path: str) -> None:
        _require_tensor(em, path)
        expr, src = em.ref(path), f"state.{self.source}"
        if _STATE_FIELDS[self.source].optional:
            em.emit(f"if {src} is None:")
            em.error(path, repr(f"is an alias of {src}, which is None"), 1)
        # a pair of tensor objects verified once stays verified (a tensor's storage is fixed
        # unless set_() swaps it): the steady state costs two identity tests
        shares = em.bind(_shares_storage, "shares_storage")
        memo = em.bind([None], f"verified_{path}")
        em.emit(f"_pair = {memo}[0]")
        em.emit(f"if _pair is None or _pair[0] is not {expr} or _pair[1] is not {src}:")
        em.emit(f"if not {shares}({expr}, {src}):", 1)
        em.error(path, repr(f"no longer shares storage with {src} (a copy would go stale)"), 2)
        em.emit(f"{memo}[0] = ({expr}, {src})", 1)


@attrs.frozen
class Clamp:
    """Overflow policy of the new model runner: values stop at ``state.<bound> + offset``.

    Positions use ``Clamp("max_model_len", -1)``, sequence lengths ``Clamp("max_model_len")``.
    """

    kind: ClassVar[str] = "clamp"
    bound: str = attrs.field(validator=_identifier)
    offset: int = attrs.field(default=0, validator=_int)

    def least_bound(self) -> int:
        """The least value of ``state.<bound>`` the policy works with (the limit is >= 0)."""
        return max(1, -self.offset)

    def describe(self, by: int) -> str:
        """``explain``'s text for an advance by ``by`` under this policy."""
        return f"+= {by}, clamped to {_plus_text(self.bound, self.offset)}"

    def lower(self, expr: str, by: int) -> str:
        """The torch statement advancing the tensor ``expr`` in place."""
        return f"{expr}.add_({by}).clamp_(max={_plus(f'state.{self.bound}', self.offset)})"

    def lower_triton(self, kernel: TritonKernel, value: str, by: int) -> str:
        """The Triton expression of the advanced ``value`` (a register)."""
        bound, offset = self.bound, self.offset
        limit = kernel.scalar(_bound_name(bound, offset),
                              lambda s: int(getattr(s, bound)) + offset)
        return f"tl.minimum({value} + {by}, {limit})"


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

    def least_bound(self) -> int:
        """The least value of ``state.<bound>`` the policy works with (the span
        ``bound + offset - restart + 1`` is at least 1)."""
        return max(1, self.restart - self.offset)

    def describe(self, by: int) -> str:
        """``explain``'s text for an advance by ``by`` under this policy."""
        return f"+= {by}, past {_plus_text(self.bound, self.offset)} restarts at {self.restart}"

    def lower(self, expr: str, by: int) -> str:
        """The torch statement advancing the tensor ``expr`` in place."""
        # values live in [restart, limit]; x' = (x + by - restart) % span + restart
        span = _plus(f"state.{self.bound}", self.offset - self.restart + 1)
        shift = by - self.restart
        head = f"{expr}.add_({shift})" if shift else expr
        tail = f".add_({self.restart})" if self.restart else ""
        return f"{head}.remainder_({span}){tail}"

    def lower_triton(self, kernel: TritonKernel, value: str, by: int) -> str:
        """The Triton expression of the advanced ``value`` (a register)."""
        bound, offset, restart = self.bound, self.offset, self.restart
        span = kernel.scalar(f"{_bound_name(bound, offset)}_span_from_{restart}",
                             lambda s: int(getattr(s, bound)) + offset - restart + 1)
        return f"({value} + {by - restart}) % {span} + {restart}"


def _plus_text(bound: str, offset: int) -> str:
    return f"state.{bound}{offset:+d}" if offset else f"state.{bound}"


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
        rows = f" (rows < state.{self.rows}; the rest stay)" if self.rows else ""
        return f"advance: {self.overflow.describe(self.by)}{rows}"

    @property
    def fusable(self) -> bool:
        return True

    def state_operands(self) -> tuple[tuple[str, int], ...]:
        rows = ((self.rows, 0),) if self.rows else ()
        return (*rows, (self.overflow.bound, self.overflow.least_bound()))

    def lower_structure(self, em: Emitter, path: str) -> None:
        _require_tensor(em, path)
        expr = em.ref(path)
        em.emit(f"if not isinstance({expr}, _Tensor):")
        em.error(path, f"f'is a {{type({expr}).__qualname__}}; advance needs an integer tensor'",
                 1)
        em.emit(f"if {expr}.is_floating_point() or {expr}.is_complex() or {expr}.dtype is _bool:")
        em.error(path, f"f'is a {{{expr}.dtype}} tensor; advance needs integers'", 1)

    def memory(self, em: Emitter, path: str) -> Sequence[Memory]:
        return ((Written(path, 0, None), (em.ref(path),)),)

    def lower_write(self, em: Emitter, path: str) -> None:
        expr = em.ref(path)
        if self.rows:  # the leading rows' view, remade only when the tensor or count moves
            # (one immutable tuple, read once: a thread updating another object with the same
            # spec can replace it, never mix its parts with ours)
            memo = em.bind([None], f"rows_of_{path}")
            rows = f"state.{self.rows}"
            local = em.fresh(f"rows_of_{path}_now")
            em.emit(f"{local} = {memo}[0]")
            em.emit(f"if {local} is None or {local}[0] is not {expr} or {local}[1] != {rows}:")
            em.emit(f"{local} = ({expr}, {rows}, {expr}[:{rows}])", 1)
            em.emit(f"{memo}[0] = {local}", 1)
            expr = f"{local}[2]"
        em.emit(self.overflow.lower(expr, self.by))

    def lower_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        x = kernel.load1d(out, names[0])
        value = self.overflow.lower_triton(kernel, x, self.by)
        if self.rows:  # padded rows keep their values
            rows_name = self.rows
            real = kernel.scalar(rows_name, lambda s: int(getattr(s, rows_name)))
            value = f"tl.where(offs < {real}, {value}, {x})"
        kernel.store1d(out, value, names[0])


@attrs.frozen
class Derive(Rule):
    """The field is recomputed every step from other fields by a formula, never incremented.

    The fused kernel applies it where the formula provides its Triton emission
    (:attr:`~draftmeta.derivations.Derivation.fusable`).

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

    @property
    def in_place_function(self) -> InPlaceFunction:
        return self.derivation

    @property
    def fusable(self) -> bool:
        return self.derivation.fusable

    def _call(self, em: Emitter, path: str) -> tuple[str, str]:
        # a generic derivation (copy, fill) is named after its field too, so that its name does
        # not depend on which other field's derivation was bound first
        name = em.bind(self.derivation, f"{self.derivation.name}_{path.rsplit('.', 1)[-1]}")
        return name, ", ".join([em.ref(path), *(em.ref(r) for r in self.inputs)])

    def lower_structure(self, em: Emitter, path: str) -> None:
        _require_tensor(em, path)

    def lower_formula_check(self, em: Emitter, path: str) -> None:
        _formula_check(em, path, self._call(em, path))

    def memory(self, em: Emitter, path: str) -> Sequence[Memory]:
        refs = (em.ref(path), *(em.ref(r) for r in self.inputs))
        return ((Written(path, len(self.inputs), self.derivation), refs),)

    def lower_write(self, em: Emitter, path: str) -> None:
        name, args = self._call(em, path)
        em.emit(f"{name}.apply({args}, workspace=state.workspace)")

    def lower_triton(
        self,
        kernel: TritonKernel,
        out: torch.Tensor,
        inputs: Sequence[object],
        names: Sequence[str],
    ) -> None:
        self.derivation.emit_triton(kernel, out, inputs, names)


@attrs.frozen
class Recompute(Rule):
    """A backend kernel refills a persistent buffer of fixed shape (a scheduler's metadata).

    Attributes:
        hook: the backend hook; it writes into the field's tensor in place.
        inputs: references the hook reads.
        also: other fields the hook's kernel refills too (each bound to
            ``WrittenBy(this field)``); the hook receives their tensors as ``also=``.
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

    def also_writes(self) -> tuple[str, ...]:
        return self.also

    @property
    def in_place_function(self) -> InPlaceFunction:
        return self.hook

    def capture_problem(self) -> str | None:
        if self.hook.capture_safe:
            return None
        return f"is refilled by the recompute hook {self.hook.name}, which is not capture-safe"

    def _call(self, em: Emitter, path: str) -> tuple[str, str]:
        name = em.bind(self.hook, self.hook.name)
        args = ", ".join([em.ref(path), *(em.ref(r) for r in self.inputs)])
        if self.also:
            args += f", also=({''.join(em.ref(p) + ', ' for p in self.also)})"
        return name, args

    def lower_structure(self, em: Emitter, path: str) -> None:
        _require_tensor(em, path)

    def lower_formula_check(self, em: Emitter, path: str) -> None:
        _formula_check(em, path, self._call(em, path))

    def memory(self, em: Emitter, path: str) -> Sequence[Memory]:
        refs = tuple(em.ref(r) for r in self.inputs)
        own = (Written(path, len(self.inputs), self.hook), (em.ref(path), *refs))
        return (own, *((Written(extra, len(self.inputs)), (em.ref(extra), *refs))
                       for extra in self.also))

    def lower_write(self, em: Emitter, path: str) -> None:
        name, args = self._call(em, path)
        em.emit(f"{name}.apply({args}, workspace=state.workspace)")


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

    @property
    def written_by(self) -> str:
        return self.owner


@attrs.frozen
class Reset(Rule):
    """A lazily filled host object is replaced by a fresh one each step.

    FlashMLA's scheduler object caches its tile schedule on first use and may only be reused
    while the sequence lengths are unchanged, so every draft step needs a new one. Bound to a
    nested record, it covers every field of that record. A captured CUDA graph cannot replay it.

    Attributes:
        factory: makes the fresh object (called with no arguments).
        label: how the factory is shown in the generated source.
    """

    kind: ClassVar[str] = "reset"
    target: ClassVar[Target] = "object"
    writes: ClassVar[bool] = True
    covers_record: ClassVar[bool] = True
    stores_host_value: ClassVar[bool] = True
    factory: Callable[[], object] = attrs.field(validator=attrs.validators.is_callable())
    label: str = attrs.field(default="", validator=_text)

    def describe(self) -> str:
        name = self.label or getattr(self.factory, "__qualname__", repr(self.factory))
        return f"reset: replaced by a fresh {name}()"

    def capture_problem(self) -> str | None:
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


@attrs.frozen
class Unsupported(Rule):
    """The field cannot be updated in place: builders with this spec always rebuild.

    Bound to a nested record, it covers every field of that record.

    Attributes:
        reason: why, reported by the draft loop as the fallback reason.
    """

    kind: ClassVar[str] = "unsupported"
    target: ClassVar[Target] = "any"
    writes: ClassVar[bool] = False
    covers_record: ClassVar[bool] = True
    reason: str = attrs.field(validator=attrs.validators.and_(_text, attrs.validators.min_len(1)))

    def describe(self) -> str:
        return f"unsupported: {self.reason}"

    @property
    def unsupported_reason(self) -> str:
        return self.reason
