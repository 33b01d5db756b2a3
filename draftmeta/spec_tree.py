"""The field tree a spec covers: the fields and nested records of its metadata class, with the
spec's ``nested=``, ``dtypes=`` and ``attributes=`` applied, checked when the spec is declared.

:func:`read_tree` is the first half of declaring a :class:`~draftmeta.spec.DraftSpec`: it checks
the class, the overrides and the field names, and returns a :class:`SpecTree`, what exists to
bind rules to. :func:`~draftmeta.spec_validation.validate_rules` then checks the rules against
it. Every problem raises :class:`~draftmeta.errors.SpecError` naming the field and the fix.
"""

from __future__ import annotations

import difflib
import keyword
import typing
from collections.abc import Mapping
from typing import TypeVar

import attrs
import torch

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
from draftmeta.state import DraftState

__all__ = ["STATE_FIELDS", "SpecTree", "describe_kind", "read_tree"]

STATE_FIELDS: dict[str, FieldInfo] = {f.name: f for f in class_fields(DraftState)}
"""The draft state's fields by name: what a ``state.X`` reference may name."""


@attrs.define(eq=False)
class SpecTree:
    """What a spec can bind rules to: every field path of its metadata class (nested records
    and declared attributes included) and the class of every record, with what the spec
    declared about them. Made by :func:`read_tree`; it answers, for the checks of the rules,
    what a path or reference is, and words the errors.

    Attributes:
        name: the spec's name, in errors.
        cls: the metadata class.
        nested: the spec's ``nested=``: concrete classes of nested fields, by path.
        dtypes: the spec's ``dtypes=``: tensor dtypes, by path.
        fields: every field path, in declaration order (parents before their fields).
        records: the class of every record by path (``""``: the metadata class), parents first.
    """

    name: str
    cls: type
    nested: Mapping[str, type]
    dtypes: Mapping[str, torch.dtype]
    fields: dict[str, FieldInfo] = attrs.field(factory=dict)
    records: dict[str, type] = attrs.field(factory=dict)

    def fail(self, path: str, problem: str, fix: str) -> SpecError:
        """The error for a problem at ``path``, with its fix."""
        return SpecError(self.name, path, problem, fix)

    def dtype_of(self, path: str) -> torch.dtype | None:
        """The tensor dtype known for ``path`` from ``dtypes=`` or an ``Annotated`` annotation."""
        info = self.fields.get(path)
        return self.dtypes.get(path) or (info.dtype if info else None)

    def unknown(self, path: str, where: str) -> SpecError:
        """The error for ``where`` naming ``path``, which is no field: through a field without
        fields (a TypeVar's, a tensor's), or a name that does not exist (with close names)."""
        parts = path.split(".")
        for i in range(1, len(parts)):
            head = ".".join(parts[:i])
            info = self.fields.get(head)
            if info is not None and info.kind is FieldKind.GENERIC and head not in self.records:
                return self.fail(
                    path,
                    f"{where} names a path through {head!r}, which is typed by the TypeVar "
                    f"{info.annotation}, so its fields are unknown",
                    f"pass nested={{{head!r}: TheConcreteClass}} to the spec (a record class)",
                )
            if info is not None and head not in self.records:
                return self.fail(
                    path,
                    f"{where} names a path through {head!r}, which is "
                    f"{describe_kind(info, self.dtype_of(head))} and has no fields",
                    f"address a field that exists; if {head!r} holds a record typed by a "
                    f"TypeVar, pass nested={{{head!r}: ItsClass}}",
                )
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        cls = self.records.get(parent, self.cls)
        siblings = [p for p in self.fields if p.rsplit(".", 1)[0] == parent or "." not in p]
        close = difflib.get_close_matches(path, siblings, n=3)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else (
            f"{cls.__qualname__} has fields "
            + ", ".join(repr(i.name) for i in class_fields(cls))
        )
        return self.fail(path, f"{where} names a field that does not exist", hint)

    def ref_info(self, ref: str) -> FieldInfo:
        """The field a reference reads: a draft-state field (``state.X``) or a path."""
        if is_state_ref(ref):
            return STATE_FIELDS[ref[len(STATE_PREFIX):]]
        return self.fields[ref]

    def is_tensor_ref(self, ref: str) -> bool:
        """Whether the reference reads a tensor."""
        return self.ref_info(ref).kind is FieldKind.TENSOR

    def check_ref(self, owner: str, ref: str) -> None:
        """Raise unless ``ref``, read by ``owner`` (a field path or a precondition), names a
        draft-state field or a field of the tree."""
        if is_state_ref(ref):
            name = ref[len(STATE_PREFIX):]
            if name not in STATE_FIELDS:
                close = difflib.get_close_matches(name, list(STATE_FIELDS), n=3)
                raise self.fail(
                    owner,
                    f"reads {ref!r}, but the draft state has no field {name!r}",
                    f"use one of {', '.join(close) if close else ', '.join(STATE_FIELDS)}",
                )
            return
        if ref not in self.fields:
            err = self.unknown(ref, f"a reference of {owner!r}")
            raise self.fail(owner, f"reads {ref!r}, which does not exist", err.fix)


