"""Classify every field from probe evidence: the rule that explains what the builder did.

Each field's evidence is weighed in a fixed order, the first explanation that holds at every
step of every probe trajectory wins, and the evidence is kept as a sentence for the emitted
source:

1. ``None`` in every build: :class:`~draftmeta.rules.Unchanged`.
2. A tensor sharing storage with a draft-state buffer in every build:
   :class:`~draftmeta.rules.Alias`.
3. A value equal at every step of each trajectory: ``Unchanged`` (tensors, host objects) or
   :class:`~draftmeta.rules.HostConstant` (host scalars).
4. A tensor that one of the library's derivations reproduces from the state at every step:
   :class:`~draftmeta.rules.Derive` (copy, flattened copy, fill, slot mapping,
   token-to-request, the K-pool tail slot).
5. A host int equal to a host int of the state at every step (``copy_of``), or to one of the
   library's host functions of it (AMX's split count).
6. A buffer whose values differ between two builds of the same state (left unfilled on this
   device): a library recompute hook known for that field name, else a stub.
7. A host object replaced by a fresh one at every build: :class:`~draftmeta.rules.Reset`.
8. Anything else is *unsettled*: a tensor gets a :class:`TodoHook` stub (its ``check`` fails, so
   the spec cannot verify until the hook is written), a host value ``Unsupported``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs
import torch

from draftmeta.backends.amx import AmxKvSplits
from draftmeta.backends.hooks import DeepGemmPagedMqaSchedule, PagedMqaKernel
from draftmeta.backends.indexer import KpoolTailSlot
from draftmeta.derivations import (
    CopyFrom,
    Derivation,
    ExpandBlockTable,
    Fill,
    RecomputeHook,
    SlotMapping,
    TokenToRequest,
)
from draftmeta.fields import record_items
from draftmeta.infer.probe import STATE_TENSORS, Observation, Trajectory
from draftmeta.rules import (
    Alias,
    Derive,
    HostConstant,
    HostDerive,
    Recompute,
    Reset,
    Rule,
    Unchanged,
    Unsupported,
    copy_of,
)
from draftmeta.state import DraftState
from draftmeta.workspace import Workspace

__all__ = ["HOST_INTS", "TodoHook", "Verdict", "classify"]

HOST_INTS = ("max_seq_len", "num_reqs", "max_model_len", "block_size")
"""Host ints of the draft state a host field may mirror."""


@attrs.frozen
class TodoHook(RecomputeHook):
    """A stub for a buffer no rule explains: its check fails until the real hook is written.

    Attributes:
        path: the field it stands in for.
    """

    name: ClassVar[str] = "todo"
    formula: ClassVar[str] = "TODO: write the recompute hook"
    path: str = ""

    def check(
        self, out: torch.Tensor, *inputs: object, also: tuple[torch.Tensor, ...] = ()
    ) -> str | None:
        """Always a problem: the hook is not written yet."""
        return f"TODO: write the recompute hook of {self.path} (draftmeta infer left a stub)"

    def apply(
        self, out: torch.Tensor, *inputs: object, workspace: Workspace,
        also: tuple[torch.Tensor, ...] = (),
    ) -> None:
        """Never reached: :meth:`check` refuses first."""
        raise NotImplementedError(f"the recompute hook of {self.path} is not written")


@attrs.frozen
class Verdict:
    """The rule chosen for one field and why.

    Attributes:
        path: the field's dotted path.
        rule: the rule (a stub or ``Unsupported`` when unsettled).
        evidence: the observation that chose it, one sentence.
        settled: whether the evidence determines the rule.
        attribute: whether the field is an attribute outside the class's fields.
        annotation: its annotation for ``attributes=`` (attributes only).
    """

    path: str
    rule: Rule
    evidence: str
    settled: bool = True
    attribute: bool = False
    annotation: object = None


Candidate = tuple[str, Derivation, tuple[str, ...]]


def _tensor_candidates(observed: torch.Tensor, block_size: int) -> list[Candidate]:
    found: list[Candidate] = []
    for name in STATE_TENSORS:
        found.append((f"a copy of state.{name}", CopyFrom(), (f"state.{name}",)))
    for name in STATE_TENSORS:
        found.append((f"a flattened copy of state.{name}", CopyFrom(flat=True),
                      (f"state.{name}",)))
    if observed.numel() and not observed.is_floating_point():
        first = int(observed.reshape(-1)[0])
        found.append((f"every element {first}", Fill(first), ()))
    found.append(("the slot mapping of state.positions", SlotMapping(),
                  ("state.positions", "state.block_table", "state.seq_lens",
                   "state.block_size", "state.num_reqs")))
    found.append(("the token-to-request map of state.query_start_loc", TokenToRequest(),
                  ("state.query_start_loc", "state.num_reqs")))
    found.append(("the block table expanded to one row entry per token", ExpandBlockTable(),
                  ("state.block_table",)))
    found.append((f"the K-pool tail slot (pool {block_size})", KpoolTailSlot(block_size),
                  ("state.positions", "state.block_table", "state.slot_mapping",
                   "state.num_reqs")))
    return found


def _read(state: DraftState, ref: str) -> object:
    return getattr(state, ref.split(".", 1)[1])


def _reproduces(candidate: Candidate, seen: Sequence[tuple[Observation, torch.Tensor]]) -> bool:
    """Whether the candidate, reading the state, gives the field's value in every build."""
    return _reproduces_with(candidate, seen, lambda obs, ref: _read(obs.state, ref))


