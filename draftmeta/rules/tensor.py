"""Rules of tensor fields: views of the draft state (:class:`Alias`), advances with an overflow
policy (:class:`Advance`, :class:`Clamp`, :class:`Wrap`), formulas (:class:`Derive`) and
backend hooks (:class:`Recompute`, :class:`WrittenBy`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal, cast

import attrs
import torch

from draftmeta.derivations import Derivation, InPlaceFunction, RecomputeHook, TritonKernel
from draftmeta.fields import FieldKind
from draftmeta.layout import Written
from draftmeta.rules.base import (
    _STATE_FIELDS,
    Emitter,
    Memory,
    Rule,
    Target,
    _as_refs,
    _bound_name,
    _formula_check,
    _identifier,
    _instance,
    _int,
    _path,
    _plus,
    _positive,
    _refs,
    _require_tensor,
    _shares_storage,
)

__all__ = ["Advance", "Alias", "Clamp", "Derive", "Overflow", "Recompute", "Wrap", "WrittenBy"]


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
        shares = em.bind(_shares_storage, "shares_storage")
        problem = repr(f"no longer shares storage with {src} (a copy would go stale)")
        if em.once_per_object:  # new objects at every call: a memo of the last pair would miss
            em.emit(f"if {expr} is not {src} and not {shares}({expr}, {src}):")
            em.error(path, problem, 1)
            return
        # a pair of tensor objects verified once stays verified (a tensor's storage is fixed
        # unless set_() swaps it): the steady state costs two identity tests
        memo = em.bind([None], f"verified_{path}")
        em.emit(f"_pair = {memo}[0]")
        em.emit(f"if _pair is None or _pair[0] is not {expr} or _pair[1] is not {src}:")
        em.emit(f"if {expr} is not {src} and not {shares}({expr}, {src}):", 1)
        em.error(path, problem, 2)
        em.emit(f"{memo}[0] = ({expr}, {src})", 1)


@attrs.frozen
class Clamp:
    """Overflow policy of the new model runner: values stop at ``state.<bound> + offset``.

    Positions use ``Clamp("max_model_len", -1)``, sequence lengths ``Clamp("max_model_len")``.
    """

    kind: ClassVar[Literal["clamp"]] = "clamp"
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

    kind: ClassVar[Literal["wrap"]] = "wrap"
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
        rows: the host int of the draft state that counts the real rows, ``"num_reqs"``
            (the default): only that many leading rows advance and the rest (padding) keep
            their values, as the draft loop's source advance and vLLM's runners leave them.
            Any other value (``None``: every row) would drift from the state in padded rows,
            so :class:`~draftmeta.DraftSpec` refuses it.
    """

    kind: ClassVar[str] = "advance"
    target: ClassVar[Target] = "int tensor"
    writes: ClassVar[bool] = True
    relative: ClassVar[bool] = True
    overflow: Overflow = attrs.field(validator=attrs.validators.instance_of((Clamp, Wrap)))
    by: int = attrs.field(default=1, validator=_positive)
    rows: str | None = attrs.field(
        default=cast("str | None", "num_reqs"), validator=attrs.validators.optional(_identifier)
    )

    def __attrs_post_init__(self) -> None:
        if isinstance(self.overflow, Wrap) and self.overflow.restart < 0:
            raise ValueError(f"Wrap.restart must be >= 0, got {self.overflow.restart}")

    def bounds(self) -> tuple[str, ...]:
        return (self.overflow.bound,) + ((self.rows,) if self.rows else ())

    def describe(self) -> str:
        rows = f" (rows < state.{self.rows}; the rest stay)" if self.rows else ""
        return f"advance: {self.overflow.describe(self.by)}{rows}"

    @property
    def overflow_policy(self) -> Literal["clamp", "wrap"]:
        return self.overflow.kind

    @property
    def advances_padded_rows(self) -> bool:
        return self.rows != "num_reqs"

    @property
    def padded_rows_fix(self) -> str:
        return f"omit rows={self.rows!r}: a plain Advance advances the state.num_reqs real rows"

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
        _formula_check(em, path, self._call(em, path), self.derivation, self.inputs)

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
        _formula_check(em, path, self._call(em, path), self.hook, (*self.inputs, *self.also))

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


