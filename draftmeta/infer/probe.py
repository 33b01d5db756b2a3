"""Probe a metadata builder: build at successive and perturbed draft states, record what is seen.

A probe runs a handful of short draft trajectories chosen to hit the edge cases that separate
rules (a batch of one, padded rows, requests crossing a block boundary, positions reaching
``max_model_len`` under both overflow policies, both host-bound policies, a long context). At
every step it builds metadata from the live draft state (to see which tensors share storage with
the state's buffers) and again from a copy of it (to see which values are deterministic), and
keeps a snapshot of every leaf of the built object: dataclass and attrs fields, nested records,
and attributes set outside the class's fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch

from draftmeta.advance import HostBound, OverflowPolicy, advance_state
from draftmeta.fields import record_items
from draftmeta.state import DraftState
from draftmeta.testing import random_state

__all__ = [
    "STATE_TENSORS",
    "Leaf",
    "Observation",
    "ProbeCase",
    "Trajectory",
    "default_cases",
    "probe",
    "walk",
]

STATE_TENSORS = ("positions", "seq_lens", "slot_mapping", "block_table", "query_start_loc")
"""The draft-state buffers a field may alias or be derived from."""


@attrs.frozen
class ProbeCase:
    """One short draft trajectory to build along.

    Attributes:
        why: what edge case it exercises (shown in evidence comments).
        batch_size: real requests.
        num_padded: padding rows after them.
        max_model_len: the context limit.
        steps: draft steps K (built at step 1..K).
        overflow: the source advance's overflow policy.
        host_bound: how the host ``max_seq_len`` moves.
        seed: the random state's seed.
        near_limit: share of requests within K of ``max_model_len``.
        near_boundary: share of requests just before a block boundary.
    """

    why: str
    batch_size: int
    num_padded: int
    max_model_len: int
    steps: int
    overflow: OverflowPolicy
    host_bound: HostBound
    seed: int
    near_limit: float = 0.2
    near_boundary: float = 0.3


def default_cases(max_model_lens: tuple[int, ...] = (256, 4096)) -> tuple[ProbeCase, ...]:
    """The standard probe schedule: each edge case at least once, both policies both ways."""
    short, long = max_model_lens[0], max_model_lens[-1]
    return (
        ProbeCase("a batch of one", 1, 0, short, 6, "clamp", "advance", 1),
        ProbeCase("padded rows, positions at max_model_len, wrap", 7, 3, short, 8, "wrap",
                  "frozen", 2, near_limit=0.6),
        ProbeCase("positions at max_model_len, clamp", 16, 0, short, 8, "clamp", "frozen", 3,
                  near_limit=0.6),
        ProbeCase("block-boundary crossings, padded rows", 5, 3, short, 8, "wrap", "advance", 4,
                  near_limit=0.0, near_boundary=0.9),
        ProbeCase("a long context", 31, 0, long, 8, "clamp", "advance", 5),
        ProbeCase("a long context, frozen bound, wrap", 3, 3, long, 5, "wrap", "frozen", 6,
                  near_limit=0.4),
        ProbeCase("a short request under a long limit, frozen bound (host values jump)", 1, 0,
                  long, 4, "clamp", "frozen", 1, near_limit=0.0, near_boundary=0.0),
        ProbeCase("another batch the size of block-boundary crossings' (what a graph captured "
                  "with one batch replays for the next)", 5, 3, short, 4, "wrap", "advance", 8),
    )


def walk(obj: object, prefix: str = "") -> Iterator[tuple[str, object, bool]]:
    """``(path, value, is_attribute)`` for every leaf of a built metadata object.

    Records (dataclass or attrs instances) are entered; their leaves are their fields and the
    attributes in their ``__dict__`` outside those fields (``is_attribute`` is then true). A
    record's own path is yielded too, with the record as the value, before its leaves.
    """
    items = record_items(obj)
    if items is None:
        return
    names = {name for name, _ in items}
    extra = [(k, v) for k, v in getattr(obj, "__dict__", {}).items() if k not in names]
    for name, value, attribute in [(n, v, False) for n, v in items] + [
        (n, v, True) for n, v in extra
    ]:
        path = f"{prefix}{name}"
        yield path, value, attribute
        if record_items(value) is not None:
            yield from walk(value, path + ".")


def _snapshot(value: object) -> object:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


@attrs.frozen
class Leaf:
    """One field of one built object, as seen at one step.

    Attributes:
        value: a snapshot (tensors cloned right after the build), or the host value itself.
        aliases: the draft-state tensors the live object's tensor shares storage with.
        deterministic: whether a second build from a copy of the state gave the same value.
        attribute: whether it is an attribute outside the class's fields.
    """

    value: object
    aliases: tuple[str, ...]
    deterministic: bool
    attribute: bool


@attrs.frozen
class Observation:
    """Every leaf of the metadata built at one step, with a copy of the state it was built for."""

    step: int
    state: DraftState
    leaves: dict[str, Leaf]
    types: dict[str, type]


@attrs.frozen
class Trajectory:
    """The observations along one probe case."""

    case: ProbeCase
    steps: tuple[Observation, ...]


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    if record_items(a) is not None:
        return type(a) is type(b)
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _observe(build: Callable[[DraftState], Any], state: DraftState, step: int) -> Observation:
    live = build(state)
    buffers = {name: _storage(getattr(state, name)) for name in STATE_TENSORS}
    leaves: dict[str, Leaf] = {}
    types: dict[str, type] = {"": type(live)}
    for path, value, attribute in walk(live):
        aliases: tuple[str, ...] = ()
        if isinstance(value, torch.Tensor) and value.numel() > 0:
            aliases = tuple(n for n, ptr in buffers.items() if ptr == _storage(value))
        if record_items(value) is not None:
            types[path] = type(value)
        leaves[path] = Leaf(_snapshot(value), aliases, True, attribute)
    copy = state.clone()
    again = {path: value for path, value, _ in walk(build(copy))}
    for path, leaf in leaves.items():
        if path not in again or not _same(leaf.value, again[path]):
            leaves[path] = attrs.evolve(leaf, deterministic=False)
    return Observation(step, state.clone(), leaves, types)


def probe(
    build: Callable[[DraftState], Any],
    *,
    block_size: int,
    cases: tuple[ProbeCase, ...] | None = None,
) -> tuple[Trajectory, ...]:
    """Build along every probe case and return what was observed.

    Args:
        build: makes metadata from a draft state (the object may alias the state's tensors).
        block_size: the KV block size the builder was made for.
        cases: the trajectories (default :func:`default_cases`).
    """
    found = []
    for case in cases or default_cases():
        g = torch.Generator().manual_seed(case.seed)
        state = random_state(
            g, batch_size=case.batch_size, block_size=block_size,
            max_model_len=case.max_model_len, steps=case.steps, num_padded=case.num_padded,
            near_limit=case.near_limit, near_boundary=case.near_boundary,
        )
        steps = [_observe(build, state, 1)]
        for step in range(2, case.steps + 1):
            advance_state(state, case.overflow, case.host_bound)
            steps.append(_observe(build, state, step))
        found.append(Trajectory(case, tuple(steps)))
    return tuple(found)
