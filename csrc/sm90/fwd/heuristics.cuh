// SM90 forward: the per-problem choices (tile shape per head dim, CTAs per SM, K/V stages and the
// problems that take the short-causal kernel), each with the measurement that set it (TFLOP/s
// against the other side in one device call; docs/decisions.md has the tables). FwdTraits
// (sm90/fwd/traits.cuh) takes a head dim's defaults from here, launch_element
// (sm90/fwd/kernel.cuh) the kernel a problem runs on.
#pragma once

namespace fa4::sm90 {

// Consumer warpgroups (64 query rows each) by head dim: three at d <= 64 (Note [three consumers
// at hd64]: +9-15 % non-causal hd64 against two), two above.
constexpr int default_consumer_warpgroups(int head_dim) {
  return head_dim <= 64 ? 3 : 2;
}

// Keys per KV block by head dim: S costs kBlockN / 2 registers per consumer thread beside O's
// d_v / 2, so 128 up to d = 128, 64 at d = 192 and 80 at d = 256 (Note [hd256 kBlockN 80]: +8 %
// at 16k against 64).
constexpr int default_block_n(int head_dim) {
  return head_dim <= 128 ? 128 : (head_dim == 256 ? 80 : 64);
}

// Note [fp8 kBlockN]: keys per KV block of the FP8 forward (P·V's K steps by 32): 192 at hd128
// (S 96 + P 48 + O 64 registers; highest register R214 of 224, no spill) and 96 at hd256 (12 bytes
// of spills). H100, 16k, one call: hd128 888 / 827 TFLOP/s non-causal / causal against 845 / 804
// with 128 (160: 829 / 814); hd256 1065 / 1033 against 1008 / 959 with 64 (128: 48 bytes of
// spills, 899 / 857). Larger blocks amortize the per-block chain of a warpgroup (row max, turns,
// waits) over more keys; FA3's FP8 tiles are 128 × 224 / 128 × 128 likewise. Other head dims keep
// the 16-bit blocks (hd192: 64, hd64 and hd96: 128; not measured).
constexpr int fp8_block_n(int head_dim) {
  return head_dim == 128   ? 192
         : head_dim == 256 ? 96
         : head_dim > 128  ? 64
                           : default_block_n(head_dim);
}

// Note [hd256 narrow blocks]: the 64-key kernel runs where 80-key blocks compute more than this
// many times its key columns (80-key blocks at 1k waste 1.6 % and run ~4 % faster per column).
constexpr double kNarrowWaste = 1.04;

// Note [three CTAs at short causal hd64]: causal and local problems of the three-consumer head dim
// with at most this many query rows per sequence run the three-CTA kernel (causal 512 +6.8 %,
// causal 1k +3.1 % against two warpgroups; up to 2048 rows it lost 3.0 % at causal 2k).
constexpr int kShortBandedRows = 1024;
// The three-CTA kernel (Note [several CTAs per SM]): one consumer warpgroup, 64-key blocks,
// three CTAs per SM (the only variant ahead of two warpgroups among four measured).
constexpr int kShortBandedBlockN = 64;
constexpr int kShortBandedCtasPerSm = 3;
// Note [three-CTA stages]: K/V stages of the three-CTA kernel (against 2: causal 512 +2.6 %,
// causal 1k +3.9 %; a fourth does not fit its 75 KB).
constexpr int kThreeCtaStages = 3;

// Note [right-edge mask]: the one-compare mask of causal blocks at every head dim but 96, where
// it cost non-causal 512 / 1k 1.2 / 1.9 % (hd64 causal +2.0-2.4 %, hd128 causal 1k +3 %).
constexpr bool default_right_edge_mask(int head_dim) {
  return head_dim != 96;
}

}  // namespace fa4::sm90
