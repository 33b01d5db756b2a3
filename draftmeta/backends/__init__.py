"""The specs of MLA attention metadata and the DeepSeek-V3.2 indexer in the chain-drafting
decode phase: rule families, their hooks and formulas. Engine-neutral: nothing here imports an
engine; the metadata classes, kernels and compute units are handed in by a binding
(:mod:`draftmeta.integrations.vllm.specs` for vLLM).

* :mod:`~draftmeta.backends.mla`: ``MLACommonMetadata`` and the decode variants of the MLA
  builders.
* :mod:`~draftmeta.backends.indexer`: the DeepSeek-V3.2 sparse-attention indexer metadata and
  the K-pool tail.
* :mod:`~draftmeta.backends.amx`: the extra decode state of the CPU ``AMX_MLA`` builder.
* :mod:`~draftmeta.backends.hooks`: recompute hooks refilling scheduler buffers.
* :mod:`~draftmeta.backends.views`: which fields view the draft state's buffers (the MLA
  layouts).
* :mod:`~draftmeta.backends.common`: rules and preconditions the specs share.
"""
