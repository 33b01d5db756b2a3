"""Specs: a rule for every field of a metadata class, validated when declared.

>>> import dataclasses, torch
>>> from draftmeta import DraftSpec, Alias, Unchanged, HostAdvance
>>> @dataclasses.dataclass
... class Meta:
...     seq_lens: torch.Tensor
...     block_table: torch.Tensor
...     max_seq_len: int
>>> spec = DraftSpec(Meta, {
...     "seq_lens": Alias("seq_lens"),
...     "block_table": Unchanged(),
...     "max_seq_len": HostAdvance(clamp="max_model_len"),
... })

A spec that leaves a field out, names a field that does not exist, has a dependency cycle, or
binds a rule that does not fit its field raises :class:`~draftmeta.errors.SpecError` at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import keyword
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs
import torch

from draftmeta.conditions import Precondition
from draftmeta.errors import SpecError
from draftmeta.fields import (
    FieldInfo,
    FieldKind,
    _resolved_hints,
    class_fields,
    classify,
    is_record_class,
)
from draftmeta.refs import STATE_PREFIX, is_state_ref
from draftmeta.rules import Rule
from draftmeta.state import DraftState

if TYPE_CHECKING:
    from draftmeta.codegen import SealFunction, StepFunction, UpdateFunction

__all__ = ["DraftSpec"]

M = TypeVar("M")

_STATE_FIELDS: dict[str, FieldInfo] = {f.name: f for f in class_fields(DraftState)}


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _describe_kind(info: FieldInfo, dtype: torch.dtype | None) -> str:
    kind = {
        FieldKind.TENSOR: f"a tensor{f' of {dtype}' if dtype is not None else ''}",
        FieldKind.INT: "a host int",
        FieldKind.BOOL: "a host bool",
        FieldKind.FLOAT: "a host float",
        FieldKind.RECORD: f"a nested {info.record.__qualname__ if info.record else 'record'}",
        FieldKind.GENERIC: f"a nested record typed {info.annotation}",
        FieldKind.OBJECT: f"a host object ({info.annotation})",
    }[info.kind]
    return kind


class DraftSpec(Generic[M]):
    """How every field of metadata class ``M`` changes between draft steps.

    Args:
        cls: the metadata class (a dataclass or attrs class).
        rules: a rule per field path, in the order the update applies them. Nested fields are
            addressed by dotted paths (``"decode.seq_lens"``); a covering rule (one whose
            :attr:`~draftmeta.rules.Rule.covers_record` is set: ``Unchanged``, ``Reset``,
            ``Unsupported``) on a nested record covers all its fields.
        name: the spec's name in messages and generated code (default: the class's name).
        preconditions: checked, in order, before the update writes anything.
        nested: concrete classes for nested fields typed by a ``TypeVar`` (or a subclass to use
            instead of the annotated class), by path: ``{"decode": FlashMLADecodeMetadata}``.
        dtypes: tensor dtypes by path where the annotations do not say, so rules can be checked
            against them at declaration (an advance on a float tensor is rejected).
        attributes: attributes a built object carries outside its class's fields (a builder
            that sets ``metadata.seq_lens_i64 = ...`` after construction), by path, with their
            annotation (``{"seq_lens_i64": torch.Tensor, "num_kv_splits": int}``). They need
            rules like fields do; :meth:`uncovered` reports any attribute a built object
            carries that is neither a field nor declared here.

    Raises:
        SpecError: the spec is malformed; the message names the field and says how to fix it.
    """

    def __init__(
        self,
        cls: type[M],
        rules: Mapping[str, Rule],
        *,
        name: str | None = None,
        preconditions: Sequence[Precondition] = (),
        nested: Mapping[str, type] | None = None,
        dtypes: Mapping[str, torch.dtype] | None = None,
        attributes: Mapping[str, object] | None = None,
    ) -> None:
        self.cls: type[M] = cls
        self.name: str = name or str(getattr(cls, "__qualname__", repr(cls)))
        self.rules: dict[str, Rule] = dict(rules)
        self.preconditions: tuple[Precondition, ...] = tuple(preconditions)
        self.nested: dict[str, type] = dict(nested or {})
        self.dtypes: dict[str, torch.dtype] = dict(dtypes or {})
        self.attributes: dict[str, object] = dict(attributes or {})
        self._fields: dict[str, FieldInfo] = {}
        self._records: dict[str, type] = {}
        self._compiled: UpdateFunction[M] | None = None
        self._sealed: tuple[SealFunction[M], StepFunction[M]] | None = None
        self._uncovered_memo: dict[
            tuple[tuple[type, tuple[str, ...]] | None, ...], tuple[str, ...]
        ] = {}
        self._records_walk: list[tuple[tuple[str, ...], str, str, type]] | None = None
        self._validate()
        self._capture_problems: tuple[tuple[str, str], ...] = tuple(
            (p, problem) for p, r in self.rules.items()
            if (problem := r.capture_problem()) is not None
        )

    # -- public views -------------------------------------------------------------------------

    @property
    def fields(self) -> Mapping[str, FieldInfo]:
        """Every field path of the class tree (nested records included), in declaration order."""
        return self._fields

    def record_class(self, path: str) -> type:
        """The class of the nested record at ``path`` (``""`` for the metadata class)."""
        return self._records[path]

    @property
    def unsupported_reasons(self) -> tuple[tuple[str, str], ...]:
        """``(path, reason)`` for every field whose rule cannot update in place
        (:class:`~draftmeta.rules.Unsupported`)."""
        return tuple(
            (p, reason) for p, r in self.rules.items()
            if (reason := r.unsupported_reason) is not None
        )

    @property
    def supported(self) -> bool:
        """Whether the spec can update in place at all (no field is unsupported)."""
        return not self.unsupported_reasons

    @property
    def capture_safe(self) -> bool:
        """Whether a captured CUDA graph can replay the spec's update: no rule replaces a host
        object (``Reset``, ``Invalidate``) and no recompute hook declares itself unsafe.
        Decided at declaration, from each rule's :meth:`~draftmeta.rules.Rule.capture_problem`;
        the draft loop's capture still checks at run time that nothing syncs or moves."""
        return not self._capture_problems

    @property
    def capture_unsafe_reason(self) -> str | None:
        """Why a captured CUDA graph cannot replay the spec's update (the first field in
        declaration order that prevents it), or ``None`` when :attr:`capture_safe`."""
        if not self._capture_problems:
            return None
        path, problem = self._capture_problems[0]
        return f"{path} {problem}"

    def rule_for(self, path: str) -> Rule:
        """The rule that governs ``path`` (its own, or a covering rule of an enclosing record)."""
        probe = path
        while True:
            if probe in self.rules:
                return self.rules[probe]
            if "." not in probe:
                raise KeyError(f"spec {self.name!r} has no rule covering {path!r}")
            probe = probe.rsplit(".", 1)[0]

    def dtype_of(self, path: str) -> torch.dtype | None:
        """The tensor dtype known for ``path`` from ``dtypes`` or an ``Annotated`` annotation."""
        info = self._fields.get(path)
        return self.dtypes.get(path) or (info.dtype if info else None)

    @property
    def update(self) -> UpdateFunction[M]:
        """The generated update function ``update(metadata, state) -> None`` (compiled once)."""
        if self._compiled is None:
            from draftmeta.codegen import compile_spec

            self._compiled = compile_spec(self)
        return self._compiled

    @property
    def sealed(self) -> tuple[SealFunction[M], StepFunction[M]]:
        """``(seal, step)``: the update split for a caller that updates one object at many
        steps (compiled once).

        ``seal(metadata, state)`` is the object's first update: the full :attr:`update` (every
        check before the first write; it raises, writing nothing, what :attr:`update` raises),
        returning a seal of what the checks that depend only on the object's structure and the
        tensors it holds verified (phases 0, 1, 2 and 3c). ``step(metadata, state, seal)`` then
        updates that object at a later step: it runs every check that can change between steps
        (the exact classes and attribute names of the object and its records, the
        preconditions, the state's bounds, new host values, formula checks) and, instead of
        phases 2 and 3c, compares the object with its seal: the same records and tensors, and
        the state's buffers the same objects or new ones in the same memory. Where one of those
        differs or fails it writes nothing and returns ``False``: call ``seal`` again (or
        :attr:`update`), which checks everything and raises what failed.
        """
        if self._sealed is None:
            from draftmeta.codegen import compile_sealed

            self._sealed = compile_sealed(self)
        return self._sealed

    def __repr__(self) -> str:
        return f"<DraftSpec {self.name!r} for {self.cls.__qualname__}: {len(self.rules)} rules>"

    # -- validation ---------------------------------------------------------------------------

    def _fail(self, path: str, problem: str, fix: str) -> SpecError:
        return SpecError(self.name, path, problem, fix)

    def _validate(self) -> None:
        given: object = self.cls
        if not isinstance(given, type) and is_record_class(type(given)):
            raise self._fail(
                "",
                f"the spec is given an instance of {type(given).__qualname__}, not a class",
                f"pass the class itself: DraftSpec({type(given).__qualname__}, ...)",
            )
        if not isinstance(self.name, str) or not self.name:
            raise self._fail("", f"name= is {self.name!r}", "name the spec with a non-empty str")
        origin = typing.get_origin(self.cls)
        if is_record_class(origin):
            assert isinstance(origin, type)
            raise self._fail(
                "",
                f"{_alias_text(self.cls)} is a parameterized alias of the generic "
                f"{_record_kind(origin)} {origin.__qualname__}, not a class a spec can cover",
                f"declare the spec for {origin.__qualname__} itself, with the concrete classes "
                f"of its TypeVar fields: "
                f"DraftSpec({origin.__qualname__}, ..., {_nested_for(self.cls)})",
            )
        if not is_record_class(self.cls):
            raise self._fail(
                "",
                f"{self.cls!r} is neither a dataclass nor an attrs class",
                "declare specs for dataclass or attrs metadata classes",
            )
        self._check_overrides_shape()
        self._walk(self.cls, "")
        self._add_attributes()
        self._check_overrides_known()
        self._check_rules_known()
        self._check_rules_fit()
        self._check_complete()
        self._check_references()
        self._check_hook_outputs()
        self._check_written_by()
        self._check_formulas()
        self._check_frozen()
        self._check_order()

    def _check_overrides_shape(self) -> None:
        for path, klass in self.nested.items():
            if klass is torch.Tensor:
                raise self._fail(
                    path,
                    "nested= maps it to torch.Tensor, but nested= takes record classes",
                    f"for a tensor field typed by a TypeVar pass dtypes={{{path!r}: its dtype}} "
                    "(torch.int32, ...)",
                )
            given: object = klass
            if not isinstance(given, type) and is_record_class(type(given)):
                raise self._fail(
                    path,
                    f"nested= maps it to an instance of {type(klass).__qualname__}, not a class",
                    f"map it to the class itself: nested={{{path!r}: "
                    f"{type(klass).__qualname__}}}",
                )
            origin = typing.get_origin(klass)
            if is_record_class(origin):
                assert isinstance(origin, type)
                raise self._fail(
                    path,
                    f"nested= maps it to {_alias_text(klass)}, a parameterized alias of the "
                    f"generic {_record_kind(origin)} {origin.__qualname__}, not a class",
                    f"map it to {origin.__qualname__} itself, and its TypeVar fields by their "
                    f"paths: {_nested_for(klass, path + '.', {path: origin})}",
                )
            if not is_record_class(klass):
                raise self._fail(
                    path,
                    f"nested= maps it to {klass!r}, which is not a dataclass or attrs class",
                    "map nested paths to the concrete dataclass or attrs class of that field",
                )
        for path, dtype in self.dtypes.items():
            if not isinstance(dtype, torch.dtype):
                raise self._fail(
                    path, f"dtypes= maps it to {dtype!r}, not a torch.dtype", "use torch.int32 etc."
                )

    def _walk(self, cls: type, prefix: str) -> None:
        self._records[prefix.rstrip(".")] = cls
        for info in class_fields(cls):
            path = prefix + info.name
            if not info.name.isidentifier() or keyword.iskeyword(info.name):
                raise self._fail(
                    path,
                    f"{cls.__qualname__} has a field named {info.name!r}, which generated code "
                    "cannot address as an attribute",
                    "rename the field to a Python identifier that is not a keyword",
                )
            if info.kind is FieldKind.GENERIC and path in self.dtypes:
                info = FieldInfo(info.name, FieldKind.TENSOR, info.optional, None,
                                 self.dtypes[path], info.annotation)
            self._fields[path] = info
            child = self.nested.get(path) or info.record
            if child is not None and info.kind in (
                FieldKind.RECORD, FieldKind.GENERIC, FieldKind.OBJECT
            ):
                self._walk(child, path + ".")

    def _add_attributes(self) -> None:
        for path, annotation in self.attributes.items():
            parent, _, name = str(path).rpartition(".")
            if not isinstance(path, str) or not name.isidentifier():
                raise self._fail(
                    str(path), "attributes= names it, but it is not an attribute name",
                    "name attributes by a Python identifier, dotted for nested records",
                )
            if parent not in self._records:
                raise self._unknown(parent, "attributes=")
            if path in self._fields:
                raise self._fail(
                    path, "attributes= declares it, but it is already a field of the class",
                    f"remove {path!r} from attributes=: fields are covered by rules already",
                )
            kind, optional, record, dtype = classify(annotation)
            if kind in (FieldKind.RECORD, FieldKind.GENERIC):
                raise self._fail(
                    path, "attributes= declares it as a nested record",
                    "declare extra attributes as tensors, host scalars or host objects",
                )
            text = annotation if isinstance(annotation, str) else getattr(
                annotation, "__qualname__", str(annotation))
            self._fields[path] = FieldInfo(name, kind, optional, record, dtype, str(text))

    # -- built objects ------------------------------------------------------------------------

    def uncovered(self, metadata: object) -> tuple[str, ...]:
        """What a built ``metadata`` object carries that this spec has no rule for.

        Walks the object and its nested records and reports, as readable strings, every
        attribute in an instance ``__dict__`` that is neither a field of its class nor declared
        in ``attributes=``, and every record whose class is not exactly the declared one (a
        subclass may add fields). An empty tuple means the spec covers the object completely.
        Cost: one pass over the object's attributes; call it once per built object, not per step.
        """
        key: list[tuple[type, tuple[str, ...]] | None] = []
        records = self._record_walk()
        for parts, _, _, _ in records:
            obj: object = metadata
            for part in parts:
                obj = getattr(obj, part, None)
            key.append(None if obj is None else (type(obj), tuple(getattr(obj, "__dict__", ()))))
        # the verdict depends only on the classes and attribute names: cache it by them
        verdict = self._uncovered_memo.get(tuple(key))
        if verdict is not None:
            return verdict
        problems: list[str] = []
        for (_, where, prefix, cls), shape in zip(records, key):
            if shape is None:
                continue
            kind, names = shape
            if kind is not cls:
                problems.append(
                    f"{where} is a {kind.__qualname__}, not the declared {cls.__qualname__}"
                )
                continue
            for name in names:
                if f"{prefix}{name}" not in self._fields:
                    problems.append(f"{prefix}{name} (an attribute outside the class's fields)")
        verdict = tuple(problems)
        if len(self._uncovered_memo) < 64:
            self._uncovered_memo[tuple(key)] = verdict
        return verdict

    def _record_walk(self) -> list[tuple[tuple[str, ...], str, str, type]]:
        """``(attribute chain, name for messages, field prefix, class)`` of every record."""
        if self._records_walk is None:
            self._records_walk = [
                (tuple(path.split(".")) if path else (), path or "the metadata object",
                 f"{path}." if path else "", cls)
                for path, cls in self._records.items()
            ]
        return self._records_walk

    def _check_overrides_known(self) -> None:
        for path in self.nested:
            info = self._fields.get(path)
            if info is None:
                raise self._unknown(path, "nested=")
            if info.kind not in (FieldKind.RECORD, FieldKind.GENERIC, FieldKind.OBJECT):
                raise self._fail(
                    path,
                    f"nested= gives it a class, but it is {_describe_kind(info, None)}",
                    "list only nested record (or host object) fields in nested=",
                )
        for path in self.dtypes:
            info = self._fields.get(path)
            if info is None:
                raise self._unknown(path, "dtypes=")
            if info.kind is not FieldKind.TENSOR:
                raise self._fail(
                    path,
                    f"dtypes= gives it a dtype, but it is {_describe_kind(info, None)}",
                    "list only tensor fields in dtypes=",
                )

    def _unknown(self, path: str, where: str) -> SpecError:
        parts = path.split(".")
        for i in range(1, len(parts)):
            head = ".".join(parts[:i])
            info = self._fields.get(head)
            if info is not None and info.kind is FieldKind.GENERIC and head not in self._records:
                return self._fail(
                    path,
                    f"{where} names a path through {head!r}, which is typed by the TypeVar "
                    f"{info.annotation}, so its fields are unknown",
                    f"pass nested={{{head!r}: TheConcreteClass}} to the spec (a record class)",
                )
            if info is not None and head not in self._records:
                return self._fail(
                    path,
                    f"{where} names a path through {head!r}, which is "
                    f"{_describe_kind(info, self.dtype_of(head))} and has no fields",
                    f"address a field that exists; if {head!r} holds a record typed by a "
                    f"TypeVar, pass nested={{{head!r}: ItsClass}}",
                )
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        cls = self._records.get(parent, self.cls)
        siblings = [p for p in self._fields if p.rsplit(".", 1)[0] == parent or "." not in p]
        close = difflib.get_close_matches(path, siblings, n=3)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else (
            f"{cls.__qualname__} has fields "
            + ", ".join(repr(i.name) for i in class_fields(cls))
        )
        return self._fail(path, f"{where} names a field that does not exist", hint)

    def _check_rules_known(self) -> None:
        for path, rule in self.rules.items():
            if not isinstance(path, str):
                raise self._fail(str(path), "rule keys must be field paths (str)", "use 'a.b'")
            if not isinstance(rule, Rule):
                raise self._fail(
                    path,
                    f"bound to {rule!r}, which is not a Rule",
                    "bind a rule object such as Unchanged() or Alias('seq_lens')",
                )
            if path not in self._fields:
                raise self._unknown(path, "the spec")
            ancestor = path
            while "." in ancestor:
                ancestor = ancestor.rsplit(".", 1)[0]
                if ancestor in self.rules:
                    raise self._fail(
                        path,
                        f"has a rule, but so has its enclosing record {ancestor!r} "
                        f"({self.rules[ancestor].kind})",
                        f"give rules either to {ancestor!r} as a whole or to each of its fields",
                    )

    def _check_rules_fit(self) -> None:
        for path, rule in self.rules.items():
            info = self._fields[path]
            dtype = self.dtype_of(path)
            kind = info.kind
            what = _describe_kind(info, dtype)
            target = rule.target
            if kind is FieldKind.GENERIC and path not in self.nested and target != "any":
                raise self._fail(
                    path,
                    f"is typed by the TypeVar {info.annotation}, so its class is unknown",
                    f"pass nested={{{path!r}: TheConcreteClass}} if it holds a record, or "
                    f"dtypes={{{path!r}: torch.int32}} (its dtype) if it holds a tensor",
                )
            misfit = rule.field_problem(info)
            if misfit is not None:
                raise self._fail(path, *misfit)
            if target == "tensor" and kind is not FieldKind.TENSOR:
                raise self._fail(
                    path,
                    f"rule {rule.kind} needs a tensor field, but the field is {what}",
                    "use a host rule (HostConstant, HostAdvance, HostUpperBound, HostDerive, "
                    "HostSet) for host values, Reset for host objects",
                )
            if target == "int tensor":
                if kind is not FieldKind.TENSOR:
                    raise self._fail(
                        path,
                        f"rule {rule.kind} needs an integer tensor, but the field is {what}",
                        "use HostAdvance for host ints",
                    )
                if dtype is not None and (dtype.is_floating_point or dtype is torch.bool
                                          or dtype.is_complex):
                    raise self._fail(
                        path,
                        f"rule {rule.kind} needs an integer tensor, but the field is {what}",
                        "advance only integer tensors (positions, lengths); derive other fields",
                    )
            if target in ("host", "int") and kind in (
                FieldKind.TENSOR, FieldKind.RECORD, FieldKind.GENERIC
            ):
                raise self._fail(
                    path,
                    f"host rule {rule.kind} cannot update {what} in place",
                    "use Alias, Advance, Derive or Recompute for tensors; Unchanged or Reset "
                    "for nested records",
                )
            if target == "int" and kind is not FieldKind.INT:
                raise self._fail(
                    path,
                    f"rule {rule.kind} needs a host int, but the field is {what}",
                    "use HostConstant or HostDerive for other host values",
                )
            if target == "object" and kind in (
                FieldKind.TENSOR, FieldKind.INT, FieldKind.BOOL, FieldKind.FLOAT
            ):
                raise self._fail(
                    path,
                    f"rule {rule.kind} replaces a host object, but the field is {what}",
                    "use Derive or Recompute for tensors and host rules for scalars",
                )

    def _check_complete(self) -> None:
        missing: list[str] = []
        unresolved: list[str] = []
        for path, info in self._fields.items():
            if self._covered(path):
                continue
            if path in self._records:  # a nested record without a rule: its fields need rules
                continue
            if info.kind is FieldKind.GENERIC:
                unresolved.append(path)
            else:
                missing.append(path)
        if unresolved:
            path = unresolved[0]
            raise self._fail(
                path,
                f"is typed by the TypeVar {self._fields[path].annotation} and has no rule, so "
                "its fields are unknown",
                f"pass nested={{{path!r}: TheConcreteClass}}, or cover it with Unchanged() "
                "if it stays the same",
            )
        if missing:
            listed = ", ".join(repr(p) for p in missing)
            raise self._fail(
                missing[0],
                f"has no rule ({len(missing)} field(s) without a rule: {listed}); every field "
                "must say how it changes per draft step",
                f"add a rule for each, e.g. {missing[0]!r}: Unchanged() if it keeps its value",
            )

    def _covered(self, path: str) -> bool:
        if path in self.rules:
            return True
        probe = path
        while "." in probe:
            probe = probe.rsplit(".", 1)[0]
            rule = self.rules.get(probe)
            if rule is not None:
                return rule.covers_record
        return False

    def _ref_info(self, ref: str) -> FieldInfo:
        if is_state_ref(ref):
            return _STATE_FIELDS[ref[len(STATE_PREFIX):]]
        return self._fields[ref]

    def _is_tensor_ref(self, ref: str) -> bool:
        return self._ref_info(ref).kind is FieldKind.TENSOR

    def _check_ref(self, owner: str, ref: str) -> None:
        if is_state_ref(ref):
            name = ref[len(STATE_PREFIX):]
            if name not in _STATE_FIELDS:
                close = difflib.get_close_matches(name, list(_STATE_FIELDS), n=3)
                raise self._fail(
                    owner,
                    f"reads {ref!r}, but the draft state has no field {name!r}",
                    f"use one of {', '.join(close) if close else ', '.join(_STATE_FIELDS)}",
                )
            return
        if ref not in self._fields:
            err = self._unknown(ref, f"a reference of {owner!r}")
            raise self._fail(owner, f"reads {ref!r}, which does not exist", err.fix)

    def _check_references(self) -> None:
        for path, rule in self.rules.items():
            for ref in rule.reads():
                self._check_ref(path, ref)
                read = self._ref_info(ref)
                misfit = rule.reference_problem(ref, read.kind, _describe_kind(read, None))
                if misfit is not None:
                    raise self._fail(path, *misfit)
                if ref == path:
                    raise self._fail(
                        path,
                        f"rule {rule.kind} reads the field it writes",
                        "derive the field from other fields or the draft state; use Advance "
                        "for a field that grows from its own value",
                    )
            for bound in rule.bounds():
                info = _STATE_FIELDS.get(bound)
                if info is None or info.kind is not FieldKind.INT:
                    ints = [n for n, f in _STATE_FIELDS.items() if f.kind is FieldKind.INT]
                    raise self._fail(
                        path,
                        f"rule {rule.kind} is bounded by {bound!r}, which is not a host int of "
                        "the draft state",
                        f"bound by one of {', '.join(ints)}",
                    )
            if rule.advances_padded_rows:
                raise self._fail(
                    path,
                    f"rule {rule.kind} advances rows at or past state.num_reqs (padding), but "
                    "the source advance leaves padded rows where they are, so the field would "
                    "drift from the state in padded rows",
                    rule.padded_rows_fix,
                )
        for cond in self.preconditions:
            if not isinstance(cond, Precondition):
                raise self._fail(
                    "", f"precondition {cond!r} is not a Precondition", "use Equals(...) etc."
                )
            for ref in cond.reads():
                self._check_ref(f"<precondition {cond.name}>", ref)
                if cond.host_only and self._is_tensor_ref(ref):
                    raise self._fail(
                        "",
                        f"precondition {cond.name!r} compares the tensor {ref!r} on the host, "
                        "which would wait for the device",
                        "check host scalars only",
                    )

    def _check_hook_outputs(self) -> None:
        """What a ``Recompute`` lists in ``also=``: distinct tensor fields of the metadata,
        other than its own field and its inputs, each refilled by one hook only."""
        owners: dict[str, str] = {}
        for path, rule in self.rules.items():
            outputs = rule.also_writes()
            for i, extra in enumerate(outputs):
                if extra == path:
                    raise self._fail(
                        path,
                        "lists its own field in also=, but a Recompute always refills its own "
                        "field; also= names the hook's other outputs",
                        f"remove {path!r} from also=",
                    )
                if extra in outputs[:i]:
                    raise self._fail(
                        path, f"lists {extra!r} twice in also=", f"list {extra!r} once",
                    )
                if is_state_ref(extra):
                    raise self._fail(
                        path,
                        f"lists the draft-state buffer {extra!r} in also=, but a hook refills "
                        "metadata buffers only (the draft loop advances the state)",
                        f"remove {extra!r} from also=",
                    )
                info = self._fields.get(extra)
                if info is None:
                    raise self._unknown(extra, f"also= of {path!r}")
                if info.kind is not FieldKind.TENSOR:
                    raise self._fail(
                        path,
                        f"lists {extra!r} in also=, which is "
                        f"{_describe_kind(info, self.dtype_of(extra))}; a hook refills tensor "
                        "buffers only",
                        f"remove {extra!r} from also= and give it a rule of its own",
                    )
                first = owners.setdefault(extra, path)
                if first != path:
                    raise self._fail(
                        extra,
                        f"is listed in also= of both {first!r} and {path!r}, but one kernel "
                        "call refills a buffer",
                        f"keep {extra!r} in the also= of the hook that computes it and remove "
                        "it from the other's",
                    )
                read = next((r for r in rule.reads() if _overlaps(r, extra)), None)
                if read is not None:
                    raise self._fail(
                        path,
                        f"reads {read!r}, which its own hook refills (also={extra!r}), so the "
                        "kernel would read a buffer while overwriting it",
                        f"remove {read!r} from the inputs of {path!r}: compute the hook from the "
                        "fields or draft-state buffers that buffer is computed from",
                    )

    def _check_written_by(self) -> None:
        for path, rule in self.rules.items():
            owner_path = rule.written_by
            if owner_path is not None:
                owner = self.rules.get(owner_path)
                if owner_path == path:
                    raise self._fail(
                        path,
                        "is declared written by itself",
                        "give the field its own Recompute(hook, inputs) rule",
                    )
                info = self._fields.get(owner_path)
                if info is None:
                    raise self._unknown(owner_path, f"WrittenBy of {path!r}")
                if info.kind is not FieldKind.TENSOR:
                    raise self._fail(
                        path,
                        f"is written by {owner_path!r}, which is "
                        f"{_describe_kind(info, self.dtype_of(owner_path))}; only a tensor "
                        "field's Recompute hook writes other fields",
                        "name the tensor field whose Recompute rule lists this one in also=",
                    )
                if owner is None or path not in owner.also_writes():
                    raise self._fail(
                        path,
                        f"is written by {owner_path!r}, but that field's rule is not a Recompute "
                        "listing it in also=",
                        f"give {owner_path!r} Recompute(hook, inputs, also=({path!r},))",
                    )
            for extra in rule.also_writes():  # each a field: _check_hook_outputs ran first
                other = self.rules.get(extra)
                if other is None or other.written_by != path:
                    raise self._fail(
                        extra,
                        f"is refilled by the recompute hook of {path!r} but its rule is not "
                        f"WrittenBy({path!r})",
                        f"bind {extra!r}: WrittenBy({path!r})",
                    )

    def _check_formulas(self) -> None:
        """A formula's or hook's inputs (``Derive``, ``Recompute``): as many as it takes, of the
        kinds it takes."""
        for path, rule in self.rules.items():
            fn = rule.in_place_function
            if fn is None:
                continue
            kinds = fn.arguments
            if kinds is None:
                continue
            inputs = rule.reads()
            if len(inputs) != len(kinds):
                raise self._fail(
                    path,
                    f"{fn.name} takes {len(kinds)} input(s) ({', '.join(kinds) or 'none'}), "
                    f"but the rule gives {len(inputs)}: {list(inputs)}",
                    f"give {fn.name} exactly {len(kinds)} input(s), in the order "
                    f"{type(fn).__qualname__}'s docstring lists",
                )
            for i, (ref, kind) in enumerate(zip(inputs, kinds)):
                info = (_STATE_FIELDS[ref[len(STATE_PREFIX):]] if is_state_ref(ref)
                        else self._fields[ref])
                actual = info.kind
                wrong = (
                    (kind == "tensor" and actual is not FieldKind.TENSOR)
                    or (kind == "int" and actual is not FieldKind.INT)
                )
                if wrong:
                    raise self._fail(
                        path,
                        f"input {i} of {fn.name} must be a {'host int' if kind == 'int' else kind}"
                        f", but {ref!r} is {_describe_kind(info, None)}",
                        f"pass a {'host int' if kind == 'int' else kind} reference as input {i}",
                    )

    def _check_frozen(self) -> None:
        """Host rules store new values with setattr: a frozen record cannot take them."""
        for path, rule in self.rules.items():
            if not rule.stores_host_value:
                continue
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            cls = self._records.get(parent)
            if cls is not None and _frozen(cls):
                where = f"{parent!r}" if parent else "the metadata class"
                raise self._fail(
                    path,
                    f"rule {rule.kind} stores a new value each step, but {where} "
                    f"({cls.__qualname__}) is frozen, so the store would fail mid-update",
                    "make the class mutable, or declare the spec Unsupported for it so the "
                    "builder rebuilds",
                )

    def _writer(self, path: str) -> str | None:
        rule = self.rules.get(path)
        if rule is not None and rule.written_by is not None:
            return rule.written_by
        return path if rule is not None and rule.writes else None

    def _check_order(self) -> None:
        written = [p for p, r in self.rules.items() if r.writes]
        outputs = {p: self._writer(p) for p in self.rules if self._writer(p)}
        deps: dict[str, list[str]] = {}
        via: dict[tuple[str, str], str] = {}  # (reader, writer) -> the output it reads
        for path in written:
            reads = [r for r in self.rules[path].reads() if not is_state_ref(r)]
            found: set[str] = set()
            for out, writer in outputs.items():
                read = next((r for r in reads if _overlaps(out, r)), None)
                if writer and writer != path and read is not None:
                    found.add(writer)
                    via.setdefault((path, writer), out if out != writer else read)
            deps[path] = [w for w in written if w in found]

        def reads_text(reader: str, writer: str) -> str:
            out = via[(reader, writer)]
            if out == writer or _overlaps(out, writer):
                return f"reads {out!r}"
            return f"reads {out!r}, which the recompute hook of {writer!r} refills"

        cycle = _find_cycle(deps)
        if cycle:
            chain = " -> ".join(repr(p) for p in cycle)
            hooks = [f"{a!r} {reads_text(a, b)}" for a, b in itertools.pairwise(cycle)
                     if "recompute hook" in reads_text(a, b)]
            if hooks:
                chain += f" ({'; '.join(hooks)})"
            raise self._fail(
                cycle[0],
                f"derived fields depend on each other in a cycle: {chain}",
                "break the cycle: derive one of them from the draft state or an unchanged field",
            )
        order = {p: i for i, p in enumerate(self.rules)}
        for path in written:
            for dep in deps[path]:
                if order[dep] > order[path]:
                    raise self._fail(
                        path,
                        f"{reads_text(path, dep)}, but {dep!r} is also updated and declared "
                        "later, so it is ambiguous whether the old or the new value is meant",
                        f"declare {dep!r} before {path!r}; updates run in declaration order and "
                        "always read values already updated this step",
                    )

    # -- helpers for the code generator -------------------------------------------------------

    def containers(self) -> Iterator[str]:
        """Nested record paths, parents before children."""
        return (p for p in self._records if p)

    def optional(self, path: str) -> bool:
        """Whether the field at ``path`` may be ``None`` by its annotation."""
        info = self._fields[path]
        return info.optional or info.kind is FieldKind.OBJECT


