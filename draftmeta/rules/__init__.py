"""The rule vocabulary: how one metadata field changes between two draft steps.

A spec binds exactly one rule to every field of a metadata class. Rules are immutable values,
and each rule *lowers itself*: it owns its checks, its host computation, its tensor write, its
optional Triton emission and its properties (what it may be bound to, whether it covers a
nested record, whether a CUDA graph can replay it, whether the fused kernel can apply it).
:mod:`draftmeta.codegen` only drives the phases of the generated update function and asks each
rule for its lines through the ``lower_*`` methods of :class:`Rule` and an :class:`Emitter`;
:mod:`draftmeta.fused`, :mod:`draftmeta.spec` and the draft loop ask the rule's properties.
A new rule kind is therefore one subclass of :class:`Rule`: nothing else changes.

The shipped kinds live in one module per kind of field: ``draftmeta.rules.tensor``
(``Alias``, ``Advance`` with ``Clamp`` or ``Wrap``, ``Derive``, ``Recompute``, ``WrittenBy``),
``draftmeta.rules.host`` (``HostConstant``, ``HostAdvance``, ``HostUpperBound``,
``HostDerive``, ``HostSet``, ``Reset``, ``Invalidate``) and ``draftmeta.rules.passive``
(``Unchanged``, ``Unsupported``), on the base in ``draftmeta.rules.base``; every public name
is exported here (``from draftmeta.rules import Alias``).

Names that a rule reads are *references*:

* ``"state.NAME"`` reads field ``NAME`` of the :class:`~draftmeta.state.DraftState` that the
  draft loop advances once per step (positions, seq_lens, slot_mapping, max_model_len, ...);
* any other string is a dotted path into the metadata object itself (``"decode.seq_lens"``).

Bounds of overflow policies and host rules name host scalars of the draft state
(``"max_model_len"``), without the ``state.`` prefix.
"""

from draftmeta.rules.base import Emitter, Memory, Rule, Target
from draftmeta.rules.host import (
    HostAdvance,
    HostConstant,
    HostDerive,
    HostSet,
    HostUpperBound,
    Invalidate,
    Reset,
    copy_of,
    same_value,
)
from draftmeta.rules.passive import Unchanged, Unsupported
from draftmeta.rules.tensor import (
    Advance,
    Alias,
    Clamp,
    Derive,
    Overflow,
    Recompute,
    Wrap,
    WrittenBy,
)

__all__ = [
    "Advance",
    "Alias",
    "Clamp",
    "Derive",
    "Emitter",
    "HostAdvance",
    "HostConstant",
    "HostDerive",
    "HostSet",
    "HostUpperBound",
    "Invalidate",
    "Memory",
    "Overflow",
    "Recompute",
    "Reset",
    "Rule",
    "Target",
    "Unchanged",
    "Unsupported",
    "Wrap",
    "WrittenBy",
    "copy_of",
    "same_value",
]
