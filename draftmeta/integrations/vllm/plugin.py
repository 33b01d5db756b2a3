"""The vLLM general plugin: draftmeta's generated updates inside vLLM 0.33's draft loops.

Installed with draftmeta, the entry point ``draftmeta`` in group ``vllm.general_plugins`` makes
vLLM call :func:`register` once per process, before any metadata builder exists. It:

* checks the installed vLLM (version 0.33, and every class, method and field the specs rely on);
  on any mismatch it changes nothing and logs one line saying why (it fails closed);
* **older proposer** (``llm_base_proposer.py``, which calls ``build_for_drafting`` for every
  group at every draft step): for builders with a draftmeta spec, the metadata built at draft
  index 1 is kept and, at later indices of the same draft loop, updated in place instead of
  rebuilt; anything the spec refuses (a precondition, DCP > 1) falls back to the original build;
* **new model runner** (``supports_draft_decode_metadata_update`` /
  ``update_draft_decode_metadata``): for the MLA builders vLLM leaves out (FlashMLA dense and
  sparse, CUTLASS MLA, FlashInfer-MLA dense, FlashAttn-MLA dense) it installs a generated
  ``update_draft_decode_metadata`` and sets the flag after the builder's own ``__init__``, where
  the spec's conditions hold. The hook is a full refresh from the buffers the metadata views,
  as vLLM's contract requires. Builders vLLM covers itself are left alone unless
  ``DRAFTMETA_VLLM_OVERRIDE_UPSTREAM=1``.

``DRAFTMETA_VLLM_PLUGIN=0`` turns the plugin off; vLLM's ``VLLM_PLUGINS`` allow-list works as
usual. :func:`unregister` restores every patched attribute exactly.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import attrs
import torch

from draftmeta.backends.hooks import FlashAttnCompute
from draftmeta.backends.indexer import (
    INDEXER_BUILDER,
    KPOOL_TAIL_BUILDER,
    indexer_spec,
    kpool_tail_spec,
)
from draftmeta.backends.mla import MLA_VARIANTS, MLAVariant, mla_spec
from draftmeta.backends.vllm_classes import ClassRef
from draftmeta.errors import DraftMetaError, SpecError
from draftmeta.spec import DraftSpec
from draftmeta.state import DraftState

__all__ = [
    "DISABLE_ENV",
    "OVERRIDE_ENV",
    "SUPPORTED_VERSIONS",
    "Installed",
    "installed",
    "register",
    "unregister",
]

logger = logging.getLogger("draftmeta.vllm")

DISABLE_ENV = "DRAFTMETA_VLLM_PLUGIN"
"""Set to ``0`` (or ``off``, ``false``) to turn the plugin off."""
OVERRIDE_ENV = "DRAFTMETA_VLLM_OVERRIDE_UPSTREAM"
"""Set to ``1`` to install draftmeta's hook also on builders vLLM covers itself."""
SUPPORTED_VERSIONS = ("0.33.",)
"""vLLM releases whose classes the specs were declared and tested against."""

_MISSING = object()
_CAD_FIELDS = ("seq_lens", "slot_mapping", "block_table_tensor", "query_start_loc",
               "max_seq_len", "num_reqs", "positions")


@attrs.define
class _Patch:
    cls: type
    name: str
    original: object  # the class's own attribute, or _MISSING if it was inherited


@attrs.frozen
class Installed:
    """What :func:`register` did.

    Attributes:
        v1: builder classes whose ``build_for_drafting`` updates in place after index 1.
        v2: builder classes given draftmeta's ``update_draft_decode_metadata``.
        skipped: ``{builder: reason}`` for builders left alone.
    """

    v1: tuple[str, ...]
    v2: tuple[str, ...]
    skipped: dict[str, str]


_patches: list[_Patch] = []
_installed: Installed | None = None


class _Mismatch(Exception):
    """The installed vLLM is not what the specs were declared against."""


def installed() -> Installed | None:
    """What the plugin installed in this process, or ``None`` if it is not active."""
    return _installed


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "off", "false", "no")


def register() -> None:
    """The plugin's entry point: idempotent, fails closed, logs one line."""
    global _installed
    if _installed is not None:
        return
    if _disabled():
        logger.info("draftmeta: plugin turned off by %s", DISABLE_ENV)
        return
    try:
        plan = _plan()
    except _Mismatch as exc:
        logger.warning("draftmeta: vLLM left untouched: %s", exc)
        return
    for cls, name, value in plan.patches:
        _patches.append(_Patch(cls, name, cls.__dict__.get(name, _MISSING)))
        setattr(cls, name, value)
    _installed = Installed(tuple(plan.v1), tuple(plan.v2), dict(plan.skipped))
    logger.info(
        "draftmeta: in-place draft updates for %d builder(s) in the older proposer, %d in the "
        "new runner; %d left alone", len(plan.v1), len(plan.v2), len(plan.skipped),
    )


