// Compile check for tests/api/test_shared_headers.py: the shared headers (common/mask.cuh,
// common/softmax.cuh, common/tile_scheduler.cuh) in __global__ functions shaped like the kernels'
// use of them, built for sm_90a and sm_100a (nvcc -c; nothing runs). ptxas must keep every
// fragment in registers.
#include <stdint.h>

#include "common/mask.cuh"
#include "common/softmax.cuh"
#include "common/tile_scheduler.cuh"

namespace fa4_test {

constexpr int kBlockM = 128, kBlockN = 128;

// SM90 shape: a warpgroup holds 64 rows of S (wgmma m64n128) and of O (d_v = 128) as QuadFrag
// accumulators; rows of a quad reduced with __shfl_xor_sync. Scores come from global memory
// here instead of the MMA, and P is folded into O instead of an MMA.
template <int kEmu>
__global__ void softmax_quad(const float* __restrict__ s_in, float* __restrict__ o_out,
                             float* __restrict__ lse_out, int seqlen_q, int seqlen_k,
                             int window_left, float scale, float softcap) {
  using Frag = fa4::QuadFrag<kBlockN>;
  using OFrag = fa4::QuadFrag<128>;
  const int t = threadIdx.x % 32, w = threadIdx.x / 32;
  const fa4::Mask mask = fa4::Mask::make(seqlen_q, seqlen_k, window_left, -1, true);
  const fa4::ScoreScale ss = fa4::ScoreScale::make(scale, softcap);
  const int m_block = blockIdx.x / 2, half = blockIdx.x % 2;
  const fa4::BlockRange br = fa4::block_range<kBlockM, kBlockN>(mask, m_block);
  auto row_of = [&](int r) { return m_block * kBlockM + 64 * half + 16 * w + t / 4 + 8 * r; };
  fa4::OnlineSoftmax<Frag> sm;
  sm.init();
  float o[OFrag::kSize];
  FA4_UNROLL
  for (int i = 0; i < OFrag::kSize; ++i) o[i] = 0.0f;
  for (int n = br.n_begin; n < br.n_end; ++n) {
    float s[Frag::kSize];
    FA4_UNROLL
    for (int i = 0; i < Frag::kSize; ++i) {
      s[i] =
          s_in[(int64_t(n) * gridDim.x * 128 + blockIdx.x * 128 + threadIdx.x) * Frag::kSize + i];
    }
    if (ss.softcap) fa4::apply_softcap<Frag>(s, ss.pre);
    if (br.needs_mask(n)) {
      auto col_of = [&](int e) { return n * kBlockN + 8 * (e / 2) + 2 * (t % 4) + e % 2; };
      fa4::apply_mask<Frag>(s, mask, row_of, col_of);
    }
    float o_scale[Frag::kRows];
    const fa4::RowDecisions d = sm.update_max(s, ss.scale_log2, 8.0f, o_scale);
    if (__any_sync(0xffffffffu, d.any_rescaled())) fa4::scale_rows<OFrag>(o, o_scale);
    sm.template exp2_and_sum<kEmu, 3>(s, ss.scale_log2);
    FA4_UNROLL
    for (int i = 0; i < OFrag::kSize; ++i) o[i] += s[i];
  }
  float inv_l[Frag::kRows], lse[Frag::kRows];
  sm.finalize(inv_l, lse);
  fa4::scale_rows<OFrag>(o, inv_l);
  FA4_UNROLL
  for (int i = 0; i < OFrag::kSize; ++i)
    o_out[(blockIdx.x * 128 + threadIdx.x) * OFrag::kSize + i] = o[i];
  if (t % 4 == 0) {
    FA4_UNROLL
    for (int r = 0; r < Frag::kRows; ++r) lse_out[row_of(r)] = lse[r];
  }
}

// SM100 shape: a softmax warpgroup, thread t owning row t of a 128-row tile (TMEM 32x32b
// loads), a whole 128-column row in registers; the O rescale by the correction warpgroup is
// stood in for by a 32-column RowMajorFrag.
template <int kEmu>
__global__ void softmax_row(const float* __restrict__ s_in, float* __restrict__ o_out,
                            float* __restrict__ lse_out, int seqlen_q, int seqlen_k, float scale) {
  using Frag = fa4::RowMajorFrag<1, kBlockN>;
  using OFrag = fa4::RowMajorFrag<1, 32>;
  const fa4::Mask mask = fa4::Mask::make(seqlen_q, seqlen_k, -1, -1, true);
  const fa4::ScoreScale ss = fa4::ScoreScale::make(scale, 0.0f);
  const fa4::BlockRange br = fa4::block_range<kBlockM, kBlockN>(mask, blockIdx.x);
  const int row = blockIdx.x * kBlockM + threadIdx.x;
  fa4::OnlineSoftmax<Frag> sm;
  sm.init();
  float o[OFrag::kSize];
  FA4_UNROLL
  for (int i = 0; i < OFrag::kSize; ++i) o[i] = 0.0f;
  for (int n = br.n_begin; n < br.n_end; ++n) {
    float s[Frag::kSize];
    FA4_UNROLL
    for (int i = 0; i < Frag::kSize; ++i) s[i] = s_in[(int64_t(n) * seqlen_q + row) * kBlockN + i];
    if (br.needs_mask(n)) {
      fa4::apply_mask<Frag>(
          s, mask, [&](int) { return row; }, [&](int e) { return n * kBlockN + e; });
    }
    float o_scale[1];
    const fa4::RowDecisions d = sm.update_max(s, ss.scale_log2, 8.0f, o_scale);
    if (__any_sync(0xffffffffu, d.any_rescaled())) fa4::scale_rows<OFrag>(o, o_scale);
    sm.template exp2_and_sum<kEmu, 3>(s, ss.scale_log2);
    FA4_UNROLL
    for (int i = 0; i < Frag::kSize; ++i) o[i % OFrag::kSize] += s[i];
  }
  float inv_l[1], lse[1];
  sm.finalize(inv_l, lse);
  fa4::scale_rows<OFrag>(o, inv_l);
  FA4_UNROLL
  for (int i = 0; i < OFrag::kSize; ++i) o_out[int64_t(row) * OFrag::kSize + i] = o[i];
  lse_out[row] = lse[0];
}

// The persistent loop of a kernel over its tiles, with varlen bookkeeping.
__global__ void schedule(const int* cu_seqlens_q, const int* cu_seqlens_k, const int* seqused_k,
                         int batch, int heads, int max_seqlen_q, int seqlen_k, bool causal,
                         int4* tiles) {
  const int section = fa4::lpt_section_heads(50 << 20, seqlen_k, 128, 128, 2, 1);
  const fa4::TileScheduler sched = fa4::TileScheduler::make(
      batch, heads, (max_seqlen_q + kBlockM - 1) / kBlockM,
      causal ? fa4::TileOrder::kLongestFirst : fa4::TileOrder::kMBlockFastest, section);
  for (int64_t w = blockIdx.x; w < sched.total(); w += gridDim.x) {
    const fa4::TileCoord t = sched.at(w);
    const fa4::SeqInfo si = fa4::SeqInfo::get(t.batch, cu_seqlens_q, cu_seqlens_k, seqused_k, 0, 0);
    const fa4::Mask mask = fa4::Mask::make(si.seqlen_q, si.seqlen_k, -1, -1, causal);
    const fa4::BlockRange br = fa4::block_range<kBlockM, kBlockN>(mask, t.m_block);
    if (threadIdx.x == 0) tiles[w] = make_int4(t.head, t.m_block, br.n_begin, br.n_end);
  }
}

}  // namespace fa4_test

// Instantiations: emulation off, the kernels' likely 4/16, and all 16/16.
template __global__ void fa4_test::softmax_quad<0>(const float*, float*, float*, int, int, int,
                                                   float, float);
template __global__ void fa4_test::softmax_quad<4>(const float*, float*, float*, int, int, int,
                                                   float, float);
template __global__ void fa4_test::softmax_row<4>(const float*, float*, float*, int, int, float);
template __global__ void fa4_test::softmax_row<16>(const float*, float*, float*, int, int, float);
