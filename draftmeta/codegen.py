"""Generated update functions: one function per spec, its source readable and in tracebacks.

Like attrs and dataclasses generate ``__init__`` from field declarations, draftmeta generates, from
a spec, the source text of one function that applies every rule in place, compiles it once and
registers it with :mod:`linecache` so tracebacks and debuggers show the generated lines.

The generated function runs in phases, so that a failed update leaves the metadata untouched:

0. the object and its nested records: exactly the declared classes, no instance attribute
   outside the spec (on every call: one type test and one set comparison per record);
1. preconditions (raise :class:`~draftmeta.errors.PreconditionFailed`);
2. structure checks: nested records present, aliases still sharing storage with their source,
   host ints of the state in range (raise :class:`~draftmeta.errors.UpdateError`);
3. new host values computed into locals; formula inputs of the right shape, dtype and device;
   the memory check;
4. tensor writes, in declaration order, in place;
5. host values stored.

Five functions can be generated from one spec (:data:`Part`): the update, its checks alone, the
rest after the checks (around a fused kernel), and a seal and step for an object updated at many
steps. They differ only in which phases they run and in a few flags, so each is one row of a
table of data (``_VARIANTS``: its name, docstring, phases in order, flags), read side by side,
rather than a generator subclass each or tests of a flag in every phase.

:func:`generate` returns one :class:`GeneratedUpdate`: the source, the globals it reads and a
map from each line a rule wrote to that rule's field. :func:`explain` prints it,
:meth:`GeneratedUpdate.compile` (behind :attr:`DraftSpec.update
<draftmeta.spec.DraftSpec.update>`, :attr:`DraftSpec.sealed <draftmeta.spec.DraftSpec.sealed>`
and :class:`~draftmeta.fused.FusedStep`) is the one place it is compiled. A write that raises is
reported as :class:`~draftmeta.errors.WriteFailed` naming its field through that map (the line
the exception left the function at), so the writes themselves carry no marker.

This module only drives the phases: every line that depends on a rule comes from the rule
itself (its ``lower_*`` methods, :class:`~draftmeta.rules.Rule`), written through a
:class:`~draftmeta.rules.Emitter` that this module implements.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import linecache
import re
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

import torch

from draftmeta.errors import PreconditionFailed, UpdateError, WriteFailed
from draftmeta.fields import FieldInfo, FieldKind
from draftmeta.layout import STATE_BUFFERS, LayoutGuard, Written
from draftmeta.refs import identifier, is_state_ref
from draftmeta.rules import Rule
from draftmeta.state import DraftState

if TYPE_CHECKING:
    from draftmeta.spec import DraftSpec

__all__ = ["GeneratedUpdate", "Part", "SealFunction", "StepFunction", "UpdateFunction",
           "compile_sealed", "compile_spec", "explain", "generate"]

M_contra = TypeVar("M_contra", contravariant=True)
M = TypeVar("M")


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


def _one_line(text: object) -> str:
    """``text`` safe inside a comment or docstring of generated code: one line, no quotes that
    could end a docstring, escapes instead of control characters. User text (names, formulas,
    reasons) goes through here or through ``repr``, never into code as written."""
    return repr(str(text))[1:-1].replace('"', '\\"')


_FIXED = ("_SPEC", "_PreconditionFailed", "_UpdateError", "_WriteFailed", "_bool", "_pair",
          "_problem", "_exc", "_raised", "_int", "_FIELD_AT_LINE", "_Tensor")


class _Namespace:
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
            "_raised": _raised,
            "_int": int,
        }
        self.taken: set[str] = set(_FIXED)
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


def _raised(exc: BaseException) -> str:
    """The message of an exception raised inside a formula, for a draftmeta error."""
    return f"{type(exc).__name__}: {exc}"


Part = Literal["full", "check", "finish", "seal", "step"]
"""Which phases a generated function runs: all of them; only the checks (phases 0-3); or
everything after the checks (phases 3-5) minus the tensor writes done elsewhere (fused);
``"seal"``: the full update (every check, then the writes), returning a seal of what the
checks that depend only on the object's structure and the tensors it holds (phases 0, 1, 2 and
3c) verified; ``"step"``: the update of a sealed object, with phases 2 and 3c replaced by a
comparison with its seal (identity of every record and tensor verified; a state buffer that is
a new object must lie in the same memory)."""


@dataclass(frozen=True)
class _Variant:
    """One kind of generated function, as data: what :class:`_Generator` writes for a
    :data:`Part`."""

    prefix: str
    """The function's name, before the spec's name."""
    takes_seal: bool
    """Whether it takes a third argument, the seal (a sealed step)."""
    summary: str
    """The docstring's first line (``{cls}``: the metadata class)."""
    about: tuple[str, ...]
    """The docstring's paragraph (``{origin}``: which spec it was generated from; ``{name}``:
    the spec's name as an identifier)."""
    phases: tuple[Callable[[_Generator], None], ...]
    """What it writes, in order: methods of :class:`_Generator`."""
    checks: bool = True
    """Whether the phases it shares with the update run their checks (a nested record's class,
    a new host value's type); ``False`` where the checks ran in another function already."""
    diagnoses: bool = True
    """Whether a failed check of phases 0-2 raises the error saying what failed; ``False``:
    it returns ``False``, writing nothing, and the caller's full update diagnoses."""
    once_per_object: bool = False
    """Whether it runs once per metadata object (a seal): a memo of the last call would miss."""
    compares_seal: bool = False
    """Whether phases 2 and 3c are replaced by a comparison with the seal (a sealed step)."""


