"""Failure injection: a failure at any phase before the first write leaves the metadata and the
draft state bit-identical, for the shared advance (every policy, host bound and DCP setting),
the toy family and the shipped vLLM specs; a failure inside a write is reported as WriteFailed
and never touches the state.

Failures are injected through the generated function's own namespace (the objects it calls
for each phase) or by breaking an input that a phase checks, so every phase is reached exactly
as in production."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftmeta import DraftState, advance_spec, advance_state
from draftmeta.conditions import Satisfies
from draftmeta.derivations import InPlaceFunction
from draftmeta.errors import DraftMetaError, WriteFailed
from draftmeta.fields import record_items
from draftmeta.layout import LayoutGuard
from draftmeta.rules import Alias, HostDerive, Reset, same_value
from draftmeta.spec import DraftSpec
from draftmeta.testing import random_state
from tests.toy import toy_metadata, toy_rules, toy_spec


class Injected(RuntimeError):
    """The failure a patched phase raises."""


def _fingerprint(obj: object, path: str = "") -> Iterator[tuple[str, object]]:
    """Every leaf of a record tree: tensors by identity, dtype, shape, strides and bytes; host
    values by type and repr (so NaN equals NaN); other objects by identity."""
    items = record_items(obj)
    if items is None:
        if isinstance(obj, torch.Tensor):
            data = obj.detach().clone().contiguous().view(torch.uint8) if obj.numel() else None
            yield path, (id(obj), obj.dtype, tuple(obj.shape), obj.stride(), obj.data_ptr(),
                         None if data is None else bytes(data.numpy()))
        elif isinstance(obj, (int, float, bool, str, type(None))):
            yield path, (type(obj), repr(obj))
        else:
            yield path, ("object", id(obj))
        return
    yield path, ("record", id(obj), type(obj))
    for name, value in items:
        if name == "workspace":
            continue  # scratch contents are undefined by contract
        yield from _fingerprint(value, f"{path}.{name}")


def _snapshot(*objs: object) -> list[list[tuple[str, object]]]:
    return [list(_fingerprint(o)) for o in objs]


@contextmanager
def _patched(namespace: dict[str, Any], name: str, value: object) -> Iterator[None]:
    old = namespace[name]
    namespace[name] = value
    try:
        yield
    finally:
        namespace[name] = old


class _FailingCheck:
    """A formula whose check reports a problem (or raises); apply must never run."""

    def __init__(self, fn: InPlaceFunction, raise_: bool) -> None:
        self.fn, self.raise_, self.name = fn, raise_, fn.name

    def check(self, *args: object, **kwargs: object) -> str | None:
        if self.raise_:
            raise Injected("check")
        return "injected check failure"

    def apply(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("apply ran after a failed check")


class _FailingApply:
    """A formula whose check passes and whose apply raises."""

    def __init__(self, fn: InPlaceFunction) -> None:
        self.fn, self.name = fn, fn.name

    def check(self, *args: object, **kwargs: object) -> str | None:
        return self.fn.check(*args, **kwargs)  # type: ignore[arg-type]

    def apply(self, *args: object, **kwargs: object) -> None:
        raise Injected("apply")


class _FailingGuard:
    def check(self, *args: object) -> tuple[str, str]:
        return "<injected>", "injected layout failure"


def _failing_guard(ns: dict[str, Any], name: str, guard: LayoutGuard, metadata: Any
                   ) -> AbstractContextManager[None]:
    """The layout guard replaced by one that fails. Where it checks only optional fields that
    are all ``None`` here, the update skips it; one of them gets a tensor so that it runs."""
    if all(e.unchanged for e in guard.entries) and all(
            _get_path(metadata, e.path) is None for e in guard.entries):
        _set_path(metadata, guard.entries[0].path, torch.zeros(4, dtype=torch.int32))
    return _patched(ns, name, _FailingGuard())


def _raise(*args: object) -> object:
    raise Injected("host value")


def _injections(spec: DraftSpec[Any]) -> list[tuple[str, Callable[[Any, DraftState], Any]]]:
    """``(phase, inject)`` for every phase of ``spec`` that can fail; ``inject(metadata,
    state)`` returns a context manager (a namespace patch) or breaks the inputs in place."""
    ns: dict[str, Any] = spec.update.__globals__  # type: ignore[attr-defined]
    out: list[tuple[str, Callable[[Any, DraftState], Any]]] = []
    for name, value in list(ns.items()):
        if value is spec.cls:
            # phase 0 refuses an object that is not exactly this class
            out.append(("0 object", lambda m, s, n=name: _patched(ns, n, Injected)))
        elif name == "_attributes_metadata":
            # phase 0 refuses an object carrying an attribute outside this set
            out.append(("0 object", lambda m, s, n=name: _patched(ns, n, frozenset())))
        elif isinstance(value, LayoutGuard):
            out.append(("3c layout", lambda m, s, n=name, g=value: _failing_guard(ns, n, g, m)))
        elif isinstance(value, InPlaceFunction):
            for raise_ in (False, True):
                out.append((f"3b formula check{' raises' if raise_ else ''}",
                            lambda m, s, n=name, v=value, r=raise_:
                            _patched(ns, n, _FailingCheck(v, r))))
            out.append(("4 write", lambda m, s, n=name, v=value: _patched(ns, n, _FailingApply(v))))
    for cond in spec.preconditions:
        if isinstance(cond, Satisfies):
            fn_name = next(n for n, v in ns.items() if v is cond.fn)
            out.append(("1 precondition",
                        lambda m, s, n=fn_name: _patched(ns, n, lambda *a: False)))
    for path, rule in spec.rules.items():
        if isinstance(rule, HostDerive) and rule.fn is not same_value:
            fn_name = next(n for n, v in ns.items() if v is rule.fn)
            out.append(("3 host value", lambda m, s, n=fn_name: _patched(ns, n, _raise)))
        elif isinstance(rule, Reset):
            fn_name = next(n for n, v in ns.items() if v is rule.factory)
            out.append(("3 host object", lambda m, s, n=fn_name: _patched(ns, n, _raise)))
        elif isinstance(rule, Alias) and spec.cls is not DraftState:
            out.append(("2 alias", lambda m, s, p=path: _set_path(m, p, _get_path(m, p).clone())))
    if any(r.bounds() for r in spec.rules.values()):
        out.append(("2 host operand", lambda m, s: setattr(s, "max_model_len", float("nan"))))
    out.append(("0 wrong object", lambda m, s: "replace metadata"))
    return out


def _get_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _set_path(obj: Any, path: str, value: object) -> None:
    head, _, leaf = path.rpartition(".")
    setattr(_get_path(obj, head) if head else obj, leaf, value)


def _inject_and_check(spec: DraftSpec[Any], metadata: Any, state: DraftState, phase: int
                      ) -> str:
    """Inject the phase-th failure of ``spec`` into an update of ``metadata`` and check that
    nothing was written; returns the phase's name."""
    injections = _injections(spec)
    name, inject = injections[phase % len(injections)]
    handle = inject(metadata, state)
    target = None if handle == "replace metadata" else metadata
    before = _snapshot(metadata, state)
    patch = handle if hasattr(handle, "__enter__") else _nothing()
    with patch, pytest.raises((DraftMetaError, Injected)) as info:
        spec.update(target, state)
    after = _snapshot(metadata, state)
    if name == "4 write":
        assert isinstance(info.value, WriteFailed), info.value
        if spec.cls is not DraftState:  # the group's update never writes the state
            assert after[1] == before[1]
        return name
    assert not isinstance(info.value, WriteFailed), info.value
    assert after == before, f"{spec.name}: phase {name} wrote something"
    return name


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _state(seed: int, dcp: bool = False, **kw: Any) -> DraftState:
    params: dict[str, Any] = {"batch_size": 4, "block_size": 4, "max_model_len": 48,
                              "steps": 4, "num_padded": 1}
    params.update(kw)
    state = random_state(torch.Generator().manual_seed(seed), **params)
    if dcp:
        state.dcp_world_size, state.dcp_rank = 2, 1
        state.dcp_local_seq_lens = torch.zeros_like(state.seq_lens)
    return state


