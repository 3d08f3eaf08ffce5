// Prints the SM100 forward's TMEM plan for every head dim (csrc/tmem.cuh compiled by g++), one
// line per plan: d_v block_n q_tiles S0 S1 O0 O1 P_columns end alloc.
// tests/models/test_tmem_plan.py checks the regions for overlaps and the 512-column limit.
#include <cstdio>

#include "tmem.cuh"

template <int kHeadDimV>
void print_plan() {
  using P = fa4::sm100::FwdTmemPlan<kHeadDimV, fa4::sm100::fwd_block_n<kHeadDimV>()>;
  std::printf("%d %d %d %u %u %u %u %u %u %u\n", kHeadDimV, fa4::sm100::fwd_block_n<kHeadDimV>(),
              P::kQTiles, unsigned(P::kS0), unsigned(P::kS1), unsigned(P::kO0), unsigned(P::kO1),
              unsigned(P::kPColumns), unsigned(P::kEnd), P::kAllocColumns);
}

int main() {
  print_plan<64>();
  print_plan<96>();
  print_plan<128>();
  print_plan<192>();
  print_plan<256>();
  return 0;
}
