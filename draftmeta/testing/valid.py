"""Valid-prefix declarations for fixed-capacity metadata buffers.

Some builders keep a buffer at a fixed capacity and fill only its leading part: FlashInfer's
``kv_indices`` holds the page ids of all requests back to back and is meaningful only up to
``kv_indptr[-1]``; a per-request buffer of a CUDA-graph batch is meaningful only for its first
``num_reqs`` rows. What lies beyond is whatever the buffer held before, so an update and a
rebuild may differ there without either being wrong. A :class:`ValidPrefix` names where the
meaningful part ends; :func:`~draftmeta.testing.check_spec` compares only that part.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from draftmeta.fields import FieldKind, class_fields
from draftmeta.refs import STATE_PREFIX, is_state_ref
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = ["ValidPrefix", "check_valid_prefixes", "resolve_valid_prefixes"]

_STATE_KINDS = {f.name: f.kind for f in class_fields(DraftState)}


def _reference(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not all(p.isidentifier() for p in value.split(".")):
        raise ValueError(
            f"ValidPrefix.{attribute.name} must be a reference such as 'num_reqs', "
            f"'state.num_reqs' or 'kv_indptr', got {value!r}"
        )


def _at(_: object, attribute: attrs.Attribute[int | str | None], value: object) -> None:
    if value is None or type(value) is int:
        return
    _reference(_, attribute, value)  # type: ignore[arg-type]


@attrs.frozen
class ValidPrefix:
    """The leading elements (along the first dimension) of a buffer that are meaningful.

    ``length`` is a reference, as in rules: ``"state.NAME"`` reads the draft state, any other
    string a dotted path into the metadata. It names either a host int (the prefix length
    itself) or, with ``at``, an integer tensor whose element ``at`` holds it. Both are read from
    the *rebuilt* metadata (the reference) and the state it was built from.

    >>> ValidPrefix("kv_indptr", at=-1)              # kv_indices: up to kv_indptr[-1]
    ValidPrefix(length='kv_indptr', at=-1)
    >>> ValidPrefix("kv_indptr", at="state.num_reqs")  # up to kv_indptr[num_reqs]
    ValidPrefix(length='kv_indptr', at='state.num_reqs')
    >>> ValidPrefix("state.num_reqs")                # a per-request buffer: its real rows
    ValidPrefix(length='state.num_reqs', at=None)

    Attributes:
        length: the host int, or the tensor holding the length.
        at: for a tensor ``length``, the element that holds the length: an index (``-1``) or a
            reference to a host int; ``None`` for a host int ``length``.
    """

    length: str = attrs.field(validator=_reference)
    at: int | str | None = attrs.field(default=None, validator=_at)

    def describe(self) -> str:
        """How the prefix is shown in reports: ``up to kv_indptr[-1]``, ``first num_reqs rows``."""
        if self.at is None:
            return f"first {self.length} rows"
        return f"up to {self.length}[{self.at}]"

    def resolve(self, metadata: object, state: DraftState) -> int:
        """The prefix length for this metadata and the state it was built from.

        Raises:
            ValueError: a reference reads ``None``, a value of the wrong kind, or an index out
                of range; the message names the reference.
        """
        value = _lookup(self.length, metadata, state)
        if isinstance(value, torch.Tensor):
            if self.at is None:
                raise ValueError(f"ValidPrefix length {self.length!r} is a tensor; say which "
                                 "element holds the length with at=-1 (or at='num_reqs')")
            index = self.at if isinstance(self.at, int) else _host_int(self.at, metadata, state)
            if value.dim() != 1 or not -value.shape[0] <= index < value.shape[0]:
                raise ValueError(
                    f"ValidPrefix reads {self.length}[{index}], but {self.length} has shape "
                    f"{tuple(value.shape)}: give at= an index inside a 1-D tensor"
                )
            return int(value[index].item())
        return _host_int(self.length, metadata, state)


def _lookup(ref: str, metadata: object, state: DraftState) -> object:
    obj: object = state if is_state_ref(ref) else metadata
    path = ref[len(STATE_PREFIX):] if is_state_ref(ref) else ref
    for part in path.split("."):
        if obj is None:
            break
        obj = getattr(obj, part)
    if obj is None:
        raise ValueError(f"ValidPrefix reference {ref!r} is None in the rebuilt metadata")
    return obj


def _host_int(ref: str, metadata: object, state: DraftState) -> int:
    value = _lookup(ref, metadata, state)
    if type(value) is not int:
        raise ValueError(
            f"ValidPrefix reference {ref!r} is {value!r} ({type(value).__qualname__}), not a "
            "host int; name a host int, or a tensor with at="
        )
    return value


def _kind(spec: DraftSpec[Any], ref: str) -> FieldKind | None:
    if is_state_ref(ref):
        return _STATE_KINDS.get(ref[len(STATE_PREFIX):])
    info = spec.fields.get(ref)
    return None if info is None else info.kind


def _unknown(spec: DraftSpec[Any], ref: str, what: str) -> ValueError:
    state = is_state_ref(ref)
    names = [STATE_PREFIX + n for n in _STATE_KINDS] if state else list(spec.fields)
    close = difflib.get_close_matches(ref, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(names)}"
    where = "the draft state" if is_state_ref(ref) else f"{spec.cls.__qualname__}"
    return ValueError(f"{what} {ref!r} is not a field of {where}; {hint}")


def check_valid_prefixes(spec: DraftSpec[Any], valid: Mapping[str, ValidPrefix]) -> None:
    """Check that every declaration names a tensor field of the spec's class and readable refs.

    Raises:
        ValueError: naming the declaration, what is wrong and the fix.
    """
    for path, prefix in valid.items():
        if not isinstance(prefix, ValidPrefix):
            raise ValueError(f"valid[{path!r}] is {prefix!r}; declare it as a ValidPrefix(...)")
        kind = _kind(spec, path)
        if kind is None:
            raise _unknown(spec, path, "valid= names the field")
        if kind is not FieldKind.TENSOR:
            raise ValueError(f"valid= names {path!r}, which is a {kind.value} field, not a "
                             "tensor: only tensor buffers have a valid prefix")
        length = _kind(spec, prefix.length)
        if length is None:
            raise _unknown(spec, prefix.length, f"the ValidPrefix of {path!r} reads")
        if length is FieldKind.TENSOR and prefix.at is None:
            raise ValueError(
                f"the ValidPrefix of {path!r} reads the tensor {prefix.length!r} without at=; "
                f"say which element holds the length: ValidPrefix({prefix.length!r}, at=-1)"
            )
        if length is not FieldKind.TENSOR and prefix.at is not None:
            raise ValueError(
                f"the ValidPrefix of {path!r} reads {prefix.length!r}, a {length.value} field, "
                f"with at={prefix.at!r}; at= only applies to a tensor: drop it"
            )
        if length not in (FieldKind.TENSOR, FieldKind.INT):
            raise ValueError(f"the ValidPrefix of {path!r} reads {prefix.length!r}, a "
                             f"{length.value} field; name a host int or an int tensor")
        if isinstance(prefix.at, str):
            at = _kind(spec, prefix.at)
            if at is None:
                raise _unknown(spec, prefix.at, f"the ValidPrefix of {path!r} indexes with")
            if at is not FieldKind.INT:
                raise ValueError(f"the ValidPrefix of {path!r} indexes with {prefix.at!r}, a "
                                 f"{at.value} field; at= must name a host int")


def resolve_valid_prefixes(
    valid: Mapping[str, ValidPrefix], metadata: object, state: DraftState
) -> dict[str, int]:
    """``{path: prefix length}`` for :func:`~draftmeta.testing.compare_metadata`'s
    ``valid_prefix=``, read from ``metadata`` (the rebuilt one) and ``state``."""
    return {path: prefix.resolve(metadata, state) for path, prefix in valid.items()}
