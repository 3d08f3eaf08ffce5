// Prints the SM100 backward's TMEM plan (csrc/tmem.cuh, BwdTmemPlan, compiled by g++) for every
// head dim the 1-CTA kernel instantiates, one line per plan:
//   d block_m S DP DQ DK DV end alloc slice_column(S, 0..block_m/16-1)
// tests/test_tmem_plan.py checks the regions and where each compute warpgroup's P / dS slices
// land.
#include <cstdio>

#include "../../csrc/tmem.cuh"

template <int kHeadDim>
void print_plan() {
  constexpr int kBlockM = 128;
  using P = fa4::sm100::BwdTmemPlan<kHeadDim, kHeadDim, kBlockM>;
  std::printf("%d %d %u %u %u %u %u %u %u", kHeadDim, kBlockM, unsigned(P::kS), unsigned(P::kDP),
              unsigned(P::kDQ), unsigned(P::kDK), unsigned(P::kDV), unsigned(P::kEnd),
              P::kAllocColumns);
  for (int k = 0; k < kBlockM / 16; ++k) std::printf(" %u", P::slice_column(P::kS, k));
  std::printf("\n");
}

int main() {
  print_plan<64>();
  print_plan<96>();
  print_plan<128>();
  return 0;
}
