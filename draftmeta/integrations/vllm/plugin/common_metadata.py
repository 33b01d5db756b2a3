"""vLLM's common attention metadata and draftmeta's draft state, both ways: one adapter.

vLLM describes a draft step to its metadata builders as a ``CommonAttentionMetadata``; draftmeta's
specs read a :class:`~draftmeta.state.DraftState`. The plugin maps the first to the second
(:func:`draft_state_of` once per builder, :func:`rebind` at each draft step: vLLM makes new views
per step), the harness and the benchmarks the second to the first (:func:`common_metadata_of`,
:func:`make_common_metadata`), with the same field correspondence: ``seq_lens``,
``slot_mapping``, ``block_table_tensor`` as ``block_table``, ``query_start_loc``,
``positions``, ``num_reqs``, ``max_seq_len``.

Importing this module does not import vLLM; :func:`make_common_metadata` does, on first use.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from draftmeta.state import DraftState

if TYPE_CHECKING:
    from vllm.v1.attention.backend import CommonAttentionMetadata

__all__ = ["common_metadata_of", "draft_state_of", "make_common_metadata", "rebind"]


def rebind(state: DraftState, cad: Any) -> DraftState:
    """Point ``state`` at this draft step's common metadata (vLLM makes new views per step)."""
    state.seq_lens, state.slot_mapping = cad.seq_lens, cad.slot_mapping
    state.block_table, state.query_start_loc = cad.block_table_tensor, cad.query_start_loc
    state.max_seq_len, state.num_reqs = cad.max_seq_len, cad.num_reqs
    if cad.positions is not None:
        state.positions = cad.positions
    return state


def draft_state_of(cad: Any, builder: Any) -> DraftState:
    """The builder's draft state, over one draft loop's common metadata (rebound to each
    step's by :func:`rebind`: allocating a state per loop costs more than rebinding one)."""
    positions = cad.positions if cad.positions is not None else cad.seq_lens.new_empty(0)
    return DraftState(
        positions=positions,
        seq_lens=cad.seq_lens,
        slot_mapping=cad.slot_mapping,
        block_table=cad.block_table_tensor,
        query_start_loc=cad.query_start_loc,
        num_reqs=cad.num_reqs,
        max_seq_len=cad.max_seq_len,
        max_model_len=builder.vllm_config.model_config.max_model_len,
        block_size=builder.kv_cache_spec.block_size,
    )


def make_common_metadata(
    *,
    seq_lens: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_seq_len: int,
    num_reqs: int,
    query_start_loc_cpu: torch.Tensor | None = None,
    seq_lens_cpu: torch.Tensor | None = None,
    dcp_local_seq_lens: torch.Tensor | None = None,
) -> CommonAttentionMetadata:
    """Describe a decode-only batch (query length 1 per request) to vLLM.

    ``seq_lens``, ``positions``, ``slot_mapping``, ``block_table`` and ``query_start_loc`` go
    into the metadata as the same tensor objects (no copy, no slice), so metadata built from it
    aliases them. The fields are taken from whatever ``dataclasses.fields`` the installed
    ``CommonAttentionMetadata`` has; host mirrors (``query_start_loc_cpu``,
    ``seq_lens_cpu_upper_bound``, older releases' ``seq_lens_cpu`` /
    ``num_computed_tokens_cpu``) are CPU copies made here unless given.

    Args:
        seq_lens: int32 [B] (or longer), context + query length per request.
        positions: int64 [B] (or longer), the position of each request's query token.
        slot_mapping: int64 [B] (or longer), the KV slot each query token writes.
        block_table: int32 [B, W] (or more rows).
        query_start_loc: int32 [B+1] (or longer), normally ``arange(B+1)``.
        max_seq_len: host upper bound on ``seq_lens``.
        num_reqs: B; also the number of tokens.
        query_start_loc_cpu: the host mirror of ``query_start_loc``; default a CPU copy.
        seq_lens_cpu: the host (upper-bound) mirror of ``seq_lens``; default a CPU copy.
        dcp_local_seq_lens: passed through (DCP only).

    Raises:
        ValueError: a tensor is too short for ``num_reqs`` or has the wrong dtype.
        TypeError: the installed release has a required field this function cannot fill.
    """
    _check(seq_lens, "seq_lens", torch.int32, num_reqs)
    _check(positions, "positions", torch.int64, num_reqs)
    _check(slot_mapping, "slot_mapping", torch.int64, num_reqs)
    _check(block_table, "block_table", torch.int32, num_reqs, ndim=2)
    _check(query_start_loc, "query_start_loc", torch.int32, num_reqs + 1)
    cad_cls, init_fields = _common_metadata_class()
    if query_start_loc_cpu is None:
        query_start_loc_cpu = query_start_loc.to("cpu", copy=True)
    if seq_lens_cpu is None:
        seq_lens_cpu = seq_lens.to("cpu", copy=True)
    values: dict[str, Any] = {
        "query_start_loc": query_start_loc,
        "query_start_loc_cpu": query_start_loc_cpu,
        "seq_lens": seq_lens,
        "seq_lens_cpu": seq_lens_cpu,
        "seq_lens_cpu_upper_bound": seq_lens_cpu,
        "num_reqs": num_reqs,
        "num_actual_tokens": num_reqs,
        "max_query_len": 1,
        "max_seq_len": max_seq_len,
        "block_table_tensor": block_table,
        "slot_mapping": slot_mapping,
        "causal": True,
        "positions": positions,
        "dcp_local_seq_lens": dcp_local_seq_lens,
    }
    kwargs: dict[str, Any] = {}
    missing: list[str] = []
    for f in init_fields:
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.name == "num_computed_tokens_cpu":  # releases before seq_lens_cpu_upper_bound
            kwargs[f.name] = seq_lens_cpu - 1
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            missing.append(f.name)
    if missing:
        raise TypeError(
            f"CommonAttentionMetadata of this vLLM release requires fields {missing} that "
            "make_common_metadata does not know how to fill"
        )
    return cad_cls(**kwargs)


_cad_class: tuple[type[Any], tuple[dataclasses.Field[Any], ...]] | None = None


def _common_metadata_class() -> tuple[type[Any], tuple[dataclasses.Field[Any], ...]]:
    """vLLM's ``CommonAttentionMetadata`` and its init fields, looked up once per process."""
    global _cad_class
    if _cad_class is None:
        from vllm.v1.attention.backend import CommonAttentionMetadata

        fields = tuple(f for f in dataclasses.fields(CommonAttentionMetadata) if f.init)
        _cad_class = (CommonAttentionMetadata, fields)
    return _cad_class


def _check(
    tensor: torch.Tensor, name: str, dtype: torch.dtype, min_len: int, *, ndim: int = 1
) -> None:
    if tensor.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {tensor.dtype}")
    if tensor.dim() != ndim or tensor.shape[0] < min_len:
        raise ValueError(
            f"{name} must be {ndim}-D with at least {min_len} rows, got shape {tuple(tensor.shape)}"
        )


def common_metadata_of(state: DraftState) -> CommonAttentionMetadata:
    """vLLM's common metadata over a draft state's buffers (aliased, not copied): the way back
    of :func:`draft_state_of`."""
    return make_common_metadata(
        seq_lens=state.seq_lens,
        positions=state.positions,
        slot_mapping=state.slot_mapping,
        block_table=state.block_table,
        query_start_loc=state.query_start_loc,
        max_seq_len=state.max_seq_len,
        num_reqs=state.num_reqs,
        dcp_local_seq_lens=state.dcp_local_seq_lens,
    )
