#!/usr/bin/env python3
"""Issue 12 on one H200: draftmeta against vLLM 0.33's own code, in one run.

Parts (each guarded: a failure is logged with its traceback and the next part runs):

1. ``equivalence``: vLLM's ``TritonMLAMetadataBuilder`` and ``DeepseekV32IndexerMetadataBuilder``
   on CUDA tensors; over random batches, draftmeta's advance + generated update equals what a
   second builder rebuilds (``build_for_drafting``) for a copy of the same state; plus a negative
   control (an update without the advance must mismatch).
2. ``metadata_steps``: host time per draft step (perf_counter around the step's calls, no
   sync) and wall time per step (synchronised rounds) for the same two groups over one state:
   vLLM's step (its ``eagle_step_update_slot_mapping_and_metadata`` kernel, the host fields it
   moves, then both builders' ``build_for_drafting``) next to draftmeta's eager advance +
   update, the fused step (``FusedStep`` called directly), the step graph
   (:mod:`draftmeta.step_graph`, called directly and through ``DraftLoop(fused=True)``, whose
   fused path it is) and the captured loop.
3. ``draft_loop``: a draft layer whose attention is vLLM's Triton MLA decode kernel
   (``decode_attention_fwd(..., is_mla=True)``, paged KV cache, block size 64) fed by the
   metadata, for a DeepSeek-V2-Lite-sized and a GLM-5.1-sized layer, K = 1..5, batch 1..64:
   draft tokens/s for (a) eager + vLLM's rebuild per step, (b) eager + draftmeta's update
   (unfused ``DraftLoop``, ``FusedStep`` directly, ``StepGraph`` directly, ``DraftLoop(fused=True)``
   which runs a ``StepGraph``), (c) the whole K-step loop in one CUDA graph with the fused update;
   the draft tokens of every path are compared with (a)'s.

Writes ``draft-loop-h200.json`` to ``--out`` (``$OUT`` on the device machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

from vllm_cuda import use_cuda, vllm_version  # noqa: E402

harness = use_cuda()

from draftmeta.advance import advance_state  # noqa: E402
from draftmeta.arguments import DEFAULT_OUT, OUT_HELP  # noqa: E402
from draftmeta.fused import FusedStep  # noqa: E402
from draftmeta.integrations.vllm.testing.equivalence import BUILDERS as SPECS  # noqa: E402
from draftmeta.loop import AttentionGroup, DraftLoop  # noqa: E402
from draftmeta.protocol import SpecBuilder  # noqa: E402
from draftmeta.state import DraftState  # noqa: E402
from draftmeta.step_graph import StepGraph  # noqa: E402
from draftmeta.testing import compare_metadata, random_state  # noqa: E402

# vLLM's eagle step kernel wraps a position that reaches max_model_len
POLICY: Literal["wrap"] = "wrap"
BLOCK = 64
MAX_MODEL_LEN = 4096
RESULTS: dict[str, Any] = {}


def log(*args: object) -> None:
    print(*args, flush=True)


def guarded(name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    log(f"\n===== {name} =====")
    try:
        RESULTS[name] = fn()
    except Exception:
        log(traceback.format_exc())
        RESULTS[name] = {"error": traceback.format_exc()}
    log(f"===== {name}: {time.perf_counter() - t0:.1f} s =====")


def _ignore_unfilled(path: str) -> bool:
    # the indexer's DeepGEMM schedule: vLLM allocates it with torch.empty and fills it only
    # where DeepGEMM runs (not on this machine)
    return path == "decode.schedule_metadata"


def _builders(name: str, max_model_len: int, block_size: int) -> tuple[Any, Any]:
    config = harness.cached_vllm_config(max_model_len=max_model_len, block_size=block_size)
    kwargs: dict[str, Any] = {"block_size": block_size, "device": "cuda"}
    if name == "INDEXER":
        kwargs["block_table_width"] = -(-max_model_len // block_size)
    make = harness.make_builder
    return make(name, config, **kwargs), make(name, config, **kwargs)


# ---------------------------------------------------------------------------------------------
# 1. equivalence on CUDA
# ---------------------------------------------------------------------------------------------

def equivalence(batches: int) -> dict[str, Any]:
    from draftmeta.integrations.vllm.testing.equivalence import BUILDERS, random_case

    out: dict[str, Any] = {}
    for name in ("TRITON_MLA", "INDEXER"):
        steps = mismatched = 0
        failures: list[str] = []
        for seed in range(batches):
            case = random_case(name, seed)
            spec = BUILDERS[name].make_spec(host_bound=case.host_bound)
            up, rb = _builders(name, case.max_model_len, case.block_size)
            state = random_state(torch.Generator().manual_seed(seed), batch_size=case.batch_size,
                                 block_size=case.block_size, max_model_len=case.max_model_len,
                                 steps=case.steps, num_padded=case.num_padded, device="cuda")
            meta = harness.build_metadata(up, harness.common_metadata_for(state), draft_index=1)
            for step in range(2, case.steps + 1):
                advance_state(state, case.overflow, case.host_bound)
                spec.update(meta, state)
                rebuilt = harness.build_metadata(
                    rb, harness.common_metadata_for(state.clone()), draft_index=step)
                found = compare_metadata(meta, rebuilt, ignore=_ignore_unfilled)
                steps += 1
                if found:
                    mismatched += 1
                    failures.append(f"{case} step {step}: {found[0]}")
        # negative control: the update without the shared advance must differ from the rebuild
        case = random_case(name, 1)
        spec = BUILDERS[name].make_spec(host_bound=case.host_bound)
        up, rb = _builders(name, case.max_model_len, case.block_size)
        state = random_state(torch.Generator().manual_seed(1), batch_size=max(case.batch_size, 2),
                             block_size=case.block_size, max_model_len=case.max_model_len,
                             steps=case.steps, device="cuda")
        meta = harness.build_metadata(up, harness.common_metadata_for(state), draft_index=1)
        advanced = state.clone()
        advance_state(advanced, case.overflow, case.host_bound)
        spec.update(meta, state)  # the advance forgotten
        control = compare_metadata(
            meta, harness.build_metadata(rb, harness.common_metadata_for(advanced), draft_index=2),
            ignore=_ignore_unfilled)
        out[name] = {"batches": batches, "steps_checked": steps, "steps_mismatched": mismatched,
                     "first_failures": failures[:5],
                     "negative_control_mismatches": [str(m) for m in control[:3]],
                     "negative_control_caught": bool(control)}
        log(f"{name}: {batches} batches, {steps} steps checked on CUDA, {mismatched} mismatched; "
            f"negative control (no advance) caught: {bool(control)} "
            f"({control[0] if control else '-'})")
        for f in failures[:5]:
            log("  MISMATCH", f)
    return out


# ---------------------------------------------------------------------------------------------
# shared: a decode batch around a given context length
# ---------------------------------------------------------------------------------------------

def decode_state(batch: int, context: int, seed: int) -> DraftState:
    """``batch`` requests with context ``context .. context + 63``, random block tables."""
    g = torch.Generator().manual_seed(seed)
    state = random_state(g, batch_size=batch, block_size=BLOCK, max_model_len=MAX_MODEL_LEN,
                         steps=8, near_limit=0.0, near_boundary=0.0)
    seq = torch.randint(context, context + BLOCK, (batch,), generator=g).to(torch.int32)
    state.seq_lens.copy_(seq)
    state.positions.copy_(seq.to(torch.int64) - 1)
    blk = state.block_table.gather(1, (state.positions // BLOCK).view(-1, 1)).view(-1)
    state.slot_mapping.copy_(blk.to(torch.int64) * BLOCK + state.positions % BLOCK)
    state.max_seq_len = int(seq.max())
    return state.to("cuda")


class Snapshot:
    """The state's values at a point, to restore between timed rounds."""

    def __init__(self, state: DraftState) -> None:
        self.state = state
        self.saved = state.clone()

    def restore(self) -> None:
        for name in ("positions", "seq_lens", "slot_mapping"):
            getattr(self.state, name).copy_(getattr(self.saved, name))
        self.state.max_seq_len = self.saved.max_seq_len
        self.state.step = 0


