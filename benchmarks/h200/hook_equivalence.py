"""On the H200: draftmeta's hooks for Hopper's MLA builders against vLLM 0.34's own rebuild.

For ``FLASH_ATTN_MLA``, ``FLASHMLA`` (bf16 and FP8 KV cache) and ``TRITON_MLA``, built by
vLLM's real builders on CUDA with full CUDA graphs configured (the persistent scheduler buffers
the captured kernels read), over random decode batches (1 to 64 requests, mixed lengths near
block boundaries and the context limit, every 4th batch placed so that each request, under DCP
each rank's share, enters a new 256-token tile of the kernels' schedulers at the first step;
K = 2..8):

1. **update == rebuild**: build at draft step 1; at every later step advance the draft state
   (clamp, frozen host bound: what vLLM's fused loop does), run draftmeta's hook (the spec the
   plugin binds to the builder), and compare field by field with a second builder's fresh
   build from a copy of the state. FA3's scheduler metadata is a kernel's output, compared
   exactly; FlashMLA's scheduler object is compared as an object, and then *used*: FlashMLA's
   decode kernel runs on random queries and cache with the updated and with the rebuilt
   metadata, and the outputs must be equal.
2. **inside a captured graph**: the hook (and, for FlashMLA, the decode kernel after it) is
   captured once in a CUDA graph, the state advanced on the device, the graph replayed, and
   the result compared with an eager rebuild at the new lengths: what vLLM's fused draft loop
   relies on.
3. **negative controls**: the same checks with the scheduler left ``Unchanged``, on batches
   whose requests enter a new scheduler tile at the first step, must fail wherever the right
   schedule changed in the loop: every FlashMLA control; for FA3 each control whose rebuilt
   schedule differs from the first (one request, or requests all crossing together, can keep
   FA3's splits and order, and a stale schedule is then right), and at least one must.

Run on the H200 with vLLM 0.34 on the path (``.h200/run.sh install`` then
``. /root/vllm034/env.sh``):  ``python3 benchmarks/h200/hook_equivalence.py --out $OUT``.
Prints one line per builder and writes ``hook-equivalence.json``; exit 1 on any mismatch or an
uncaught negative control. ``--dcp N``: the same under decode context parallelism, each batch for
one rank of a stand-in group of N (the rebuild's local lengths from vLLM's own function); writes
``hook-equivalence-dcpN.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_cuda import use_cuda

harness = use_cuda()

from draftmeta.advance import advance_state  # noqa: E402
from draftmeta.arguments import DEFAULT_OUT, OUT_HELP  # noqa: E402
from draftmeta.integrations.vllm.catalogue import current_release  # noqa: E402
from draftmeta.rules import Unchanged  # noqa: E402
from draftmeta.spec import DraftSpec  # noqa: E402
from draftmeta.testing import compare_metadata, random_state  # noqa: E402
from draftmeta.testing.states import state_for_lengths  # noqa: E402

BUILDERS = (("FLASH_ATTN_MLA", "auto"), ("FLASHMLA", "auto"), ("FLASHMLA", "fp8"),
            ("TRITON_MLA", "auto"))
CONTROLS = 6  # negative-control batches per builder
CROSSING_EVERY = 4  # every 4th regular batch crosses a scheduler tile at the loop's first step
TILE = 256
"""A multiple of every power-of-two tile of the kernels' schedulers (FlashMLA's 64-token
blocks, FA3's n-blocks): a length that is a multiple of it enters a new tile of each of them at
the next step (``ceil(length / tile)`` goes up by one)."""
HEADS = 4  # query heads of the FlashMLA kernel check: the harness model's, as its builder has


def make_config(max_model_len: int, block_size: int, kv_cache_dtype: str, dcp_world: int = 1,
                interleave: int = 1) -> Any:
    from vllm.config.compilation import CUDAGraphMode

    config = harness.make_vllm_config(max_model_len=max_model_len, block_size=block_size,
                                      max_num_seqs=64, dcp_world_size=dcp_world,
                                      dcp_interleave=interleave)
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    config.compilation_config.max_cudagraph_capture_size = 64
    config.cache_config.cache_dtype = kv_cache_dtype
    return config


def fa3_read_entries(schedule: torch.Tensor, batch: int) -> torch.Tensor:
    """The entries of FA3's scheduler metadata that its kernels read.

    FA3 (``hopper/flash_api.cpp``, ``mha_fwd_get_scheduler_metadata``) lays the metadata out as
    prepared vectors of ``round_up(batch, 4)`` entries each (dynamic splits, m-blocks, batch
    order, head swizzle), then the tile-count semaphore; each vector's entries past ``batch``
    are rounding padding that FA3 allocates with ``torch::empty`` and never writes or reads, in
    vLLM's own rebuild as much as here. Those are left out of the comparison; everything else
    is compared exactly.
    """
    rounded = -(-batch // 4) * 4
    n = schedule.shape[0]
    if n == 1 or (n - 1) % rounded:
        raise ValueError(f"FA3 scheduler metadata of {n} entries for batch {batch}: not the "
                         f"layout this check knows (vectors of {rounded}, then a semaphore)")
    index = [v * rounded + i for v in range((n - 1) // rounded) for i in range(batch)]
    return schedule[torch.tensor([*index, n - 1], device=schedule.device)]


def fa3_schedule(metadata: Any, batch: int) -> torch.Tensor:
    """A copy of the entries of ``metadata``'s FA3 schedule that the kernel reads."""
    return fa3_read_entries(metadata.decode.scheduler_metadata, batch).clone()


