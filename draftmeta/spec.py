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

This module is the declaration: what a spec holds and answers. The checks it runs when declared
are in :mod:`draftmeta.spec_tree` (the class, its overrides and field names) and
:mod:`draftmeta.spec_validation` (the rules); the functions it compiles come from
:mod:`draftmeta.codegen`, which reads a spec through :class:`~draftmeta.codegen.SpecView` and
never imports this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, TypeVar

import torch

from draftmeta.codegen import (
    SealFunction,
    StepFunction,
    UpdateFunction,
    compile_sealed,
    compile_spec,
)
from draftmeta.conditions import Precondition
from draftmeta.fields import FieldInfo, FieldKind
from draftmeta.rules import Rule
from draftmeta.spec_tree import read_tree
from draftmeta.spec_validation import validate_rules

__all__ = ["DraftSpec"]

M = TypeVar("M")


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
        self._compiled: UpdateFunction[M] | None = None
        self._sealed: tuple[SealFunction[M], StepFunction[M]] | None = None
        self._uncovered_memo: dict[
            tuple[tuple[type, tuple[str, ...]] | None, ...], tuple[str, ...]
        ] = {}
        self._records_walk: list[tuple[tuple[str, ...], str, str, type]] | None = None
        tree = read_tree(self.name, cls, nested=self.nested, dtypes=self.dtypes,
                         attributes=self.attributes)
        validate_rules(tree, self.rules, self.preconditions)
        self._tree = tree
        self._capture_problems: tuple[tuple[str, str], ...] = tuple(
            (p, problem) for p, r in self.rules.items()
            if (problem := r.capture_problem()) is not None
        )

    # -- public views -------------------------------------------------------------------------

    @property
    def fields(self) -> Mapping[str, FieldInfo]:
        """Every field path of the class tree (nested records included), in declaration order."""
        return self._tree.fields

    def record_class(self, path: str) -> type:
        """The class of the nested record at ``path`` (``""`` for the metadata class)."""
        return self._tree.records[path]

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
        return self._tree.dtype_of(path)

    @property
    def update(self) -> UpdateFunction[M]:
        """The generated update function ``update(metadata, state) -> None`` (compiled once)."""
        if self._compiled is None:
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
            self._sealed = compile_sealed(self)
        return self._sealed

    def __repr__(self) -> str:
        return f"<DraftSpec {self.name!r} for {self.cls.__qualname__}: {len(self.rules)} rules>"

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
                if f"{prefix}{name}" not in self._tree.fields:
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
                for path, cls in self._tree.records.items()
            ]
        return self._records_walk

    # -- helpers for the code generator -------------------------------------------------------

    def containers(self) -> Iterator[str]:
        """Nested record paths, parents before children."""
        return (p for p in self._tree.records if p)

    def optional(self, path: str) -> bool:
        """Whether the field at ``path`` may be ``None`` by its annotation."""
        info = self._tree.fields[path]
        return info.optional or info.kind is FieldKind.OBJECT
