// SM90 backward: how dK and dV leave a kv tile (both consumer variants) and the register writes
// the dQ postprocess shares (write_quad_rows). Split from sm90/bwd/common.cuh by role.
#pragma once

#include <cutlass/arch/memory.h>

#include "sm90/bwd/common.cuh"

namespace fa4::sm90 {

// The first row of this CTA's kv tile in dK or dV (base and strides of that tensor).
template <class T>
__device__ __forceinline__ typename T::Element* kv_tile_row0(
    void* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
    const BwdKernelParams<T>& kp, const SeqInfo& seq, int n, int head_kv, int b) {
  const int bidb = kp.p.fwd.cu_seqlens_q != nullptr ? 0 : b;
  return static_cast<typename T::Element*>(base) + int64_t(bidb) * batch_stride +
         (int64_t(seq.offset_k) + int64_t(n) * T::kBlockN) * row_stride +
         int64_t(head_kv) * head_stride;
}
template <class T>
__device__ __forceinline__ typename T::Element* dv_tile(const BwdKernelParams<T>& kp,
                                                        const SeqInfo& seq, int n, int head_kv,
                                                        int b) {
  const BwdParams& p = kp.p;
  return kv_tile_row0<T>(p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, kp, seq, n,
                         head_kv, b);
}

// Note [dK/dV epilogue]: dK and dV leave through shared memory. Written from the accumulator
// fragments, each thread's 4-byte pairs hit 8 rows per warp store (16 of a row's 32-byte sectors
// per instruction); the trace build measured that epilogue at 6.7 us of a 46 us CTA at hd128 1k.
// Once both warpgroups are done with the buffers of ss.staging(), the tile
// goes there in rows (pitch d + 8 elements: a warp's pairs then cover all 32 banks), and the CTA
// writes whole 16-byte row chunks (dispatch guarantees 16-byte aligned dk, dv and strides).
// Measured: the hd128 backward +8-9 % at 1k, 0-2 % at 16k. The d <= 128 variant
// stages over dS, stage_pad and dQ, which its next tile's K/V and Q/dO loads leave alone (Note
// [persistent bwd]). The split variant has no such buffers (Note [split epilogue]).
// Note [dV staged first]: dV's rows lie within dS and the pad, so they are staged while the
// reducer may still be reading the tile's last dQ; the wait for its hand-back (which ncu put at
// ~2.5 % of a consumer warp's time at hd128 causal 2k) comes after them, and
// dK's rows, which reach into dQ's buffer, after it. write_rows issues all of a thread's loads
// before its stores, so a row pass costs one shared-memory round trip, not one per chunk (the
// loop before was ~3.6 % of a consumer warp's time there).

// The fragment, times scale, as rows of `rows` (pitch kD + 8 elements).
template <class T, int kD, class Frag, class Coord>
__device__ __forceinline__ void stage_rows(typename T::Element* rows, float scale, const Frag& acc,
                                           const Coord& coords) {
  using Element = typename T::Element;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    cutlass::Array<Element, 2> pair;
    pair[0] = Element(acc(i) * scale);
    pair[1] = Element(acc(i + 1) * scale);
    const int at = get<0>(coords(i)) * (kD + 8) + get<1>(coords(i));
    *reinterpret_cast<cutlass::Array<Element, 2>*>(rows + at) = pair;
  }
}

