"""Introspection of metadata classes: which fields a class has and what kind each one is.

A spec binds a rule to every field of a metadata class. This module reads the class's fields
(dataclasses and attrs classes, nested ones included) and classifies each field's annotation so
that the spec can check that a rule fits the field it is bound to.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
import typing
from collections.abc import Mapping

import attrs
import torch

__all__ = ["FieldInfo", "FieldKind", "class_fields", "is_record_class", "record_items"]


class FieldKind(enum.Enum):
    """What a metadata field holds, as far as its annotation tells."""

    TENSOR = "tensor"
    """A ``torch.Tensor`` (possibly ``Optional``)."""
    INT = "int"
    """A host ``int``."""
    BOOL = "bool"
    """A host ``bool``."""
    FLOAT = "float"
    """A host ``float``."""
    RECORD = "record"
    """A nested dataclass or attrs class whose own fields need rules."""
    GENERIC = "generic"
    """A nested field typed by a ``TypeVar``: the spec must name its concrete class."""
    OBJECT = "object"
    """Any other host object (a scheduler object, an enum, a union of kinds, ...)."""


@attrs.frozen
class FieldInfo:
    """One field of a metadata class, as the spec sees it.

    Attributes:
        name: the attribute name.
        kind: what the annotation says the field holds.
        optional: whether ``None`` is allowed by the annotation.
        record: the nested class, for ``RECORD`` fields.
        dtype: the tensor dtype if the annotation states one (``Annotated[Tensor, torch.int32]``).
        annotation: the annotation as written, for messages.
    """

    name: str
    kind: FieldKind
    optional: bool = False
    record: type | None = None
    dtype: torch.dtype | None = None
    annotation: str = ""


def is_record_class(cls: object) -> bool:
    """Whether ``cls`` is a dataclass or an attrs class (a class whose fields a spec can cover)."""
    return isinstance(cls, type) and (dataclasses.is_dataclass(cls) or attrs.has(cls))


def record_items(obj: object) -> list[tuple[str, object]] | None:
    """``(name, value)`` of every field of a dataclass or attrs instance, else ``None``."""
    cls = type(obj)
    if attrs.has(cls):
        return [(a.name, getattr(obj, a.name)) for a in attrs.fields(cls)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return None


def _raw_fields(cls: type) -> list[tuple[str, object]]:
    if attrs.has(cls):
        return [(a.name, a.type) for a in attrs.fields(cls)]
    if dataclasses.is_dataclass(cls):
        return [(f.name, f.type) for f in dataclasses.fields(cls)]
    raise TypeError(f"{cls!r} is neither a dataclass nor an attrs class")


def _resolved_hints(cls: type) -> Mapping[str, object]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # an annotation names something only imported under TYPE_CHECKING
        hints: dict[str, object] = {}
        for klass in reversed(cls.__mro__):
            module = sys.modules.get(klass.__module__)
            namespace = dict(vars(module)) if module is not None else {}
            namespace.setdefault("torch", torch)
            for name, annotation in getattr(klass, "__annotations__", {}).items():
                if isinstance(annotation, str):
                    try:
                        annotation = eval(annotation, namespace)
                    except Exception:
                        pass
                hints[name] = annotation
        return hints


_UNION_TYPES: tuple[object, ...] = (typing.Union, types.UnionType)


def _classify_string(text: str) -> tuple[FieldKind, bool]:
    parts = [p.strip() for p in text.replace("Optional[", "").rstrip("]").split("|")]
    optional = "None" in parts or text.startswith("Optional[")
    parts = [p for p in parts if p != "None"]
    if len(parts) == 1:
        word = parts[0]
        if word in ("torch.Tensor", "Tensor"):
            return FieldKind.TENSOR, optional
        if word in ("int", "bool", "float"):
            return FieldKind(word), optional
    return FieldKind.OBJECT, optional


def classify(annotation: object) -> tuple[FieldKind, bool, type | None, torch.dtype | None]:
    """Classify one annotation: its kind, whether it allows None, its record class and dtype."""
    if isinstance(annotation, str):
        kind, optional = _classify_string(annotation)
        return kind, optional, None, None
    dtype: torch.dtype | None = None
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        dtype = next((e for e in extras if isinstance(e, torch.dtype)), None)
        annotation = base
    optional = False
    if typing.get_origin(annotation) in _UNION_TYPES:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(members) < len(typing.get_args(annotation))
        if len(members) != 1:
            return FieldKind.OBJECT, optional, None, None
        annotation = members[0]
        if typing.get_origin(annotation) is typing.Annotated:
            base, *extras = typing.get_args(annotation)
            dtype = next((e for e in extras if isinstance(e, torch.dtype)), None)
            annotation = base
    if annotation is torch.Tensor:
        return FieldKind.TENSOR, optional, None, dtype
    if annotation is bool:
        return FieldKind.BOOL, optional, None, None
    if annotation is int:
        return FieldKind.INT, optional, None, None
    if annotation is float:
        return FieldKind.FLOAT, optional, None, None
    if isinstance(annotation, typing.TypeVar):
        return FieldKind.GENERIC, optional, None, None
    origin = typing.get_origin(annotation)
    if origin is not None and is_record_class(origin):
        annotation = origin
    if is_record_class(annotation):
        assert isinstance(annotation, type)
        return FieldKind.RECORD, optional, annotation, None
    return FieldKind.OBJECT, optional, None, None


def class_fields(cls: type) -> list[FieldInfo]:
    """The fields of a dataclass or attrs class, in declaration order, classified.

    Raises:
        TypeError: ``cls`` is neither a dataclass nor an attrs class.
    """
    hints = _resolved_hints(cls)
    result = []
    for name, raw in _raw_fields(cls):
        annotation = hints.get(name, raw)
        kind, optional, record, dtype = classify(annotation)
        text = annotation if isinstance(annotation, str) else _annotation_text(annotation)
        result.append(FieldInfo(name, kind, optional, record, dtype, text))
    return result


def _annotation_text(annotation: object) -> str:
    if isinstance(annotation, type):
        return annotation.__qualname__
    return str(annotation).replace("typing.", "")