def unregister() -> None:
    """Restore every attribute the plugin patched, in reverse order."""
    global _installed
    while _patches:
        patch = _patches.pop()
        if patch.original is _MISSING:
            delattr(patch.cls, patch.name)
        else:
            setattr(patch.cls, patch.name, patch.original)
    _installed = None


@attrs.define
class _Plan:
    patches: list[tuple[type, str, object]] = attrs.field(factory=list)
    v1: list[str] = attrs.field(factory=list)
    v2: list[str] = attrs.field(factory=list)
    skipped: dict[str, str] = attrs.field(factory=dict)


def _import_class(ref: ClassRef) -> type | None:
    import importlib

    try:
        module = importlib.import_module(ref.module)
    except Exception:
        return None
    cls = getattr(module, ref.qualname, None)
    return cls if isinstance(cls, type) else None


def _plan() -> _Plan:
    try:
        import vllm
        from vllm.v1.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata
    except Exception as exc:
        raise _Mismatch(f"cannot import vLLM's attention backend API ({exc})") from exc
    version = str(getattr(vllm, "__version__", "unknown"))
    if not version.startswith(SUPPORTED_VERSIONS):
        raise _Mismatch(
            f"vLLM {version} is not a supported release ({', '.join(SUPPORTED_VERSIONS)}x)"
        )
    for name in ("build_for_drafting", "update_draft_decode_metadata",
                 "supports_draft_decode_metadata_update"):
        if not hasattr(AttentionMetadataBuilder, name):
            raise _Mismatch(f"AttentionMetadataBuilder has no {name}")
    import dataclasses

    cad_fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    missing = [f for f in _CAD_FIELDS if f not in cad_fields]
    if missing:
        raise _Mismatch(f"CommonAttentionMetadata lacks {missing}")
    override = os.environ.get(OVERRIDE_ENV, "0").strip() in ("1", "true", "yes", "on")
    plan = _Plan()
    targets: list[tuple[str, ClassRef, MLAVariant | None]] = [
        (name, v.builder, v) for name, v in MLA_VARIANTS.items()
    ]
    targets.append(("indexer", INDEXER_BUILDER, None))
    targets.append(("kpool_tail", KPOOL_TAIL_BUILDER, None))
    for name, ref, variant in targets:
        cls = _import_class(ref)
        if cls is None:
            plan.skipped[str(ref)] = "cannot be imported on this machine"
            continue
        try:
            v1_spec = _spec(name, "advance")
            _spec(name, "frozen")
        except SpecError as exc:
            raise _Mismatch(f"{ref.qualname}: {exc}") from exc
        except Exception as exc:
            raise _Mismatch(f"{ref.qualname}: cannot declare its spec ({exc})") from exc
        if v1_spec.supported:
            plan.patches.append((cls, "build_for_drafting", _v1_build_for_drafting(cls, name)))
            plan.v1.append(ref.qualname)
        upstream = variant.upstream if variant is not None else "refresh"
        if name == "kpool_tail":
            plan.skipped[str(ref)] = (
                "new runner: vLLM's own hook (its metadata does not reference the block table "
                "draftmeta's spec derives the slot from)"
            )
            continue
        if upstream != "none" and not override:
            plan.skipped[str(ref)] = f"vLLM's own update_draft_decode_metadata ({upstream})"
            continue
        plan.patches.append((cls, "__init__", _v2_init(cls, name)))
        plan.patches.append((cls, "update_draft_decode_metadata", _v2_update))
        plan.v2.append(ref.qualname)
    return plan


def _spec(name: str, policy: str, *, dcp: bool = False, builder: Any = None) -> DraftSpec[Any]:
    if name == "kpool_tail":
        kpool = builder.kv_cache_spec.block_size if builder is not None else 64
        return kpool_tail_spec(kpool=kpool, policy=policy)
    if name == "indexer":
        return indexer_spec(policy=policy, dcp=dcp)
    kwargs: dict[str, Any] = {}
    if builder is not None and name == "flashattn_mla":
        kwargs["flash_attn_compute"] = _flash_attn_compute(builder)
    if builder is not None and name == "flashmla" and getattr(builder, "is_fp8_kvcache", False):
        heads = builder.num_q_heads * max(1, getattr(builder, "dcp_world_size", 1))
        kwargs.update(fp8_kv_cache=True, num_q_tokens_per_head_k=heads)
    return mla_spec(name, policy=policy, dcp=dcp, **kwargs)


def _flash_attn_compute(builder: Any) -> FlashAttnCompute | None:
    schedule = getattr(builder, "_schedule_decode", None)
    if schedule is None:
        return None

    def compute(seq_lens: torch.Tensor, query_start_loc: torch.Tensor, max_seq_len: int
                ) -> torch.Tensor:
        result = schedule(
            num_reqs=seq_lens.shape[0], cu_query_lens=query_start_loc, max_query_len=1,
            seqlens=seq_lens, max_seq_len=max_seq_len, causal=True,
            max_num_splits=getattr(builder, "max_num_splits", 0),
        )
        assert isinstance(result, torch.Tensor)
        return result

    return compute


