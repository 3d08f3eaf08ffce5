#!/usr/bin/env bash
# The GPU check of a change on an H100/H200 in one call (docs/testing.md): build the SM90
# kernels, `python -m fa4`, the GPU and API tests, then memcheck and racecheck of the forward and
# backward drivers with FA4_NUM_SMS=2 (each CTA walks many tiles). Logs go to $OUT (or ./gpu-suite).
# Usage: bash tools/gpu_suite.sh [FA4_HDIMS, default all]
set -uo pipefail
out=${OUT:-gpu-suite}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
step() {  # step NAME TIMEOUT_S CMD...: runs CMD, logs to $out/NAME.log, prints its tail
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - start)) s"
  tail -n 4 "$out/$name.log"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$out/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee "$out/commit.txt"
FA4_CUDA_ARCHS=90a FA4_HDIMS=${1:-64,96,128,192,256,192x128} MAX_JOBS=${MAX_JOBS:-16} \
  step build 300 python3 -m pip install --no-build-isolation --no-deps --no-index -e . || exit 1
step main 60 python3 -m fa4
step tests 300 python3 -m pytest tests/gpu tests/api -q -rs -p no:cacheprovider
for tool in memcheck racecheck; do
  for dir in fwd bwd; do
    FA4_NUM_SMS=2 step "$tool-$dir" 120 compute-sanitizer --tool "$tool" python3 "tools/sanitize_$dir.py"
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool-$dir.log"
  done
done
exit "$status"
