// Online softmax with conditional rescaling, per row, on the scores a thread holds in registers
// (a fragment, common/fragment.cuh). Shared by the SM90 forward (wgmma accumulators: QuadFrag, a
// row over 4 lanes) and the SM100 forward (TMEM loads: RowMajorFrag, a row per thread), and run on
// the host by tests/cpp/shared_headers_harness.cpp, which reproduces
// fa4.reference.attention_fa4_model with it (tests/api/test_shared_headers.py).
//
// Per KV block, in the order of the model (fa4/reference.py, _online_step):
//   (i)   update_max: block row max of the scores, in log2 units
//   (ii)  update_max: the rescale decision (Note [conditional rescale]); returns the O scale
//         factor of each row (exactly 1 where nothing moved) and which rows rescaled, so that a
//         warp vote can skip the O rescale (SM100 correction warpgroup)
//   (iii) exp2_and_sum: P = 2^(s - m), split between exp2_poly and MUFU.EX2
//         (Note [exp2 column split])
//   (iv)  exp2_and_sum: l += rowsum(P) in fp32, before the caller rounds P to 16 bits for P·V
//   (v)   finalize: 1/l and the natural-log LSE (Note [empty rows])
//
// Note [conditional rescale] (the full note is in fa4/reference.py): per row a running max m
// (log2 units, -inf before any visible key) and sum l. With m_blk the block's row max:
//   m_blk == -inf: nothing (no visible key of this row in the block)
//   m == -inf:     m = m_blk ("first"; O and l are still 0)
//   m_blk > m + tau (fp32 add, strict): factor = 2^(m - m_blk), m = m_blk, l *= factor, and the
//                  caller scales O by factor ("rescaled")
//   otherwise:     m stays stale ("skipped"): P = 2^(s - m) <= 2^tau = 256 for tau = 8, which fp32
//                  l and O and 16-bit P (fp16 max 65504) hold, so the rescale can wait.
// tau = 0 is the classic online softmax.
//
// Note [score scaling]: the model scales in three steps, s = qk · scale, s = softcap ·
// tanh(s / softcap), s · log2(e). The kernels fold the constants (ScoreScale): x = qk, or
// x = tanh(qk · scale / softcap) with softcap; the row max is taken on x, and x enters the
// exponent as fmaf(x, scale_log2, -m), one FFMA per element instead of an FMUL and an FADD:
// 16384 FMULs per 128 x 128 tile saved, 128 clk of the FMA pipe (128/clk/SM) that also runs
// exp2_poly. fl(max(x) · c) equals max(fl(x · c)) because rounding is monotone, so m is the max
// of the scaled scores. With scale_log2 = 1 and x pre-scaled the model's way, the arithmetic
// is the model's exactly (the host tests compare to 1e-6). Folded, P differs from the model's
// by the rounding of x · c, and the row max's own exponent is that rounding's residual
// (|r| ~ 1e-7) instead of 0: for r < 0 exp2_poly reduces it to f = 1 + r, where its error is
// largest (8.6e-5 for degree 3) instead of none, so l and lse move by up to that much. Both are
// far below the 16-bit rounding of P (2^-8 bf16, 2^-11 fp16).
#pragma once

#include <stdint.h>

#include <math.h>

#include "exp2_poly.cuh"
#include "common/fragment.cuh"