# -- the older proposer: build at index 1, update in place after ---------------------------


@attrs.define
class _V1Cache:
    cad: Any
    metadata: Any
    state: DraftState
    spec: DraftSpec[Any]


def _state_from_cad(cad: Any, builder: Any) -> DraftState:
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


def _v1_build_for_drafting(cls: type, name: str) -> Callable[..., Any]:
    original = cls.build_for_drafting  # type: ignore[attr-defined]

    def build_for_drafting(self: Any, common_attn_metadata: Any, draft_index: int) -> Any:
        cache: _V1Cache | None = self.__dict__.get("_draftmeta_v1")
        if draft_index > 1 and cache is not None and cache.cad is common_attn_metadata:
            cad, state = common_attn_metadata, cache.state
            state.seq_lens, state.slot_mapping = cad.seq_lens, cad.slot_mapping
            state.block_table, state.query_start_loc = cad.block_table_tensor, cad.query_start_loc
            state.max_seq_len, state.num_reqs = cad.max_seq_len, cad.num_reqs
            if cad.positions is not None:
                state.positions = cad.positions
            try:
                cache.spec.update(cache.metadata, state)
                return cache.metadata
            except DraftMetaError as exc:
                logger.info("draftmeta: %s rebuilds this draft loop: %s", cls.__qualname__, exc)
                self._draftmeta_v1 = None
        metadata = original(self, common_attn_metadata, draft_index)
        self._draftmeta_v1 = None
        if draft_index == 1 and getattr(self, "dcp_world_size", 1) == 1:
            state = _state_from_cad(common_attn_metadata, self)
            spec = _spec(name, "advance", builder=self)
            self._draftmeta_v1 = _V1Cache(common_attn_metadata, metadata, state, spec)
        return metadata

    build_for_drafting.__qualname__ = f"{cls.__qualname__}.build_for_drafting"
    build_for_drafting.__doc__ = (
        "vLLM's build_for_drafting, with draftmeta's in-place update after draft index 1."
    )
    build_for_drafting.__wrapped__ = original  # type: ignore[attr-defined]
    return build_for_drafting


# -- the new runner: the update hook -------------------------------------------------------


def _v2_init(cls: type, name: str) -> Callable[..., None]:
    original: Callable[..., None] = getattr(cls, "__init__")  # noqa: B009

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        dcp = getattr(self, "dcp_world_size", 1) > 1
        spec = _spec(name, "frozen", dcp=dcp, builder=self)
        self._draftmeta_spec = spec
        self._draftmeta_name = name
        self._draftmeta_states = {}
        conditions = spec.supported and getattr(self, "pcp_world_size", 1) == 1
        if getattr(self, "hisparse_config", None) is not None:
            conditions = False
        self.supports_draft_decode_metadata_update = conditions

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _v2_state(builder: Any, metadata: Any) -> DraftState:
    """A draft state over the buffers ``metadata`` views (the hook's full-refresh sources)."""
    key = id(metadata)
    states: dict[int, DraftState] = builder._draftmeta_states
    state = states.get(key)
    if state is not None:
        return state
    name: str = builder._draftmeta_name
    dense = name != "indexer" and not MLA_VARIANTS[name].sparse
    dcp: int = getattr(builder, "dcp_world_size", 1)
    decode: Any = getattr(metadata, "decode", None)
    local: torch.Tensor | None = None
    if dense:
        seq_lens = decode.dcp_tot_seq_lens if dcp > 1 else decode.seq_lens
        block_table = decode.block_table
        local = decode.seq_lens if dcp > 1 else None
    else:
        seq_lens, block_table = metadata.seq_lens, metadata.block_table
    query_start_loc: Any = getattr(metadata, "query_start_loc", None)
    if len(states) > 16:
        states.clear()
    state = states[key] = DraftState(
        positions=seq_lens.new_empty(0),
        seq_lens=seq_lens,
        slot_mapping=metadata.slot_mapping,
        block_table=block_table,
        query_start_loc=seq_lens.new_empty(0) if query_start_loc is None else query_start_loc,
        num_reqs=getattr(metadata, "num_reqs", None) or metadata.num_decodes,
        max_seq_len=metadata.max_seq_len,
        max_model_len=builder.vllm_config.model_config.max_model_len,
        block_size=builder.kv_cache_spec.block_size,
        dcp_world_size=dcp,
        dcp_rank=getattr(builder, "dcp_rank", 0),
        dcp_interleave=getattr(builder, "cp_kv_cache_interleave_size", 1),
        dcp_local_seq_lens=local,
    )
    return state


def _v2_update(self: Any, metadata: Any) -> None:
    """draftmeta's generated full refresh of ``metadata`` from the buffers it views."""
    if getattr(metadata, "num_decode_tokens", 1) == 0:
        return
    self._draftmeta_spec.update(metadata, _v2_state(self, metadata))
