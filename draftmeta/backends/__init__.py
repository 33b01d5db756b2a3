"""Backend specs for vLLM 0.33's attention metadata in the chain-drafting decode phase.

* :mod:`draftmeta.backends.mla`: ``MLACommonMetadata`` and the decode variants of the MLA builders.
* :mod:`draftmeta.backends.indexer`: the DeepSeek-V3.2 sparse-attention indexer metadata.
* :mod:`draftmeta.backends.hooks`: recompute hooks refilling scheduler buffers.
* :mod:`draftmeta.backends.vllm_classes`: loading vLLM's metadata classes (or their field lists,
  where a module cannot be imported without a GPU).
"""
