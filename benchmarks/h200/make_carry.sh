#!/usr/bin/env bash
# Make the carry for benchmarks/h200/device_run.sh, outside the repository, then copy it in
# right before the device call:
#   benchmarks/h200/make_carry.sh .venv /work/h200carry        # here, with vLLM 0.33 installed
#   cp -r /work/h200carry .h200carry                          # .h200carry must be git-ignored
# It holds vllm/ (../shared/tools/vllm-on-h200/make_carry.sh's output: 22 cp312 wheels and
# vLLM's .py files, ~24 MB) and vllm-cache/modelinfos/ (vLLM's model-info cache written by a
# CPU run of the harness, so vLLM's model-inspection subprocess never runs on the H200).
set -eu
VENV=${1:?usage: make_carry.sh VENV DEST}; DEST=${2:?usage: make_carry.sh VENV DEST}
here=$(cd "$(dirname "$0")" && pwd)
recipe=${RECIPE:-$here/../../../shared/tools/vllm-on-h200/make_carry.sh}
mkdir -p "$DEST"
bash "$recipe" "$VENV" "$DEST/vllm"
VLLM_CACHE_ROOT=$DEST/vllm-cache "$VENV/bin/python" -c "
from draftmeta.integrations.vllm.testing import harness
harness.make_vllm_config(max_model_len=4096, block_size=64)"
ls "$DEST/vllm-cache/modelinfos"
du -sh "$DEST"