class VllmStep:
    """What vLLM 0.33's proposer does per draft step: its fused step-advance kernel, the host
    fields of the common metadata it moves, then each group's ``build_for_drafting``."""

    def __init__(self, state: DraftState, builders: list[Any]) -> None:
        from vllm.v1.spec_decode.utils import eagle_step_update_slot_mapping_and_metadata

        self.kernel = eagle_step_update_slot_mapping_and_metadata
        self.state = state
        self.builders = builders
        self.cad = harness.common_metadata_for(state)
        self.base_max = state.max_seq_len
        upper = self.cad.seq_lens_cpu_upper_bound
        self.base_upper = None if upper is None else upper.clone()
        n = state.num_reqs
        self.positions, self.seq_lens = state.positions[:n], state.seq_lens[:n]
        self.slots, self.table = state.slot_mapping[:n], state.block_table[:n]
        self.parts: dict[str, list[float]] = {"advance": [], "build": []}

    def reset(self) -> None:
        self.cad.max_seq_len = self.base_max
        if self.base_upper is not None:
            self.cad.seq_lens_cpu_upper_bound.copy_(self.base_upper)

    def advance(self) -> None:
        self.kernel(positions_1d=self.positions, block_table_tensor=self.table,
                    seq_lens=self.seq_lens, block_size=BLOCK, max_model_len=MAX_MODEL_LEN,
                    out_clamped_positions=self.positions, out_slot_mapping=self.slots,
                    input_batch_size=self.state.num_reqs)
        self.cad.max_seq_len = min(self.cad.max_seq_len + 1, MAX_MODEL_LEN)
        if self.cad.seq_lens_cpu_upper_bound is not None:
            self.cad.seq_lens_cpu_upper_bound += 1

    def build(self, index: int) -> list[Any]:
        return [b.build_for_drafting(self.cad, index) for b in self.builders]

    def __call__(self, index: int) -> list[Any]:
        t0 = time.perf_counter()
        self.advance()
        t1 = time.perf_counter()
        out = self.build(index)
        t2 = time.perf_counter()
        self.parts["advance"].append((t1 - t0) * 1e6)
        self.parts["build"].append((t2 - t1) * 1e6)
        return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.9 * len(s)))] if s else float("nan")


