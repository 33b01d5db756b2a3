"""Testing helpers: prove a spec by comparing updated metadata with rebuilt metadata.

Backend authors prove a spec with the invariant that matters most: after any number of draft
steps, the metadata updated in place equals the metadata rebuilt from scratch for the same state.

* :func:`check_spec` runs that check, ready-made, for any metadata class and any builder
  function: random batches, K draft steps, both overflow policies and the edge cases, with
  valid-prefix comparisons (:class:`ValidPrefix`) for fixed-capacity buffers; it returns a
  :class:`SpecCheckReport` or raises :class:`SpecCheckFailed` (an ``AssertionError``) naming
  the first mismatch's batch seed, step, field, index, expected and got values.
* :func:`compare_metadata` walks two metadata objects (nested dataclasses and attrs classes
  included) and reports every field that differs, by path (:class:`Mismatch`);
  :func:`assert_same_metadata` raises on any.
* :func:`random_state` makes random decode batches with the edge cases that matter (a batch of
  one, requests crossing a block boundary, positions reaching ``max_model_len``, padded rows,
  mixed lengths); :func:`state_for_lengths` one with given lengths; :func:`batch_case` one
  batch of :func:`check_spec`'s schedule from its seed.

The rest of the test support lives beside them, imported on its own (this package imports none
of it): :mod:`draftmeta.testing.reference_builds` (plain-torch models of vLLM's decode builds),
:mod:`draftmeta.testing.reference_schedules` (reference implementations of two scheduler
kernels) and :mod:`draftmeta.integrations.vllm.testing` (vLLM's real builders on a CPU, and
update versus rebuild against them; importing it does not import vLLM).

>>> from draftmeta.testing import check_spec, ValidPrefix  # doctest: +SKIP
>>> print(check_spec(spec, build, valid={"kv_indices": ValidPrefix("kv_indptr", at=-1)}))
... # doctest: +SKIP
"""

from __future__ import annotations

from draftmeta.compare import Mismatch, assert_same_metadata, compare_metadata
from draftmeta.testing.check import (
    COVERAGE,
    CheckFailure,
    PerPolicy,
    SpecCheckFailed,
    SpecCheckReport,
    check_spec,
)
from draftmeta.testing.states import (
    EDGE_CASES,
    BatchCase,
    EdgeCase,
    batch_case,
    random_state,
    state_for_lengths,
)
from draftmeta.testing.valid import ValidPrefix

__all__ = [
    "COVERAGE",
    "EDGE_CASES",
    "BatchCase",
    "CheckFailure",
    "EdgeCase",
    "Mismatch",
    "PerPolicy",
    "SpecCheckFailed",
    "SpecCheckReport",
    "ValidPrefix",
    "assert_same_metadata",
    "batch_case",
    "check_spec",
    "compare_metadata",
    "random_state",
    "state_for_lengths",
]
