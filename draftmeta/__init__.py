"""draftmeta: declarative in-place updates of attention metadata between speculative draft steps.

Declare, for every field of a metadata class, how it changes per draft step (a
:class:`DraftSpec` of rules); draftmeta validates the spec, generates one in-place,
allocation-free update function from it, and gives builders the :class:`SupportsDraftUpdate`
capability that draft loops dispatch on.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, for type checkers and the API reference
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

_EXPORTS: dict[str, str] = {
    "Advance": "draftmeta.rules",
    "Alias": "draftmeta.rules",
    "Clamp": "draftmeta.rules",
    "CopyFrom": "draftmeta.derivations",
    "DcpLocalSeqLens": "draftmeta.derivations",
    "Derivation": "draftmeta.derivations",
    "Derive": "draftmeta.rules",
    "DraftMetaError": "draftmeta.errors",
    "DraftSpec": "draftmeta.spec",
    "DraftState": "draftmeta.state",
    "DraftUpdatable": "draftmeta.protocol",
    "Equals": "draftmeta.conditions",
    "FieldInfo": "draftmeta.fields",
    "FieldKind": "draftmeta.fields",
    "Fill": "draftmeta.derivations",
    "HostAdvance": "draftmeta.rules",
    "HostBound": "draftmeta.advance",
    "HostConstant": "draftmeta.rules",
    "HostDerive": "draftmeta.rules",
    "HostSet": "draftmeta.rules",
    "HostUpperBound": "draftmeta.rules",
    "Invalidate": "draftmeta.rules",
    "IsNone": "draftmeta.conditions",
    "IsNotNone": "draftmeta.conditions",
    "Overflow": "draftmeta.rules",
    "OverflowPolicy": "draftmeta.advance",
    "Precondition": "draftmeta.conditions",
    "PreconditionFailed": "draftmeta.errors",
    "Recompute": "draftmeta.rules",
    "RecomputeHook": "draftmeta.derivations",
    "Reset": "draftmeta.rules",
    "Rule": "draftmeta.rules",
    "SameValue": "draftmeta.conditions",
    "Satisfies": "draftmeta.conditions",
    "SlotMapping": "draftmeta.derivations",
    "SpecBuilder": "draftmeta.protocol",
    "SpecError": "draftmeta.errors",
    "SupportsDraftUpdate": "draftmeta.protocol",
    "TokenToRequest": "draftmeta.derivations",
    "Unchanged": "draftmeta.rules",
    "Unsupported": "draftmeta.rules",
    "UpdateError": "draftmeta.errors",
    "UpdateFunction": "draftmeta.codegen",
    "Workspace": "draftmeta.workspace",
    "Wrap": "draftmeta.rules",
    "WrittenBy": "draftmeta.rules",
    "advance_spec": "draftmeta.advance",
    "advance_state": "draftmeta.advance",
    "copy_of": "draftmeta.rules",
    "explain": "draftmeta.codegen",
    "install_draft_update": "draftmeta.protocol",
    "spec_of": "draftmeta.protocol",
}
"""Where each public name is defined: imported on first use, so that ``import draftmeta``
(and ``draftmeta explain`` for a shipped spec) does not import torch."""


if not TYPE_CHECKING:
    from draftmeta._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
    del lazy_exports