// Rows [0, rows_valid) and columns [0, cols_valid) (a multiple of 8: Note [padded head dims]) of
// the staged tile to global memory, 16 bytes per store, chunk c of the tile (row c / kChunks) by
// thread c % kConsumerThreads: all loads, then all stores, predicated (with a branch per store
// ptxas moved each load down to its store).
template <class T, int kD>
__device__ __forceinline__ void write_rows(const typename T::Element* rows,
                                           typename T::Element* base, int64_t row_stride,
                                           int rows_valid, int cols_valid, int tid) {
  constexpr int kChunks = kD / 8, kThreads = T::kConsumerThreads;
  constexpr int kTotal = T::kBlockN * kChunks;
  constexpr int kPasses = (kTotal + kThreads - 1) / kThreads;
  // With kChunks dividing kThreads a thread keeps its column and steps kThreads / kChunks rows.
  constexpr bool kFixedCol = kThreads % kChunks == 0;
  auto row_of = [&](int k) {
    return kFixedCol ? tid / kChunks + k * (kThreads / kChunks) : (tid + k * kThreads) / kChunks;
  };
  auto col_of = [&](int k) {
    return (kFixedCol ? tid % kChunks : (tid + k * kThreads) % kChunks) * 8;
  };
  auto in_tile = [&](int k) { return kTotal % kThreads == 0 || tid + k * kThreads < kTotal; };
  uint4 v[kPasses] = {};
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kPasses; ++k) {
    if (in_tile(k)) {
      v[k] = *reinterpret_cast<const uint4*>(rows + row_of(k) * (kD + 8) + col_of(k));
    }
  }
  const int64_t step = int64_t(kThreads / kChunks) * row_stride;  // kFixedCol
  typename T::Element* const first = base + int64_t(row_of(0)) * row_stride + col_of(0);
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kPasses; ++k) {
    auto* at = kFixedCol ? first + k * step : base + int64_t(row_of(k)) * row_stride + col_of(k);
    cutlass::arch::global_store<uint4, 16>(
        v[k], at, in_tile(k) && row_of(k) < rows_valid && col_of(k) < cols_valid);
  }
}

// dK and dV of this tile, summed over the group: dK scaled by softmax_scale (dS is the gradient
// w.r.t. the scaled scores), written as the dtype; rows past seqlen_k skipped. Called by every
// consumer thread after its last GEMM (Note [dK/dV epilogue]); wait_dq() waits until the reducer
// has read this warpgroup's last dQ (Note [dV staged first]).
template <class T, class MmaK, class AccK, class MmaV, class AccV, class WaitDq>
__device__ __forceinline__ void store_dk_dv(const BwdKernelParams<T>& kp,
                                            typename T::SharedStorage& ss, const SeqInfo& seq,
                                            int n, int head_kv, int b, int tid, const MmaK& mma_dk,
                                            const AccK& acc_dk, const MmaV& mma_dv,
                                            const AccV& acc_dv, WaitDq&& wait_dq) {
  using Element = typename T::Element;
  constexpr int kN = T::kBlockN, kD = T::kHeadDim, kDV = T::kHeadDimV;
  const BwdParams& p = kp.p;
  Element* dk = kv_tile_row0<T>(p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, kp, seq,
                                n, head_kv, b);
  Element* dv = dv_tile<T>(kp, seq, n, head_kv, b);
  const int rows_valid = seq.seqlen_k - n * kN;
  const auto ck = fragment_coords(mma_dk, tid, Shape<Int<kN>, Int<kD>>{});
  const auto cv = fragment_coords(mma_dv, tid, Shape<Int<kN>, Int<kDV>>{});
  // ss.staging(): dS, stage_pad and dQ's buffer, in that order; dS is free once both warpgroups
  // pass the first barrier below, dQ's buffer once both have waited for the reducer.
  static_assert(T::kDvStageElems <= T::kDsElems + T::kStagePad, "dV's rows end before dQ's buffer");
  static_assert(T::kStageElems <= T::kDsElems + T::kStagePad + T::kDqElems, "dK's rows fit");
  Element* rows_v = ss.staging();
  Element* rows_k = rows_v + T::kDvStageElems;
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);
  stage_rows<T, kDV>(rows_v, 1.0f, acc_dv, cv);
  wait_dq();
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);
  stage_rows<T, kD>(rows_k, p.fwd.softmax_scale, acc_dk, ck);
  write_rows<T, kDV>(rows_v, dv, p.dv_row_stride, rows_valid, p.fwd.head_dim_v, tid);
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);
  write_rows<T, kD>(rows_k, dk, p.dk_row_stride, rows_valid, p.fwd.head_dim, tid);
  // The next tile's dS and dQ stores reuse the staging buffers (persistent grid).
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);
}

// Note [TMA-store dK/dV]: in dense problems (whose TMA tensors end at seqlen_k, so a partial
// last tile is clipped; varlen packs the sequences, and a clipped box would write the next
// sequence's rows) dV and dK leave by TMA stores instead of write_rows. Their stores were ~3.3 %
// of a consumer warp's time at hd128 causal 2k (ncu), mostly waits until
// the stores had read their source registers; the TMA store reads shared memory in the
// background while the next tile starts. The consumers stage them with stmatrix in the K/V
// swizzled layouts (dV over dS, dK over dQ's buffer, which needs no padded rows) and signal
// kDkDvStaged; the dQ reducer warp, after the tile's last reduce-add, issues both stores, waits
// for their reads and signals kDkDvRead, which the consumers wait for once the next tile's K
// and V have landed (their first block writes dS and dQ's buffer again) and after their last
// tile. Issued by a consumer thread instead, the store code's uniform registers made ptxas move
// a descriptor base of the loop into vector registers (+34 instructions per warp and block).