class _RuleEmitter:
    """The :class:`~draftmeta.rules.Emitter` a rule writes its lines through: the generator's
    output, indented at the level of the phase being lowered."""

    def __init__(self, gen: _Generator, depth: int) -> None:
        self._gen = gen
        self._depth = depth

    def emit(self, line: str = "", depth: int = 0) -> None:
        self._gen.emit(line, self._depth + depth)

    def comment(self, text: str, depth: int = 0) -> None:
        self._gen.comment(text, self._depth + depth)

    def error(self, path: str, detail: str, depth: int = 0) -> None:
        self._gen.error(path, detail, self._depth + depth)

    def ref(self, ref: str) -> str:
        return self._gen.ref(ref)

    def bind(self, obj: object, hint: str) -> str:
        return self._gen.ns.bind(obj, hint)

    def fresh(self, hint: str) -> str:
        return self._gen.ns.fresh(hint)

    def field(self, path: str) -> FieldInfo:
        return self._gen.spec.fields[path]

    def optional(self, path: str) -> bool:
        return self._gen.spec.optional(path)

    def readable(self, path: str) -> bool:
        return "." not in path or path.rsplit(".", 1)[0] in self._gen.locals

    @property
    def once_per_object(self) -> bool:
        return self._gen.variant.once_per_object

    def sealed(self, ref: str) -> bool:
        return self._gen.variant.compares_seal and ref in self._gen.sealed_tensors


