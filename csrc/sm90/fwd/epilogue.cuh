// SM90 forward epilogue: a consumer warpgroup's rows of O (already scaled by 1/l) and their
// LSE out, from registers (store_tile) or through shared memory and a TMA store
// (store_tile_tma). Called by the consumer of sm90/fwd/kernel.cuh.
#pragma once

#include "sm90/fwd/traits.cuh"

namespace fa4::sm90 {

using namespace cute;

// Writes the consumer's rows of O (scaled by 1/l) and the LSE; rows past the sequence are
// skipped. o: the P·V accumulator (QuadFrag<kHeadDimV>), row r of this thread is
// row0 + 8r within the tile. 16-byte stores (Note [quad transpose]); every lane of the warp
// runs the shuffles, the row test guards only the stores.
template <class T, class Frag>
__device__ __forceinline__ void store_tile(const KernelParams<T>& kp, const TileWork& t,
                                           const float* o, const float (&lse)[2], int row_in_tile0,
                                           int quad_lane) {
  using Element = typename T::OutElement;  // bf16 for the FP8 forward
  static_assert(T::kHeadDimV % 32 == 0, "groups of four 8-column chunks");
  const FwdParams& p = kp.p;
  const bool varlen = p.cu_seqlens_q != nullptr;
  FA4_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = t.tile.m_block * T::kBlockM + row_in_tile0 + 8 * r;
    const bool in_seq = row < t.seq.seqlen_q;
    const int64_t grow = int64_t(t.seq.offset_q) + row;
    Element* out = static_cast<Element*>(p.out) + grow * p.out_row_stride +
                   int64_t(t.tile.head) * p.out_head_stride +
                   (varlen ? 0 : int64_t(t.tile.batch) * p.out_batch_stride);
    FA4_UNROLL
    for (int j = 0; j < T::kHeadDimV / 32; ++j) {
      uint32_t w[4];
      FA4_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int g = 4 * j + k;
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(o[Frag::idx(r, 2 * g)]);
        pair[1] = Element(o[Frag::idx(r, 2 * g + 1)]);
        w[k] = reinterpret_cast<const uint32_t&>(pair);
      }
      quad_transpose(w, quad_lane);
      if (in_seq && 8 * (4 * j + quad_lane) < p.head_dim_v) {  // Note [padded head dims]
        *reinterpret_cast<uint4*>(out + 8 * (4 * j + quad_lane)) =
            make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    if (!in_seq) continue;
    if (p.lse != nullptr && quad_lane == 0) {
      float* l = p.lse + int64_t(t.tile.head) * p.lse_head_stride +
                 (varlen ? grow : int64_t(t.tile.batch) * p.lse_batch_stride + row);
      *l = lse[r];
    }
  }
}

// Note [TMA-store epilogue]: this warpgroup's 64 rows of O (acc_o, already scaled by 1/l) to
// shared memory and out with one TMA store; the LSE as in store_tile. The issuing thread first
// waits until its previous store has read the buffer.
template <class T, class MmaPV, class AccO>
__device__ __forceinline__ void store_tile_tma(const KernelParams<T>& kp,
                                               typename T::SharedStorage& ss, const TileWork& t,
                                               const MmaPV& mma_pv, const AccO& acc_o,
                                               const float (&lse)[2], int row_in_tile0,
                                               int quad_lane, int wg, int tid, int trace_tile) {
  using Element = typename T::OutElement;         // bf16 for the FP8 forward
  constexpr uint32_t kBarrier = T::kConsumerWGs;  // + wg; below are the ping-pong turns
  const bool issuer = threadIdx.x % 128 == 0;
  if (issuer) tma_store_wait<0>();
  cutlass::arch::NamedBarrier::sync(128, kBarrier + wg);
  ss.trace.tile_mark(issuer, wg, trace_tile, 6);
  // stmatrix, 16 bytes per instruction (per-element stores kept ~30 swizzled addresses live
  // across the tile loop, which ptxas spilled).
  Tensor sO = as_position_independent_swizzle_tensor(
      make_tensor(make_smem_ptr(ss.o.data()), typename T::SmemLayoutO{}));
  auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
  auto thr_copy_o = copy_o.get_thread_slice(tid);
  Tensor r_o = make_tensor_like<Element>(acc_o);
  FA4_UNROLL
  for (int i = 0; i < size(acc_o); ++i) r_o(i) = Element(acc_o(i));
  copy(copy_o, thr_copy_o.retile_S(r_o), thr_copy_o.partition_D(sO));
  cutlass::arch::fence_view_async_shared();
  ss.trace.tile_mark(issuer, wg, trace_tile, 7);
  cutlass::arch::NamedBarrier::sync(128, kBarrier + wg);
  if (issuer) {
    Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_o);
    Tensor gO = local_tile(mO(_, _, t.tile.head, t.bidb_gmem), Shape<_64, Int<T::kHeadDimV>>{},
                           make_coord(t.tile.m_block * T::kConsumerWGs + wg, _0{}));
    Tensor sOh =
        make_tensor(make_smem_ptr(ss.o.data() + wg * cosize_v<typename T::SmemLayoutOHalf>),
                    typename T::SmemLayoutOHalf{});
    auto cta = kp.tma_o.get_slice(_0{});
    copy(kp.tma_o, cta.partition_S(sOh), cta.partition_D(gO));
    tma_store_arrive();
  }
  ss.trace.tile_mark(issuer, wg, trace_tile, 8);
  const FwdParams& p = kp.p;
  if (p.lse == nullptr || quad_lane != 0) return;
  FA4_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = t.tile.m_block * T::kBlockM + row_in_tile0 + 8 * r;
    if (row >= t.seq.seqlen_q) continue;
    p.lse[int64_t(t.tile.head) * p.lse_head_stride + int64_t(t.tile.batch) * p.lse_batch_stride +
          row] = lse[r];
  }
}

}  // namespace fa4::sm90