def read_tree(
    name: str,
    cls: type,
    *,
    nested: Mapping[str, type],
    dtypes: Mapping[str, torch.dtype],
    attributes: Mapping[str, object],
) -> SpecTree:
    """The field tree of ``cls`` as a spec named ``name`` declares it, checked: ``cls`` a
    dataclass or attrs class (not an instance, not a parameterized alias), ``nested=`` mapping
    paths to record classes and ``dtypes=`` to dtypes, every field name a Python identifier,
    ``attributes=`` naming new attributes of existing records, and every path of ``nested=``
    and ``dtypes=`` a field of the right kind.

    Raises:
        SpecError: the first problem found, naming the field and the fix.
    """
    tree = SpecTree(name, cls, nested, dtypes)
    given: object = tree.cls
    if not isinstance(given, type) and is_record_class(type(given)):
        raise tree.fail(
            "",
            f"the spec is given an instance of {type(given).__qualname__}, not a class",
            f"pass the class itself: DraftSpec({type(given).__qualname__}, ...)",
        )
    if not isinstance(tree.name, str) or not tree.name:
        raise tree.fail("", f"name= is {tree.name!r}", "name the spec with a non-empty str")
    origin = typing.get_origin(tree.cls)
    if is_record_class(origin):
        assert isinstance(origin, type)
        raise tree.fail(
            "",
            f"{_alias_text(tree.cls)} is a parameterized alias of the generic "
            f"{_record_kind(origin)} {origin.__qualname__}, not a class a spec can cover",
            f"declare the spec for {origin.__qualname__} itself, with the concrete classes "
            f"of its TypeVar fields: "
            f"DraftSpec({origin.__qualname__}, ..., {_nested_for(tree.cls)})",
        )
    if not is_record_class(tree.cls):
        raise tree.fail(
            "",
            f"{tree.cls!r} is neither a dataclass nor an attrs class",
            "declare specs for dataclass or attrs metadata classes",
        )
    _check_overrides_shape(tree)
    _walk(tree, tree.cls, "")
    _add_attributes(tree, attributes)
    _check_overrides_known(tree)
    return tree