class _Generator:
    """Writes one function: the phases of its variant, in order (:meth:`generate`)."""

    def __init__(
        self, spec: DraftSpec[M], part: Part = "full", skip: frozenset[str] = frozenset()
    ) -> None:
        self.variant = _VARIANTS[part]
        self.skip = skip
        self.spec: DraftSpec[object] = spec  # type: ignore[assignment]
        self.ns = _Namespace(spec.name)
        self.lines: list[str] = []
        self.locals: dict[str, str] = {}  # container path -> local name
        self.host_values: dict[str, str] = {}  # host path -> local holding its new value
        # lines written only if a line follows them (a phase's header, a rule's preamble),
        # each with the field it is written for
        self.pending: list[tuple[str, str | None]] = []
        self.owner: str | None = None  # the field whose rule the lines being written are for
        self.fields_by_line: dict[int, str] = {}  # line number (the def is 1) -> field

    # -- rendering ----------------------------------------------------------------------------

    def _append(self, line: str, owner: str | None) -> None:
        self.lines.append(line)
        if owner is not None:
            self.fields_by_line[len(self.lines)] = owner

    def emit(self, line: str = "", depth: int = 1) -> None:
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

    def lower(self, depth: int = 1) -> _RuleEmitter:
        """The emitter a rule writes through, at ``depth``."""
        return _RuleEmitter(self, depth)

    def comment(self, text: str, depth: int = 1) -> None:
        self.emit(f"# {_one_line(text)}", depth)

    def raw(self, ref: str) -> str:
        return ref if is_state_ref(ref) else f"metadata.{ref}"

    def ref(self, ref: str) -> str:
        if is_state_ref(ref):
            return ref
        if ref in self.host_values:
            return self.host_values[ref]
        if ref in self.locals:
            return self.locals[ref]
        if "." not in ref:
            return f"metadata.{ref}"
        parent, leaf = ref.rsplit(".", 1)
        return f"{self.ref(parent)}.{leaf}"

    def error(self, path: str, detail: str, depth: int = 2) -> None:
        self.emit(f"raise _UpdateError(_SPEC, {path!r}, {detail})", depth)

    def refuse(self, path: str, detail: str, depth: int = 2) -> None:
        """A check of phases 0-2 failed: raise (:meth:`error`), or, in a variant that does not
        diagnose (a sealed step), return ``False`` with nothing written (the caller's full
        update then says what failed)."""
        if self.variant.diagnoses:
            self.error(path, detail, depth)
        else:
            self.emit("return False", depth)

    # -- the function: its variant's phases, in order -----------------------------------------

    def generate(self) -> str:
        """The function's name; its source is then in :attr:`lines`."""
        spec, variant = self.spec, self.variant
        name = identifier(spec.name)
        fname = variant.prefix + name
        args = "metadata, state, seal" if variant.takes_seal else "metadata, state"
        self.emit(f"def {fname}({args}):", 0)
        self.emit(f'"""{variant.summary.format(cls=_one_line(spec.cls.__qualname__))}')
        self.emit()
        origin = f"Generated by draftmeta from spec {_one_line(repr(spec.name))}"
        for line in variant.about:
            self.emit(line.format(origin=origin, name=name))
        self.emit('"""')
        if not spec.supported:
            reasons = "; ".join(f"{p}: {r}" for p, r in spec.unsupported_reasons)
            self.emit(f"raise _PreconditionFailed(_SPEC, 'unsupported', {reasons!r})")
            return fname
        for phase in variant.phases:
            phase(self)
        return fname

    def returns_true(self) -> None:
        """A sealed step's end: every check passed and everything was written."""
        self.emit("return True")

    def fused_elsewhere(self) -> None:
        """A note of the writes left to a fused kernel, if any."""
        if self.skip:
            self.comment(f"fused elsewhere: {', '.join(sorted(self.skip))}")

    # -- the seal: structure checked once per object ----------------------------------------

    def sealed_refs(self) -> tuple[list[str], list[str], list[str]]:
        """What a seal holds: the nested records and the metadata's tensor fields that phases
        2 and 3c read (compared by identity), and the state buffers they read (by identity, or
        a new object in the same memory), in a fixed order."""
        spec = self.spec
        records = [p for p in spec.containers() if p in self.locals]
        tensors: list[str] = []
        state: list[str] = []
        em = self.lower()

        def add(ref: str) -> None:
            if is_state_ref(ref):
                name = ref.split(".", 1)[1]
                if name in STATE_BUFFERS and name not in state:
                    state.append(name)
            elif (ref in spec.fields and spec.fields[ref].kind is FieldKind.TENSOR
                  and ref not in tensors and em.readable(ref)):
                tensors.append(ref)

        layout = False
        for path, rule in spec.rules.items():
            if rule.touches_field:
                for ref in (path, *rule.reads()):
                    add(ref)
            for written, _ in rule.memory(em, path):
                add(written.path)
                layout = True
        if layout:
            for name in STATE_BUFFERS:
                if name not in state:
                    state.append(name)
        return records, tensors, state

    @functools.cached_property
    def sealed_tensors(self) -> frozenset[str]:
        """The references of the tensors a seal holds: metadata paths and ``state.X``."""
        _, tensors, state = self.sealed_refs()
        return frozenset([*tensors, *(f"state.{n}" for n in state)])

    def seal(self) -> None:
        """The seal's return: the records, tensors and state buffers the checks verified."""
        records, tensors, state = self.sealed_refs()
        self.emit("# the seal: what draft_step_ compares with at every later step")
        items = ([self.locals[p] for p in records] + [self.ref(p) for p in tensors]
                 + [f"state.{name}" for name in state])
        if not items:
            self.emit("return ()")
            return
        self.emit("return (")
        for item in items:
            self.emit(f"{item},", 2)
        self.emit(")")

    def sealed(self) -> None:
        """Phase 2 of a step: the object still holds what its seal verified."""
        records, tensors, state = self.sealed_refs()
        moved = self.ns.bind(_moved, "moved")
        self.emit("# 2b. sealed: the records and tensors the seal verified, the same objects; a "
                  "state buffer")
        self.emit("# that is a new object lies in the same memory (else nothing is written: the "
                  "caller runs the full update)")
        tests = [f"{self.locals[p]} is not seal[{i}]" for i, p in enumerate(records)]
        tests += [f"{self.ref(p)} is not seal[{len(records) + i}]" for i, p in enumerate(tensors)]
        k = len(records) + len(tensors)
        if tests:
            self.emit("if (")
            for i, test in enumerate(tests):
                self.emit(test + (" or" if i < len(tests) - 1 else ""), 2)
            self.emit("):")
            self.emit("return False", 2)
        for j, name in enumerate(state):
            self.emit(f"if state.{name} is not seal[{k + j}] and "
                      f"{moved}(state.{name}, seal[{k + j}]):")
            self.emit("return False", 2)

    def source(self) -> str:
        return "\n".join(self.lines) + "\n"

    def object_check(self) -> None:
        """Phase 0, on every call: the object and each nested record present is exactly its
        declared class and carries no instance attribute outside the spec (a subclass's extra
        field, an attribute set after construction or after the last update). One ``type`` test
        and one set comparison of the attribute names per record, so a new object costs what
        the same object costs."""
        spec = self.spec
        self.emit("# 0. the object and its records: exactly the declared classes, no attribute "
                  "outside the spec (every call)")
        why = self.ns.bind(_coverage(spec), "why_uncovered")
        for path in ("", *spec.containers()):
            cls = spec.record_class(path)
            if not path:
                name = "metadata"
            else:
                parent, leaf = path.rsplit(".", 1) if "." in path else ("", path)
                holder = self.locals.get(parent, "metadata")
                name = self.ns.fresh(path.replace(".", "__"))
                guard = f" if {holder} is not None else None" if parent else ""
                self.emit(f"{name} = {holder}.{leaf}{guard}")
                self.locals[path] = name
            test = f"type({name}) is not {self.ns.bind(cls, cls.__name__)}"
            if cls.__dictoffset__:  # instances carry a __dict__: attributes can be added
                allowed = self.ns.bind(_allowed_attributes(spec, path),
                                       f"attributes_{path.replace('.', '__') or 'metadata'}")
                test = f"{test} or not {name}.__dict__.keys() <= {allowed}"
            if path:
                test = f"{name} is not None and ({test})"
            self.emit(f"if {test}:")
            self.refuse("", f"{why}(metadata)")

    def _guards(self, refs: tuple[str, ...]) -> list[str]:
        """Optional records on the way to ``refs``: each must be present before reading."""
        out: list[str] = []
        for ref in refs:
            if is_state_ref(ref):
                continue
            parts = ref.split(".")
            for i in range(1, len(parts)):
                head = ".".join(parts[:i])
                if self.spec.optional(head) and head not in out:
                    out.append(head)
        return out

    def preconditions(self) -> None:
        if not self.spec.preconditions:
            return
        exprs = []
        for cond in self.spec.preconditions:
            expr = cond.expression(self.raw, self.ns.bind)
            guards = self._guards(cond.reads())
            exprs.append(" and ".join([f"{self.raw(g)} is not None" for g in guards] + [expr]))
        if not self.variant.diagnoses:  # the full update says which one failed
            self.emit("# 1. preconditions" if len(exprs) > 1 else "# 1. precondition")
            self.all_of(exprs)
            self.emit("return False", 2)
            return
        single = len(exprs) == 1
        if single:
            self.emit("# 1. precondition")
        else:
            self.emit("# 1. preconditions: one combined test; on failure, find the first that "
                      "fails")
            self.all_of(exprs)
        depth = 1 if single else 2
        for cond, expr in zip(self.spec.preconditions, exprs):
            observed = "f" + repr(cond.observed(self.raw))
            for g in reversed(self._guards(cond.reads())):
                observed = f"{g + ' is None'!r} if {self.raw(g)} is None else {observed}"
            self.emit(f"if not ({expr}):", depth)
            self.emit(f"raise _PreconditionFailed(_SPEC, {cond.name!r}, {observed})", depth + 1)

    def all_of(self, exprs: list[str]) -> None:
        """``if not (...):`` over ``exprs``, one per line where there are several."""
        if len(exprs) == 1:
            self.emit(f"if not ({exprs[0]}):")
            return
        self.emit("if not (")
        for i, expr in enumerate(exprs):
            self.emit(f"({expr})" + (" and" if i < len(exprs) - 1 else ""), 2)
        self.emit("):")

    def _active(self) -> list[tuple[str, Rule]]:
        return [(p, r) for p, r in self.spec.rules.items() if r.touches_field]

    def containers(self) -> None:
        used: set[str] = set()
        for path, rule in self._active():
            for ref in (path, *rule.reads()):
                if is_state_ref(ref):
                    continue
                parts = ref.split(".")
                used.update(".".join(parts[:i]) for i in range(1, len(parts)))
        wanted = [c for c in self.spec.containers() if c in used]
        if not wanted:
            return
        self.emit("# 2. structure: nested records, aliases, derivation inputs")
        for path in wanted:
            checked = path in self.locals  # fetched and its class checked in phase 0
            if checked:
                name = self.locals[path]
            else:
                name = self.ns.fresh(path.replace(".", "__"))
                self.emit(f"{name} = {self.ref(path)}")
                self.locals[path] = name
            if not self.variant.checks:
                continue
            cls = self.spec.record_class(path)
            if self.spec.optional(path):
                self.emit(f"if {name} is None:")
                self.refuse(path, repr("is None, but the spec updates fields inside it"))
            if checked:
                continue
            self.emit(f"if type({name}) is not {self.ns.bind(cls, cls.__name__)}:")
            self.refuse(
                path,
                f"f'is a {{type({name}).__qualname__}}, not the declared "
                f"{_text(cls.__qualname__)} (its extra fields would go stale)'",
            )

    def checks(self) -> None:
        if not self.locals:
            self.defer("# 2. structure: aliases and derivation inputs")
        em = self.lower()
        for path, rule in self._active():
            with self.owning(path):
                rule.lower_structure(em, path)
        self.drop()

    def host_operands(self) -> None:
        """Host ints of the state that bound advances: exact ints in range, or nothing runs."""
        minimum: dict[str, int] = {}
        users: dict[str, str] = {}
        for path, rule in self.spec.rules.items():
            for name, least in rule.state_operands():
                minimum[name] = max(minimum.get(name, 0), least)
                users.setdefault(name, path)
        if not minimum:
            return
        self.emit("# 2. structure: host ints of the state that bound the advances")
        for name, least in minimum.items():
            value = f"state.{name}"
            self.emit(f"if type({value}) is not _int or {value} < {least}:")
            self.refuse(
                f"state.{name}",
                f"f'is {{{value}!r}}; {_text(users[name])} needs an int >= {least}'",
            )

    def formula_checks(self) -> None:
        self.defer("# 3b. formulas: inputs of the right number, kind, shape, dtype, device "
                   "(new host values)")
        em = self.lower()
        for path, rule in self._active():
            with self.owning(path):
                rule.lower_formula_check(em, path)
        self.drop()

    def layout(self) -> None:
        entries: list[Written] = []
        args: list[str] = []
        em = self.lower()
        for path, rule in self.spec.rules.items():
            for written, refs in rule.memory(em, path):
                entries.append(written)
                args += refs
        if not any(not e.unchanged for e in entries) and self.spec.cls is DraftState:
            return
        if not entries:
            return
        guard = self.ns.bind(
            LayoutGuard(entries, owns_state=self.spec.cls is DraftState), "layout"
        )
        self.emit("# 3c. memory: written tensors own their memory (checked once per tensor set)")
        depth = 1
        if all(e.unchanged and self.spec.optional(e.path) for e in entries):
            # only optional fields said to stay: the guard has nothing to check while all are None
            self.emit(f"if {' or '.join(f'{a} is not None' for a in args)}:")
            depth = 2
        self.emit(f"_problem = {guard}.check(state, {', '.join(args)})", depth)
        self.emit("if _problem is not None:", depth)
        self.emit("raise _UpdateError(_SPEC, *_problem)", depth + 1)

    def host_phase(self) -> None:
        first = True
        em = self.lower()
        for path, rule in self.spec.rules.items():
            if not rule.stores_host_value:
                continue
            if first:
                self.emit("# 3. new host values, computed before any write")
                first = False
            with self.owning(path):
                value = rule.lower_host(em, path)
                local = self.ns.fresh("new_" + path.replace(".", "__"))
                self.comment(f"{path}: {rule.describe()}")
                self.emit(f"{local} = {value}")
                self.host_values[path] = local
                if self.variant.checks:
                    rule.lower_host_check(em, path, local)

    def tensor_phase(self) -> None:
        """Phase 4. A write that raises is reported with its field, found in the line map at
        the line the exception left this function at (the first entry of its traceback is
        this function's frame): no marker per write."""
        self.defer("# 4. tensor writes, in place, in declaration order (an exception here is a "
                   "bug in a formula or hook: WriteFailed)")
        self.defer("try:")
        em = self.lower(2)
        for path, rule in self.spec.rules.items():
            if path in self.skip:
                continue
            keep = len(self.pending)  # the phase's header, while nothing is written yet
            with self.owning(path):
                self.defer(f"# {_one_line(f'{path}: {rule.describe()}')}", 2)
                rule.lower_write(em, path)
            self.drop(keep)
        if self.drop():
            self.emit("except Exception as _exc:")
            self.emit("raise _WriteFailed(_SPEC, _FIELD_AT_LINE[_exc.__traceback__.tb_lineno], "
                      "_raised(_exc)) from _exc", 2)

    def store_phase(self) -> None:
        if not self.host_values:
            return
        self.emit("# 5. host values stored")
        for path, local in self.host_values.items():
            if "." in path:
                parent, leaf = path.rsplit(".", 1)
                target = f"{self.locals[parent]}.{leaf}"
            else:
                target = f"metadata.{path}"
            with self.owning(path):
                self.emit(f"{target} = {local}")

    def untouched(self) -> None:
        rest = [(p, r) for p, r in self.spec.rules.items()
                if not r.writes and r.written_by is None]
        also = [(p, r) for p, r in self.spec.rules.items() if r.written_by is not None]
        if also:
            self.emit("# fields written by another field's rule above:")
            for path, written_by in also:
                self.comment(f"  {path}: {written_by.describe()}")
        if not rest:
            return
        self.emit("# fields this update does not write:")
        for path, rule in rest:
            self.comment(f"  {path}: {rule.describe()}")


