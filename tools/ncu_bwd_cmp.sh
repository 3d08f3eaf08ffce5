#!/bin/bash
# ncu of the hd128 backward main kernel, fa4 against flash-attn-4 (docs/decisions.md); OUT: logs.
# Arguments: batch seqlen causal.
b=${1:-1}; s=${2:-16384}; c=${3:-0}
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
   --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
   --section InstructionStats --section LaunchStats --section Occupancy"
M=l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__inst_executed_pipe_uniform.sum,smsp__inst_executed.sum
for impl in fa4 flash-attn-4; do
  k=bwd_kernel; [ $impl = fa4 ] || k=BackwardSm90
  ncu --clock-control none -k regex:$k --launch-skip 1 --launch-count 1 $S \
    python3 tools/bwd_once.py $impl $b $s $c >"$OUT/ncu_${impl}_${s}_${c}.txt" 2>&1
  ncu --clock-control none -k regex:$k --launch-skip 1 --launch-count 1 --metrics $M \
    python3 tools/bwd_once.py $impl $b $s $c >"$OUT/ncu_m_${impl}_${s}_${c}.txt" 2>&1
done
ncu --query-metrics 2>&1 | grep -iE "gmma|data_bank|tensor" >"$OUT/metric_names.txt"
