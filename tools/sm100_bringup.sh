#!/usr/bin/env bash
# SM100 bring-up in one command on a B200 (docs/sm100.md, "Bring-up kit"): every step under
# `timeout`, logs in $OUT/<step>.log, one summary in $OUT/report.md.
#   1. build for sm_100a with FA4_SM100_DEBUG=1 (bounded waits, hang records, role traces)
#   2. the debug-wait proof (tests/gpu/test_debug_wait.py: the planted-bug kernel)
#   3. the SM100 GPU tests, smallest cases first (seqlen 1, then 128: a hang here is reported by
#      name within seconds), and one traced forward and backward (tools/trace_sm100.py, PNGs)
#   4. the normal build; the whole SM100 test files
#   5. compute-sanitizer memcheck, racecheck, synccheck on one case per kernel (forward two-tile
#      and one-tile, backward 1-CTA and 2-CTA)
#   6. the benchmark against flash-attn-4 (bench/bench.py, plus fa4's SM100 kernels timed beside
#      flash-attn-4 here: bench.py's fa4 runs the SM90 backend only)
# On another GPU (H100: CC 9.0) the SM100 steps are skipped with the reason and the rest runs
# for sm_90a. --dry-run prints the plan and writes the report without building or running
# (FA4_BRINGUP_CC=10.0 | 9.0 | none pretends a device; CI runs it: tests/tools/test_sm100_bringup.py).
# Usage: bash tools/sm100_bringup.sh [--dry-run] [--out DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
out=${OUT:-sm100-bringup}
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --out) out=$2; shift ;;
    *) echo "usage: $0 [--dry-run] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
report=$out/report.md
export PYTHONUNBUFFERED=1
status=0
hdims=${FA4_HDIMS:-64,96,128,192,256,192x128}

note() { echo "$*"; echo "$*" >>"$report"; }
step() {  # step NAME TIMEOUT_S CMD...: runs CMD (env assignments allowed first) under timeout
  local name=$1 limit=$2
  shift 2
  if [ "$dry" -eq 1 ]; then
    note "- [plan] $name (timeout ${limit}s): $*"
    return 0
  fi
  local start=$SECONDS
  timeout "$limit" env "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local why=""
  [ "$rc" -eq 124 ] && why=" (timed out: a hang the debug build did not catch?)"
  note "- $name: rc=$rc$why, $((SECONDS - start)) s"
  # the hang reports of a debug build (fa4.debug.HangError), else the log's tail
  if grep -q "hung: " "$out/$name.log"; then
    grep -h -A3 "hung: " "$out/$name.log" | head -n 20 | sed 's/^/    /' | tee -a "$report"
  else
    tail -n 4 "$out/$name.log" | sed 's/^/    /' | tee -a "$report"
  fi
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}
skip() { note "- $1: skipped: $2"; }

# ---- device --------------------------------------------------------------------------------
if [ "$dry" -eq 1 ]; then
  cc=${FA4_BRINGUP_CC:-none}
else
  cc=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability() \
       if torch.cuda.is_available() else 'none')" 2>/dev/null || echo none)
fi
case $cc in
  10.*) arch=100a ;;
  9.0) arch=90a ;;
  *) arch="" ;;
esac
: >"$report"
note "# SM100 bring-up report"
note "date $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), CC $cc$([ "$dry" -eq 1 ] && echo ', dry run')"
if [ "$dry" -eq 0 ] && command -v nvidia-smi >/dev/null; then
  note "GPU: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -n 1)"
fi
sm100_why=""
[ "$arch" = 100a ] || sm100_why="not an SM100 device (CC $cc): the SM100 kernels cannot run here"
if [ -z "$arch" ]; then
  skip "everything" "no CUDA device (CC $cc): nothing to build or run"
  exit 1
fi

build() {  # build NAME [VAR=VALUE...]: pip install -e . for $arch
  local name=$1
  shift
  step "$name" 3600 "$@" FA4_CUDA_ARCHS="$arch" FA4_HDIMS="$hdims" MAX_JOBS="${MAX_JOBS:-16}" \
    python3 -m pip install --no-build-isolation --no-deps --no-index -e .
}
# The smallest cases of a test file first: test_dense's case 2 (seqlen 1) at every head dim,
# then case 0 (seqlen 128), bf16; the node ids come from the file's own collection.
smallest() {  # smallest FILE CASE
  python3 -m pytest --collect-only -q -p no:cacheprovider "$1" 2>/dev/null |
    grep -E "::test_dense\[.*-$2-dtype0\]$" | tr '\n' ' '
}

# ---- 1, 2: debug build, the planted-bug proof -----------------------------------------------
note "## debug build (FA4_SM100_DEBUG=1, sm_$arch)"
build build-debug FA4_SM100_DEBUG=1 || { note "debug build failed: stop"; exit 1; }
step debug-wait-proof 600 python3 -m pytest tests/gpu/test_debug_wait.py -q -rs -p no:cacheprovider

