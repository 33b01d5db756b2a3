"""The phases of a generated function, and the five functions a spec gives as a table of them.

:func:`generate` writes one function of a spec (:data:`~draftmeta.codegen.product.Part`) by
running the phases of its variant in order (the ``_VARIANTS`` table: its name, docstring,
phases and flags), each phase a method of the generator, which is a
:class:`~draftmeta.codegen.writer.SourceWriter`. Phases 0-3 check, 4 writes tensors, 5 stores
host values (:mod:`draftmeta.codegen` lists them); the lines that depend on a rule come from the
rule's own ``lower_*`` methods, written through the :class:`~draftmeta.rules.Emitter`
implemented here. The result is a :class:`~draftmeta.codegen.product.GeneratedUpdate`; nothing
is compiled here.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from draftmeta.codegen import runtime
from draftmeta.codegen.product import GeneratedUpdate, Part
from draftmeta.codegen.spec_view import SpecView
from draftmeta.codegen.writer import SourceWriter, fstring_text, one_line
from draftmeta.fields import FieldInfo, FieldKind
from draftmeta.layout import STATE_BUFFERS, LayoutGuard, Written
from draftmeta.refs import identifier, is_state_ref
from draftmeta.rules import Rule
from draftmeta.state import DraftState

__all__ = ["allowed_attributes", "generate"]

M = TypeVar("M")


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


class _Generator(SourceWriter):
    """Writes one function: the phases of its variant, in order (:meth:`generate`), through
    the :class:`~draftmeta.codegen.writer.SourceWriter` it is."""

    def __init__(
        self, spec: SpecView[M], part: Part = "full", skip: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(spec.name)
        self.variant = _VARIANTS[part]
        self.skip = skip
        self.spec: SpecView[object] = spec
        self.locals: dict[str, str] = {}  # container path -> local name
        self.host_values: dict[str, str] = {}  # host path -> local holding its new value

    def lower(self, depth: int = 1) -> _RuleEmitter:
        """The emitter a rule writes through, at ``depth``."""
        return _RuleEmitter(self, depth)

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
        self.emit(f'"""{variant.summary.format(cls=one_line(spec.cls.__qualname__))}')
        self.emit()
        origin = f"Generated by draftmeta from spec {one_line(repr(spec.name))}"
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
        moved = self.ns.bind(runtime.moved, "moved")
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

    def object_check(self) -> None:
        """Phase 0, on every call: the object and each nested record present is exactly its
        declared class and carries no instance attribute outside the spec (a subclass's extra
        field, an attribute set after construction or after the last update). One ``type`` test
        and one set comparison of the attribute names per record, so a new object costs what
        the same object costs."""
        spec = self.spec
        self.emit("# 0. the object and its records: exactly the declared classes, no attribute "
                  "outside the spec (every call)")
        why = self.ns.bind(runtime.why_uncovered_for(spec), "why_uncovered")
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
                allowed = self.ns.bind(allowed_attributes(spec, path),
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
                f"{fstring_text(cls.__qualname__)} (its extra fields would go stale)'",
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
                f"f'is {{{value}!r}}; {fstring_text(users[name])} needs an int >= {least}'",
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
                self.defer(f"# {one_line(f'{path}: {rule.describe()}')}", 2)
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


def allowed_attributes(spec: SpecView[Any], path: str) -> frozenset[str]:
    """The instance attribute names a record at ``path`` may carry: its class's fields and
    the attributes declared with ``attributes=``."""
    prefix = f"{path}." if path else ""
    return frozenset(p[len(prefix):] for p in spec.fields
                     if p.startswith(prefix) and "." not in p[len(prefix):])


def generate(
    spec: SpecView[M], part: Part = "full", skip: frozenset[str] = frozenset()
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