FP8_TILES = "decode.scheduler_metadata.tile_scheduler_metadata"
FP8_TILE_FIELDS = 5
"""FlashMLA's FP8 tile metadata rows have 8 slots (TileSchedulerMetaDataSize); its scheduler
kernel writes the first 5 (begin/end request and block, first split) and leaves 5..7 as
``torch.empty`` gave them, in vLLM's rebuild as here; its decode kernel reads the first 5."""


def compare(metadata: Any, rebuilt: Any, name: str, batch: int) -> list[str]:
    """Field by field; FA3's scheduler and FlashMLA's FP8 tiles on the entries kernels read."""
    if name == "FLASHMLA":
        found = [str(m) for m in compare_metadata(metadata, rebuilt,
                                                  ignore=lambda p: p == FP8_TILES)]
        sched, other = metadata.decode.scheduler_metadata, rebuilt.decode.scheduler_metadata
        ours = getattr(sched, "tile_scheduler_metadata", None)
        theirs = getattr(other, "tile_scheduler_metadata", None)
        if ours is None or theirs is None:
            return found if ours is theirs else [*found, f"{FP8_TILES}: one side is None"]
        if ours.shape != theirs.shape or not torch.equal(ours[:, :FP8_TILE_FIELDS],
                                                         theirs[:, :FP8_TILE_FIELDS]):
            found.append(f"{FP8_TILES}: the {FP8_TILE_FIELDS} fields its kernel reads differ")
        return found
    if name != "FLASH_ATTN_MLA":
        return [str(m) for m in compare_metadata(metadata, rebuilt)]
    path = "decode.scheduler_metadata"
    found = [str(m) for m in compare_metadata(metadata, rebuilt, ignore=lambda p: p == path)]
    ours, theirs = metadata.decode.scheduler_metadata, rebuilt.decode.scheduler_metadata
    if ours.shape != theirs.shape:
        return [*found, f"{path}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"]
    a, b = fa3_read_entries(ours, batch), fa3_read_entries(theirs, batch)
    if not torch.equal(a, b):
        differ = int((a != b).sum())
        found.append(f"{path}: {differ} of the {a.numel()} entries the kernel reads differ")
    return found


def stale(spec: DraftSpec[Any]) -> DraftSpec[Any]:
    """``spec`` with every scheduler field left unchanged: the negative control."""
    rules = {p: r for p, r in spec.rules.items() if not p.startswith("decode.scheduler_metadata")}
    rules["decode.scheduler_metadata"] = Unchanged()
    nested = {p: c for p, c in spec.nested.items() if not p.startswith("decode.scheduler")}
    return DraftSpec(spec.cls, rules, name=f"{spec.name}.stale", preconditions=spec.preconditions,
                     nested=nested, dtypes=spec.dtypes, attributes=spec.attributes)