_G = _Generator
_CHECKED = (_G.object_check, _G.preconditions, _G.containers, _G.checks, _G.host_operands,
            _G.host_phase, _G.formula_checks, _G.layout)
"""Phases 0-3 with every check: what the update, its check function and its seal share."""
_WRITES = (_G.tensor_phase, _G.store_phase)

_VARIANTS: dict[Part, _Variant] = {
    "full": _Variant(
        prefix="draft_update_", takes_seal=False,
        summary="Update a {cls} in place for one draft step.",
        about=("{origin}; every check runs before",
               "the first write, so a failed update leaves the metadata untouched."),
        phases=(*_CHECKED, *_WRITES, _G.untouched, _G.fused_elsewhere)),
    "check": _Variant(
        prefix="draft_check_", takes_seal=False,
        summary="Check that a {cls} can be updated; write nothing.",
        about=("{origin}; it runs every check of", "the update and writes nothing."),
        phases=(*_CHECKED, _G.fused_elsewhere)),
    "finish": _Variant(
        prefix="draft_finish_", takes_seal=False,
        summary="Finish updating a {cls} after its checks passed.",
        about=("{origin}. It checks nothing: call it",
               "only after draft_check_{name} passed for this step."),
        phases=(_G.containers, _G.host_phase, *_WRITES, _G.fused_elsewhere), checks=False),
    "seal": _Variant(
        prefix="draft_seal_", takes_seal=False,
        summary="Update a {cls} in place with every check; return its seal.",
        about=("{origin}: the full update (every",
               "check before the first write), returning what the structure checks",
               "verified, for draft_step_{name} at the later steps."),
        phases=(*_CHECKED, *_WRITES, _G.untouched, _G.seal, _G.fused_elsewhere),
        once_per_object=True),
    "step": _Variant(
        prefix="draft_step_", takes_seal=True,
        summary="Update a sealed {cls} in place; False (nothing written) if a check fails.",
        about=("{origin}. ``seal`` is what",
               "draft_seal_{name} returned for this object; every check",
               "that can change between steps runs here, before the first write. Where",
               "one of phases 0-2 fails it returns False: the full update says what failed."),
        phases=(_G.object_check, _G.preconditions, _G.containers, _G.sealed, _G.host_operands,
                _G.host_phase, _G.formula_checks, *_WRITES, _G.untouched, _G.returns_true),
        diagnoses=False, compares_seal=True),
}
"""The five variants side by side: which phases each writes, in order, and how they differ."""