ADVANCE_SPECS = [(p, h, d) for p in ("wrap", "clamp") for h in ("advance", "frozen")
                 for d in (False, True)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(ADVANCE_SPECS), phase=st.integers(0, 64), seed=st.integers(0, 999))
def test_a_failure_at_any_phase_of_the_shared_advance_changes_nothing(
    which: tuple[str, str, bool], phase: int, seed: int
) -> None:
    policy, host_bound, dcp = which
    spec = advance_spec(policy, host_bound, dcp)  # type: ignore[arg-type]
    state = _state(seed, dcp)
    _inject_and_check(spec, state, state, phase)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["wrap", "clamp"]), phase=st.integers(0, 64),
       seed=st.integers(0, 999), steps=st.integers(0, 3))
def test_a_failure_at_any_phase_of_the_toy_spec_changes_nothing(
    policy: str, phase: int, seed: int, steps: int
) -> None:
    spec = toy_spec(rules=toy_rules(policy), name=f"toy_{policy}")
    state = _state(seed)
    metadata = toy_metadata(state)
    for _ in range(steps):
        advance_state(state, policy)  # type: ignore[arg-type]
        spec.update(metadata, state)
    advance_state(state, policy)  # type: ignore[arg-type]
    _inject_and_check(spec, metadata, state, phase)


