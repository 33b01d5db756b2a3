"""What draftmeta needs to give the example's builder vLLM's draft hook: one catalogue entry.

The metadata is vLLM's dense MLA metadata plus one field, so the spec is draftmeta's MLA spec
for the ``dense`` family with one extra rule: ``seq_lens_i64`` is derived at every step from the
decode part's lengths (a copy, int32 to int64, into the same buffer). Declared against the
installed classes, so a field vLLM adds in a later release, or one the example adds without a
rule, fails the declaration and the plugin leaves the builder to vLLM. The harness recipe lets
``draftmeta audit OOT_CPU_MLA`` (and the equivalence checks) build it on a CPU. Nothing recorded
has run it (``proven_by`` is empty), so the plugin leaves it to vLLM unless
``DRAFTMETA_VLLM_UNPROVEN=1``; a committed ``draftmeta audit --json`` output named in
``proven_by`` (``recorded_audits``) would prove it on that output's vLLM release.

Importing this module does not import vLLM (class paths only).
"""

from __future__ import annotations

from draftmeta.derivations import CopyFrom
from draftmeta.integrations.vllm.catalogue import BuilderEntry, HarnessRecipe, class_ref
from draftmeta.integrations.vllm.specs.mla import MLASpec
from draftmeta.rules import Derive

PACKAGE = "draftmeta_example_oot.backend"

ENTRY = BuilderEntry(
    name="OOT_CPU_MLA",
    builder=class_ref(f"{PACKAGE}.OotMLAMetadataBuilder"),
    spec=MLASpec(
        "dense",
        class_ref(f"{PACKAGE}.OotMLAMetadata"),
        class_ref("vllm.model_executor.layers.attention.mla_attention.MLACommonDecodeMetadata"),
        extra_rules=(("seq_lens_i64", Derive(CopyFrom(), ("decode.seq_lens",))),),
    ),
    harness=HarnessRecipe("mla", class_ref(f"{PACKAGE}.OotCPUMLABackend")),
)
"""The example builder's catalogue entry."""
