#!/bin/bash
# Per-instruction warp-stall samples of the SM90 forward's main kernel: what a warpgroup's
# softmax waits on, which the trace build cannot say (docs/decisions.md, 2026-12-01). Arguments:
# batch seqlen causal [hdim]. Writes to OUT: the report, its details page, and its source page as
# CSV (one row per SASS instruction with its sampled stall reasons), which is read on the CPU
# machine against `cuobjdump -sass` of the same build.
b=${1:-1}; s=${2:-16384}; c=${3:-0}; d=${4:-128}
name="$OUT/fwd_src_hd${d}_${s}_${c}"
ncu --clock-control none -k regex:fwd_kernel --launch-skip 1 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SchedulerStats -f -o "$name" \
  python3 tools/fwd_once.py "$b" "$s" "$c" "$d" >"$name.log" 2>&1 || { tail -5 "$name.log"; exit 1; }
ncu -i "$name.ncu-rep" --page details >"$name.details.txt" 2>&1
ncu -i "$name.ncu-rep" --page source --csv --print-source sass >"$name.csv" 2>&1 ||
  echo "source page export failed: $(head -3 "$name.csv")"
wc -c "$name".*
