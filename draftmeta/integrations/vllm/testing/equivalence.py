"""Update versus rebuild against vLLM's real builders: the invariant, checked on one batch.

For a random decode batch, :func:`check_batch` builds metadata once with a vLLM builder, then
for every later draft step advances the draft state in place, updates the metadata with
draftmeta's generated function, and compares it field by field with what a *second* builder
instance (fresh buffers) builds from a *copy* of the advanced state, so that neither shared
buffers nor shared tensors can make the comparison vacuous.

Used by the test suite and by ``draftmeta verify``.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from draftmeta.advance import HostBound, OverflowPolicy, advance_state
from draftmeta.integrations.vllm.catalogue import BuilderEntry, HarnessRecipe
from draftmeta.integrations.vllm.testing import harness
from draftmeta.spec import DraftSpec
from draftmeta.testing import Mismatch, compare_metadata, random_state

__all__ = ["BUILDERS", "BatchResult", "CaseConfig", "check_batch", "compare_on_cpu",
           "random_case"]


def _builders() -> dict[str, BuilderEntry]:
    from draftmeta.integrations.vllm.catalogue import current_release

    return {entry.name: entry for entry in current_release().builders
            if entry.harness is not None}


BUILDERS: dict[str, BuilderEntry] = _builders()
"""The installed release's builders that construct on a CPU, by name: their catalogue entries
(the spec of the metadata each builds is the entry's
:meth:`~draftmeta.integrations.vllm.catalogue.BuilderEntry.make_spec`)."""

_UNFILLED_ON_CPU = frozenset({"decode.schedule_metadata"})
"""Buffers vLLM allocates with ``torch.empty`` and fills only on CUDA with DeepGEMM: on CPU
their contents are undefined, so only their shape and dtype are compared."""


@attrs.frozen
class CaseConfig:
    """One random batch to check.

    Attributes:
        builder: a key of :data:`BUILDERS`.
        seed: the generator seed (printed on failure).
        batch_size: real requests.
        num_padded: padding rows after them.
        block_size: the KV block size.
        max_model_len: the context limit.
        steps: draft steps K; the metadata is built for step 1 and updated K - 1 times.
        overflow: the source advance's overflow policy.
        host_bound: how the host ``max_seq_len`` moves.
        dcp_world_size: decode context parallelism: ranks a sequence's KV cache is dealt to
            (1: off).
        dcp_rank: the rank whose metadata is built and updated.
        dcp_interleave: tokens dealt to a rank at a time.
    """

    builder: str
    seed: int
    batch_size: int
    num_padded: int
    block_size: int
    max_model_len: int
    steps: int
    overflow: OverflowPolicy
    host_bound: HostBound
    dcp_world_size: int = 1
    dcp_rank: int = 0
    dcp_interleave: int = 1

    def __str__(self) -> str:
        dcp = (f" dcp={self.dcp_world_size} rank={self.dcp_rank} interleave="
               f"{self.dcp_interleave}" if self.dcp_world_size > 1 else "")
        return (
            f"{self.builder} seed={self.seed} B={self.batch_size}+{self.num_padded} "
            f"bs={self.block_size} L={self.max_model_len} K={self.steps} "
            f"{self.overflow}/{self.host_bound}{dcp}"
        )


@attrs.frozen
class BatchResult:
    """What :func:`check_batch` found: mismatches per draft step (empty when all equal)."""

    case: CaseConfig
    steps_checked: int
    mismatches: tuple[tuple[int, Mismatch], ...]

    @property
    def ok(self) -> bool:
        """Whether every step's updated metadata equaled the rebuilt one."""
        return not self.mismatches


def random_case(builder: str, seed: int, *, max_steps: int = 8,
                recipe: HarnessRecipe | None = None) -> CaseConfig:
    """A random batch configuration for ``builder`` from ``seed`` (batch 1..64, K 2..8, ...).

    The block size is the recipe's (a builder that needs 64 gets 64), or 64 or the recipe's at
    random; the recipe is ``recipe`` where given, else the catalogue entry's (its CPU one, or
    its GPU one where it has none), else block sizes 16 or 64."""
    g = torch.Generator().manual_seed(seed)

    def pick(options: list[Any]) -> Any:
        return options[int(torch.randint(len(options), (1,), generator=g))]

    if recipe is None:
        from draftmeta.integrations.vllm.catalogue import current_release

        release = current_release()
        if builder in release.names:
            entry = release.entry(builder)
            recipe = entry.harness or entry.gpu_harness
    smallest = recipe.block_size if recipe is not None else 16
    block_size = 64 if smallest == 64 else pick([smallest, 64])
    batch = pick([1, 1, 2, 3, 7, 16, 31, 64, int(torch.randint(1, 65, (1,), generator=g))])
    return CaseConfig(
        builder=builder,
        seed=seed,
        batch_size=batch,
        num_padded=pick([0, 0, 0, 3]),
        block_size=block_size,
        max_model_len=pick([256, 1000, 4096]),
        steps=int(torch.randint(2, max_steps + 1, (1,), generator=g)),
        overflow=pick(["wrap", "clamp"]),
        host_bound=pick(["advance", "advance", "frozen"]),
    )


