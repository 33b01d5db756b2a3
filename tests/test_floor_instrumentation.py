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
from draftmeta.codegen import generate
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
    function = ast.parse(generate(toy_spec(), part).source).body[0]  # type: ignore[arg-type]
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
    source = generate(toy_spec(), "step").source
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


class _Builder:
    """vLLM's builder class, as ``--wrapper`` sees it: a build that takes a while."""

    def build_for_drafting(self, cad: Any, draft_index: int) -> Any:
        _spin(200_000)
        return ("built", draft_index)


class _Group:
    """vLLM's attention group: work around the build, then the build, or (``in_place``) no
    build at all, as the plugin's in-place steps."""

    in_place = False

    def __init__(self) -> None:
        self.builder = _Builder()

    def build_metadata_for_drafting(self, cad: Any, draft_index: int) -> Any:
        _spin(100_000)
        if self.in_place:
            return ("kept", draft_index)
        return self.builder.build_for_drafting(cad, draft_index)


def _spin(ns: int) -> None:
    import time

    end = time.thread_time_ns() + ns
    while time.thread_time_ns() < end:
        pass


def test_wrapper_times_what_lies_around_vllms_build_per_mode_and_index(
    e2e_floor: ModuleType,
) -> None:
    """Around a 200 us build the group spends 100 us: ``--wrapper`` gives the 100, not the
    300 or the 200; a call that builds nothing, or one made while ``mode`` is ``None`` (a
    warm-up), gives no sample; the classes are restored afterwards."""
    samples: dict[str, dict[int, list[float]]] = {}
    mode: list[str | None] = [None]
    build, refresh = _Builder.build_for_drafting, _Group.build_metadata_for_drafting
    group = _Group()
    with e2e_floor.time_around_build(samples, mode, _Builder, _Group):
        assert group.build_metadata_for_drafting(None, 1) == ("built", 1)  # warm-up: not kept
        mode[0] = "off"
        for index in (1, 2, 1):
            group.build_metadata_for_drafting(None, index)
        mode[0] = "on"
        group.in_place = True
        assert group.build_metadata_for_drafting(None, 2) == ("kept", 2)
    assert _Builder.build_for_drafting is build and _Group.build_metadata_for_drafting is refresh
    assert set(samples) == {"off"} and sorted(samples["off"]) == [1, 2]
    assert len(samples["off"][1]) == 2 and len(samples["off"][2]) == 1
    for value in (*samples["off"][1], *samples["off"][2]):
        assert 100 <= value < 190, value  # the group's own 100 us (and the timers'), no build


def test_what_a_mode_adds_around_the_build_is_its_median_less_offs_at_each_index(
    e2e_floor: ModuleType,
) -> None:
    result = e2e_floor.around_build_result({
        "off": {0: [5.0, 6.0, 7.0], 1: [4.0, 4.0, 9.0]},
        "on": {0: [7.0, 7.5, 8.0], 1: [6.5, 6.0, 7.0], 2: [3.0]},
    })
    assert result["around_build_us"] == {"off": {0: 6.0, 1: 4.0},
                                         "on": {0: 7.5, 1: 6.5, 2: 3.0}}
    assert result["adds_around_build_us"] == {"on": {0: 1.5, 1: 2.5}}  # index 2: off never built