def _reproduces_from_leaves(candidate: Candidate,
                            seen: Sequence[tuple[Observation, object]]) -> bool:
    """Whether the candidate, reading the build's own metadata leaves, gives the field's value
    in every build."""
    return _reproduces_with(candidate, seen, lambda obs, ref: obs.leaves[ref].value)


def _reproduces_with(candidate: Candidate, seen: Sequence[tuple[Observation, object]],
                     read: Callable[[Observation, str], object]) -> bool:
    _, derivation, inputs = candidate
    for obs, value in seen:
        if not isinstance(value, torch.Tensor):
            return False
        args = tuple(read(obs, ref) for ref in inputs)
        out = torch.full_like(value, -7)
        try:
            if derivation.check(out, *args) is not None:
                return False
            derivation.apply(out, *args, workspace=Workspace())
        except Exception:
            return False
        if not torch.equal(out, value):
            return False
    return True


def _host_candidates(units: int | None) -> list[tuple[str, Rule, Callable[[DraftState], object]]]:
    def reader(name: str) -> Callable[[DraftState], object]:
        return lambda s: getattr(s, name)

    found: list[tuple[str, Rule, Callable[[DraftState], object]]] = [
        (f"equal to state.{name}", copy_of(f"state.{name}"), reader(name))
        for name in HOST_INTS
    ]
    if units is not None:
        splits = AmxKvSplits(units)
        found.append((
            f"AMX's split count of state.max_seq_len ({units} compute units)",
            HostDerive(splits, ("state.max_seq_len",),
                       formula="min(next_pow2(max(1, max_seq_len // 512)), 2 * compute_units)"),
            lambda s: splits(s.max_seq_len),
        ))
    return found


def _known_hook(
    path: str, block_size: int, kernel: PagedMqaKernel | None
) -> tuple[Rule, str] | None:
    """A library recompute hook for a buffer this device leaves unfilled, by field name (with
    the engine's kernel handed in, where the caller has one)."""
    parent, _, name = path.rpartition(".")
    if name == "schedule_metadata":
        lengths = f"{parent}.seq_lens" if parent else "seq_lens"
        return (Recompute(DeepGemmPagedMqaSchedule(block_size, kernel=kernel), (lengths,)),
                "the library's DeepGEMM paged-MQA schedule hook, chosen by the field's name")
    return None


def _differs_between_batches_of_one_shape(per_traj: Sequence[Sequence[object]]) -> bool:
    """Whether two trajectories whose values have one shape and dtype hold different values
    (a value that follows the batch's contents, not only its size)."""
    firsts = [values[0] for values in per_traj if isinstance(values[0], torch.Tensor)]
    for i, a in enumerate(firsts):
        for b in firsts[i + 1:]:
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            if a.shape == b.shape and a.dtype == b.dtype and not torch.equal(a, b):
                return True
    return False


def _constant_per_trajectory(per_traj: Sequence[Sequence[object]]) -> bool:
    for values in per_traj:
        first = values[0]
        for v in values[1:]:
            if isinstance(first, torch.Tensor) and isinstance(v, torch.Tensor):
                if first.shape != v.shape or first.dtype != v.dtype or not torch.equal(first, v):
                    return False
            elif isinstance(first, torch.Tensor) or isinstance(v, torch.Tensor):
                return False
            else:
                try:
                    if type(first) is not type(v) or not bool(first == v):
                        return False
                except Exception:
                    return False
    return True


