"""vLLM's attention metadata in the chain-drafting decode phase: the specs of its builders.

* :mod:`~draftmeta.integrations.vllm.backends.mla`: ``MLACommonMetadata`` and the decode
  variants of the MLA builders.
* :mod:`~draftmeta.integrations.vllm.backends.indexer`: the DeepSeek-V3.2 sparse-attention
  indexer metadata.
* :mod:`~draftmeta.integrations.vllm.backends.hooks`: recompute hooks refilling scheduler
  buffers.
* :mod:`~draftmeta.integrations.vllm.backends.vllm_classes`: loading vLLM's metadata classes (or
  their field lists, where a module cannot be imported without a GPU).
"""
