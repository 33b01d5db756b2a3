#!/usr/bin/env bash
# On the H200, after the five-part carry of ../shared/tools/vllm-engine-on-h200/ is installed
# (`bash .h200/run.sh install`): the GPU runs of issue 20, each stage under its own timeout,
# logs and JSON under $OUT. Run from the repository root; this tree's draftmeta is imported
# (PYTHONPATH), the carried wheel only supplies vLLM's plugin entry point.
#   bash benchmarks/h200/engine_run.sh STAGE...
# Stages:
#   equivalence  draftmeta audit --device cuda --negative-control: every draft hook whose builder
#                constructs on the GPU (vLLM's and draftmeta's) against vLLM's rebuild, idempotent
#                and equal at the first step, captured and replayed; audit-vllm-*-cuda.json
#   hopper       draftmeta e2e --device cuda: FLASH_ATTN_MLA, FLASHMLA, tiny model,
#                K = 2 3 4, batch 1 and 8, and the negative control
#   fp8          FLASHMLA with an FP8 KV cache, tiny model, K = 3
#   cudatests    the CUDA tests of the suite (tests/test_cuda.py, step graph, loop, codegen)
#   override     TRITON_MLA: vLLM's own hook against draftmeta's in its place, K = 3
#   large        the DeepSeek-V3-sized model: FLASH_ATTN_MLA, FLASHMLA, K = 3, batch 1 and 8
#   k1           K = 1 (no draft loop: the plugin has nothing to do), tiny model
#   eager        engines without CUDA graphs (--eager: every draft loop on the host), tiny
#                model, BACKENDS (default FLASH_ATTN_MLA FLASHMLA), K = KS (default 2 3 4)
#   pluginlog    plugin_log.py: vLLM's default multiprocess engine, the plugin loaded by vLLM
#                itself, on and off: draftmeta's line in vLLM's log (KS for `large`: KS="1 2 4")
#   dcp          hook_equivalence.py --dcp 2 and --dcp 4: the hooks under decode context
#                parallelism, builders made for one rank of a stand-in DCP group (vLLM's direct
#                symmetric-memory gathers off: the stand-in has no process group to probe)
#   flashinfer   flashinfer_probe.py: whether vLLM can use FLASHINFER_MLA here (FlashInfer is
#                not carried; vLLM 0.34 declares the backend for compute capability 10.x only)
# Production depth and the limit (issues 34, 45; vLLM's INFO lines kept in each log, tqdm
# bars left out; every row with the GPU's busy time and the limit, an A/A pair where no K = 1
# runs):
#   trained      the trained model (its checkpoint, vLLM's default loader): FLASH_ATTN_MLA and
#                FLASHMLA, K = 3, batch 1 and 8, plugin off vs on, and the negative controls
#                (each backend's scheduler left stale; FlashMLA's judged where a loop crossed a
#                tile)
#   trainedcheck vLLM 0.34 computes what the training code computes
#                (tests/test_trained_model_vllm.py)
#   tinyk3       the tiny model's K = 3 rows, PAIRS (default 2) fresh engine pairs, batch 1 8,
#                and the negative controls
#   v3rank       one rank of DeepSeek-V3 under TP8 (61 layers, FP8; an H200): BACKENDS (default
#                FLASH_ATTN_MLA), KS (default 3), batch 1 8 32, PAIRS (default 3) pairs
#   v2lite       the Moonlight-shaped MLA MoE: BACKENDS (default FLASH_ATTN_MLA FLASHMLA), K = 3,
#                batch 1 and 16, PAIRS (1)
#   glm          GLM-4.7-Flash's published config.json (benchmarks/models/glm-4.7-flash, 47
#                layers, 30 billion parameters) with dummy weights through --model PATH:
#                FLASH_ATTN_MLA, K = 3, batch 1 and 16, one engine at a time on an H100
set -u
. /root/vllm034/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
REPEATS=${REPEATS:-5}
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv,noheader
e2e() {  # NAME TIMEOUT ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m draftmeta e2e --device cuda --repeats "$REPEATS" \
    --out "$OUT/$name" "$@" 2>&1 | grep -v -e "^INFO" -e "^WARNING.*deprecated" \
    | tee "$OUT/h200-e2e-$name.log"
  echo "== e2e $name rc ${PIPESTATUS[0]}"
}
e2e_info() {  # NAME TIMEOUT ARGS...: e2e with vLLM's INFO lines in the log
  local name=$1 limit=$2; shift 2
  VLLM_LOGGING_LEVEL=INFO timeout "$limit" python3 -m draftmeta e2e --device cuda \
    --repeats "$REPEATS" --out "$OUT/$name" "$@" 2>&1 | grep --line-buffered -v "it/s\]" \
    | tee "$OUT/h200-e2e-$name.log"
  echo "== e2e $name rc ${PIPESTATUS[0]}"
}
for stage in "$@"; do
  case $stage in
    equivalence)
      timeout "${EQ_TIMEOUT:-560}" python3 -m draftmeta audit --device cuda --negative-control \
        --batches "${EQ_BATCHES:-16}" --out "$OUT" 2>&1 | grep -v -e "^INFO" -e "^(MainProcess" \
        | tee "$OUT/h200-audit-cuda.log"
      echo "== equivalence rc ${PIPESTATUS[0]}";;
    hopper) e2e hopper "${HOPPER_TIMEOUT:-560}" --backends FLASH_ATTN_MLA FLASHMLA \
              --ks ${KS:-2 3 4} --negative-control;;
    fp8) e2e fp8 "${FP8_TIMEOUT:-150}" --backends FLASHMLA --ks 3 --kv-cache-dtype fp8;;
    cudatests)
      # without vLLM on the path, as CI's CUDA-free runs are split (the harness would hide CUDA)
      PYTHONPATH=$PWD timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -rs -p no:cacheprovider \
        tests/test_cuda.py tests/test_step_graph.py tests/test_loop.py tests/test_codegen.py \
        2>&1 | tail -25 | tee "$OUT/h200-pytest.log"
      echo "== pytest rc ${PIPESTATUS[0]}";;
    override) e2e override "${OVERRIDE_TIMEOUT:-200}" --backends TRITON_MLA --ks 3;;
    large) e2e large "${LARGE_TIMEOUT:-400}" --models large \
             --backends FLASH_ATTN_MLA FLASHMLA --ks ${KS:-3};;
    k1) e2e k1 "${K1_TIMEOUT:-200}" --backends FLASH_ATTN_MLA FLASHMLA --ks 1;;
    eager) e2e "eager${EAGER_NAME:-}" "${EAGER_TIMEOUT:-560}" --eager \
             --backends ${BACKENDS:-FLASH_ATTN_MLA FLASHMLA} --ks ${KS:-2 3 4};;
    dcp)
      for w in 2 4; do
        VLLM_USE_DIRECT_DCP_KV_GATHER=0 VLLM_USE_DIRECT_DCP_Q_GATHER=0 timeout 220 python3 \
          benchmarks/h200/hook_equivalence.py --batches "${EQ_BATCHES:-16}" --dcp $w --out "$OUT" \
          2>&1 | grep -v -e "^(MainProcess" -e "^INFO" -e "^W1204" -e "fa_utils" \
          | tee "$OUT/h200-hook-equivalence-dcp$w.log"
      done;;
    flashinfer)
      timeout 120 python3 benchmarks/h200/flashinfer_probe.py 2>&1 | grep -v "^INFO" \
        | tee "$OUT/h200-flashinfer-probe.log";;
    pluginlog)
      timeout "${LOG_TIMEOUT:-300}" python3 benchmarks/h200/plugin_log.py --out "$OUT" 2>&1 \
        | tail -40
      echo "== pluginlog rc ${PIPESTATUS[0]}";;
    trained) e2e_info trained "${TRAINED_TIMEOUT:-300}" --models trained \
               --backends FLASH_ATTN_MLA FLASHMLA --ks 3 --batch-sizes 1 8 --negative-control;;
    trainedcheck)
             timeout "${CHECK_TIMEOUT:-200}" python3 -m pytest -q -rs \
               -p no:cacheprovider tests/test_trained_model_vllm.py 2>&1 \
               | tee "$OUT/h200-trained-check.log"
             echo "== trained check rc ${PIPESTATUS[0]}";;
    tinyk3) e2e_info tiny-k3 "${TINY_TIMEOUT:-400}" --backends FLASH_ATTN_MLA FLASHMLA \
              --negative-control --ks 3 --batch-sizes 1 8 --pairs "${PAIRS:-2}";;
    v3rank) e2e_info "v3rank${NAME:-}" "${V3_TIMEOUT:-580}" --models v3-rank \
              --backends ${BACKENDS:-FLASH_ATTN_MLA} --ks ${KS:-3} --batch-sizes 1 8 32 \
              --pairs "${PAIRS:-3}" --max-tokens "${MAX_TOKENS:-128}";;
    v2lite) e2e_info "v2lite${NAME:-}" "${V2_TIMEOUT:-580}" --models v2-lite \
              --backends ${BACKENDS:-FLASH_ATTN_MLA FLASHMLA} --ks ${KS:-3} \
              --batch-sizes 1 16 --pairs "${PAIRS:-1}" --max-tokens "${MAX_TOKENS:-128}";;
    glm) e2e_info "glm${NAME:-}" "${GLM_TIMEOUT:-580}" --model benchmarks/models/glm-4.7-flash \
           --dummy-weights --max-model-len 1024 --backends ${BACKENDS:-FLASH_ATTN_MLA} \
           --ks ${KS:-3} --batch-sizes 1 16 --max-tokens "${MAX_TOKENS:-128}";;
    *) echo "unknown stage $stage"; exit 2;;
  esac
done
ls -R "$OUT"
# the Markdown and PNG are made again here from the JSON (a call brings back 8 files at most)
rm -f "$OUT"/*/e2e-cuda*.md "$OUT"/*/e2e-cuda*.png