def _annotation(values: Sequence[object]) -> object:
    sample = next((v for v in values if v is not None), None)
    kind: Any = type(sample) if sample is not None else object
    if isinstance(sample, torch.Tensor):
        kind = torch.Tensor
    return kind | None if any(v is None for v in values) and sample is not None else kind


def _classify_path(
    path: str,
    trajectories: Sequence[Trajectory],
    block_size: int,
    units: int | None,
    kernel: PagedMqaKernel | None,
) -> Verdict | None:
    per_traj = []
    seen: list[tuple[Observation, Any]] = []
    attribute = False
    for traj in trajectories:
        values = []
        for obs in traj.steps:
            leaf = obs.leaves.get(path)
            if leaf is None:
                return Verdict(path, Unsupported(f"{path} is missing from some builds"),
                               "present in some builds only", settled=False)
            attribute = attribute or leaf.attribute
            values.append(leaf.value)
            seen.append((obs, leaf.value))
        per_traj.append(values)
    values = [v for _, v in seen]
    n = len(values)
    annotation = _annotation(values) if attribute else None

    def verdict(rule: Rule, evidence: str, settled: bool = True) -> Verdict:
        return Verdict(path, rule, evidence, settled, attribute, annotation)

    records = [record_items(v) is not None for v in values]
    if all(records):
        return None  # a nested record: its fields get rules
    if all(v is None for v in values):
        return verdict(Unchanged(), f"None in all {n} builds")
    if any(records):
        return verdict(Unsupported(f"{path} is a record in some builds and not in others"),
                       "a record in some builds only", settled=False)
    if all(isinstance(v, torch.Tensor) for v in values):
        return _classify_tensor(path, trajectories, per_traj, seen, block_size, verdict,
                                kernel)
    if any(isinstance(v, torch.Tensor) for v in values):
        return verdict(Unsupported(f"{path} is a tensor in some builds only"),
                       "a tensor in some builds and None or a host value in others",
                       settled=False)
    if _constant_per_trajectory(per_traj):
        scalar = all(type(v) in (int, bool, float, str) for v in values)
        return verdict(HostConstant() if scalar else Unchanged(),
                       f"the same value at every step of each of {len(per_traj)} trajectories")
    if all(type(v) is int for v in values):
        for label, rule, value_of in _host_candidates(units):
            if all(value_of(obs.state) == v for obs, v in seen):
                return verdict(rule, f"{label} at all {n} builds")
        return verdict(Unsupported(f"{path}: a host int no known function of the state gives"),
                       "a host int that changes but matches no host int of the state",
                       settled=False)
    kinds = {type(v) for v in values}
    if len(kinds) == 1:
        kind = kinds.pop()
        try:
            kind()
            fresh = True
        except Exception:
            fresh = False
        distinct = len({id(v) for v in values}) == n
        if fresh and distinct:
            return verdict(Reset(kind, label=kind.__qualname__),
                           f"a new {kind.__qualname__} in each of {n} builds")
    return verdict(Unsupported(f"{path}: a host object that changes in a way infer cannot name"),
                   "a host object that changes between steps", settled=False)