def _check_overrides_shape(tree: SpecTree) -> None:
    for path, klass in tree.nested.items():
        if klass is torch.Tensor:
            raise tree.fail(
                path,
                "nested= maps it to torch.Tensor, but nested= takes record classes",
                f"for a tensor field typed by a TypeVar pass dtypes={{{path!r}: its dtype}} "
                "(torch.int32, ...)",
            )
        given: object = klass
        if not isinstance(given, type) and is_record_class(type(given)):
            raise tree.fail(
                path,
                f"nested= maps it to an instance of {type(klass).__qualname__}, not a class",
                f"map it to the class itself: nested={{{path!r}: "
                f"{type(klass).__qualname__}}}",
            )
        origin = typing.get_origin(klass)
        if is_record_class(origin):
            assert isinstance(origin, type)
            raise tree.fail(
                path,
                f"nested= maps it to {_alias_text(klass)}, a parameterized alias of the "
                f"generic {_record_kind(origin)} {origin.__qualname__}, not a class",
                f"map it to {origin.__qualname__} itself, and its TypeVar fields by their "
                f"paths: {_nested_for(klass, path + '.', {path: origin})}",
            )
        if not is_record_class(klass):
            raise tree.fail(
                path,
                f"nested= maps it to {klass!r}, which is not a dataclass or attrs class",
                "map nested paths to the concrete dataclass or attrs class of that field",
            )
    for path, dtype in tree.dtypes.items():
        if not isinstance(dtype, torch.dtype):
            raise tree.fail(
                path, f"dtypes= maps it to {dtype!r}, not a torch.dtype", "use torch.int32 etc."
            )


def _walk(tree: SpecTree, cls: type, prefix: str) -> None:
    tree.records[prefix.rstrip(".")] = cls
    for info in class_fields(cls):
        path = prefix + info.name
        if not info.name.isidentifier() or keyword.iskeyword(info.name):
            raise tree.fail(
                path,
                f"{cls.__qualname__} has a field named {info.name!r}, which generated code "
                "cannot address as an attribute",
                "rename the field to a Python identifier that is not a keyword",
            )
        if info.kind is FieldKind.GENERIC and path in tree.dtypes:
            info = FieldInfo(info.name, FieldKind.TENSOR, info.optional, None,
                             tree.dtypes[path], info.annotation)
        tree.fields[path] = info
        child = tree.nested.get(path) or info.record
        if child is not None and info.kind in (
            FieldKind.RECORD, FieldKind.GENERIC, FieldKind.OBJECT
        ):
            _walk(tree, child, path + ".")


def _add_attributes(tree: SpecTree, attributes: Mapping[str, object]) -> None:
    for path, annotation in attributes.items():
        parent, _, name = str(path).rpartition(".")
        if not isinstance(path, str) or not name.isidentifier():
            raise tree.fail(
                str(path), "attributes= names it, but it is not an attribute name",
                "name attributes by a Python identifier, dotted for nested records",
            )
        if parent not in tree.records:
            raise tree.unknown(parent, "attributes=")
        if path in tree.fields:
            raise tree.fail(
                path, "attributes= declares it, but it is already a field of the class",
                f"remove {path!r} from attributes=: fields are covered by rules already",
            )
        kind, optional, record, dtype = classify(annotation)
        if kind in (FieldKind.RECORD, FieldKind.GENERIC):
            raise tree.fail(
                path, "attributes= declares it as a nested record",
                "declare extra attributes as tensors, host scalars or host objects",
            )
        text = annotation if isinstance(annotation, str) else getattr(
            annotation, "__qualname__", str(annotation))
        tree.fields[path] = FieldInfo(name, kind, optional, record, dtype, str(text))


def _check_overrides_known(tree: SpecTree) -> None:
    for path in tree.nested:
        info = tree.fields.get(path)
        if info is None:
            raise tree.unknown(path, "nested=")
        if info.kind not in (FieldKind.RECORD, FieldKind.GENERIC, FieldKind.OBJECT):
            raise tree.fail(
                path,
                f"nested= gives it a class, but it is {describe_kind(info, None)}",
                "list only nested record (or host object) fields in nested=",
            )
    for path in tree.dtypes:
        info = tree.fields.get(path)
        if info is None:
            raise tree.unknown(path, "dtypes=")
        if info.kind is not FieldKind.TENSOR:
            raise tree.fail(
                path,
                f"dtypes= gives it a dtype, but it is {describe_kind(info, None)}",
                "list only tensor fields in dtypes=",
            )


def describe_kind(info: FieldInfo, dtype: torch.dtype | None) -> str:
    """How a field reads in a message: ``a tensor of torch.int32``, ``a host int``, ``a nested
    Decode``, ...; ``dtype`` where known."""
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