def test_every_phase_of_the_advance_and_the_toy_spec_is_injected() -> None:
    """The injection list reaches every phase (so the property tests cannot pass vacuously)."""
    names = {n for n, _ in _injections(advance_spec("wrap", "advance", True))}
    assert {"0 object", "1 precondition", "2 host operand", "3b formula check",
            "3b formula check raises", "3c layout", "4 write", "0 wrong object"} <= names
    toy = {n for n, _ in _injections(toy_spec())}
    assert {"2 alias", "3 host value", "3 host object"} <= toy


def test_a_state_the_advance_cannot_use_is_refused_with_nothing_moved() -> None:
    for field, value in (("block_size", 0), ("max_model_len", 0),
                         ("max_model_len", math.nan), ("num_reqs", -1)):
        state = _state(3)
        setattr(state, field, value)
        before = _snapshot(state)
        with pytest.raises(DraftMetaError, match=field):
            advance_state(state)
        assert _snapshot(state) == before, field


def test_padded_rows_stay_at_zero_under_both_policies() -> None:
    for policy in ("wrap", "clamp"):
        state = _state(5, batch_size=3, num_padded=2)
        for _ in range(6):
            advance_state(state, policy)  # type: ignore[arg-type]
        assert state.positions[3:].tolist() == [0, 0]
        assert state.seq_lens[3:].tolist() == [0, 0]
        assert state.slot_mapping[3:].tolist() == [-1, -1]
        assert (state.seq_lens[:3] > 0).all()


# -- the shipped vLLM specs ------------------------------------------------------------------

SHIPPED = ["TRITON_MLA", "INDEXER"]


def _shipped(name: str, state: DraftState) -> tuple[DraftSpec[Any], Any]:
    pytest.importorskip("vllm", reason="builds the shipped specs' metadata with vLLM")
    from draftmeta.integrations.vllm.catalogue import builder_spec
    from draftmeta.integrations.vllm.testing import harness

    config = harness.cached_vllm_config(max_model_len=state.max_model_len, block_size=64)
    kwargs: dict[str, Any] = {"block_size": 64}
    if name == "INDEXER":
        kwargs["block_table_width"] = state.block_table.shape[1]
    builder = harness.make_builder(name, config, **kwargs)
    metadata = harness.build_metadata(builder, harness.common_metadata_for(state), draft_index=1)
    return builder_spec(name), copy.copy(metadata)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SHIPPED), phase=st.integers(0, 64), seed=st.integers(0, 999))
def test_a_failure_at_any_phase_of_a_shipped_spec_changes_nothing(
    name: str, phase: int, seed: int
) -> None:
    state = _state(seed, block_size=64, max_model_len=512, num_padded=0)
    spec, metadata = _shipped(name, state)
    advance_state(state)
    _inject_and_check(spec, metadata, state, phase)
