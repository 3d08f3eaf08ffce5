// Prints the SM100 forward's TMEM plan for every head dim (csrc/tmem.cuh compiled by g++), one
// line per plan: d_v block_n q_tiles S0 S1 O0 O1 P_columns end alloc; then the 2-CTA forward's
// plans (FwdTraits2::Plan = FwdTmemPlan<d_v, 128>, each CTA of the pair), the same fields after
// "pair". tests/models/test_tmem_plan.py checks the regions for overlaps and the 512-column
// limit; test_sm100_fwd_dataflow.py and test_sm100_fwd2_dataflow.py replay the MMA orders.
#include <cstdio>

#include "tmem.cuh"

template <int kHeadDimV, int kBlockN>
void print_fields() {
  using P = fa4::sm100::FwdTmemPlan<kHeadDimV, kBlockN>;
  std::printf("%d %d %d %u %u %u %u %u %u %u\n", kHeadDimV, kBlockN, P::kQTiles, unsigned(P::kS0),
              unsigned(P::kS1), unsigned(P::kO0), unsigned(P::kO1), unsigned(P::kPColumns),
              unsigned(P::kEnd), P::kAllocColumns);
}

template <int kHeadDimV>
void print_plan() {
  print_fields<kHeadDimV, fa4::sm100::fwd_block_n<kHeadDimV>()>();
}

// The 2-CTA forward (sm100/fwd/kernel_2cta.cuh, d = d_v = 192 / 256): kBlockN 128 keys.
template <int kHeadDimV>
void print_pair_plan() {
  std::printf("pair ");
  print_fields<kHeadDimV, 128>();
}

int main() {
  print_plan<64>();
  print_plan<96>();
  print_plan<128>();
  print_plan<192>();
  print_plan<256>();
  print_pair_plan<192>();
  print_pair_plan<256>();
  return 0;
}