namespace fa4 {

constexpr float kLog2e = 1.44269504088896340736f;  // 0x1.715476p+0
constexpr float kLn2 = 0.693147180559945309417f;   // 0x1.62e43p-1

// Note [host exp2]: MUFU.EX2 (PTX ex2.approx.ftz.f32) on the device: ~2 ulp, denormal results
// flushed to +0. The host stands in with 2^x rounded from double (correctly rounded but for
// double-rounding cases, ~2^-29 of arguments), flushed the same way below 2^-126. Not exp2f:
// glibc's exp2f and torch's CPU exp2 differ in 1 ulp for ~6 % of arguments, while the
// double-rounded value is the same in both, so the host harness and the torch model agree bit
// for bit on P and no bf16 rounding of P can flip between them.
__host__ __device__ __forceinline__ float exp2_hw(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return x < -126.0f ? 0.0f : static_cast<float>(exp2(static_cast<double>(x)));
#endif
}

// Folded score constants (Note [score scaling]).
struct ScoreScale {
  float pre = 1.0f;         // softcap: x = tanh(qk · pre), pre = scale / softcap
  float scale_log2 = 0.0f;  // log2-domain score = x · scale_log2
  bool softcap = false;
  __host__ __device__ static ScoreScale make(float softmax_scale, float softcap) {
    ScoreScale s;
    s.softcap = softcap > 0.0f;
    s.pre = s.softcap ? softmax_scale / softcap : 1.0f;
    s.scale_log2 = (s.softcap ? softcap : softmax_scale) * kLog2e;
    return s;
  }
};

// Note [softcap tanh]: tanh.approx.f32 (MUFU.TANH), absolute error up to ~2^-11, which a softcap
// of 30 turns into 0.015 in the score, 1.5 % in P (four bf16 steps). Chosen by measurement: an
// accurate tanh from ex2.approx and a reciprocal (error ~2^-23) at softcap 30 cost the H200
// forward 21 % at hd128 16k (481 -> 380 TFLOP/s), 30 % at hd64 and forward + backward 13 % at
// hd128, because it adds two MUFU operations per score where the softmax's exp2 already loads
// the unit (and SM90 has no FMA-pipe slack for a polynomial, Note [SM90 exp2 split]); FA2, FA3
// and flash-attn-4 use tanh.approx too. Written as PTX so that it does not depend on
// --use_fast_math (under which tanhf compiles to the same instruction). The host (g++ harnesses)
// uses tanhf; tests/gpu/test_softcap_tanh.py measures the device error.
__host__ __device__ __forceinline__ float softcap_tanh(float y) {
#ifdef __CUDA_ARCH__
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(y));
  return t;
#else
  return tanhf(y);
#endif
}

// x = tanh(qk · pre) in place (Note [softcap tanh]); call before masking (tanh(-inf) would be
// -1, not -inf).
template <class Frag>
__host__ __device__ __forceinline__ void apply_softcap(float (&s)[Frag::kSize], float pre) {
  FA4_UNROLL
  for (int i = 0; i < Frag::kSize; ++i) s[i] = softcap_tanh(s[i] * pre);
}

namespace detail {
// v combined over the kThreads adjacent lanes sharing a row (common/fragment.cuh). All 32 lanes of
// the warp must call it together (the kernels call the softmax warp-uniformly).
template <int kThreads, bool kMax>
__host__ __device__ __forceinline__ float row_allreduce(float v) {
  static_assert(kThreads == 1 || kThreads == 2 || kThreads == 4, "kThreadsPerRow: 1, 2 or 4");
#ifdef __CUDA_ARCH__
  FA4_UNROLL
  for (int lane_mask = 1; lane_mask < kThreads; lane_mask <<= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, lane_mask);
    v = kMax ? fmaxf(v, o) : v + o;
  }
#elif !defined(__CUDACC__)
  static_assert(kThreads == 1, "on the host a row belongs to one thread (kThreadsPerRow = 1)");
#endif
  return v;
}
}  // namespace detail

// Which rows of this thread took which branch of Note [conditional rescale] in one KV block,
// bit r for row r.
struct RowDecisions {
  uint32_t first = 0, rescaled = 0, skipped = 0;
  __host__ __device__ bool any_rescaled() const { return rescaled != 0; }
};

// Multiplies each row of an O fragment (rows as the S fragment's, columns d_v) by its factor:
// the o_scale of update_max, or 1/l at the end.
template <class OFrag>
__host__ __device__ __forceinline__ void scale_rows(float (&o)[OFrag::kSize],
                                                    const float (&factor)[OFrag::kRows]) {
  FA4_UNROLL
  for (int r = 0; r < OFrag::kRows; ++r) {
    FA4_UNROLL
    for (int e = 0; e < OFrag::kCols; ++e) o[OFrag::idx(r, e)] *= factor[r];
  }
}

// kPLog2: P = 2^(x · scale_log2 - m + kPLog2), a power-of-two scale of P folded into the
// exponent's offset (Note [fp8 P scale], common/fp8.cuh): l carries the same
// 2^kPLog2, so O / l is unchanged, and finalize takes it out of the LSE.
template <class Frag, int kPLog2 = 0>
struct OnlineSoftmax {
  static constexpr int kRows = Frag::kRows;
  static constexpr int kThreads = Frag::kThreadsPerRow;
  static_assert(kRows >= 1 && kRows <= 32, "RowDecisions holds 32 rows");
  static_assert(is_register_permutation<Frag>(), "Frag::idx must be one to one");

  float row_max[kRows];  // m, log2 units; -inf until the row sees a key
  float row_sum[kRows];  // l; this lane's part when kThreadsPerRow > 1 (summed in finalize:
                         // 2 SHFL + 2 FADD per row once, instead of per KV block)

  __host__ __device__ void init() {
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
  }

