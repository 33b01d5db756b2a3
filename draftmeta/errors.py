"""Exceptions raised by draftmeta.

Every error says what was wrong, where (the spec and the field path) and how to fix it.
"""

from __future__ import annotations

__all__ = ["DraftMetaError", "PreconditionFailed", "SpecError", "UpdateError", "WriteFailed"]


class DraftMetaError(Exception):
    """Base class of every error draftmeta raises."""


class SpecError(DraftMetaError, TypeError):
    """A spec is malformed: raised when the spec is declared, never later.

    Attributes:
        spec: the name of the spec being declared.
        path: the field path the problem is about, or ``""`` for the spec as a whole.
        problem: what is wrong.
        fix: how to fix it.
    """

    def __init__(self, spec: str, path: str, problem: str, fix: str) -> None:
        self.spec = spec
        self.path = path
        self.problem = problem
        self.fix = fix
        where = f"field {path!r} of " if path else ""
        super().__init__(f"{where}spec {spec!r}: {problem}. Fix: {fix}")


class PreconditionFailed(DraftMetaError):
    """An update's precondition does not hold; the metadata was left untouched.

    The draft loop catches this and rebuilds the metadata instead, recording ``name`` as the
    reason.

    Attributes:
        spec: the name of the spec whose update was refused.
        name: the precondition's name (for instance ``"decode_only"``).
        detail: what was observed.
    """

    def __init__(self, spec: str, name: str, detail: str) -> None:
        self.spec = spec
        self.name = name
        self.detail = detail
        super().__init__(
            f"spec {spec!r}: precondition {name!r} does not hold ({detail}); "
            "the metadata was left untouched, rebuild it instead"
        )


class UpdateError(DraftMetaError):
    """The metadata handed to an update does not have the structure its spec requires.

    Raised before the first write (a field is None, has the wrong dtype or device, or an alias
    no longer shares storage with its source buffer), so the metadata is left untouched.

    Attributes:
        spec: the name of the spec.
        path: the field path at fault.
        detail: what was observed and what was expected.
    """

    def __init__(self, spec: str, path: str, detail: str) -> None:
        self.spec = spec
        self.path = path
        self.detail = detail
        super().__init__(
            f"spec {spec!r}, field {path!r}: {detail}; the metadata was left untouched"
        )


class WriteFailed(DraftMetaError):
    """A write raised after every check had passed (a backend kernel or a formula failing on
    inputs its ``check`` accepted): the metadata may be partly updated and must be rebuilt.

    The draft state is not affected: the update's layout check has already shown that no
    written tensor shares memory with it. The draft loop catches this, rebuilds the group's
    metadata (replacing the partly written object) and rebuilds that group from then on.

    Attributes:
        spec: the name of the spec.
        path: the field whose write raised.
        detail: the original exception, as text.
    """

    def __init__(self, spec: str, path: str, detail: str) -> None:
        self.spec = spec
        self.path = path
        self.detail = detail
        super().__init__(
            f"spec {spec!r}, field {path!r}: the write raised after every check passed "
            f"({detail}); the metadata may be partly updated: rebuild it"
        )
