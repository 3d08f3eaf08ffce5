// The compute warpgroups' per-element work of the SM100 backward, shared by the 1-CTA kernel
// (sm100/bwd/roles.cuh) and the 2-CTA kernel (sm100/bwd/roles_2cta.cuh), which differ only in
// where dS goes in shared memory and on which CTA's barriers they wait and arrive. Thread `row`
// holds one kv row of S and dP in TMEM (lanes), warpgroup w the query columns [c0, c0 + kCols).
#pragma once

namespace fa4::sm100::bwd {

// P = exp2(S·c − lse₂) of this thread's kCols columns, written as 16-bit over S (32 columns at
// a time, over S columns the first chunk's load has already read), and in dsf the factor dS
// needs besides dP − D: P, or P·(1 − x²) with softcap (x = tanh of the scaled score). Mask and
// softcap are decided once per block: run-time tests inside the unrolled loops keep a branch per
// element (as the SM90 backward found).
template <class T, int kCols>
__device__ __forceinline__ void compute_p(const ScoreScale& score, uint32_t tmem_row, int c0,
                                          int q0, const float* lse2, const RowBounds& seen,
                                          bool masked, float (&dsf)[kCols]) {
  using Element = typename T::Element;
  using Plan = typename T::Plan;
  auto run = [&](auto masked_c, auto softcap_c) {
    constexpr bool kMasked = decltype(masked_c)::value, kSoftcap = decltype(softcap_c)::value;
    FA4_UNROLL
    for (int c = 0; c < kCols / 32; ++c) {
      uint32_t r[32];
      tmem_load_32(tmem_row + Plan::kS + c0 + 32 * c, r);
      tmem_wait_ld();
      uint32_t p16[16];
      FA4_UNROLL
      for (int j = 0; j < 32; ++j) {
        const int e = 32 * c + j;
        float x = __uint_as_float(r[j]);
        if constexpr (kSoftcap) x = softcap_tanh(x * score.pre);
        float pv = exp2_hw(fmaf(x, score.scale_log2, -lse2[e]));
        if constexpr (kMasked) pv = seen.contains(q0 + e) ? pv : 0.0f;
        dsf[e] = kSoftcap ? pv * (1.0f - x * x) : pv;
        r[j] = __float_as_uint(pv);
      }
      FA4_UNROLL
      for (int j = 0; j < 16; ++j) {
        p16[j] = pack2<Element>(__uint_as_float(r[2 * j]), __uint_as_float(r[2 * j + 1]));
      }
      tmem_store_16(tmem_row + Plan::slice_column(Plan::kS, (c0 + 32 * c) / T::kMmaK), p16);
    }
  };
  using True = cute::true_type;
  using False = cute::false_type;
  if (masked) {
    score.softcap ? run(True{}, True{}) : run(True{}, False{});
  } else {
    score.softcap ? run(False{}, True{}) : run(False{}, False{});
  }
}

// dS = dsf ∘ (dP − D), 16-bit, over dP in TMEM (as P over S); store_smem(c, ds16) puts each
// 32-column chunk where the kernel's dQ MMA reads it.
template <class T, int kCols, class StoreSmem>
__device__ __forceinline__ void compute_ds(uint32_t tmem_row, int c0, const float* dpsum,
                                           const float (&dsf)[kCols], StoreSmem&& store_smem) {
  using Element = typename T::Element;
  using Plan = typename T::Plan;
  FA4_UNROLL
  for (int c = 0; c < kCols / 32; ++c) {
    uint32_t dp[32];
    tmem_load_32(tmem_row + Plan::kDP + c0 + 32 * c, dp);
    tmem_wait_ld();
    uint32_t ds16[16];
    FA4_UNROLL
    for (int j = 0; j < 16; ++j) {
      const int e = 32 * c + 2 * j;
      ds16[j] = pack2<Element>(dsf[e] * (__uint_as_float(dp[2 * j]) - dpsum[e]),
                               dsf[e + 1] * (__uint_as_float(dp[2 * j + 1]) - dpsum[e + 1]));
    }
    tmem_store_16(tmem_row + Plan::slice_column(Plan::kDP, (c0 + 32 * c) / T::kMmaK), ds16);
    store_smem(c, ds16);
  }
}

// kCols columns of this thread's row of a TMEM accumulator (region) from TMEM to `out`, scaled,
// of which the first cols_valid exist (Note [padded head dims]); zeros when no Q block saw the
// tile. tcgen05.ld is .sync.aligned: the whole warp loads, only the stores are per row.
template <class T, int kCols>
__device__ __forceinline__ void store_acc_row(typename T::Element* out, uint32_t taddr, float scale,
                                              bool any_iters, bool in_seq, int cols_valid) {
  using Element = typename T::Element;
  FA4_UNROLL
  for (int c = 0; c < kCols / 32; ++c) {
    uint32_t o[32];
    if (any_iters) {
      tmem_load_32(taddr + 32 * c, o);
      tmem_wait_ld();
    } else {
      FA4_UNROLL
      for (int j = 0; j < 32; ++j) o[j] = 0u;
    }
    scale_pack_32<Element>(o, scale);
    if (in_seq) store_64_bytes(out + 32 * c, o, cols_valid - 32 * c);
  }
}

// dK (w = 0, scaled by softmax_scale: dS is the gradient of the scaled scores) or dV (w = 1) of
// this thread's kv row `kv` from TMEM to global, after the last dK / dV MMA (the caller waited
// for it when iters > 0): this CTA's column slice h of kSliceD (dK) or kSliceDV (dV) columns
// (Note [bwd head-dim split]; the whole row when unsplit).
template <class T>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const SeqInfo& seq, int b,
                                            int head_kv, int kv, bool any_iters, uint32_t tmem_row,
                                            int w, int h = 0) {
  using Element = typename T::Element;
  using Plan = typename T::Plan;
  const int bidb = p.fwd.cu_seqlens_q != nullptr ? 0 : b;
  const bool in_seq = kv < seq.seqlen_k;
  if (!__any_sync(0xffffffffu, in_seq)) return;
  const int64_t grow = int64_t(seq.offset_k) + kv;
  if (w == 0) {
    Element* out = static_cast<Element*>(p.dk) + int64_t(bidb) * p.dk_batch_stride +
                   grow * p.dk_row_stride + int64_t(head_kv) * p.dk_head_stride + h * T::kSliceD;
    store_acc_row<T, T::kSliceD>(out, tmem_row + Plan::kDK, p.fwd.softmax_scale, any_iters, in_seq,
                                 p.fwd.head_dim - h * T::kSliceD);
  } else {
    Element* out = static_cast<Element*>(p.dv) + int64_t(bidb) * p.dv_batch_stride +
                   grow * p.dv_row_stride + int64_t(head_kv) * p.dv_head_stride + h * T::kSliceDV;
    store_acc_row<T, T::kSliceDV>(out, tmem_row + Plan::kDV, 1.0f, any_iters, in_seq,
                                  p.fwd.head_dim_v - h * T::kSliceDV);
  }
}

}  // namespace fa4::sm100::bwd