class FlashMLAKernel:
    """FlashMLA's dense decode on random queries over a random paged cache."""

    def __init__(self, state: Any, block_size: int, fp8: bool, g: torch.Generator) -> None:
        num_blocks = int(state.block_table.max()) + 1
        self.fp8 = fp8
        cache = torch.randn(num_blocks, block_size, 1, 576, generator=g, device="cuda",
                            dtype=torch.bfloat16) / 4
        self.cache = cache.to(torch.float8_e4m3fn) if fp8 else cache
        b = state.seq_lens.shape[0]
        q = torch.randn(b, 1, HEADS, 576, generator=g, device="cuda", dtype=torch.bfloat16) / 4
        # with an FP8 cache vLLM quantizes the query too (MLA's supports_quant_query_input)
        self.q = q.to(torch.float8_e4m3fn) if fp8 else q
        self.scale = 576 ** -0.5

    def __call__(self, metadata: Any) -> torch.Tensor:
        decode = metadata.decode
        sched = decode.scheduler_metadata
        if self.fp8:
            from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache_fp8

            one = torch.ones(1, device="cuda", dtype=torch.float32)
            out, _ = flash_mla_with_kvcache_fp8(
                self.q, self.cache, decode.block_table, decode.seq_lens, 512,
                sched.tile_scheduler_metadata, sched.num_splits, softmax_scale=self.scale,
                causal=True, descale_q=one, descale_k=one)
        else:
            from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache

            out, _ = flash_mla_with_kvcache(
                self.q, self.cache, decode.block_table, decode.seq_lens, 512, sched,
                softmax_scale=self.scale, causal=True)
        return out.clone()


def crossing_lengths(g: torch.Generator, batch: int, max_model_len: int, steps: int,
                     dcp_world: int = 1, rank: int = 0, interleave: int = 1) -> torch.Tensor:
    """Context lengths at which every request's length (under DCP: this rank's share, by
    vLLM's own function) is a multiple of :data:`TILE` and grows at the loop's first advance:
    every request enters a new tile of the kernel's scheduler there, so a schedule left stale
    may differ from the rebuild's from the first step on."""
    lengths = torch.arange(TILE, max_model_len - steps + 1, dtype=torch.int32)
    if dcp_world == 1:
        local, after = lengths, lengths + 1
    else:
        local = harness.dcp_local_seq_lens(lengths, dcp_world, rank, interleave)
        after = harness.dcp_local_seq_lens(lengths + 1, dcp_world, rank, interleave)
    fits = lengths[(local % TILE == 0) & (local > 0) & (after == local + 1)]
    if not len(fits):
        raise ValueError(f"no length up to {max_model_len - steps} lets rank {rank} of "
                         f"{dcp_world} enter a new {TILE}-token tile: raise max_model_len")
    return fits[torch.randint(len(fits), (batch,), generator=g)]


