#!/bin/bash
# ncu of the backward main kernel, fa4 against flash-attn-4 (docs/decisions.md); OUT: logs.
# Arguments: batch seqlen causal [head_dim heads heads_kv] (tools/bwd_once.py's). Clocks as the
# card runs them (--clock-control none: the device's rules forbid locking them).
b=${1:-1}; s=${2:-16384}; c=${3:-0}; d=${4:-128}; h=${5:-$((2048 / d))}; hkv=${6:-$h}
tag=${s}_${c}_${d}_${h}_${hkv}
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
   --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
   --section InstructionStats --section LaunchStats --section Occupancy"
# Work per cycle and where the energy may go: instructions by pipe, tensor-pipe cycles, L2 and
# DRAM bytes, L2 reduction requests (the dQ reduce-adds) and shared-memory wavefronts.
M=sm__cycles_elapsed.max,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_xu.sum
M=$M,sm__inst_executed_pipe_uniform.sum,sm__inst_executed_pipe_lsu.sum,sm__issue_active.avg.pct_of_peak_sustained_active
M=$M,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_requests_op_red.sum,lts__t_sectors_op_red.sum
M=$M,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
for impl in fa4 flash-attn-4; do
  k=bwd_kernel; [ $impl = fa4 ] || k=BackwardSm90
  args="$b $s $c $d $h $hkv"
  ncu --clock-control none -k regex:$k --launch-skip 1 --launch-count 1 $S --metrics $M \
    python3 tools/bwd_once.py $impl $args >"$OUT/ncu_${impl}_${tag}.txt" 2>&1
done