# ---- 3: smallest SM100 cases under the debug build, traces -----------------------------------
if [ -z "$sm100_why" ]; then
  for dir in fwd bwd; do
    for case in 2 0; do
      ids=$(smallest "tests/gpu/test_${dir}_sm100.py" "$case")
      if [ -z "$ids" ]; then
        skip "debug-$dir-case$case" "no test_dense[...-$case-dtype0] collected"
        continue
      fi
      # shellcheck disable=SC2086  # ids: one word per node id
      step "debug-$dir-case$case" 600 python3 -m pytest -x -q -rs -p no:cacheprovider $ids
    done
    step "trace-$dir" 300 FA4_DEBUG_TRACE=1 python3 tools/trace_sm100.py --run "$dir" \
      --seqlen 1024 -o "$out/trace_$dir.png" --save "$out/area_$dir.bin"
  done
else
  skip "SM100 tests under the debug build, traces" "$sm100_why"
fi

# ---- 4: normal build, the whole SM100 test files ---------------------------------------------
note "## normal build (sm_$arch)"
build build || { note "build failed: stop"; exit 1; }
step fa4-main 120 python3 -m fa4
if [ -z "$sm100_why" ]; then
  for dir in fwd bwd; do
    step "tests-$dir" 3600 python3 -m pytest "tests/gpu/test_${dir}_sm100.py" -x -q -rs \
      -p no:cacheprovider
  done
else
  skip "tests/gpu/test_fwd_sm100.py, test_bwd_sm100.py" "$sm100_why"
fi

# ---- 5: compute-sanitizer, one case per kernel -----------------------------------------------
cat >"$out/sm100_case.py" <<'EOF'
"""One small SM100 call per kernel, for compute-sanitizer: fwd128 (two Q tiles), fwd256 (one
Q tile), bwd64 (1-CTA backward), bwd128 (2-CTA backward). Exits non-zero on a non-finite result."""
import sys

import torch

import fa4

case = sys.argv[1]
d = int(case[3:])
torch.manual_seed(0)
x = [torch.randn(1, 300, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
if case.startswith("bwd"):
    x = [t.requires_grad_() for t in x]
out = fa4.attention(*x, causal=True, backend="sm100")
if case.startswith("bwd"):
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
for t in [out] + ([t.grad for t in x] if case.startswith("bwd") else []):
    assert torch.isfinite(t.float()).all(), case
print(f"ok {case}")
EOF
note "## compute-sanitizer"
if [ -z "$sm100_why" ]; then
  for tool in memcheck racecheck synccheck; do
    for case in fwd128 fwd256 bwd64 bwd128; do
      step "$tool-$case" 900 compute-sanitizer --tool "$tool" python3 "$out/sm100_case.py" "$case"
      [ "$dry" -eq 1 ] || grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool-$case.log" |
        sed 's/^/    /' | tee -a "$report"
    done
  done
else
  skip "compute-sanitizer memcheck, racecheck, synccheck" "$sm100_why"
fi

# ---- 6: benchmark --------------------------------------------------------------------------
cat >"$out/sm100_vs_fa4_peer.py" <<'EOF'
"""fa4's SM100 kernels (backend="sm100") against flash-attn-4, bench.py's inputs (16k tokens,
heads 2048 / hd, bf16) and timing (triton do_bench, median ms): TFLOP/s per point."""
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "bench")
import bench_impls as bi  # noqa: E402

import fa4  # noqa: E402

peer = bi.make_impls(["flash-attn-4"])[0]
for d in (64, 128, 256):
    for s in (1024, 8192):
        for causal in (False, True):
            b, h = 16384 // s, 2048 // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            ours = do_bench(lambda: fa4.attention(q, k, v, causal=causal, backend="sm100"))
            why = peer.skip_reason("fwd", d)
            theirs = None if why else do_bench(lambda: peer.fwd(q, k, v, causal))
            row = f"fwd hd{d} s{s} causal={causal}: fa4 {flops / ours / 1e9:.0f} TFLOP/s"
            row += f", flash-attn-4 {flops / theirs / 1e9:.0f}" if theirs else f", peer: {why}"
            print(row)
EOF
note "## benchmark"
if [ -z "$sm100_why" ]; then
  step bench 3600 python3 bench/bench.py --dirs fwd,bwd --hdims 64,128,256 --seqlens 1k,8k \
    --impls fa4,flash-attn-4,sdpa-cudnn --out "$out/bench"
  step bench-sm100-vs-flash-attn-4 1800 python3 "$out/sm100_vs_fa4_peer.py"
  [ "$dry" -eq 1 ] || sed 's/^/    /' "$out/bench-sm100-vs-flash-attn-4.log" >>"$report"
else
  skip "benchmark against flash-attn-4" "$sm100_why"
fi

if [ "$dry" -eq 1 ]; then
  note "## result: dry run, nothing was built or run"
else
  note "## result: $([ "$status" -eq 0 ] && echo 'every step passed' || echo 'some step failed')"
fi
echo "report: $report"
exit "$status"