def _find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in deps.get(node, ()):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _alias_text(alias: object) -> str:
    """``Top[Dec]`` for a parameterized generic alias (without module prefixes)."""
    origin = typing.get_origin(alias)
    args = ", ".join(getattr(a, "__qualname__", str(a)) for a in typing.get_args(alias))
    return f"{getattr(origin, '__qualname__', origin)}[{args}]"


def _record_kind(cls: type) -> str:
    return "attrs class" if attrs.has(cls) else "dataclass"


def _type_var_of(annotation: object) -> object:
    """The TypeVar a field annotation names (through ``Optional`` and ``Annotated``), or None."""
    for _ in range(3):
        if isinstance(annotation, TypeVar):
            return annotation
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < 1:
            return None
        annotation = args[0]
    return None


def _nested_for(alias: object, prefix: str = "", found: dict[str, type] | None = None
                ) -> str:
    """The ``nested=`` (or ``dtypes=``) arguments that declare what the parameterized generic
    ``alias`` means: each field typed by one of its TypeVars, mapped to the class given for it
    (a tensor field to its dtype)."""
    origin = typing.get_origin(alias)
    assert isinstance(origin, type)
    bound = dict(zip(getattr(origin, "__parameters__", ()), typing.get_args(alias)))
    nested: dict[str, type] = dict(found or {})
    tensors: list[str] = []
    hints = _resolved_hints(origin)
    for info in class_fields(origin):
        arg = bound.get(_type_var_of(hints.get(info.name)))
        if isinstance(arg, type) and is_record_class(arg):
            nested[prefix + info.name] = arg
        elif arg is torch.Tensor:
            tensors.append(prefix + info.name)
    parts = []
    if nested or not tensors:
        parts.append("nested={" + ", ".join(f"{p!r}: {k.__qualname__}"
                                            for p, k in nested.items()) + "}")
    if tensors:
        parts.append("dtypes={" + ", ".join(f"{p!r}: its dtype" for p in tensors) + "}")
    return ", ".join(parts)


def _frozen(cls: type) -> bool:
    """Whether instances of a dataclass or attrs class refuse attribute assignment."""
    params = getattr(cls, "__dataclass_params__", None)
    if dataclasses.is_dataclass(cls) and params is not None and params.frozen:
        return True
    setattr_ = getattr(cls, "__setattr__", None)
    return getattr(setattr_, "__name__", "") == "_frozen_setattrs"



