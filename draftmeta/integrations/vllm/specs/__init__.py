"""The spec factories of vLLM's builders: what binds :mod:`draftmeta.backends` to vLLM.

:mod:`draftmeta.backends` declares the MLA, indexer and AMX specs against classes and kernels
handed in; this package hands in vLLM's. A factory resolves the metadata classes of the
installed release (imported, or rebuilt from source or the recorded lists:
:mod:`draftmeta.integrations.vllm.catalogue.classes`), reads what the spec depends on from a live
builder
(a pool size, FA3's head configuration, an FP8 cache, AMX's compute units) and hands in vLLM's
kernels (FlashMLA's, DeepGEMM's). A release catalogue
(:mod:`draftmeta.integrations.vllm.catalogue`) declares one factory per builder.

* :mod:`~draftmeta.integrations.vllm.specs.mla`: ``MLASpec``, the factory of every MLA
  builder, and FlashMLA's and FA3's kernels.
* :mod:`~draftmeta.integrations.vllm.specs.indexer`: the DeepSeek-V3.2 indexer and the K-pool
  tail.
* :mod:`~draftmeta.integrations.vllm.specs.amx`: ``AMX_MLA``'s extra decode state, bound to
  this machine's compute units.
"""
