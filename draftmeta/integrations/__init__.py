"""Integrations of draftmeta with serving engines (vLLM)."""