// The fragment acc · scale, as the dtype, into `buf` in Layout (stmatrix, 16 bytes per lane).
template <class T, class Layout, class Mma, class Acc>
__device__ __forceinline__ void stage_swizzled(typename T::Element* buf, const Mma& mma,
                                               const Acc& acc, float scale, int tid) {
  using Element = typename T::Element;
  Tensor s = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(buf), Layout{}));
  auto copy_c = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
  auto thr = copy_c.get_thread_slice(tid);
  Tensor r = make_tensor_like<Element>(acc);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(acc); ++i) r(i) = Element(acc(i) * scale);
  copy(copy_c, thr.retile_S(r), thr.partition_D(s));
}

// The consumers' part: dK (scaled) and dV of this tile staged for the reducer's TMA stores;
// wait_dq as in store_dk_dv.
template <class T, class MmaK, class AccK, class MmaV, class AccV, class WaitDq>
__device__ __forceinline__ void stage_dk_dv_tma(const BwdKernelParams<T>& kp,
                                                typename T::SharedStorage& ss, int tid,
                                                const MmaK& mma_dk, const AccK& acc_dk,
                                                const MmaV& mma_dv, const AccV& acc_dv,
                                                WaitDq&& wait_dq) {
  using Element = typename T::Element;
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);  // dS read by every dQ GEMM
  stage_swizzled<T, typename T::SmemLayoutDVst>(ss.ds.data(), mma_dv, acc_dv, 1.0f, tid);
  wait_dq();
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kEpilogue);  // dQ's buffer read
  stage_swizzled<T, typename T::SmemLayoutDKst>(reinterpret_cast<Element*>(ss.dq), mma_dk, acc_dk,
                                                kp.p.fwd.softmax_scale, tid);
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::arrive(T::kConsumerThreads + kReducerThreads, kDkDvStaged);
}

// Note [split epilogue]: the split variant's shared memory is K, V, two stages of Q and dO, and
// P and dS (224 KB at d = 256). With the persistent grid, K, V, Q and dO take the next tile's
// loads while this tile's epilogue runs, and P and dS (32 KB) cannot hold a 64-row dK or dV
// (64 x 264 x 2 bytes each with the padding). So dK and dV go out from the accumulators: per
// thread and row, each four 8-column groups of the warpgroup's half of d pass through
// quad_transpose (sm90/common.cuh), and then each lane writes 8 consecutive columns. A warp
// instruction thus writes 8 rows x 64 bytes, whole 32-byte sectors; the staged rows give 128 B
// per row, while the pairs before Note [dK/dV epilogue] gave half sectors. No barrier: only
// registers are read. The accumulator of a warpgroup's wgmma m64nNk16 is QuadFrag<N>
// (common/fragment.cuh): N = d / 2 here.
// Columns past cols_valid (a multiple of 8: Note [padded head dims]) are not written.
template <class T, int kCols, class Acc, class Coord>
__device__ __forceinline__ void write_quad_rows(typename T::Element* base, int64_t row_stride,
                                                int rows_valid, int cols_valid, float scale,
                                                const Acc& acc, const Coord& coords,
                                                int quad_lane) {
  using Element = typename T::Element;
  using Frag = QuadFrag<kCols>;
  static_assert(decltype(size(acc))::value == Frag::kSize, "one m64nNk16 accumulator");
  static_assert(kCols % 32 == 0, "groups of four 8-column chunks");
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < Frag::kRows; ++r) {
    const int row = get<0>(coords(Frag::idx(r, 0)));
    const bool in_seq = row < rows_valid;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kCols / 32; ++j) {
      uint32_t w[4];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int e = 2 * (4 * j + k);  // the group's first element in the row
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(acc(Frag::idx(r, e)) * scale);
        pair[1] = Element(acc(Frag::idx(r, e + 1)) * scale);
        w[k] = reinterpret_cast<const uint32_t&>(pair);
      }
      quad_transpose(w, quad_lane);
      // Group 4j sits at column c0 + 2·quad_lane of this row; lane q now holds group 4j + q.
      const int col = get<1>(coords(Frag::idx(r, 8 * j))) + 6 * quad_lane;
      if (in_seq && col < cols_valid) {
        *reinterpret_cast<uint4*>(base + row * row_stride + col) =
            make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
}