  // Steps (i) and (ii). s: scores x of one KV block (softcap applied, masked with -inf); see
  // Note [score scaling] for scale_log2. o_scale[r]: the factor for row r of O, 1 if none.
  // Note [branch-free max]: max is exact and associative, so the row max is taken as kMaxPart
  // independent chains per row with the rows interleaved, and the decision is made with selects;
  // only the rare rescale (one exp2 and l *= factor) stays conditional, which the compiler
  // predicates. Bit for bit a sequential max, which had put two dependent 32-deep FMNMX chains
  // and two branch regions per block on the SM90 softmax's critical path. On SM100 (128 columns per
  // thread) 8 chains spill no more than one did; computing the factor unconditionally (exp2 of 0)
  // added 28 bytes of spills there.
  __host__ __device__ RowDecisions update_max(const float (&s)[Frag::kSize], float scale_log2,
                                              float tau, float (&o_scale)[kRows]) {
    float m_loc[kRows];
    local_max(s, m_loc);
    return update_max_local(m_loc, scale_log2, tau, o_scale);
  }

  // Per row, the maximum of this thread's part of s: update_max's kMaxPart independent chains,
  // not yet combined across the row's lanes.
  __host__ __device__ void local_max(const float (&s)[Frag::kSize], float (&m_loc)[kRows]) const {
    constexpr int kMaxPart = Frag::kCols % 8 == 0 && Frag::kCols >= 64 ? 8
                             : Frag::kCols % 4 == 0                    ? 4
                                                                       : 1;
    float part[kRows][kMaxPart];
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      FA4_UNROLL
      for (int k = 0; k < kMaxPart; ++k) part[r][k] = -INFINITY;
    }
    FA4_UNROLL
    for (int e = 0; e < Frag::kCols; ++e) {
      FA4_UNROLL
      for (int r = 0; r < kRows; ++r)
        part[r][e % kMaxPart] = fmaxf(part[r][e % kMaxPart], s[Frag::idx(r, e)]);
    }
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      FA4_UNROLL
      for (int w = kMaxPart / 2; w >= 1; w /= 2) {
        FA4_UNROLL
        for (int k = 0; k < w; ++k) part[r][k] = fmaxf(part[r][k], part[r][k + w]);
      }
      m_loc[r] = part[r][0];
    }
  }

  // Note [stale-max vote]: true when this thread's part of every row keeps the stale max, i.e.
  // the row has seen a key (m finite) and m_loc · scale_log2 <= m + tau. The row's own test in
  // update_max_local is on the maximum over its lanes, scaled after combining; scaling by
  // scale_log2 > 0 is monotone in fp32 too, so when every lane of a row passes here, the row is
  // neither first nor rescaled there: update_max_local would leave m, l and O as they are. A
  // kernel that finds this for every lane of the warp (one vote) skips update_max_local, its
  // shuffles and its decisions, and exp2_and_sum then runs exactly as after it.
  __host__ __device__ bool keeps_max(const float (&m_loc)[kRows], float scale_log2,
                                     float tau) const {
    bool keep = true;
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r)
      keep = keep && row_max[r] != -INFINITY && !(m_loc[r] * scale_log2 > row_max[r] + tau);
    return keep;
  }

  // update_max from local_max's per-lane maxima.
  __host__ __device__ RowDecisions update_max_local(const float (&m_loc)[kRows], float scale_log2,
                                                    float tau, float (&o_scale)[kRows]) {
    float m_blk[kRows];
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r)
      m_blk[r] = detail::row_allreduce<kThreads, true>(m_loc[r]) * scale_log2;
    RowDecisions d;
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float m = row_max[r];
      const uint32_t bit = 1u << r;
      // m_blk == -inf: no visible key of this row in the block; nothing changes.
      const bool visible = m_blk[r] != -INFINITY;
      const bool first = visible && m == -INFINITY;
      const bool rescaled = visible && !first && m_blk[r] > m + tau;
      float factor = 1.0f;
      if (rescaled) {
        factor = exp2_hw(m - m_blk[r]);  // < 2^-tau; flushed to 0 below 2^-126, like MUFU
        row_sum[r] *= factor;
      }
      row_max[r] = first || rescaled ? m_blk[r] : m;
      d.first |= first ? bit : 0u;
      d.rescaled |= rescaled ? bit : 0u;
      d.skipped |= visible && !first && !rescaled ? bit : 0u;
      o_scale[r] = factor;
    }
    return d;
  }

  // The exponent's offset of row r: P = 2^(x · scale_log2 + exp_offset(r)), i.e. kPLog2 - m.
  // While m is -inf the row has seen no key and all its x are -inf: offset 0, P = 0, and
  // -inf - (-inf) = NaN is never formed. finalize reads the same fp32 value back, so the LSE
  // matches the P that l summed even where kPLog2 - m rounds.
  __host__ __device__ float exp_offset(int r) const {
    return row_max[r] == -INFINITY ? 0.0f : float(kPLog2) - row_max[r];
  }

  // Steps (iii) and (iv), after update_max on the same s: s becomes P = 2^(x · scale_log2 - m)
  // in fp32, and l gains its row sums. Note [exp2 column split]: element e of a row goes
  // through exp2_poly<kDegree> iff e % 16 < kEmuSixteenths, else through MUFU.EX2; a
  // compile-time choice per register, so no lane diverges. With RowMajorFrag element e is column
  // e of the KV block: the model's split (emu_columns). With QuadFrag the same fraction of each
  // lane's elements is emulated, but the columns differ (element e is column 8(e/2) + 2(t%4) +
  // e%2); a per-column split there would depend on the lane, and a quad would run both paths.
  template <int kEmuSixteenths, int kDegree = 3>
  __host__ __device__ void exp2_and_sum(float (&s)[Frag::kSize], float scale_log2) {
    static_assert(kEmuSixteenths >= 0 && kEmuSixteenths <= 16, "kEmuSixteenths: 0..16");
    // 4 partial sums: a 128-element row as one dependent FADD chain would take 128 x 4 clk.
    constexpr int kPart = Frag::kCols % 4 == 0 ? 4 : 1;
    // Note [packed exp2]: pairs on SM100 and in the host harnesses (which so test the pair loop
    // with scalar arithmetic); the SM90 build keeps the one-element loop it was measured with
    // (it has no packed fp32 instructions).
#if defined(__CUDA_ARCH__) && !FA4_PACKED_FP32
    constexpr bool kPairs = false;
#else
    constexpr bool kPairs = kEmuSixteenths % 2 == 0 && Frag::kCols % 2 == 0;
#endif
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float neg_m = exp_offset(r);
      float part[kPart];
      FA4_UNROLL
      for (int k = 0; k < kPart; ++k) part[k] = 0.0f;
      if constexpr (kPairs) {
        // Note [packed exp2]: elements e, e + 1 are in the same class (kEmuSixteenths even), so
        // the argument FFMA and the polynomial run as packed pairs; the sums in element order.
        FA4_UNROLL
        for (int e = 0; e < Frag::kCols; e += 2) {
          const int i0 = Frag::idx(r, e), i1 = Frag::idx(r, e + 1);
          float x0, x1, p0, p1;
          detail::fma_x2(x0, x1, s[i0], s[i1], scale_log2, scale_log2, neg_m, neg_m);
          if (e % 16 < kEmuSixteenths) {
            exp2_poly_pair<kDegree>(x0, x1, p0, p1);
          } else {
            p0 = exp2_hw(x0);
            p1 = exp2_hw(x1);
          }
          s[i0] = p0;
          s[i1] = p1;
          part[e % kPart] += p0;
          part[(e + 1) % kPart] += p1;
        }
      } else {
        FA4_UNROLL
        for (int e = 0; e < Frag::kCols; ++e) {
          const int i = Frag::idx(r, e);
          const float x = fmaf(s[i], scale_log2, neg_m);
          const float p = e % 16 < kEmuSixteenths ? exp2_poly<kDegree>(x) : exp2_hw(x);
          s[i] = p;
          part[e % kPart] += p;
        }
      }
      float sum = part[0];
      FA4_UNROLL
      for (int k = 1; k < kPart; ++k) sum += part[k];
      row_sum[r] += sum;
    }
  }

  // Note [chunked exp2]: exp2_and_sum in column chunks, so that the caller can pack and store
  // each chunk of P while the next is computed and the chunk's fp32 registers die early (SM100:
  // a 128-score row in the 192 registers of its thread):
  //   Exp2Sums sums = exp2_sums_begin();
  //   for c: exp2_chunk<kEmuSixteenths, kChunk>(s, scale_log2, c, sums);  // elements
  //          c · kChunk .. (c + 1) · kChunk - 1 of every row become P
  //   exp2_sums_end(sums);
  // with c a constant after unrolling and every chunk in order once. The same per element and
  // the same sums as exp2_and_sum: element e takes the same path (e % 16 < kEmuSixteenths, Note
  // [exp2 column split]), and each row's partial sums gain the elements in element order and
  // are combined once, in exp2_sums_end.
  static constexpr int kSumParts = Frag::kCols % 4 == 0 ? 4 : 1;  // exp2_and_sum's kPart
  struct Exp2Sums {
    float part[kRows][kSumParts];
  };

  __host__ __device__ static Exp2Sums exp2_sums_begin() {
    Exp2Sums sums;
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      FA4_UNROLL
      for (int k = 0; k < kSumParts; ++k) sums.part[r][k] = 0.0f;
    }
    return sums;
  }

  template <int kEmuSixteenths, int kChunk, int kDegree = 3>
  __host__ __device__ void exp2_chunk(float (&s)[Frag::kSize], float scale_log2, int c,
                                      Exp2Sums& sums) const {
    static_assert(kEmuSixteenths >= 0 && kEmuSixteenths <= 16, "kEmuSixteenths: 0..16");
    static_assert(Frag::kCols % kChunk == 0 && kChunk % 2 == 0, "whole, even chunks");
#if defined(__CUDA_ARCH__) && !FA4_PACKED_FP32
    constexpr bool kPairs = false;
#else
    constexpr bool kPairs = kEmuSixteenths % 2 == 0 && Frag::kCols % 2 == 0;
#endif
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float neg_m = exp_offset(r);
      float (&part)[kSumParts] = sums.part[r];
      if constexpr (kPairs) {
        FA4_UNROLL
        for (int j = 0; j < kChunk; j += 2) {
          const int e = c * kChunk + j;
          const int i0 = Frag::idx(r, e), i1 = Frag::idx(r, e + 1);
          float x0, x1, p0, p1;
          detail::fma_x2(x0, x1, s[i0], s[i1], scale_log2, scale_log2, neg_m, neg_m);
          if (e % 16 < kEmuSixteenths) {
            exp2_poly_pair<kDegree>(x0, x1, p0, p1);
          } else {
            p0 = exp2_hw(x0);
            p1 = exp2_hw(x1);
          }
          s[i0] = p0;
          s[i1] = p1;
          part[e % kSumParts] += p0;
          part[(e + 1) % kSumParts] += p1;
        }
      } else {
        FA4_UNROLL
        for (int j = 0; j < kChunk; ++j) {
          const int e = c * kChunk + j;
          const int i = Frag::idx(r, e);
          const float x = fmaf(s[i], scale_log2, neg_m);
          const float p = e % 16 < kEmuSixteenths ? exp2_poly<kDegree>(x) : exp2_hw(x);
          s[i] = p;
          part[e % kSumParts] += p;
        }
      }
    }
  }

  __host__ __device__ void exp2_sums_end(const Exp2Sums& sums) {
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = sums.part[r][0];
      FA4_UNROLL
      for (int k = 1; k < kSumParts; ++k) sum += sums.part[r][k];
      row_sum[r] += sum;
    }
  }

  // Step (v): inv_l = 1/l (0 where l = 0: the row saw no key, O is 0, and out = 0) and
  // lse = (m + log2 l) · ln 2, natural log, -inf for such rows (Note [empty rows] in
  // fa4/reference.py). The caller scales O by inv_l (scale_rows). row_sum becomes the full l.
  //
  // Note [learnable sink]: sink_log2 (the head's sink logit times log2 e; -inf = none) joins the
  // denominator without a value: with m' = max(m, sink), l' = l 2^(m - m') + 2^(sink - m'),
  // inv_l = 2^(m - m') / l' scales O (accumulated against m) and lse = (m' + log2 l') ln 2. A row
  // that saw no key gets inv_l = 0 (O is 0) and lse = the sink.
  __host__ __device__ void finalize(float (&inv_l)[kRows], float (&lse)[kRows],
                                    float sink_log2 = -INFINITY) {
    FA4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float l = detail::row_allreduce<kThreads, false>(row_sum[r]);
      row_sum[r] = l;
      const bool empty = row_max[r] == -INFINITY || !(l > 0.0f);
      // l sums 2^(x · scale_log2 - m_p) with m_p = m - kPLog2 (exp_offset); m itself for 0.
      const float m_p = kPLog2 == 0 ? row_max[r] : -exp_offset(r);
      if (sink_log2 == -INFINITY) {
        inv_l[r] = empty ? 0.0f : 1.0f / l;
        lse[r] = empty ? -INFINITY : (m_p + log2f(l)) * kLn2;
      } else {
        const float mt = empty ? sink_log2 : fmaxf(m_p, sink_log2);
        const float scale = empty ? 0.0f : exp2_hw(m_p - mt);
        const float lt = l * scale + exp2_hw(sink_log2 - mt);
        inv_l[r] = scale / lt;
        lse[r] = (mt + log2f(lt)) * kLn2;
      }
    }
  }
};

}  // namespace fa4
