"""The extra state vLLM's CPU ``AMX_MLA`` builder attaches to MLA decode metadata.

``AMXMLAMetadataBuilder.build`` (any supported vLLM, ``v1/attention/backends/mla/amx_mla.py``)
sets four attributes on ``metadata.decode`` that are not dataclass fields: ``req_to_token``
(the block table expanded to one row index per token), ``seq_lens_i64`` (an int64 *copy* of
``decode.seq_lens``), ``req_pool_indices`` (``arange(num_decodes)``) and ``num_kv_splits`` (a
host int from ``max_seq_len`` and the CPU's compute units). The expansion is refreshed from the
block table at every step (a hook that starts from the metadata built for a captured graph must
not keep the capture batch's expansion); the row indices depend only on the batch, which
drafting keeps; the copy and the split count must follow every step, or the AMX kernel reads
stale lengths.

The CPU's compute units are handed in (the vLLM binding reads them from vLLM's platform:
:mod:`draftmeta.integrations.vllm.specs.amx`).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from draftmeta.derivations import CopyFrom, ExpandBlockTable
from draftmeta.rules import Derive, HostDerive, Rule, Unchanged

__all__ = ["AMX_DECODE_ATTRIBUTES", "AmxKvSplits", "amx_decode_rules"]

AMX_DECODE_ATTRIBUTES: tuple[tuple[str, object], ...] = (
    ("decode.req_to_token", torch.Tensor),
    ("decode.seq_lens_i64", torch.Tensor),
    ("decode.req_pool_indices", torch.Tensor),
    ("decode.num_kv_splits", int),
)
"""The attributes AMX sets on the decode part, with their annotations."""


@attrs.frozen
class AmxKvSplits:
    """vLLM's AMX ``num_kv_splits`` for a host ``max_seq_len``: the smallest power of two
    ``>= max(1, max_seq_len // 512)``, at most twice the CPU's compute units.

    Attributes:
        units: the compute units, or a function reading them at each call (a spec declared
            without a live builder reads them only where it runs).
    """

    units: int | Callable[[], int]

    def __call__(self, max_seq_len: int) -> int:
        """The split count for ``max_seq_len``."""
        units = self.units if isinstance(self.units, int) else self.units()
        ideal = 1
        while ideal < max(1, max_seq_len // 512):
            ideal *= 2
        return min(ideal, units * 2)


def amx_decode_rules(units: int | Callable[[], int]) -> tuple[tuple[str, Rule], ...]:
    """The rules of :data:`AMX_DECODE_ATTRIBUTES`, the split count bounded by ``units`` (see
    :class:`AmxKvSplits`)."""
    return (
        ("decode.req_to_token", Derive(ExpandBlockTable(), ("decode.block_table",))),
        ("decode.seq_lens_i64", Derive(CopyFrom(), ("decode.seq_lens",))),
        ("decode.req_pool_indices", Unchanged()),
        ("decode.num_kv_splits", HostDerive(
            AmxKvSplits(units), ("max_seq_len",),
            formula="min(next_pow2(max(1, max_seq_len // 512)), 2 * compute_units)",
        )),
    )
