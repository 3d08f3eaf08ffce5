#!/bin/bash
# Per-instruction executed counts and warp-stall samples of the SM90 backward's main kernel, fa4
# and flash-attn-4 on the same shape: where the hd128 backward's 41 % more instructions sit.
# Arguments: batch seqlen causal [hdim]. Writes to OUT, per implementation: the report's details
# page and its source page as CSV (one row per SASS instruction), which
# `tools/ncu_source_summary.py --opcodes` reads on the CPU machine.
b=${1:-8}; s=${2:-2048}; c=${3:-1}; d=${4:-128}
for impl in fa4 flash-attn-4; do
  k=bwd_kernel; [ $impl = fa4 ] || k=BackwardSm90
  name="$OUT/bwd_src_${impl}_hd${d}_${s}_${c}"
  ncu --clock-control none -k regex:$k --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section InstructionStats -f -o "$name" \
    python3 tools/bwd_once.py $impl "$b" "$s" "$c" "$d" >"$name.log" 2>&1 ||
    { tail -5 "$name.log"; continue; }
  ncu -i "$name.ncu-rep" --page details >"$name.details.txt" 2>&1
  ncu -i "$name.ncu-rep" --page source --csv --print-source sass >"$name.csv" 2>&1 ||
    echo "source page export failed: $(head -3 "$name.csv")"
  rm -f "$name.ncu-rep"
done
wc -c "$OUT"/bwd_src_*