def _unfilled(path: str) -> bool:
    return path in _UNFILLED_ON_CPU


def check_batch(case: CaseConfig, *, spec: DraftSpec[Any] | None = None) -> BatchResult:
    """Build, then update and rebuild for every later step; collect every mismatch.

    ``spec`` overrides the builder's registered spec (``draftmeta verify`` uses this to show
    that a deliberately broken spec is caught).

    Under decode context parallelism (``case.dcp_world_size > 1``) both builders are made for
    ``case.dcp_rank`` of a stand-in group
    (:func:`~draftmeta.integrations.vllm.testing.harness.dcp_group`), the spec is the builder's
    DCP spec, draftmeta's advance recomputes the rank's local lengths, and the rebuild gets
    them from vLLM's own ``get_dcp_local_seq_lens``.
    """
    dcp = case.dcp_world_size > 1
    config = harness.cached_vllm_config(
        max_model_len=case.max_model_len, block_size=case.block_size,
        dcp_world_size=case.dcp_world_size, dcp_interleave=case.dcp_interleave,
    )
    width = -(-case.max_model_len // case.block_size)
    kwargs: dict[str, Any] = {"block_size": case.block_size, "dcp_rank": case.dcp_rank}
    if case.builder == "INDEXER":
        kwargs["block_table_width"] = width
    updater = harness.make_builder(case.builder, config, **kwargs)
    rebuilder = harness.make_builder(case.builder, config, **kwargs)
    if spec is None:
        spec = BUILDERS[case.builder].make_spec(host_bound=case.host_bound, builder=updater,
                                                dcp=dcp)

    g = torch.Generator().manual_seed(case.seed)
    state = random_state(
        g,
        batch_size=case.batch_size,
        block_size=case.block_size,
        max_model_len=case.max_model_len,
        steps=case.steps,
        num_padded=case.num_padded,
    )
    if dcp:
        state.dcp_world_size, state.dcp_rank = case.dcp_world_size, case.dcp_rank
        state.dcp_interleave = case.dcp_interleave
        state.dcp_local_seq_lens = _vllm_local_seq_lens(state, case)
    metadata = harness.build_metadata(updater, harness.common_metadata_for(state), draft_index=1)
    found: list[tuple[int, Mismatch]] = []
    for step in range(2, case.steps + 1):
        advance_state(state, case.overflow, case.host_bound)
        spec.update(metadata, state)
        copy = state.clone()
        if dcp:  # the rebuild's local lengths from vLLM's function, not draftmeta's advance
            copy.dcp_local_seq_lens = _vllm_local_seq_lens(copy, case)
        fresh = harness.common_metadata_for(copy)
        rebuilt = harness.build_metadata(rebuilder, fresh, draft_index=step)
        found += [(step, m) for m in compare_on_cpu(metadata, rebuilt)]
    return BatchResult(case, case.steps - 1, tuple(found))


def compare_on_cpu(metadata: object, rebuilt: object, *,
                   workspaces: frozenset[str] = frozenset()) -> list[Mismatch]:
    """Every field where an updated ``metadata`` differs from vLLM's ``rebuilt`` one on a CPU:
    field by field, except buffers only CUDA kernels fill (:data:`_UNFILLED_ON_CPU`) and the
    given ``workspaces`` (scratch a kernel writes, which a build allocates and never fills),
    whose shape and dtype alone are compared."""
    shape_only = _UNFILLED_ON_CPU | workspaces
    mismatches = compare_metadata(metadata, rebuilt, ignore=shape_only.__contains__)
    for path in sorted(shape_only):
        mismatches += _shape_only(metadata, rebuilt, path)
    return mismatches


def _vllm_local_seq_lens(state: Any, case: CaseConfig) -> torch.Tensor:
    return harness.dcp_local_seq_lens(state.seq_lens, case.dcp_world_size, case.dcp_rank,
                                      case.dcp_interleave)


def _shape_only(a: object, b: object, path: str) -> list[Mismatch]:
    for part in path.split("."):
        a, b = getattr(a, part, None), getattr(b, part, None)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            return [Mismatch(path, f"{tuple(a.shape)} {a.dtype} != {tuple(b.shape)} {b.dtype}")]
        return []
    if (a is None) != (b is None):
        return [Mismatch(path, f"{type(a).__name__} != {type(b).__name__}")]
    return []
