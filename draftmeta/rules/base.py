"""The base of every rule: :class:`Rule`, the :class:`Emitter` its lowering writes through, and
the helpers the shipped rule kinds share (see :mod:`draftmeta.rules`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Literal, Protocol

import attrs
import torch

from draftmeta.derivations import InPlaceFunction, TritonKernel
from draftmeta.fields import FieldInfo, FieldKind, class_fields
from draftmeta.layout import Written
from draftmeta.state import DraftState

__all__ = ["Emitter", "Memory", "Rule", "Target"]

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

    @property
    def once_per_object(self) -> bool:
        """Whether the function being written runs once per metadata object (a seal, at the
        first step of a new object): a memo of the objects its last call saw would only miss."""

    def sealed(self, ref: str) -> bool:
        """Whether the function being written is a sealed step and ``ref`` a tensor it has
        verified to be the one the seal checked (the same object, or a state buffer over the
        same memory, shape, strides and dtype)."""


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


def _formula_check(em: Emitter, path: str, call: tuple[str, str], function: InPlaceFunction,
                   inputs: Sequence[str]) -> None:
    """``check`` of a formula or hook: its problem, or an exception it raised, as an
    :class:`~draftmeta.errors.UpdateError` of ``path``; in a sealed step, nothing where the
    check reads only the layout of tensors the seal checked (it passed there)."""
    if function.checks_layout_only and all(em.sealed(r) for r in (path, *inputs)):
        em.comment(f"{path}: its formula's check passed at the seal, on these same tensors")
        return
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
        relative: the new value is computed from the field's previous value, one step at a
            time (``Advance``, ``HostAdvance``), so the update is right only after the step
            before it, never from an unrelated state.
    """

    kind: ClassVar[str]
    target: ClassVar[Target]
    writes: ClassVar[bool]
    covers_record: ClassVar[bool] = False
    inspects: ClassVar[bool] = False
    stores_host_value: ClassVar[bool] = False
    relative: ClassVar[bool] = False

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
    def overflow_policy(self) -> Literal["clamp", "wrap"] | None:
        """The overflow policy (``"clamp"`` or ``"wrap"``) of a rule that advances its tensor
        alongside the draft loop's source advance, whose policy it must match
        (:func:`~draftmeta.advance.check_policy`); ``None`` for any other rule."""
        return None

    @property
    def advances_padded_rows(self) -> bool:
        """Whether the rule advances rows at or past ``state.num_reqs`` (padding), which the
        draft loop's source advance leaves where they are (:class:`~draftmeta.DraftSpec`
        refuses such a rule when it is declared)."""
        return False

    @property
    def padded_rows_fix(self) -> str:
        """How to declare the rule so that it leaves padded rows alone (the fix
        :class:`~draftmeta.DraftSpec` proposes when :attr:`advances_padded_rows`)."""
        return "make the rule leave rows at or past state.num_reqs as they are"

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


