"""draftmeta: declarative in-place updates of attention metadata between speculative draft steps.

Declare, for every field of a metadata class, how it changes per draft step (a
:class:`DraftSpec` of rules); draftmeta validates the spec, generates one in-place,
allocation-free update function from it, and gives builders the :class:`SupportsDraftUpdate`
capability that draft loops dispatch on.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the public names for type checkers, as explicit re-exports; equal to
    # _EXPORTS below, which is the one list (tests/test_public_names.py holds them equal)
    from draftmeta.advance import HostBound as HostBound
    from draftmeta.advance import OverflowPolicy as OverflowPolicy
    from draftmeta.advance import advance_spec as advance_spec
    from draftmeta.advance import advance_state as advance_state
    from draftmeta.codegen import UpdateFunction as UpdateFunction
    from draftmeta.codegen import explain as explain
    from draftmeta.conditions import Equals as Equals
    from draftmeta.conditions import IsNone as IsNone
    from draftmeta.conditions import IsNotNone as IsNotNone
    from draftmeta.conditions import Precondition as Precondition
    from draftmeta.conditions import SameValue as SameValue
    from draftmeta.conditions import Satisfies as Satisfies
    from draftmeta.derivations import CopyFrom as CopyFrom
    from draftmeta.derivations import DcpLocalSeqLens as DcpLocalSeqLens
    from draftmeta.derivations import Derivation as Derivation
    from draftmeta.derivations import Fill as Fill
    from draftmeta.derivations import RecomputeHook as RecomputeHook
    from draftmeta.derivations import SlotMapping as SlotMapping
    from draftmeta.derivations import TokenToRequest as TokenToRequest
    from draftmeta.errors import DraftMetaError as DraftMetaError
    from draftmeta.errors import PreconditionFailed as PreconditionFailed
    from draftmeta.errors import SpecError as SpecError
    from draftmeta.errors import UpdateError as UpdateError
    from draftmeta.fields import FieldInfo as FieldInfo
    from draftmeta.fields import FieldKind as FieldKind
    from draftmeta.protocol import DraftUpdatable as DraftUpdatable
    from draftmeta.protocol import SpecBuilder as SpecBuilder
    from draftmeta.protocol import SupportsDraftUpdate as SupportsDraftUpdate
    from draftmeta.protocol import install_draft_update as install_draft_update
    from draftmeta.protocol import spec_of as spec_of
    from draftmeta.rules import Advance as Advance
    from draftmeta.rules import Alias as Alias
    from draftmeta.rules import Clamp as Clamp
    from draftmeta.rules import Derive as Derive
    from draftmeta.rules import HostAdvance as HostAdvance
    from draftmeta.rules import HostConstant as HostConstant
    from draftmeta.rules import HostDerive as HostDerive
    from draftmeta.rules import HostSet as HostSet
    from draftmeta.rules import HostUpperBound as HostUpperBound
    from draftmeta.rules import Invalidate as Invalidate
    from draftmeta.rules import Overflow as Overflow
    from draftmeta.rules import Recompute as Recompute
    from draftmeta.rules import Reset as Reset
    from draftmeta.rules import Rule as Rule
    from draftmeta.rules import Unchanged as Unchanged
    from draftmeta.rules import Unsupported as Unsupported
    from draftmeta.rules import Wrap as Wrap
    from draftmeta.rules import WrittenBy as WrittenBy
    from draftmeta.rules import copy_of as copy_of
    from draftmeta.spec import DraftSpec as DraftSpec
    from draftmeta.state import DraftState as DraftState
    from draftmeta.workspace import Workspace as Workspace

__version__ = "0.1.0"


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

__all__ = sorted([*_EXPORTS, "__version__"])
"""The public names: derived from :data:`_EXPORTS`, the one list of them (the imports above, for
type checkers, are checked against it by ``tests/test_public_names.py``)."""


if not TYPE_CHECKING:
    from draftmeta._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
    del lazy_exports
