"""What code generation reads of a spec: :class:`SpecView`.

:class:`~draftmeta.spec.DraftSpec` satisfies it; the generator, the compiled functions and the
run-time helpers depend on this protocol and never import the spec's module, so the spec can
compile its own update (:attr:`DraftSpec.update <draftmeta.spec.DraftSpec.update>`) without an
import circle.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

from draftmeta.conditions import Precondition
from draftmeta.fields import FieldInfo
from draftmeta.rules import Rule

__all__ = ["SpecView"]

M_co = TypeVar("M_co", covariant=True)


class SpecView(Protocol[M_co]):
    """A spec as code generation reads it, for metadata class ``M_co``: its name, class,
    rules and preconditions, its field tree, and what a built object carries that it has no
    rule for. See :class:`~draftmeta.spec.DraftSpec` for each member's meaning."""

    @property
    def name(self) -> str:
        """The spec's name, in generated names and messages."""

    @property
    def cls(self) -> type[M_co]:
        """The metadata class."""

    @property
    def rules(self) -> Mapping[str, Rule]:
        """A rule per field path, in the order the update applies them."""

    @property
    def preconditions(self) -> Sequence[Precondition]:
        """Checked, in order, before the update writes anything."""

    @property
    def fields(self) -> Mapping[str, FieldInfo]:
        """Every field path of the class tree, in declaration order."""

    @property
    def supported(self) -> bool:
        """Whether the spec can update in place at all."""

    @property
    def unsupported_reasons(self) -> Sequence[tuple[str, str]]:
        """``(path, reason)`` for every field whose rule cannot update in place."""

    def containers(self) -> Iterator[str]:
        """Nested record paths, parents before children."""

    def record_class(self, path: str) -> type:
        """The class of the record at ``path`` (``""``: the metadata class)."""

    def optional(self, path: str) -> bool:
        """Whether the field at ``path`` may be ``None``."""

    def uncovered(self, metadata: object) -> Sequence[str]:
        """What a built ``metadata`` object carries that the spec has no rule for."""
