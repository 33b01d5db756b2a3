"""``benchmarks/e2e_floor.py --phases`` and ``--lines``: the generated functions, compiled with
timestamps, still update exactly as before and are timed where they should be (each phase, or
each statement of the function's body once).

No engine here: the toy spec's seal and step run the instrumented code directly.
"""

from __future__ import annotations

import ast
from types import ModuleType
from typing import Any

import torch

from draftmeta import advance_state
from draftmeta.codegen import _generate
from draftmeta.testing import compare_metadata, random_state
from tests.toy import Scheduler, toy_metadata, toy_spec


def _three_steps(spec: Any) -> None:
    """A seal and two steps of one object, each compared with the rebuild."""
    state = random_state(torch.Generator().manual_seed(0), batch_size=5, block_size=4,
                         max_model_len=32, steps=4)
    meta = toy_metadata(state)
    seal, step = spec.sealed
    advance_state(state, "clamp")
    sealed = seal(meta, state)
    for _ in range(2):
        advance_state(state, "clamp")
        assert step(meta, state, sealed) is True
    opaque = lambda obj: isinstance(obj, Scheduler)  # noqa: E731
    assert compare_metadata(meta, toy_metadata(state), opaque=opaque) == []


def _statements(part: str) -> int:
    """Top-level statements of the generated function's body, docstring left out."""
    _, source, _ = _generate(toy_spec(), part)  # type: ignore[arg-type]
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    return len(function.body) - 1


def test_lines_time_every_statement_of_the_seal_and_the_step_once(e2e_floor: ModuleType) -> None:
    samples: dict[str, list[float]] = {}
    undo = e2e_floor.instrument_phases(samples, lines=True)
    try:
        _three_steps(toy_spec())
    finally:
        undo()
    for part, when in (("seal", "first"), ("step", "first"), ("step", "later")):
        timed = [k for k in samples if k.startswith(f"{part} L") and k.endswith(f" {when}")]
        assert len(timed) == _statements(part), (part, when, timed)
        assert samples[f"{part} total {when}"]
    assert any(k.startswith("seal L") and " return " in k for k in samples)  # its seal too


def test_phases_time_each_phase_comment(e2e_floor: ModuleType) -> None:
    samples: dict[str, list[float]] = {}
    undo = e2e_floor.instrument_phases(samples)
    try:
        _three_steps(toy_spec())
    finally:
        undo()
    _, source, _ = _generate(toy_spec(), "step")  # type: ignore[arg-type]
    phases = {line.split()[1] for line in source.splitlines()
              if line.startswith("    # ") and line[6:7].isdigit()}
    assert phases and {k.split()[1] for k in samples if k.startswith("step ")} == {
        *phases, "call", "total"}


def test_undoing_the_instrumentation_compiles_plain_functions_again(e2e_floor: ModuleType) -> None:
    samples: dict[str, list[float]] = {}
    e2e_floor.instrument_phases(samples, lines=True)()
    spec = toy_spec()
    _three_steps(spec)
    assert samples == {}
    assert "_now()" not in spec.sealed[1].__draftmeta_source__
