"""The MLA layout is declared once (``draftmeta.backends.views``): the specs' view rules and the
draft state the vLLM hook reads from a built record come from the same declaration."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from draftmeta.backends.views import FLAT, MLA_DENSE, MLA_DENSE_DCP, StateViews, views_of
from draftmeta.integrations.vllm.catalogue.model import hook_state
from draftmeta.registry import get_spec, recorded_classes
from draftmeta.rules import Alias, Unchanged


@pytest.mark.parametrize(("name", "views"), [
    ("CPU_MLA", MLA_DENSE), ("CPU_MLA.dcp", MLA_DENSE_DCP), ("TRITON_MLA.dcp", MLA_DENSE_DCP),
    ("FLASH_ATTN_MLA_SPARSE", FLAT), ("INDEXER", FLAT),
])
def test_every_field_a_layout_names_is_an_alias_of_its_buffer_in_the_shipped_spec(
    name: str, views: StateViews,
) -> None:
    with recorded_classes():
        spec = get_spec(name)
    expected = {path: Alias(buffer) for path, buffer in views.buffers().items()
                if path in spec.rules}
    assert {views.seq_lens, views.block_table, views.slot_mapping} <= expected.keys()
    assert {path: spec.rules[path] for path in expected} == expected


def test_the_dense_mla_spec_aliases_exactly_the_fields_its_layout_names() -> None:
    with recorded_classes():
        plain, dcp = get_spec("CPU_MLA"), get_spec("CPU_MLA.dcp")
    for spec, views in ((plain, MLA_DENSE), (dcp, MLA_DENSE_DCP)):
        aliases = {p: r.source for p, r in spec.rules.items() if isinstance(r, Alias)}
        assert aliases == views.buffers()
    assert plain.rules["decode.dcp_tot_seq_lens"] == Unchanged()  # views nothing without DCP


def _tensor(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32)


def _builder(dcp: int) -> Any:
    return SimpleNamespace(
        dcp_world_size=dcp, dcp_rank=0, cp_kv_cache_interleave_size=1,
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096)),
        kv_cache_spec=SimpleNamespace(block_size=16),
    )


def test_the_hook_reads_the_dense_layouts_buffers_from_the_decode_part() -> None:
    decode = SimpleNamespace(seq_lens=_tensor(4), block_table=_tensor(8).view(4, 2),
                             dcp_tot_seq_lens=_tensor(4))
    record = SimpleNamespace(decode=decode, slot_mapping=_tensor(4), query_start_loc=_tensor(5),
                             num_reqs=4, max_seq_len=9)
    plain = hook_state(_builder(1), record)
    assert views_of(record, dcp=False) is MLA_DENSE
    assert plain.seq_lens is decode.seq_lens and plain.block_table is decode.block_table
    assert plain.slot_mapping is record.slot_mapping
    assert plain.query_start_loc is record.query_start_loc
    assert plain.dcp_local_seq_lens is None
    under_dcp = hook_state(_builder(2), record)
    assert under_dcp.seq_lens is decode.dcp_tot_seq_lens
    assert under_dcp.dcp_local_seq_lens is decode.seq_lens
    assert (under_dcp.max_model_len, under_dcp.block_size, under_dcp.dcp_world_size) == (
        4096, 16, 2)


def test_the_hook_reads_a_record_without_a_decode_part_by_the_flat_layout() -> None:
    record = SimpleNamespace(decode=None, seq_lens=_tensor(3), block_table=_tensor(6).view(3, 2),
                             slot_mapping=_tensor(3), num_decodes=3, max_seq_len=5)
    state = hook_state(_builder(2), record)  # DCP does not change a flat record's layout
    assert views_of(record, dcp=True) is FLAT
    assert state.seq_lens is record.seq_lens and state.block_table is record.block_table
    assert state.dcp_local_seq_lens is None
    assert state.query_start_loc.numel() == 0  # the record has none: an empty stand-in
    assert state.num_reqs == 3  # num_decodes, where the record has no num_reqs


@pytest.mark.parametrize("dcp", [1, 2])
def test_the_hook_reads_the_indexers_own_fields_not_its_decode_parts_copies(dcp: int) -> None:
    """The indexer's record holds the buffers' views itself and copies of them in its decode
    part (its spec declares :data:`FLAT`): the draft state is read from the views, with or
    without DCP, never from the copies."""
    seq_lens, block_table = _tensor(3), _tensor(6).view(3, 2)
    decode = SimpleNamespace(seq_lens=seq_lens.clone(), block_table=block_table.clone(),
                             decode_lens=_tensor(3))
    record = SimpleNamespace(seq_lens=seq_lens, block_table=block_table, slot_mapping=_tensor(3),
                             decode=decode, num_decodes=3, max_seq_len=5)
    assert views_of(record, dcp=dcp > 1) is FLAT
    state = hook_state(_builder(dcp), record)
    assert state.seq_lens is seq_lens and state.block_table is block_table
    assert state.slot_mapping is record.slot_mapping
    assert state.dcp_local_seq_lens is None


def test_a_layout_naming_one_field_for_two_buffers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['decode.seq_lens'\] are named for two"):
        StateViews(seq_lens="decode.seq_lens", block_table="decode.block_table",
                   dcp_local_seq_lens="decode.seq_lens")
