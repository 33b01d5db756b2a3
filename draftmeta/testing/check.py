"""``check_spec``: the update-versus-rebuild check, ready for any metadata class and builder.

A backend author has a spec and a function that builds the metadata from a draft state.
:func:`check_spec` runs the draft loop's invariant over random batches: build the metadata
for a batch, then per draft step advance the state as the loop does, update the metadata in
place with the spec, build it again from a copy of the state and compare the two field by
field. The batches follow :func:`~draftmeta.testing.batch_case`'s edge-case schedule (a batch
of one, block-boundary crossings, requests reaching ``max_model_len``, padded rows, mixed
batches), K draft steps up to ``max_steps``, under both overflow policies.

On success it returns a :class:`SpecCheckReport` (what was checked, which edge cases were
exercised); on the first mismatch it raises :class:`SpecCheckFailed`, an ``AssertionError``
whose message names the batch seed, the step, the field, the index, and the expected (rebuilt)
and the updated values, with the call that reruns just that batch.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs
import torch

from draftmeta.advance import HostBound, OverflowPolicy, advance_state, check_policy
from draftmeta.compare import Mismatch, compare_metadata
from draftmeta.errors import SpecError
from draftmeta.fields import record_items
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState
from draftmeta.testing.states import BatchCase, batch_case, check_sizes
from draftmeta.testing.valid import ValidPrefix, check_valid_prefixes, resolve_valid_prefixes

__all__ = [
    "COVERAGE",
    "CheckFailure",
    "PerPolicy",
    "SpecCheckFailed",
    "SpecCheckReport",
    "check_spec",
]

M = TypeVar("M")

PerPolicy = Mapping[OverflowPolicy, DraftSpec[M]] | Mapping[str, DraftSpec[M]]
"""One spec per overflow policy, ``{"clamp": clamp_spec, "wrap": wrap_spec}`` (a plain
``dict[str, DraftSpec]`` is accepted too; its keys are checked when the check starts)."""

COVERAGE: dict[str, str] = {
    "batch_of_one": "batch of one",
    "block_crossing": "block-boundary crossing",
    "at_max_model_len": "request at max_model_len",
    "padded_rows": "padded rows",
}
"""The edge cases :class:`SpecCheckReport` counts, as observed in the states checked (not as
scheduled): a batch with one request; a request that starts a new KV block while drafting; a
request whose sequence length reaches ``max_model_len`` (clamped there, or wrapped past it); a
batch with padding rows."""


@attrs.frozen
class CheckFailure:
    """What :func:`check_spec` found first.

    Attributes:
        spec_name: the spec checked.
        case: the batch (``None`` when the spec is refused before any batch runs).
        step: the draft step: ``0`` is the build, ``k >= 1`` the k-th advance and update.
        mismatch: the first differing field (``None`` when something raised instead).
        also: the other fields that differ at that step.
        error: what raised (the build, the update, a valid-prefix reference) or why the draft
            loop refuses the spec; ``None`` for a mismatch.
        hint: a likely cause, where one is known (the loop's policy check).
        policy: the overflow policy under which the draft loop refuses the spec (only for a
            refusal, which has no batch).
        cause: the exception behind ``error``, if one was raised (chained to the failure).
    """

    spec_name: str
    case: BatchCase | None
    step: int
    mismatch: Mismatch | None = None
    also: tuple[str, ...] = ()
    error: str | None = None
    hint: str | None = None
    policy: OverflowPolicy | None = None
    cause: BaseException | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def seed(self) -> int | None:
        """The batch seed (``None`` without a batch)."""
        return None if self.case is None else self.case.seed

    @property
    def field(self) -> str | None:
        """The dotted path of the first differing field."""
        return None if self.mismatch is None else self.mismatch.path

    @property
    def index(self) -> tuple[int, ...] | None:
        """The first differing element of that field, if it is a tensor."""
        return None if self.mismatch is None else self.mismatch.index

    @property
    def expected(self) -> object:
        """The rebuilt value there."""
        return None if self.mismatch is None else self.mismatch.expected

    @property
    def got(self) -> object:
        """The updated value there."""
        return None if self.mismatch is None else self.mismatch.got

    def reproduce(self) -> str:
        """The call that reruns just this batch."""
        if self.case is None:
            return f"draftmeta.advance.check_policy(spec, {self.policy!r})"
        return (f"check_spec(spec, build, seed={self.case.seed}, batches=1, "
                f"policies=({self.case.policy!r},))")

    def __str__(self) -> str:
        if self.mismatch is not None:
            head = f"spec {self.spec_name!r}: the updated metadata differs from the rebuilt one"
        else:
            head = f"spec {self.spec_name!r} failed the update-versus-rebuild check"
        lines = [head]
        if self.case is not None:
            lines.append(_line("batch", self.case.shape()))
            lines.append(_line("", self.case.schedule()))
            what = ("the build, before any update" if self.step == 0 else
                    f"of {self.case.steps - 1}: after advance and update number {self.step}")
            lines.append(_line("step", f"{self.step} ({what})"))
        m = self.mismatch
        if m is not None:
            lines.append(_line("field", m.path))
            if m.index is not None:
                lines.append(_line("index", str(m.index)))
            lines.append(_line("expected", f"{m.expected!r} (rebuilt)"))
            lines.append(_line("got", f"{m.got!r} (updated in place)"))
            lines.append(_line("detail", m.detail))
            if self.also:
                lines.append(_line("also", f"differing at this step: {', '.join(self.also)}"))
        if self.error is not None:
            lines.append(_line("error", self.error))
        if self.hint is not None:
            lines.append(_line("hint", self.hint))
        lines.append(f"reproduce: {self.reproduce()}")
        if self.case is not None:
            lines.append("           (with your other options as given)")
        return "\n".join(lines)


def _line(label: str, text: str) -> str:
    """``  label:   text``, wrapped at 100 columns under the text's first column."""
    head = f"  {label + ':' if label else '':<10}"
    return textwrap.fill(text, width=100, initial_indent=head, subsequent_indent=" " * len(head),
                         break_long_words=False, break_on_hyphens=False)


class SpecCheckFailed(AssertionError):
    """:func:`check_spec` found an update that differs from the rebuild (or could not run).

    An ``AssertionError``, so a test that calls :func:`check_spec` fails with the report as its
    message.

    Attributes:
        failure: the first failure, with seed, step, field, index, expected and got.
    """

    def __init__(self, failure: CheckFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure
        self.__cause__ = failure.cause


@attrs.frozen
class SpecCheckReport:
    """What :func:`check_spec` checked when every update equaled its rebuild.

    Attributes:
        spec_name: the spec checked (the clamp one's, where each policy has its own).
        policies: the overflow policies checked.
        host_bound: how the host ``max_seq_len`` moved.
        batches: batches per policy.
        steps: draft steps compared (updates checked against a rebuild), all batches together.
        coverage: for each edge case of :data:`COVERAGE`, how many batches exercised it.
        valid: the valid-prefix declarations, as described in reports.
        seconds: wall time of the check.
    """

    spec_name: str
    policies: tuple[OverflowPolicy, ...]
    host_bound: HostBound
    batches: int
    steps: int
    coverage: Mapping[str, int]
    valid: Mapping[str, str]
    seconds: float

    def __str__(self) -> str:
        lines = [
            f"spec {self.spec_name!r}: updated metadata equals the rebuilt metadata",
            f"  {self.batches * len(self.policies)} batches ({self.batches} per policy: "
            f"{', '.join(self.policies)}; host bound {self.host_bound}), "
            f"{self.steps} draft steps compared",
            "  edge cases exercised (batches):",
        ]
        width = max(len(label) for label in COVERAGE.values())
        for kind, label in COVERAGE.items():
            lines.append(f"    {label:<{width}} {self.coverage.get(kind, 0):>5}")
        if self.valid:
            lines.append("  compared over valid prefixes only:")
            width = max(len(path) for path in self.valid)
            lines += [f"    {p:<{width}}  {d}" for p, d in self.valid.items()]
        return "\n".join(lines)


@attrs.define
class _Run(Generic[M]):
    """One policy's spec and the shared options of a check."""

    spec: DraftSpec[M]
    build: Callable[[DraftState], M]
    rebuild: Callable[[DraftState], M]
    valid: Mapping[str, ValidPrefix]
    ignore: Callable[[str], bool]
    opaque: Callable[[object], bool]
    coverage: dict[str, int]
    device: torch.device | str
    steps: int = 0

    def case(self, case: BatchCase) -> CheckFailure | None:
        """Build, then advance, update, rebuild and compare for every later step."""
        state = case.state(self.device)
        seen: set[str] = set()
        if state.num_reqs == 1:
            seen.add("batch_of_one")
        if state.batch_size > state.num_reqs:
            seen.add("padded_rows")
        try:
            metadata = self.build(state)
        except Exception as exc:
            return self._raised(case, 0, "build(state)", exc)
        uncovered = self.spec.uncovered(metadata)
        if uncovered:
            return CheckFailure(
                self.spec.name, case, 0,
                error=f"the built metadata carries what the spec has no rule for: "
                      f"{'; '.join(uncovered)}",
                hint="declare a rule for each (attributes= for attributes set outside the "
                     "class's fields)",
            )
        failure: CheckFailure | None = None
        for step in range(1, case.steps):
            failure = self._step(case, state, metadata, step, seen)
            if failure is not None:
                break
        for kind in seen:
            self.coverage[kind] += 1
        return failure

    def _step(
        self, case: BatchCase, state: DraftState, metadata: M, step: int, seen: set[str]
    ) -> CheckFailure | None:
        n = state.num_reqs
        before = state.seq_lens[:n].clone()
        advance_state(state, case.policy, case.host_bound)
        after = state.seq_lens[:n]
        bs = case.block_size
        if bool(((after + bs - 1) // bs > (before + bs - 1) // bs).any()):
            seen.add("block_crossing")
        if bool(((after == case.max_model_len) | (after < before)).any()):
            seen.add("at_max_model_len")
        try:
            self.spec.update(metadata, state)
        except Exception as exc:
            return self._raised(case, step, "spec.update(metadata, state)", exc)
        fresh = state.clone()
        try:
            rebuilt = self.rebuild(fresh)
        except Exception as exc:
            return self._raised(case, step, "rebuild(state)", exc)
        shared = _shared_storage(metadata, rebuilt, "", self.ignore)
        if shared is not None:
            return CheckFailure(
                self.spec.name, case, step,
                error=f"the rebuilt metadata's {shared} shares storage with the updated "
                      "metadata's, so the comparison would be vacuous (the rebuild overwrote "
                      "the buffer being checked)",
                hint="pass rebuild= the build of a second builder instance, with buffers of "
                     "its own (for a constant tensor that every build shares, ignore= its "
                     "path)",
            )
        try:
            prefixes = resolve_valid_prefixes(self.valid, rebuilt, fresh)
        except (ValueError, AttributeError) as exc:
            return self._raised(case, step, "a valid= declaration", exc)
        found = compare_metadata(
            metadata, rebuilt, ignore=self.ignore, opaque=self.opaque, valid_prefix=prefixes
        )
        self.steps += 1
        if not found:
            return None
        return CheckFailure(self.spec.name, case, step, found[0],
                            tuple(m.path for m in found[1:]))

    def _raised(self, case: BatchCase, step: int, what: str, exc: Exception) -> CheckFailure:
        return CheckFailure(self.spec.name, case, step,
                            error=f"{what} raised {type(exc).__name__}: {exc}", cause=exc)


def _shared_storage(
    updated: object, rebuilt: object, path: str, ignore: Callable[[str], bool]
) -> str | None:
    """The first field path (not ignored) where both objects hold tensors over the same
    memory, or ``None``."""
    if path and ignore(path):
        return None
    if isinstance(updated, torch.Tensor) and isinstance(rebuilt, torch.Tensor):
        if updated.numel() and rebuilt.numel() and updated.data_ptr() == rebuilt.data_ptr():
            return path or "<root>"
        return None
    items_a, items_b = record_items(updated), record_items(rebuilt)
    if items_a is None or items_b is None:
        return None
    for (key, a), (_, b) in zip(items_a, items_b):
        found = _shared_storage(a, b, f"{path}.{key}" if path else key, ignore)
        if found is not None:
            return found
    return None


def _policy_problem(spec: DraftSpec[Any], policy: OverflowPolicy) -> str | None:
    try:
        check_policy(spec, policy)
    except SpecError as exc:
        return str(exc)
    return None


def check_spec(
    spec: DraftSpec[M] | PerPolicy[M],
    build: Callable[[DraftState], M],
    *,
    rebuild: Callable[[DraftState], M] | None = None,
    valid: Mapping[str, ValidPrefix] | None = None,
    batches: int = 200,
    max_steps: int = 8,
    policies: Sequence[OverflowPolicy] | None = None,
    host_bound: HostBound = "advance",
    block_sizes: Sequence[int] = (16,),
    max_model_lens: Sequence[int] = (256, 1000),
    max_batch_size: int = 64,
    padded_rows: bool = True,
    seed: int = 0,
    ignore: Callable[[str], bool] | None = None,
    opaque: Callable[[object], bool] | None = None,
    device: torch.device | str = "cpu",
) -> SpecCheckReport:
    """Check that ``spec``'s in-place update equals ``build`` from scratch, over random batches.

    For each of ``batches`` batch seeds ``seed, seed + 1, ...`` and each overflow policy, the
    batch of :func:`~draftmeta.testing.batch_case` (kind ``EDGE_CASES[seed % 5]``: a batch of
    one, every request crossing a block boundary, every request reaching ``max_model_len``,
    padded rows, a mixed batch; K draft steps drawn from ``2..max_steps``) is built with
    ``build(state)``; then for every later step the state advances as the draft loop advances it
    (:func:`~draftmeta.advance.advance_state` under the policy and ``host_bound``), ``spec``
    updates the metadata in place, ``rebuild`` builds it again from a *copy* of the state (fresh
    tensors, so a shared buffer cannot make the comparison vacuous), and
    :func:`~draftmeta.testing.compare_metadata` compares the two. It also fails when the built
    metadata carries something the spec has no rule for (:meth:`DraftSpec.uncovered
    <draftmeta.spec.DraftSpec.uncovered>`), when the rebuild returns a tensor over the same
    memory as the updated metadata (the comparison would be vacuous), and when the draft loop
    would refuse the spec for a policy (:func:`~draftmeta.advance.check_policy`). The check
    stops at the first failure.

    Args:
        spec: the spec, or one spec per overflow policy (``{"clamp": ..., "wrap": ...}``) when
            the spec advances a field of its own with the policy.
        build: builds the metadata for a draft state, as the builder does for the first draft
            step; the update must keep what it returns equal to a rebuild.
        rebuild: builds the reference each step (default ``build``). Pass a second builder
            instance's build where the builder reuses persistent buffers, so the reference does
            not overwrite the buffers being updated.
        valid: fixed-capacity buffers that are meaningful only in a prefix, by field path:
            ``{"kv_indices": ValidPrefix("kv_indptr", at=-1)}``. Only the prefix is compared.
        batches: batch seeds per policy (at least 5 to meet every edge case).
        max_steps: the largest K.
        policies: the overflow policies checked (default both, or the keys of a per-policy
            ``spec``).
        host_bound: how the state's host ``max_seq_len`` moves (``"advance"`` or ``"frozen"``).
        block_sizes: block sizes to draw from.
        max_model_lens: context limits to draw from (each at least
            ``max(block_sizes) + max_steps + 2``).
        max_batch_size: the largest batch drawn.
        padded_rows: whether batches may carry padding rows (rows past ``num_reqs``); turn it
            off for a builder that does not support them.
        seed: the first batch seed.
        ignore: field paths not compared.
        opaque: objects that only need the same type (a lazily filled scheduler object).
        device: where the draft states live (``"cuda"`` for a builder that builds there); the
            batches are drawn on the CPU, so a seed gives the same batch on every device.

    Returns:
        What was checked, with the edge cases the batches exercised.

    Raises:
        SpecCheckFailed: an ``AssertionError`` naming the batch seed, the step, the field, the
            index, the expected (rebuilt) and the updated value, and the call that reruns the
            batch; also raised when the build, the update or the rebuild raises (chained), for
            an uncovered field, a rebuild sharing storage, and a spec the loop would refuse.
        ValueError: an option or a ``valid=`` declaration is malformed (the message says which).
    """
    specs = _specs(spec, policies)
    check_sizes(block_sizes, max_model_lens, max_steps, max_batch_size)
    if type(batches) is not int or batches < 1:
        raise ValueError(f"batches is {batches!r}; it must be an int >= 1")
    if host_bound not in ("advance", "frozen"):
        raise ValueError(f"host_bound must be 'advance' or 'frozen', got {host_bound!r}")
    declared = dict(valid or {})
    for one in specs.values():
        check_valid_prefixes(one, declared)
    coverage = {kind: 0 for kind in COVERAGE}
    runs = {
        policy: _Run(one, build, rebuild or build, declared, ignore or (lambda _: False),
                     opaque or (lambda _: False), coverage, device)
        for policy, one in specs.items()
    }
    problems = {policy: _policy_problem(one, policy) for policy, one in specs.items()}
    start = time.perf_counter()
    for s in range(seed, seed + batches):
        for policy, run in runs.items():
            case = batch_case(s, policy, host_bound, block_sizes=block_sizes,
                              max_model_lens=max_model_lens, max_steps=max_steps,
                              max_batch_size=max_batch_size, padded_rows=padded_rows)
            failure = run.case(case)
            if failure is not None:
                if problems[policy] is not None:
                    failure = attrs.evolve(
                        failure, hint=f"the draft loop refuses this spec: {problems[policy]}"
                    )
                raise SpecCheckFailed(failure)
    for policy, problem in problems.items():
        if problem is not None:
            raise SpecCheckFailed(CheckFailure(
                specs[policy].name, None, 0, policy=policy,
                error=f"every update equaled its rebuild, but the draft loop refuses this spec "
                      f"under the {policy} policy: {problem}",
            ))
    first = next(iter(specs.values()))
    return SpecCheckReport(
        spec_name=first.name,
        policies=tuple(specs),
        host_bound=host_bound,
        batches=batches,
        steps=sum(run.steps for run in runs.values()),
        coverage=coverage,
        valid={path: prefix.describe() for path, prefix in declared.items()},
        seconds=time.perf_counter() - start,
    )


def _specs(
    spec: DraftSpec[M] | PerPolicy[M],
    policies: Sequence[OverflowPolicy] | None,
) -> dict[OverflowPolicy, DraftSpec[M]]:
    """``{policy: spec}`` for the policies to check."""
    given: dict[str, object]
    if isinstance(spec, DraftSpec):
        given = {"clamp": spec, "wrap": spec}
    elif isinstance(spec, Mapping):
        given = {str(key): value for key, value in spec.items()}
    else:
        raise TypeError(f"spec must be a DraftSpec or a mapping {{policy: DraftSpec}}, got "
                        f"{type(spec).__qualname__}")
    chosen: list[str] = list(given) if policies is None else [str(p) for p in policies]
    if not chosen:
        raise ValueError("policies is empty; check 'clamp', 'wrap' or both")
    out: dict[OverflowPolicy, DraftSpec[M]] = {}
    for key in chosen:
        policy = _policy(key)
        if key not in given:
            raise ValueError(f"policies asks for {key!r}, but the specs given are for "
                             f"{sorted(given)}; add spec[{key!r}] or drop the policy")
        one = given[key]
        if not isinstance(one, DraftSpec):
            raise TypeError(f"spec[{key!r}] is {type(one).__qualname__}, not a DraftSpec")
        out[policy] = one
    return out


def _policy(key: str) -> OverflowPolicy:
    if key == "clamp":
        return "clamp"
    if key == "wrap":
        return "wrap"
    raise ValueError(f"overflow policy must be 'clamp' or 'wrap', got {key!r}")
