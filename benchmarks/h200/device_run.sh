#!/usr/bin/env bash
# Everything issue 12 runs on the H200, in one device call (run from the repository root):
#   set -o pipefail; bash benchmarks/h200/device_run.sh
# Needs the carry made by benchmarks/h200/make_carry.sh in .h200carry/ (named in the call's
# carry). Writes its logs and JSON under $OUT: h200-draft-loop.log + draft-loop-h200.json
# (benchmarks/h200/run_h200.py), h200-pytest.log (CUDA tests), h200-verify.log and
# bench/bench-cuda.* (draftmeta verify / bench on CUDA, without vLLM on the path).
set -u
CARRY=${CARRY:-.h200carry}
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"

# 1. vLLM 0.33's Python code and the cp312 wheels it imports, unpacked into $HOME/vllm-site
bash "$CARRY/vllm/install.sh" && rm -rf "$HOME/vllm-site/draftmeta"   # draftmeta: this tree's
( export PYTHONPATH=$PWD:$HOME/vllm-site VLLM_TARGET_DEVICE=cuda HF_HUB_OFFLINE=1 \
    VLLM_CACHE_ROOT=$PWD/$CARRY/vllm-cache TVM_FFI_DISABLE_TORCH_C_DLPACK=1 \
    VLLM_LOGGING_LEVEL=CRITICAL
  timeout "${RUN_TIMEOUT:-300}" python3 benchmarks/h200/run_h200.py --out "$OUT" \
    --equivalence-batches "${EQ_BATCHES:-60}" 2>&1 | tee "$OUT/h200-draft-loop.log" )

# 2. the CUDA tests and draftmeta's own CUDA verify and bench (no vLLM on the path)
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  tests/test_step_graph.py 2>&1 | tee "$OUT/h200-pytest.log"
timeout 60 python3 -m draftmeta verify --device cuda --batches 50 2>&1 | tee "$OUT/h200-verify.log"
timeout "${BENCH_TIMEOUT:-80}" python3 -m draftmeta bench --device cuda --quiet \
  --out "$OUT/bench" 2>&1 | tail -40
