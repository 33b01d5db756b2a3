#!/usr/bin/env bash
# Everything issue 12 runs on the H200, in one device call (run from the repository root):
#   set -o pipefail; bash benchmarks/h200/device_run.sh
# Needs the carry made by benchmarks/h200/make_carry.sh in .h200carry/ (named in the call's
# carry). Writes its logs and JSON under $OUT (8 files, the most a call brings back):
# h200-pytest.log (the tests that run on CUDA, then again with vLLM on the path), h200-verify.log, h200-bench.log and
# bench/bench-cuda.{json,md,png} (draftmeta verify / bench on CUDA, without vLLM on the path),
# then h200-draft-loop.log + draft-loop-h200.json (benchmarks/h200/run_h200.py, vLLM 0.33's code).
# Each part runs under its own timeout; a failing part does not stop the next one.
set -u
CARRY=${CARRY:-.h200carry}
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"

# 1. the tests that run on CUDA, draftmeta's own CUDA verify and bench (no vLLM on the path)
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py \
  tests/test_step_graph.py tests/test_loop.py tests/test_codegen.py tests/test_rule_lowering.py \
  tests/test_check_spec.py tests/test_atomicity.py 2>&1 | tee "$OUT/h200-pytest.log"
echo "== pytest rc ${PIPESTATUS[0]}"
timeout "${VERIFY_TIMEOUT:-75}" python3 -m draftmeta verify --device cuda --batches 50 2>&1 \
  | tee "$OUT/h200-verify.log"
echo "== verify rc ${PIPESTATUS[0]}"
timeout "${BENCH_TIMEOUT:-120}" python3 -m draftmeta bench --device cuda --quiet \
  --out "$OUT/bench" 2>&1 | tee "$OUT/h200-bench.log"
echo "== bench rc ${PIPESTATUS[0]}"

# 2. vLLM 0.33's Python code and the cp312 wheels it imports, unpacked into $HOME/vllm-site,
#    then the draft-loop benchmark against vLLM's own builders and Triton MLA decode kernel
bash "$CARRY/vllm/install.sh" && rm -rf "$HOME/vllm-site/draftmeta"   # draftmeta: this tree's
( export PYTHONPATH=$PWD:$HOME/vllm-site VLLM_TARGET_DEVICE=cuda HF_HUB_OFFLINE=1 \
    VLLM_CACHE_ROOT=$PWD/$CARRY/vllm-cache TVM_FFI_DISABLE_TORCH_C_DLPACK=1 \
    VLLM_LOGGING_LEVEL=CRITICAL
  timeout "${VLLM_TEST_TIMEOUT:-150}" python3 -m pytest -q -rs -p no:cacheprovider \
    tests/test_loop.py tests/test_golden.py tests/test_atomicity.py 2>&1 \
    | grep -v "fa_utils.py" | tee -a "$OUT/h200-pytest.log"
  echo "== pytest with vLLM rc ${PIPESTATUS[0]}"
  timeout "${RUN_TIMEOUT:-200}" python3 benchmarks/h200/run_h200.py --out "$OUT" \
    --equivalence-batches "${EQ_BATCHES:-60}" 2>&1 | grep -v "fa_utils.py" \
    | tee "$OUT/h200-draft-loop.log"
  echo "== run_h200 rc ${PIPESTATUS[0]}" )
ls -R "$OUT"
