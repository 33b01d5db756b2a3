"""Rules the update writes nothing for: a field that keeps its value (:class:`Unchanged`) or one
that cannot be updated in place (:class:`Unsupported`); both cover a whole nested record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs

from draftmeta.fields import FieldKind
from draftmeta.layout import Written
from draftmeta.rules.base import Emitter, Memory, Rule, Target, _text

__all__ = ["Unchanged", "Unsupported"]


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
