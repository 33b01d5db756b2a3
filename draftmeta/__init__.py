"""draftmeta: declarative in-place updates of attention metadata between speculative draft steps.

Declare, for every field of a metadata class, how it changes per draft step (a
:class:`DraftSpec` of rules); draftmeta validates the spec, generates one in-place,
allocation-free update function from it, and gives builders the :class:`SupportsDraftUpdate`
capability that draft loops dispatch on.
"""

from draftmeta.advance import HostBound, OverflowPolicy, advance_spec, advance_state
from draftmeta.codegen import UpdateFunction, explain
from draftmeta.conditions import Equals, IsNone, IsNotNone, Precondition, SameValue, Satisfies
from draftmeta.derivations import (
    CopyFrom,
    DcpLocalSeqLens,
    Derivation,
    Fill,
    RecomputeHook,
    SlotMapping,
    TokenToRequest,
)
from draftmeta.errors import DraftMetaError, PreconditionFailed, SpecError, UpdateError
from draftmeta.fields import FieldInfo, FieldKind
from draftmeta.protocol import (
    DraftUpdatable,
    SpecBuilder,
    SupportsDraftUpdate,
    install_draft_update,
    spec_of,
)
from draftmeta.rules import (
    Advance,
    Alias,
    Clamp,
    Derive,
    HostAdvance,
    HostConstant,
    HostDerive,
    HostSet,
    HostUpperBound,
    Invalidate,
    Overflow,
    Recompute,
    Reset,
    Rule,
    Unchanged,
    Unsupported,
    Wrap,
    WrittenBy,
    copy_of,
)
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState
from draftmeta.workspace import Workspace

__version__ = "0.1.0"

__all__ = [
    "Advance",
    "Alias",
    "Clamp",
    "CopyFrom",
    "DcpLocalSeqLens",
    "Derivation",
    "Derive",
    "DraftMetaError",
    "DraftSpec",
    "DraftState",
    "DraftUpdatable",
    "Equals",
    "FieldInfo",
    "FieldKind",
    "Fill",
    "HostAdvance",
    "HostBound",
    "HostConstant",
    "HostDerive",
    "HostSet",
    "HostUpperBound",
    "Invalidate",
    "IsNone",
    "IsNotNone",
    "Overflow",
    "OverflowPolicy",
    "Precondition",
    "PreconditionFailed",
    "Recompute",
    "RecomputeHook",
    "Reset",
    "Rule",
    "SameValue",
    "Satisfies",
    "SlotMapping",
    "SpecBuilder",
    "SpecError",
    "SupportsDraftUpdate",
    "TokenToRequest",
    "Unchanged",
    "Unsupported",
    "UpdateError",
    "UpdateFunction",
    "Workspace",
    "Wrap",
    "WrittenBy",
    "__version__",
    "advance_spec",
    "advance_state",
    "copy_of",
    "explain",
    "install_draft_update",
    "spec_of",
]
