"""vLLM integration for draftmeta; importing this package does not import vLLM."""
