#!/bin/bash
# ncu of every kernel of one decode step (tools/decode_once.py), fa4 at the given split counts
# against cuDNN and FA2 SDPA: each kernel's duration, DRAM bytes and throughput, SM busy cycles
# over elapsed (the ramp and tail of a short grid), occupancy and warp stalls. OUT: logs.
# Arguments: batch seqlen_k kv_heads head_dim [fa4 split counts, default "0 1"]. Clocks as the
# card runs them (--clock-control none: the device's rules forbid locking them); caches flushed
# before each kernel (ncu's default --cache-control all).
b=${1:-16}; sk=${2:-8192}; hkv=${3:-4}; d=${4:-64}; splits=${5:-0 1}
tag=b${b}_kv${sk}_h${hkv}_d${d}
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
   --section MemoryWorkloadAnalysis"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg,sm__cycles_elapsed.avg
M=$M,sm__cycles_active.max,sm__cycles_active.min,gpc__cycles_elapsed.max
run() {
  ncu --profile-from-start off --clock-control none $S --metrics $M \
    python3 tools/decode_once.py "$@" >"$OUT/ncu_decode_${1}_${tag}${6:+_s$6}.txt" 2>&1
}
for s in $splits; do run fa4 "$b" "$sk" "$hkv" "$d" "$s"; done
for impl in sdpa-cudnn sdpa-flash; do run $impl "$b" "$sk" "$hkv" "$d"; done