def check_case(name: str, kv: str, seed: int, *, wrong: bool, dcp_world: int = 1
               ) -> dict[str, Any]:
    """One random batch; under DCP (``dcp_world`` > 1) for rank ``seed % dcp_world`` of a
    stand-in group, interleave 1 or 8, the rebuild's local lengths from vLLM's function.
    Negative controls and every :data:`CROSSING_EVERY`-th batch cross a scheduler tile at the
    first step (:func:`crossing_lengths`); the others mix lengths as ``random_state`` does."""
    rank = seed % dcp_world
    interleave = 1 if (seed // dcp_world) % 2 == 0 else 8
    g = torch.Generator().manual_seed(seed)
    pick = lambda opts: opts[int(torch.randint(len(opts), (1,), generator=g))]  # noqa: E731
    batch = pick([1, 1, 2, 3, 7, 16, 31, 64])
    steps = int(torch.randint(2, 9, (1,), generator=g))
    block_size = 64 if name == "FLASHMLA" else pick([16, 64])
    max_model_len = pick([256, 1000, 4096])
    # a stale schedule shows only where a length crosses one of the kernel's tiles during the
    # loop, which random lengths do now and then (and under DCP a rank's share grows N times
    # slower): the controls, and some regular batches, are placed to cross one
    crossing = wrong or seed % CROSSING_EVERY == CROSSING_EVERY - 1
    if crossing:
        max_model_len = 4096
    dcp = dcp_world > 1
    config = make_config(max_model_len, block_size, kv, dcp_world, interleave)
    updater = harness.make_builder(name, config, block_size=block_size, device="cuda",
                                   dcp_rank=rank)
    rebuilder = harness.make_builder(name, config, block_size=block_size, device="cuda",
                                     dcp_rank=rank)
    spec = current_release().entry(name).make_spec(host_bound="frozen", builder=updater,
                                                   dcp=dcp)
    if wrong:
        spec = stale(spec)
    if crossing:
        state = state_for_lengths(g, crossing_lengths(g, batch, max_model_len, steps, dcp_world,
                                                      rank, interleave),
                                  block_size=block_size, max_model_len=max_model_len,
                                  device="cuda")
    else:
        state = random_state(g, batch_size=batch, block_size=block_size,
                             max_model_len=max_model_len, steps=steps, device="cuda")
    if dcp:
        state.dcp_world_size, state.dcp_rank, state.dcp_interleave = dcp_world, rank, interleave
        state.dcp_local_seq_lens = harness.dcp_local_seq_lens(state.seq_lens, dcp_world, rank,
                                                              interleave)

    def build(builder: Any, s: Any) -> Any:
        if dcp and builder is rebuilder:  # its local lengths from vLLM, into a copy
            s = s.clone()
            s.dcp_local_seq_lens = harness.dcp_local_seq_lens(s.seq_lens, dcp_world, rank,
                                                              interleave)
        return harness.build_metadata(builder, harness.common_metadata_for(s))

    metadata = build(updater, state)
    kernel = (FlashMLAKernel(state, block_size, kv == "fp8", torch.Generator("cuda")
                             .manual_seed(seed)) if name == "FLASHMLA" else None)
    mismatches: list[str] = []
    if kernel is not None:
        kernel(metadata)  # step 1's attention fills the scheduler object, as in the engine
    # FA3's schedule at step 1, to tell whether the right one ever changes in this loop (a
    # schedule left stale is only wrong, and a control only informative, where it does)
    first = fa3_schedule(metadata, batch) if name == "FLASH_ATTN_MLA" else None
    changed = False

    def schedule_changed(rebuilt: Any) -> bool:
        """Whether the rebuild's FA3 schedule differs from the first (False where not FA3)."""
        if first is None:
            return False
        now = fa3_schedule(rebuilt, batch)
        return now.shape != first.shape or not torch.equal(now, first)

    for step in range(2, steps + 1):
        advance_state(state, "clamp", "frozen")
        spec.update(metadata, state)
        rebuilt = build(rebuilder, state.clone())
        changed |= schedule_changed(rebuilt)
        mismatches += [f"step {step} {m}" for m in compare(metadata, rebuilt, name, batch)]
        if kernel is not None:
            a, b = kernel(metadata), kernel(rebuilt)
            if not torch.equal(a, b):
                diff = (a.float() - b.float()).abs().max().item()
                mismatches.append(f"step {step} FlashMLA output differs (max {diff:.3g})")
    # inside a captured graph: capture the hook (and the kernel), advance, replay
    captured = "-"
    if name != "TRITON_MLA" and (steps >= 3 or wrong):  # TRITON_MLA's hook launches nothing
        graph = torch.cuda.CUDAGraph()
        out: list[torch.Tensor] = []
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            spec.update(metadata, state)  # warm-up outside capture
            if kernel is not None:
                kernel(metadata)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            spec.update(metadata, state)
            if kernel is not None:
                out.append(kernel(metadata))
        advance_state(state, "clamp", "frozen")
        graph.replay()
        torch.cuda.synchronize()
        rebuilt = build(rebuilder, state.clone())
        changed |= schedule_changed(rebuilt)
        if kernel is not None:
            expected = kernel(rebuilt)
            ok = torch.equal(out[0], expected)
            captured = "kernel output equal" if ok else "kernel output DIFFERS"
        else:
            ok = not compare(metadata, rebuilt, name, batch)
            captured = "scheduler equal" if ok else "scheduler DIFFERS"
        if not ok:
            mismatches.append(f"after replay: {captured}")
    return {"builder": name, "kv_cache_dtype": kv, "seed": seed, "batch": batch,
            "steps": steps, "block_size": block_size, "max_model_len": max_model_len,
            "dcp_world_size": dcp_world, "dcp_rank": rank, "dcp_interleave": interleave,
            "crosses_a_tile": crossing, "fa3_schedule_changed": changed if first is not None
            else None, "wrong_spec": wrong, "mismatches": mismatches[:5],
            "captured": captured}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="random batches per builder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"{OUT_HELP}; writes hook-equivalence.json")
    parser.add_argument("--force", action="store_true",
                        help="replace the hook-equivalence.json already in --out")
    parser.add_argument("--dcp", type=int, default=1,
                        help="decode context parallelism: DCP world size of a stand-in group "
                        "(each batch for rank seed %% world, interleave 1 or 8; default 1: "
                        "off); writes hook-equivalence-dcpN.json")
    args = parser.parse_args()
    stem = "hook-equivalence" + (f"-dcp{args.dcp}" if args.dcp > 1 else "")
    existing = args.out / f"{stem}.json"  # a device run's fresh $OUT holds none
    if existing.exists() and not args.force:
        parser.exit(2, f"{existing} exists; name another --out, or pass --force to replace "
                    "it\n")
    import vllm

    print(f"vLLM {vllm.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    results: list[dict[str, Any]] = []
    failed = False
    for name, kv in BUILDERS:
        start = time.perf_counter()
        try:
            cases = [check_case(name, kv, seed, wrong=False, dcp_world=args.dcp)
                     for seed in range(args.batches)]
            # TRITON_MLA has no scheduler to leave stale: no negative control
            controls = ([] if name == "TRITON_MLA" else
                        [check_case(name, kv, seed, wrong=True, dcp_world=args.dcp)
                         for seed in range(CONTROLS)])
        except Exception as exc:  # report the builder, go on with the next
            print(f"{name} {kv}: ERROR {type(exc).__name__}: {exc}", flush=True)
            results.append({"builder": name, "kv_cache_dtype": kv,
                            "error": f"{type(exc).__name__}: {exc}"})
            failed = True
            continue
        bad = [c for c in cases if c["mismatches"]]
        caught = sum(1 for c in controls if c["mismatches"])
        # every control enters a new scheduler tile at its first step; FlashMLA's schedule
        # then changes, FA3's may not (one request, or all crossing together, keep its splits
        # and order): each control whose right schedule changed must be caught, and one must
        informative = [c for c in controls if c["fa3_schedule_changed"] is not False]
        missed = sum(1 for c in informative if not c["mismatches"])
        changed = sum(1 for c in cases if c["fa3_schedule_changed"])
        steps = sum(c["steps"] - 1 for c in cases)
        replays = [c["captured"] for c in cases if c["captured"] != "-"]
        crossing = sum(1 for c in cases if c["crosses_a_tile"])
        schedule = (f", FA3's schedule changed within {changed}"
                    if name == "FLASH_ATTN_MLA" else "")
        control_note = (f" (FA3's schedule changed in {len(informative)}: {missed} of those "
                        "missed)" if name == "FLASH_ATTN_MLA" else "")
        print(f"{name} {kv}: {len(cases)} batches ({crossing} crossing a tile at the first "
              f"step{schedule}), {steps} updated steps, {len(bad)} mismatched; "
              f"captured+replayed {len(replays)} "
              f"({sum('equal' in r for r in replays)} equal); negative control caught "
              f"{caught}/{len(controls)}{control_note} ({time.perf_counter() - start:.0f} s)",
              flush=True)
        for c in bad[:3]:
            print(f"   mismatch: {c}", flush=True)
        failed |= bool(bad) or missed > 0 or bool(controls and not informative)
        results.append({"builder": name, "kv_cache_dtype": kv, "batches": len(cases),
                        "updated_steps": steps, "mismatched": len(bad),
                        "crossing_a_tile": crossing,
                        "replayed": len(replays),
                        "replayed_equal": sum("equal" in r for r in replays),
                        "negative_control_caught": caught, "negative_controls": len(controls),
                        "negative_controls_informative": len(informative),
                        "fa3_schedule_changed": changed if name == "FLASH_ATTN_MLA" else None,
                        "cases": cases, "controls": controls})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    print("hook equivalence:", "FAILED" if failed else "all equal, negative controls caught")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