def _classify_tensor(
    path: str,
    trajectories: Sequence[Trajectory],
    per_traj: Sequence[Sequence[object]],
    seen: Sequence[tuple[Observation, Any]],
    block_size: int,
    verdict: Callable[..., Verdict],
    kernel: PagedMqaKernel | None,
) -> Verdict:
    n = len(seen)
    leaves = [obs.leaves[path] for obs, _ in seen]
    shared = set(STATE_TENSORS)
    for leaf in leaves:
        shared &= set(leaf.aliases)
    if shared:
        name = path.rsplit(".", 1)[-1]
        source = name if name in shared else sorted(shared)[0]
        return verdict(Alias(source),
                       f"shares storage with state.{source} in all {n} builds")
    known = _known_hook(path, block_size, kernel)
    if known is not None:
        unfilled = not all(leaf.deterministic for leaf in leaves)
        seen_as = ("values differ between two builds of the same state (a buffer this device "
                   "leaves unfilled)" if unfilled else "a separate buffer, not a view")
        return verdict(known[0], f"{seen_as}; {known[1]}")
    if not all(leaf.deterministic for leaf in leaves):
        return verdict(Recompute(TodoHook(path), ()),
                       "values differ between two builds of the same state and no library hook "
                       "is known for it: write its recompute hook", settled=False)
    sample = seen[0][1]
    if _constant_per_trajectory(per_traj):
        constant = (f"equal at every step of each of {len(per_traj)} trajectories (and not a "
                    "view of a state buffer)")
        if not _differs_between_batches_of_one_shape(per_traj):
            return verdict(Unchanged(), constant)
        # The same within each draft loop but following the batch's contents: kept unchanged,
        # a graph captured with one batch would replay its value in another of the same size.
        # Where a derivation from the state reproduces it, refreshing it keeps it right from
        # the first step.
        for candidate in _tensor_candidates(sample, block_size):
            if _reproduces(candidate, seen):
                label, derivation, inputs = candidate
                return verdict(Derive(derivation, inputs),
                               f"{constant}, but different in two batches of one size; {label} "
                               f"at all {n} builds, so it is refreshed (right at the first step "
                               "from metadata built for another batch)")
        return verdict(Unchanged(), constant)
    for candidate in _tensor_candidates(sample, block_size):
        if _reproduces(candidate, seen):
            label, derivation, inputs = candidate
            return verdict(Derive(derivation, inputs),
                           f"{label} at all {n} builds (a separate tensor, not a view)")
    return verdict(Recompute(TodoHook(path), ()),
                   "changes between steps and no library derivation reproduces it: write its "
                   "recompute hook", settled=False)


def _prefer_metadata_inputs(verdicts: list[Verdict], seen: Sequence[Observation]) -> None:
    """Derive from the metadata's own view of a state buffer where it has one (as a maintainer
    would write it), if the derivation reproduces the field from that view in every build."""
    aliases = [(v.path, v.rule.source) for v in verdicts if isinstance(v.rule, Alias)]
    for i, v in enumerate(verdicts):
        rule = v.rule
        if not (isinstance(rule, Derive) and len(rule.inputs) == 1
                and rule.inputs[0].startswith("state.")):
            continue
        source = rule.inputs[0].split(".", 1)[1]
        for path, alias in aliases:
            if alias != source:
                continue
            through_view: Candidate = (path, rule.derivation, (path,))
            if _reproduces_from_leaves(through_view, [(obs, obs.leaves[v.path].value)
                                                      for obs in seen]):
                verdicts[i] = attrs.evolve(
                    v, rule=Derive(rule.derivation, (path,)),
                    evidence=f"{v.evidence}; read through {path}, the metadata's view of it")
                break


def classify(
    trajectories: Sequence[Trajectory], *, block_size: int, compute_units: int | None = None,
    paged_mqa_kernel: PagedMqaKernel | None = None,
) -> tuple[list[Verdict], dict[str, type]]:
    """A verdict for every leaf seen, in walk order, and the record class at every nested path.

    Args:
        trajectories: what :func:`~draftmeta.infer.probe.probe` observed.
        block_size: the builder's KV block size (a K-pool tail's pool size).
        compute_units: the CPU's compute units, for AMX's split count (``None``: not tried).
        paged_mqa_kernel: the engine's paged-MQA schedule kernel, handed to the DeepGEMM hook
            a ``schedule_metadata`` buffer gets (``None``: that hook leaves the buffer alone).
    """
    first = trajectories[0].steps[0]
    paths = list(first.leaves)
    for traj in trajectories:
        for obs in traj.steps:
            paths += [p for p in obs.leaves if p not in paths]
    types: dict[str, type] = {}
    for traj in trajectories:
        for obs in traj.steps:
            for p, t in obs.types.items():
                types.setdefault(p, t)
    verdicts = []
    for path in paths:
        found = _classify_path(path, trajectories, block_size, compute_units,
                               paged_mqa_kernel)
        if found is not None:
            verdicts.append(found)
    # a record that is None somewhere is covered by its own verdict; drop its children
    covering = {v.path for v in verdicts}
    verdicts = [v for v in verdicts
                if not any(v.path.startswith(c + ".") for c in covering)]
    _prefer_metadata_inputs(verdicts, [o for t in trajectories for o in t.steps])
    return verdicts, types