# ---------------------------------------------------------------------------------------------
# 2. host and wall time per metadata step, vLLM's own step vs draftmeta's paths
# ---------------------------------------------------------------------------------------------

def _metadata_case(batch: int, k: int, rounds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    state = decode_state(batch, 1024, seed=batch)
    snap = Snapshot(state)
    mla_u, mla_r = _builders("TRITON_MLA", MAX_MODEL_LEN, BLOCK)
    idx_u, idx_r = _builders("INDEXER", MAX_MODEL_LEN, BLOCK)
    vstep = VllmStep(state, [mla_r, idx_r])
    vllm_mla = VllmStep(state, [mla_r])

    def groups(host_bound: str) -> tuple[list[AttentionGroup], Any, Any]:
        cad = harness.common_metadata_for(state)
        mla_meta = mla_u.build_for_drafting(cad, 1)
        idx_meta = idx_u.build_for_drafting(cad, 1)
        mspec = SPECS["TRITON_MLA"](host_bound)
        ispec = SPECS["INDEXER"](host_bound)
        return ([AttentionGroup("mla", SpecBuilder(mspec), mla_meta, lambda s, i: None),
                 AttentionGroup("indexer", SpecBuilder(ispec), idx_meta, lambda s, i: None)],
                (mspec, mla_meta), (ispec, idx_meta))

    eager_groups, _, _ = groups("advance")
    eager = DraftLoop(eager_groups, state, policy=POLICY, host_bound="advance", fused=False)
    fused_groups, _, _ = groups("advance")
    fused = DraftLoop(fused_groups, state, policy=POLICY, host_bound="advance", fused=True)
    _, m, i = groups("advance")
    graph_step = StepGraph(state, [m, i], policy=POLICY, host_bound="advance")
    _, fm, fi = groups("advance")
    fused_step = FusedStep(state, [fm, fi], policy=POLICY, host_bound="advance")
    cap_groups, _, _ = groups("frozen")
    cap_loop = DraftLoop(cap_groups, state, policy=POLICY, host_bound="frozen", fused=True)
    snap.restore()
    captured = cap_loop.capture(lambda i, m: None, k)

    host_meta = [g.metadata for g in eager_groups + fused_groups] + [m[1], i[1], fm[1], fi[1]]
    base_meta_max = [mm.max_seq_len for mm in host_meta]

    def reset() -> None:
        snap.restore()
        vstep.reset()
        vllm_mla.reset()
        for mm, v in zip(host_meta, base_meta_max):
            mm.max_seq_len = v

    paths: dict[str, Callable[[int], Any]] = {
        "vLLM step (advance kernel + MLA build + indexer build)": vstep,
        "vLLM step (advance kernel + MLA build)": vllm_mla,
        "draftmeta eager advance + update": eager.refresh,
        "draftmeta fused step (FusedStep, one Triton launch)": lambda index: fused_step(),
        "draftmeta step graph (StepGraph)": lambda index: graph_step(),
        "draftmeta DraftLoop fused=True (runs a StepGraph)": fused.refresh,
    }
    for name, fn in paths.items():
        host: list[float] = []
        wall: list[float] = []
        for r in range(rounds + 3):
            reset()
            torch.cuda.synchronize()
            t_round = time.perf_counter()
            for index in range(1, k):
                t0 = time.perf_counter()
                fn(index)
                if r >= 3:
                    host.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
            if r >= 3:
                wall.append((time.perf_counter() - t_round) * 1e6 / (k - 1))
        row = {"batch": batch, "k": k, "path": name, "host_median_us": _median(host),
               "host_p90_us": _p90(host), "wall_median_us": _median(wall), "n": len(host)}
        if isinstance(fn, VllmStep):
            n = len(host)
            row["advance_host_median_us"] = _median(fn.parts["advance"][-n:])
            row["build_host_median_us"] = _median(fn.parts["build"][-n:])
        rows.append(row)
    # the captured loop: one replay covers steps 1..K-1
    host, wall = [], []
    for r in range(rounds + 3):
        reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        captured.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if r >= 3:
            host.append((t1 - t0) * 1e6 / (k - 1))
            wall.append((t2 - t0) * 1e6 / (k - 1))
    rows.append({"batch": batch, "k": k, "path": "draftmeta captured loop (replay)",
                 "host_median_us": _median(host), "host_p90_us": _p90(host),
                 "wall_median_us": _median(wall), "n": len(host)})
    log(f"batch {batch}: step graph captures {graph_step.captures}, replays "
        f"{graph_step.replays}, direct launches {graph_step.direct_launches}; DraftLoop's: "
        f"{type(fused._fused).__name__} captures {getattr(fused._fused, 'captures', '-')}, "
        f"replays {getattr(fused._fused, 'replays', '-')}, direct launches "
        f"{getattr(fused._fused, 'direct_launches', '-')}")
    return rows


def metadata_steps(batches: list[int], k: int, rounds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for batch in batches:
        rows += _metadata_case(batch, k, rounds)
    log(f"\n{'path':<58} {'batch':>5} {'host med':>9} {'host p90':>9} {'wall med':>9} "
        f"{'adv':>7} {'build':>7}")
    for r in rows:
        log(f"{r['path']:<58} {r['batch']:>5} {r['host_median_us']:9.1f} {r['host_p90_us']:9.1f} "
            f"{r['wall_median_us']:9.1f} {r.get('advance_host_median_us', float('nan')):7.1f} "
            f"{r.get('build_host_median_us', float('nan')):7.1f}")
    return rows


# ---------------------------------------------------------------------------------------------
# 3. the draft loop with vLLM's Triton MLA decode kernel
# ---------------------------------------------------------------------------------------------

LAYERS: dict[str, dict[str, Any]] = {
    # DeepSeek-V2-Lite: no q LoRA, 16 heads
    "DeepSeek-V2-Lite": {"hidden": 2048, "heads": 16, "q_lora": 0, "nope": 128, "rope": 64,
                         "v": 128, "kv_lora": 512, "vocab": 102400},
    # GLM-5.1 (GLM-5 architecture): q LoRA 2048, 64 heads, nope 192, v 256
    "GLM-5.1": {"hidden": 6144, "heads": 64, "q_lora": 2048, "nope": 192, "rope": 64,
                "v": 256, "kv_lora": 512, "vocab": 154880},
}


class DraftLayer:
    """One MLA draft layer (embedding, RMSNorm, MLA attention in the absorbed form through vLLM's
    Triton decode kernel, output projection, residual, final norm, LM head, greedy argmax).

    The new token's latent KV is written into the paged cache at ``metadata.slot_mapping``; the
    kernel reads ``metadata.decode.block_table`` and ``metadata.decode.seq_lens``. RoPE and the
    MLP/MoE are left out (elementwise / not attention). ``num_kv_splits`` is fixed from
    ``max_model_len`` for every path (a captured graph cannot follow ``max_seq_len``), so all
    paths run bit-identical kernels.
    """

    def __init__(self, dims: dict[str, Any], batch: int, num_blocks: int, seed: int) -> None:
        from vllm.v1.attention.backends.mla.triton_mla import _compute_num_kv_splits
        from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

        self.attn = decode_attention_fwd
        d = dims
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev, bf = "cuda", torch.bfloat16

        def w(*shape: int, scale: float | None = None) -> torch.Tensor:
            s = scale if scale is not None else shape[-2] ** -0.5 if len(shape) > 1 else 1.0
            return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * s).to(bf)

        self.d = d
        self.B = batch
        H, hid, lat = d["heads"], d["hidden"], d["kv_lora"] + d["rope"]
        self.embed = w(d["vocab"], hid, scale=1.0)
        self.norm1 = torch.ones(hid, device=dev, dtype=bf)
        self.norm2 = torch.ones(hid, device=dev, dtype=bf)
        qdim = H * (d["nope"] + d["rope"])
        if d["q_lora"]:
            self.wqa = w(hid, d["q_lora"])
            self.qnorm = torch.ones(d["q_lora"], device=dev, dtype=bf)
            self.wqb = w(d["q_lora"], qdim)
        else:
            self.wq = w(hid, qdim)
        self.wkv = w(hid, lat)
        self.w_uk = w(H, d["nope"], d["kv_lora"])
        self.w_uv = w(H, d["kv_lora"], d["v"])
        self.wo = w(H * d["v"], hid)
        self.lm_head = w(hid, d["vocab"])
        self.cache = (torch.randn(num_blocks, BLOCK, lat, generator=g, device=dev) * 0.5).to(bf)
        self.splits = _compute_num_kv_splits(
            MAX_MODEL_LEN, torch.cuda.get_device_properties(0).multi_processor_count)
        self.logits = torch.empty(batch, H, self.splits, d["kv_lora"] + 1, device=dev,
                                  dtype=torch.float32)
        self.o = torch.empty(batch, H, d["kv_lora"], device=dev, dtype=bf)
        self.lse = torch.empty(batch, H, device=dev, dtype=bf)
        self.one = torch.ones((), device=dev, dtype=torch.float32)
        self.scale = (d["nope"] + d["rope"]) ** -0.5
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=dev)  # the input token
        self.start_tokens = torch.randint(0, d["vocab"], (batch,), generator=g, device=dev)
        self.draft = torch.zeros(batch, 8, dtype=torch.int64, device=dev)

    def reset(self) -> None:
        self.tokens.copy_(self.start_tokens)
        self.draft.zero_()

    def forward(self, index: int, meta: Any) -> None:
        d, B, H = self.d, self.B, self.d["heads"]
        x = self.embed[self.tokens]
        h = F.rms_norm(x, (d["hidden"],), self.norm1)
        if d["q_lora"]:
            q = F.rms_norm(h @ self.wqa, (d["q_lora"],), self.qnorm) @ self.wqb
        else:
            q = h @ self.wq
        q = q.view(B, H, d["nope"] + d["rope"])
        latent = h @ self.wkv
        self.cache.view(-1, latent.shape[-1]).index_copy_(0, meta.slot_mapping[:B], latent)
        q_abs = torch.bmm(q[..., : d["nope"]].transpose(0, 1), self.w_uk).transpose(0, 1)
        q_mla = torch.cat([q_abs, q[..., d["nope"]:]], dim=-1)
        kv = self.cache.unsqueeze(2)
        self.attn(q_mla, kv, kv[..., : d["kv_lora"]], self.o, self.lse,
                  meta.decode.block_table, meta.decode.seq_lens, self.logits, self.splits,
                  self.scale, BLOCK, k_scale=self.one, v_scale=self.one, is_mla=True)
        out = torch.bmm(self.o.transpose(0, 1), self.w_uv).transpose(0, 1).reshape(B, -1)
        x = x + out @ self.wo
        tok = (F.rms_norm(x, (d["hidden"],), self.norm2) @ self.lm_head).argmax(-1)
        self.draft[:, index].copy_(tok)
        self.tokens.copy_(tok)


