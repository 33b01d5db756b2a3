"""draftmeta's worked example of an out-of-tree vLLM attention backend.

``backend.py`` is the backend: vLLM's CPU MLA backend whose metadata carries one more field that
changes every draft step (``seq_lens_i64``, the sequence lengths as int64, a buffer of the
builder's own that its decode kernel reads). ``spec.py`` is everything draftmeta needs to give the
builder vLLM's draft hook (and, on vLLM's older proposer, its in-place ``build_for_drafting``):
one catalogue entry. ``pyproject.toml`` registers both, the backend with vLLM's backend registry
and the entry with draftmeta's ``draftmeta.vllm_builders`` entry-point group.
"""

from __future__ import annotations

BACKEND = "draftmeta_example_oot.backend.OotCPUMLABackend"
"""The backend class, as vLLM's registry names it."""


def register_with_vllm() -> None:
    """vLLM's general-plugin entry point: the backend takes the ``CPU_MLA`` slot of vLLM's
    backend registry, which vLLM's CPU platform picks for MLA models."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_MLA, BACKEND)