// Note [dK/dV from registers]: the d <= 128 variant writes dK and dV as the split variant does
// (write_quad_rows: 16-byte row chunks after quad_transpose, each warpgroup's m64nN accumulator
// with N = d), instead of staging them over dS and dQ's buffers (Note [dK/dV epilogue]). The
// staging had to wait for the reducer to hand back the tile's last dQ and joined both warpgroups
// three times per tile; now each warpgroup leaves the tile as soon as its own GEMMs are done. The
// hand-back wait moves to the warpgroup's next dQ store (dq_owed, kept across tiles with no
// block, drained after the last tile so every arrival on dq_empty is matched), and the dS stages
// count blocks across tiles: the next tile's first dSᵀ store then takes the stage the other
// warpgroup's last dQ did not read, and kDsWritten's argument (sm90/bwd/kernel.cuh) holds across
// the tile boundary with no barrier. It runs at hd64 only (BwdTraits::kDkDvRegs): there (dQ from
// registers, no hand-back) +1.3-1.8 % at 512-2k, level at 16k; at hd128 it lost 6-10 % at 512-2k
// even with the hand-back still waited for at the tile's end, so the loss is the register stores
// themselves (with 12 more bytes of spills, reloaded beside them), not the moved wait.

// dK, dV of a kv tile straight from the registers (as store_dk_dv: dK scaled, rows past seqlen_k
// skipped); each warpgroup's accumulator is one m64nN atom, N = 2 · its size per thread.
template <class T, class MmaK, class AccK, class MmaV, class AccV>
__device__ __forceinline__ void store_dk_dv_regs(const BwdKernelParams<T>& kp, const SeqInfo& seq,
                                                 int n, int head_kv, int b, int tid,
                                                 const MmaK& mma_dk, const AccK& acc_dk,
                                                 const MmaV& mma_dv, const AccV& acc_dv) {
  constexpr int kN = T::kBlockN, kD = T::kHeadDim, kDV = T::kHeadDimV;
  const BwdParams& p = kp.p;
  auto* dk = kv_tile_row0<T>(p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, kp, seq, n,
                             head_kv, b);
  auto* dv = dv_tile<T>(kp, seq, n, head_kv, b);
  const int rows_valid = seq.seqlen_k - n * kN;
  const auto ck = fragment_coords(mma_dk, tid, Shape<Int<kN>, Int<kD>>{});
  const auto cv = fragment_coords(mma_dv, tid, Shape<Int<kN>, Int<kDV>>{});
  constexpr int kColsK = 2 * decltype(size(acc_dk))::value;
  constexpr int kColsV = 2 * decltype(size(acc_dv))::value;
  write_quad_rows<T, kColsK>(dk, p.dk_row_stride, rows_valid, p.fwd.head_dim, p.fwd.softmax_scale,
                             acc_dk, ck, tid % 4);
  write_quad_rows<T, kColsV>(dv, p.dv_row_stride, rows_valid, p.fwd.head_dim_v, 1.0f, acc_dv, cv,
                             tid % 4);
}

// Note [GQA head slices] (sm90/bwd/kernel.cuh): an item holds a slice of its kv head's q heads,
// so its dK and dV are partial sums; each consumer thread adds its fragments to the tile's
// fp32 accumulator blocks in the workspace (fragment order, as Note [dQ reduce]; dK unscaled),
// and bwd_postprocess_kv_sm90 writes the sums as the dtype.
template <class T, class AccK, class AccV>
__device__ __forceinline__ void red_dk_dv(const BwdKernelParams<T>& kp, const BwdTile& t, int tid,
                                          const AccK& acc_dk, const AccV& acc_dv) {
  const int64_t at = kp.ws.row_offset_k(t.b, t.seq.offset_k, t.n * T::kBlockN) * kp.ws.kv_dim;
  red_add_fragment<T::kConsumerThreads>(kp.ws.dk(t.head_kv) + at + 4 * tid, acc_dk);
  red_add_fragment<T::kConsumerThreads>(kp.ws.dv(t.head_kv) + at + 4 * tid, acc_dv);
}

}  // namespace fa4::sm90