def draft_loop(layers: list[str], batches: list[int], ks: list[int], rounds: int
               ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for layer_name in layers:
        dims = LAYERS[layer_name]
        for batch in batches:
            state = decode_state(batch, 1024, seed=100 + batch)
            snap = Snapshot(state)
            num_blocks = int(state.block_table.max().item()) + 1
            layer = DraftLayer(dims, batch, num_blocks, seed=batch)
            mla_u, mla_r = _builders("TRITON_MLA", MAX_MODEL_LEN, BLOCK)
            vstep = VllmStep(state, [mla_r])
            for k in ks:
                rows += _draft_loop_case(layer_name, layer, state, snap, vstep, mla_u, batch, k,
                                         rounds)
            del layer
            torch.cuda.empty_cache()
    return rows


def _draft_loop_case(layer_name: str, layer: DraftLayer, state: DraftState, snap: Snapshot,
                     vstep: VllmStep, mla_u: Any, batch: int, k: int, rounds: int
                     ) -> list[dict[str, Any]]:
    def build_meta(policy: str) -> tuple[Any, Any]:
        snap.restore()
        meta = mla_u.build_for_drafting(harness.common_metadata_for(state), 0)
        return meta, SPECS["TRITON_MLA"](policy)

    snap.restore()
    vstep.reset()
    first = vstep.build(0)[0]  # vLLM's metadata for the first draft step

    # (a) eager with vLLM's rebuild per step
    def round_vllm() -> None:
        meta = first
        layer.forward(0, meta)
        for index in range(1, k):
            meta = vstep(index)[0]
            layer.forward(index, meta)

    def loop_round(loop: DraftLoop) -> Callable[[], None]:
        def run() -> None:
            layer.forward(0, loop.groups[0].metadata)
            for index in range(1, k):
                loop.refresh(index)
                layer.forward(index, loop.groups[0].metadata)
        return run

    meta_e, spec_e = build_meta("advance")
    eager = DraftLoop([AttentionGroup("mla", SpecBuilder(spec_e), meta_e, lambda s, i: None)],
                      state, policy=POLICY, host_bound="advance", fused=False)
    meta_f, spec_f = build_meta("advance")
    fused = DraftLoop([AttentionGroup("mla", SpecBuilder(spec_f), meta_f, lambda s, i: None)],
                      state, policy=POLICY, host_bound="advance", fused=True)
    meta_g, spec_g = build_meta("advance")
    graph_step = StepGraph(state, [(spec_g, meta_g)], policy=POLICY, host_bound="advance")
    meta_s, spec_s = build_meta("advance")
    fused_step = FusedStep(state, [(spec_s, meta_s)], policy=POLICY, host_bound="advance")

    def round_direct(step: Callable[[], None], meta: Any) -> Callable[[], None]:
        def run() -> None:
            layer.forward(0, meta)
            for index in range(1, k):
                step()
                layer.forward(index, meta)
        return run

    # (c) the whole K-step loop in one CUDA graph, fused update
    meta_c, spec_c = build_meta("frozen")
    cap_loop = DraftLoop([AttentionGroup("mla", SpecBuilder(spec_c), meta_c, lambda s, i: None)],
                         state, policy=POLICY, host_bound="frozen", fused=True)
    round_c_eager = loop_round(cap_loop)
    side = getattr(torch.cuda, "Stream")()  # noqa: B009
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            snap.restore()
            layer.reset()
            round_c_eager()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    snap.restore()
    layer.reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        round_c_eager()
    hosts = [meta_e, meta_f, meta_g, meta_s]
    host_max = [m.max_seq_len for m in hosts]

    def reset() -> None:
        snap.restore()
        vstep.reset()
        layer.reset()
        for m, v in zip(hosts, host_max):
            m.max_seq_len = v

    paths: dict[str, Callable[[], None]] = {
        "(a) eager + vLLM rebuild": round_vllm,
        "(b) eager + draftmeta update": loop_round(eager),
        "(b) eager + draftmeta fused step (FusedStep)": round_direct(fused_step, meta_s),
        "(b) eager + draftmeta step graph (StepGraph)": round_direct(graph_step, meta_g),
        "(b) eager + DraftLoop fused=True (StepGraph)": loop_round(fused),
        "(c) captured K-step loop (fused update)": graph.replay,
    }
    # same draft tokens: one round of each path from the same start
    tokens: dict[str, torch.Tensor] = {}
    for name, fn in paths.items():
        reset()
        fn()
        torch.cuda.synchronize()
        tokens[name] = layer.draft[:, :k].clone()
    ref = tokens["(a) eager + vLLM rebuild"]
    rows: list[dict[str, Any]] = []
    for name, fn in paths.items():
        for _ in range(3):
            fn()
        reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / rounds
        rows.append({"layer": layer_name, "path": name, "batch": batch, "k": k,
                     "tokens_per_s": batch * k / dt, "us_per_round": dt * 1e6,
                     "same_tokens_as_a": bool(torch.equal(tokens[name], ref))})
    base = rows[0]["tokens_per_s"]
    tags = ["a", "b-upd", "b-fused", "b-graph", "b-loopF", "c"]
    log(f"{layer_name:<17} B={batch:<3} K={k}  " + "  ".join(
        f"{tag}={r['tokens_per_s']:8.0f}{'' if r['same_tokens_as_a'] else ' DIFF'}"
        for tag, r in zip(tags, rows)) + f"  c/a={rows[-1]['tokens_per_s'] / base:.2f}x")
    return rows


def environment() -> dict[str, Any]:
    import triton

    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "vllm": vllm_version(), "cpu_count": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "policy": POLICY, "block_size": BLOCK, "max_model_len": MAX_MODEL_LEN,
            "context": "1024..1087 tokens per request at the first draft step"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help=f"{OUT_HELP}; writes draft-loop-h200.json")
    ap.add_argument("--force", action="store_true",
                    help="replace the draft-loop-h200.json already in --out")
    ap.add_argument("--parts", default="equivalence,metadata_steps,draft_loop")
    ap.add_argument("--equivalence-batches", type=int, default=100)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--ks", default="1,2,3,4,5")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--layers", default="DeepSeek-V2-Lite,GLM-5.1")
    args = ap.parse_args()
    existing = args.out / "draft-loop-h200.json"  # a device run's fresh $OUT holds none
    if existing.exists() and not args.force:
        ap.exit(2, f"{existing} exists; name another --out, or pass --force to replace "
                "it\n")
    parts = args.parts.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    RESULTS["environment"] = environment()
    RESULTS["command"] = " ".join(sys.argv)
    log(json.dumps(RESULTS["environment"]))
    if "equivalence" in parts:
        guarded("equivalence", lambda: equivalence(args.equivalence_batches))
    if "metadata_steps" in parts:
        guarded("metadata_steps", lambda: metadata_steps([1, 16, 64], 5, 4 * args.rounds))
    if "draft_loop" in parts:
        guarded("draft_loop", lambda: draft_loop(
            args.layers.split(","), batches, [int(k) for k in args.ks.split(",")], args.rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "draft-loop-h200.json"
    path.write_text(json.dumps(RESULTS, indent=1) + "\n")
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