def _text(value: str) -> str:
    """User text as the literal part of an f-string inside a repr: braces doubled, quotes and
    control characters escaped."""
    return repr(value.replace("{", "{{").replace("}", "}}"))[1:-1]


def _moved(buffer: object, sealed: object) -> bool:
    """Whether a state ``buffer``, another object than the ``sealed`` one, lies elsewhere:
    ``False`` only for two tensors of one dtype on the same storage with the same offset,
    sizes and strides (``Tensor.is_set_to``: one call where comparing addresses, shapes and
    strides would take ten). The seal holds the sealed tensor, so its storage stays alive."""
    if not isinstance(buffer, torch.Tensor) or not isinstance(sealed, torch.Tensor):
        return True
    return buffer.dtype is not sealed.dtype or not buffer.is_set_to(sealed)


_moved.__draftmeta_describe__ = (  # type: ignore[attr-defined]
    "(buffer, sealed) -> whether buffer lies elsewhere than the sealed tensor (dtype, storage, "
    "offset, sizes, strides)"
)


def _coverage(spec: DraftSpec[Any]) -> Callable[[object], str]:
    """Why phase 0 refused an object: it is not exactly the spec's class, or it (or a nested
    record) carries something the spec has no rule for. Called only after the check failed."""
    cls = spec.cls

    def why_uncovered(metadata: object) -> str:
        if type(metadata) is not cls:
            what = "None" if metadata is None else f"a {type(metadata).__qualname__}"
            return (f"the metadata object is {what}, not the spec's {cls.__qualname__} (an "
                    "update of another class would leave its extra fields stale)")
        problems = spec.uncovered(metadata)
        return ("the metadata object carries state the spec has no rule for, which would "
                f"go stale: {'; '.join(problems) or 'an attribute outside its fields'}; "
                "declare it with attributes= or rebuild")

    why_uncovered.__draftmeta_describe__ = (  # type: ignore[attr-defined]
        f"(metadata) -> what phase 0 refused: not exactly a {cls.__qualname__}, or an "
        "attribute the spec has no rule for"
    )
    return why_uncovered


