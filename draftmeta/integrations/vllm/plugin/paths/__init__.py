"""vLLM's draft loops, one module each: what draftmeta needs of each one and how it serves it.

A module here is named after the draft path it declares (``hook.py``: ``hook``) and declares it
as ``PATH``, a :class:`~draftmeta.integrations.vllm.plugin.plan.DraftPathKind`: what vLLM must
have for it, how the plan decides who covers a builder on it, what the plugin installs on a
builder class it covers there, and what ``draftmeta coverage``, the plugin's log line and
``draftmeta audit`` say of it. The plan finds the modules by file name
(:func:`~draftmeta.integrations.vllm.plugin.plan.draft_paths`) and a release catalogue names
the paths its vLLM has (:attr:`~draftmeta.integrations.vllm.catalogue.Release.paths`). Serving
vLLM's next draft loop is one more module here, holding its decision and its replacements, and
its name in the catalogue of each release that has it; nothing else names it.

The two paths declared here keep their code where it was before they were declared: their
decisions in :mod:`~draftmeta.integrations.vllm.plugin.plan`, their replacements in
:mod:`~draftmeta.integrations.vllm.plugin.older_proposer` and
:mod:`~draftmeta.integrations.vllm.plugin.hook` (where the committed mutation results name
those functions).

This package's own module imports nothing, so the plan can find it without importing a path.
"""
