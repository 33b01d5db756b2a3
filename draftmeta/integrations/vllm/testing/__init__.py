"""Test support against vLLM's real builders:
:mod:`~draftmeta.integrations.vllm.testing.harness` constructs them on a CPU-only machine,
:mod:`~draftmeta.integrations.vllm.testing.equivalence` checks draftmeta's update against their
rebuild on one batch.

Importing this package, or either module, does not import vLLM; the functions that need it
import it when called. ``import draftmeta.testing`` does not import this package.
"""