def _allowed_attributes(spec: DraftSpec[Any], path: str) -> frozenset[str]:
    """The instance attribute names a record at ``path`` may carry: its class's fields and
    the attributes declared with ``attributes=``."""
    prefix = f"{path}." if path else ""
    return frozenset(p[len(prefix):] for p in spec.fields
                     if p.startswith(prefix) and "." not in p[len(prefix):])


@dataclass(frozen=True)
class GeneratedUpdate:
    """One generated function, before it is compiled: what :func:`explain` prints,
    :meth:`compile` compiles and :class:`~draftmeta.fused.FusedStep` runs around its kernel.

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
    (:func:`generate` makes new ones)."""
    bound: tuple[str, ...]
    """The names among :attr:`globals` bound from the spec (its classes, formulas, memos), in
    the order they were bound; the rest are draftmeta's own (:func:`explain` lists both)."""
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
        the text stands alone."""
        header = ["# globals of the generated function's module:"]
        for name, fixed in _FIXED_TEXT.items():
            if re.search(rf"\b{name}\b", self.source):
                value = repr(self.spec) if name == "_SPEC" else fixed
                header.append(f"#   {name} = {_one_line(value)}")
        for name in self.bound:
            header.append(f"#   {name} = {_one_line(describe_bound(self.globals[name]))}")
        return "\n".join(header) + "\n" + self.source

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


def generate(
    spec: DraftSpec[M], part: Part = "full", skip: frozenset[str] = frozenset()
) -> GeneratedUpdate:
    """Generate one function of ``spec`` (the whole update by default; see :data:`Part`),
    leaving the tensor writes of the paths in ``skip`` to a fused kernel; nothing is compiled.
    """
    gen = _Generator(spec, part, skip)
    fname = gen.generate()
    fields_by_line = types.MappingProxyType(dict(gen.fields_by_line))
    gen.ns.values["_FIELD_AT_LINE"] = fields_by_line
    return GeneratedUpdate(
        spec=spec.name, part=part, skip=skip, function_name=fname, source=gen.source(),
        globals=types.MappingProxyType(dict(gen.ns.values)), bound=tuple(gen.ns.bound),
        fields_by_line=fields_by_line,
    )


_FIXED_TEXT = {
    "_SPEC": None,  # its value, the spec's name
    "_PreconditionFailed": "draftmeta.errors.PreconditionFailed",
    "_UpdateError": "draftmeta.errors.UpdateError",
    "_WriteFailed": "draftmeta.errors.WriteFailed",
    "_raised": "(exc) -> 'ExcType: message', for an error raised inside a formula",
    "_FIELD_AT_LINE": "{line of this function: the field whose rule wrote it}, naming the "
                      "field of a write that raised",
    "_int": "int",
    "_bool": "torch.bool",
    "_Tensor": "torch.Tensor",
}


def describe_bound(obj: object) -> str:
    """One line saying what a global bound into generated code holds, with no address or other
    process-dependent text (for :func:`explain`'s header)."""
    text = getattr(obj, "__draftmeta_describe__", None)
    if isinstance(text, str):
        return text
    if isinstance(obj, list):
        return f"memo, initially {obj!r}"
    if isinstance(obj, frozenset):
        return "{" + ", ".join(repr(x) for x in sorted(obj, key=repr)) + "}"
    if isinstance(obj, LayoutGuard):
        written = [e.path for e in obj._entries if not e.unchanged]
        kept = [e.path for e in obj._entries if e.unchanged]
        return (f"the memory check (once per tensor set): {', '.join(written) or 'nothing'} "
                "own their memory" + (f"; unchanged {', '.join(kept)} must not overlap a "
                                      "moved buffer" if kept else ""))
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    describe = getattr(obj, "describe", None)
    if callable(describe) and not isinstance(obj, type):
        try:
            described = describe()
        except TypeError:
            described = None
        if isinstance(described, str):
            return f"{type(obj).__qualname__}: {described}"
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return f"function {obj.__module__}.{obj.__qualname__}"
    what = type(obj).__qualname__
    formula = getattr(obj, "formula", None)
    if isinstance(formula, str):
        return f"{what}: {formula}"
    name = getattr(obj, "name", None)
    return f"{what} {name!r}" if isinstance(name, str) else what


def explain(spec: DraftSpec[M]) -> str:
    """The source of the update function generated for ``spec`` (the same spec, the same text),
    after a header of comments saying what every global it uses holds, so the text stands
    alone (:meth:`GeneratedUpdate.explain` of :func:`generate`)."""
    return generate(spec).explain()


def compile_spec(
    spec: DraftSpec[M], part: Part = "full", skip: frozenset[str] = frozenset()
) -> UpdateFunction[M]:
    """Generate, compile and register the update function of ``spec``.

    ``part="check"`` gives a function running only the preconditions and structure checks;
    ``part="finish"`` one running the rest, without the tensor writes of the paths in ``skip``
    (done by a fused kernel). Prefer :attr:`DraftSpec.update` for the whole update, which
    compiles once and caches the result.
    """
    return cast("UpdateFunction[M]", _compile(spec, part, skip))


def compile_sealed(spec: DraftSpec[M]) -> tuple[SealFunction[M], StepFunction[M]]:
    """Generate, compile and register the seal and step functions of ``spec`` (see
    :attr:`DraftSpec.sealed`, which compiles once and caches them)."""
    return (cast("SealFunction[M]", _compile(spec, "seal")),
            cast("StepFunction[M]", _compile(spec, "step")))


def _compile(spec: DraftSpec[M], part: Part, skip: frozenset[str] = frozenset()
             ) -> types.FunctionType:
    """The one compile path of every generated function (``benchmarks/e2e_floor.py
    --phases`` replaces it to time the phases)."""
    return generate(spec, part, skip).compile()
