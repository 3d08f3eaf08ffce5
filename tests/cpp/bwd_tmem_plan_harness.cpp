// Prints the SM100 backward's TMEM plan (csrc/tmem.cuh, BwdShape and BwdTmemPlan, compiled by
// g++) for every head-dim pair the SM100 backward instantiates, one line per plan:
//   d d_v block_m slice_d slice_dv S DP DQ DK DV end alloc slice_column(S, 0..block_m/16-1)
// (slice_d = d, slice_dv = d_v unless the head dim is split over two CTAs, Note [bwd head-dim
// split]). tests/models/test_tmem_plan.py checks the regions and where each compute warpgroup's
// P / dS slices land; tests/models/test_sm100_bwd_dataflow.py replays the kernel's sequence on
// them.
#include <cstdio>

#include "tmem.cuh"

template <int kHeadDim, int kHeadDimV>
void print_plan() {
  using S = fa4::sm100::BwdShape<kHeadDim, kHeadDimV>;
  using P = typename S::Plan;
  std::printf("%d %d %d %d %d %u %u %u %u %u %u %u", kHeadDim, kHeadDimV, S::kBlockM, S::kSliceD,
              S::kSliceDV, unsigned(P::kS), unsigned(P::kDP), unsigned(P::kDQ), unsigned(P::kDK),
              unsigned(P::kDV), unsigned(P::kEnd), P::kAllocColumns);
  for (int k = 0; k < S::kBlockM / 16; ++k) std::printf(" %u", P::slice_column(P::kS, k));
  std::printf("\n");
}

int main() {
  print_plan<64, 64>();
  print_plan<96, 96>();
  print_plan<128, 128>();
  print_plan<192, 192>();
  print_plan<192, 128>();
  print_plan<256, 256>();
  return 0;
}
