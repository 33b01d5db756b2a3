"""Checked-in generated text: ``explain`` of every shipped spec and the fused Triton kernel.

Regenerate after an intended change with ``python -m tests.golden.regenerate`` (or
``pytest tests/test_golden.py --update-golden``) and review the diff like any other change.
"""
