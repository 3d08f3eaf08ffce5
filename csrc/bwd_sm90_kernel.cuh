// SM90 (Hopper) backward main kernel: dK, dV per KV tile, dQ by fp32 reduce-add.
//
// STATUS: compiled for sm_90a, NOT YET EXECUTED. It is not in setup.py's KERNEL_SOURCES nor
// CMake's sources, so no dispatch reaches it; issue 4 wires it in once it passes the GPU tests.
//
// One CTA per (kv tile of kBlockN rows, kv head, batch). K and V stay in shared memory; the CTA
// loops over every query head of the GQA group and every Q block of kBlockM rows that sees the
// tile, so dK and dV are summed over the group in registers and written once (no atomics,
// deterministic). Per Q block, each consumer warpgroup (64 of the kv rows) computes, with the
// scores transposed so that kv rows are the wgmma M dimension:
//   Sᵀ  = K·Qᵀ                 (SS)      Pᵀ = exp2(Sᵀ·c − lse₂)           (softmax.cuh exp2)
//   dPᵀ = V·dOᵀ                (SS)      dSᵀ = Pᵀ ∘ (dPᵀ − D) [∘ (1 − x²) with softcap]
//   dV += Pᵀ·dO                (RS: Pᵀ from registers)
//   dK += dSᵀ·Q                (RS: dSᵀ from registers)
//   dQ  = dS·K                 (SS: dS through shared memory, each warpgroup half of d)
// and adds dQ to the fp32 accumulator in the workspace with float2 atomics: one reduction per
// two elements, half the operations of a per-element scheme (Note [dQ reduce]).
// lse₂ = lse·log2(e) (+inf for rows that saw no key, so P = 0) and D = rowsum(dO∘O) − dlse come
// from the preprocess kernel (bwd_prepost.cuh); the postprocess kernel turns dQ to the dtype.
//
// Pipelines (from X to Y, protects Z):
//   kv_full  producer -> consumers, K and V (once per CTA)
//   pipe_q   producer -> consumers, kStages Q buffers
//   pipe_do  producer -> consumers, kStages dO buffers
// Named barriers: dS written by both warpgroups before the dQ GEMM reads it, and read before
// the next block overwrites it.
//
// Head dims: d <= 128 (kBlockN 128, kBlockM 64). Registers per consumer thread at d = 128: dK
// 64 + dV 64 + Sᵀ 32 + dPᵀ 32 + dQ 32 (not all live at once) of 240; larger d needs dK/dV split
// across warpgroups and is not in this kernel (kUnsupported, the reference runs).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "bwd_prepost.cuh"
#include "mask.cuh"
#include "params.h"
#include "sm90_common.cuh"
#include "softmax.cuh"

namespace fa4::sm90 {

template <int kHeadDim_, int kHeadDimV_, class Element_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static_assert(kHeadDim <= 128 && kHeadDimV <= 128, "register budget: see the header note");
  static constexpr int kBlockM = 64;   // query rows per step (wgmma N of Sᵀ)
  static constexpr int kBlockN = 128;  // kv rows per CTA, 64 per consumer warpgroup
  static constexpr int kStages = 2;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 128 + kConsumerThreads;

  using AtomM2 = Layout<Shape<_2, _1, _1>>;  // the two warpgroups split the kv rows (M)
  using AtomN2 = Layout<Shape<_1, _2, _1>>;  // ... or, for dQ, the head dim (N)
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(),
      AtomM2{}));
  using MmaDP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDimV>>>(),
      AtomM2{}));
  using MmaDV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomM2{}));
  using MmaDK = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomM2{}));
  using MmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomN2{}));

  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutDO = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                              Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStages>>{}));
  using SmemLayoutK = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutV = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, _1>{}));
  using SmemLayoutDS = decltype(tile_to_shape(smem_atom_k<Element, kBlockN>(),
                                              Shape<Int<kBlockM>, Int<kBlockN>, _1>{}));
  using SmemLayoutQt = TransposedSmem<SmemLayoutQ, kBlockM, kHeadDim, kStages>;
  using SmemLayoutDOt = TransposedSmem<SmemLayoutDO, kBlockM, kHeadDimV, kStages>;
  using SmemLayoutKt = TransposedSmem<SmemLayoutK, kBlockN, kHeadDim, 1>;
  using SmemLayoutDSt = TransposedSmem<SmemLayoutDS, kBlockM, kBlockN, 1>;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDO>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDS>> ds;
    alignas(16) float lse2[kBlockM];  // of the current Q block, written by consumer threads
    float dpsum[kBlockM];
    typename Pipeline::SharedStorage pipe_q;
    typename Pipeline::SharedStorage pipe_do;
    cutlass::arch::ClusterTransactionBarrier kv_full;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM90)");
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kDOBytes = kBlockM * kHeadDimV * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);
};

// As the forward: the producer's TMA and index arithmetic spill at 24 registers.
constexpr int kBwdProducerRegs = 40;
constexpr int kBwdConsumerRegs = 232;  // 40·128 + 232·256 = 64512 = 168·384

// Named barrier ids (user range, above CUTLASS's reserved ones).
enum BwdBarrier : uint32_t {
  kDsWritten = 0,
  kDsRead = 1,
  kStatsWritten = 2,
  kDqTurn = 3,  // deterministic mode: this CTA's turn to add to a dQ block has come
  kDqAdded = 4  // ... and every consumer thread's adds are issued and fenced
};

// Grid: (kv tile, kv head, batch) flattened into x with the kv tile fastest, so that the
// hardware's in-order block dispatch starts the tiles of one head in increasing order, which
// deterministic mode relies on (Note [deterministic dQ]); and no grid dimension limits heads or
// batch.
struct BwdGrid {
  int n_tiles, heads_kv;
  __device__ void decode(int64_t bid, int& n, int& head_kv, int& b) const {
    n = int(bid % n_tiles);
    const int64_t rest = bid / n_tiles;
    head_kv = int(rest % heads_kv);
    b = int(rest / heads_kv);
  }
};

template <class T>
struct BwdKernelParams {
  using Element = typename T::Element;
  using TmaQ = TmaTile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>;
  using TmaDO = TmaTile<Element, typename T::SmemLayoutDO, T::kBlockM, T::kHeadDimV>;
  using TmaK = TmaTile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>;
  using TmaV = TmaTile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>;
  TmaQ tma_q;
  TmaDO tma_do;
  TmaK tma_k;
  TmaV tma_v;
  Shape<int, int, int, int> shape_q, shape_do, shape_k, shape_v;
  BwdParams p;
  BwdWorkspace ws;
  ScoreScale score;
  BwdGrid grid;
  int group;
};

// The Q blocks (of kBlockM rows) that see kv block n: a contiguous range (Note [mask
// alignment]), found by asking block_range of each Q block.
template <class T>
__device__ __forceinline__ void q_blocks_seeing(const Mask& mask, int n, int& m_begin, int& m_end) {
  const int m_blocks = (mask.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  m_begin = m_blocks;
  m_end = 0;
  for (int m = 0; m < m_blocks; ++m) {
    const BlockRange br = block_range<T::kBlockM, T::kBlockN>(mask, m);
    if (br.n_begin <= n && n < br.n_end) {
      m_begin = m < m_begin ? m : m_begin;
      m_end = m + 1;
    }
  }
}

template <class T>
__device__ __forceinline__ void bwd_producer(const BwdKernelParams<T>& kp,
                                             typename T::SharedStorage& ss,
                                             typename T::Pipeline& pipe_q,
                                             typename T::Pipeline& pipe_do, const SeqInfo& seq,
                                             const Mask& mask, int n, int head_kv, int bidb) {
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);
  Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_v);
  Tensor gK = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mK(_, _, head_kv, bidb)),
                         Shape<Int<T::kBlockN>, Int<T::kHeadDim>>{}, make_coord(n, _0{}));
  Tensor gV = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mV(_, _, head_kv, bidb)),
                         Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>{}, make_coord(n, _0{}));
  auto [tKgK, tKsK] =
      tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] =
      tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  ss.kv_full.arrive_and_expect_tx(T::kKVBytes);
  copy(kp.tma_k.with(reinterpret_cast<uint64_t&>(ss.kv_full), 0), tKgK, tKsK(_, 0));
  copy(kp.tma_v.with(reinterpret_cast<uint64_t&>(ss.kv_full), 0), tVgV, tVsV(_, 0));

  Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);
  Tensor mDO = kp.tma_do.get_tma_tensor(kp.shape_do);
  auto q_state = cutlass::make_producer_start_state<typename T::Pipeline>();
  auto do_state = q_state;
  int m_begin, m_end;
  q_blocks_seeing<T>(mask, n, m_begin, m_end);
  for (int g = 0; g < kp.group; ++g) {
    const int head = head_kv * kp.group + g;
    Tensor gQ = local_tile(domain_offset(make_coord(seq.offset_q, _0{}), mQ(_, _, head, bidb)),
                           Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gDO = local_tile(domain_offset(make_coord(seq.offset_q, _0{}), mDO(_, _, head, bidb)),
                            Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{}, make_coord(_, _0{}));
    auto [tQgQ, tQsQ] =
        tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tDgD, tDsD] = tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sDO),
                                      group_modes<0, 2>(gDO));
    for (int m = m_begin; m < m_end; ++m) {
      pipelined_tma_load(pipe_q, q_state, kp.tma_q, tQgQ(_, m), tQsQ);
      pipelined_tma_load(pipe_do, do_state, kp.tma_do, tDgD(_, m), tDsD);
    }
  }
  pipe_q.producer_tail(q_state);
  pipe_do.producer_tail(do_state);
}

// Accumulator element i of a wgmma fragment at its (row, col) in the tile: identity tensors
// partitioned like the accumulator (no layout formulas repeated here).
template <class TiledMma, class Shape2>
__device__ __forceinline__ auto fragment_coords(const TiledMma& mma, int tid, Shape2 shape) {
  return mma.get_thread_slice(tid).partition_C(make_identity_tensor(shape));
}

template <class T, class Frag, class Coord>
__device__ __forceinline__ void store_rows(typename T::Element* base, int64_t row_stride,
                                           int rows_valid, float scale, const Frag& acc,
                                           const Coord& coords) {
  using Element = typename T::Element;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int row = get<0>(coords(i));
    const int col = get<1>(coords(i));
    if (row >= rows_valid) continue;
    cutlass::Array<Element, 2> pair;
    pair[0] = Element(acc(i) * scale);
    pair[1] = Element(acc(i + 1) * scale);
    *reinterpret_cast<cutlass::Array<Element, 2>*>(base + row * row_stride + col) = pair;
  }
}

// Note [deterministic dQ]: with FwdParams::deterministic, the kv tiles that see a 64-row query
// block add their dQ to it in increasing tile order. Tile n of a head waits, before its adds,
// until the block's turn counter (BwdWorkspace::sem) equals the number of tiles before it that
// see the block (those form the range [n_begin, n), Note [mask alignment]), and increments it
// after. The float adds to each address then happen in one fixed order, so dQ is bitwise
// reproducible. A tile only waits on tiles of lower block index, which the in-order dispatch
// started earlier, so the waits cannot deadlock; the cost is the skew this imposes (measured:
// docs/perf.md).
// `threads`: the consumer threads that add to the block; tid 0 of them waits and signals.
__device__ __forceinline__ void dq_turn_wait(const int* sem, int turn, int tid, int threads) {
  if (tid == 0) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(sem) : "memory");
    } while (seen != turn);
  }
  cutlass::arch::NamedBarrier::sync(threads, kDqTurn);
}

__device__ __forceinline__ void dq_turn_pass(int* sem, int tid, int threads) {
  __threadfence();
  cutlass::arch::NamedBarrier::sync(threads, kDqAdded);
  if (tid == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
}

template <class T>
__device__ __forceinline__ void bwd_consumer(const BwdKernelParams<T>& kp,
                                             typename T::SharedStorage& ss,
                                             typename T::Pipeline& pipe_q,
                                             typename T::Pipeline& pipe_do, const SeqInfo& seq,
                                             const Mask& mask, int n, int head_kv, int b, int tid) {
  using Element = typename T::Element;
  constexpr int kM = T::kBlockM, kN = T::kBlockN;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQt{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  Tensor sDOt = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDOt{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor sDS = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDS{});
  Tensor sDSt = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDSt{});

  typename T::MmaSdP mma_s;
  typename T::MmaDP mma_dp;
  typename T::MmaDV mma_dv;
  typename T::MmaDK mma_dk;
  typename T::MmaDQ mma_dq;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_dp = mma_dp.get_thread_slice(tid);
  auto thr_dv = mma_dv.get_thread_slice(tid);
  auto thr_dk = mma_dk.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tSrK = thr_s.partition_fragment_A(sK(_, _, 0));
  Tensor tSrQ = thr_s.partition_fragment_B(sQ);
  Tensor tPrV = thr_dp.partition_fragment_A(sV(_, _, 0));
  Tensor tPrDO = thr_dp.partition_fragment_B(sDO);
  Tensor tVrDOt = thr_dv.partition_fragment_B(sDOt);
  Tensor tKrQt = thr_dk.partition_fragment_B(sQt);
  Tensor tQrDS = thr_dq.partition_fragment_A(sDS(_, _, 0));
  Tensor tQrKt = thr_dq.partition_fragment_B(sKt(_, _, 0));
  Tensor tSsDSt = thr_s.partition_C(sDSt(_, _, 0));  // where this thread's dSᵀ goes in smem

  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kN>, Int<kM>>{});
  Tensor acc_dp = partition_fragment_C(mma_dp, Shape<Int<kN>, Int<kM>>{});
  Tensor acc_dv = partition_fragment_C(mma_dv, Shape<Int<kN>, Int<T::kHeadDimV>>{});
  Tensor acc_dk = partition_fragment_C(mma_dk, Shape<Int<kN>, Int<T::kHeadDim>>{});
  Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kM>, Int<T::kHeadDim>>{});
  Tensor reg_p = make_tensor<Element>(partition_shape_A(mma_dv, Shape<Int<kN>, Int<kM>>{}));
  Tensor reg_ds = make_tensor<Element>(partition_shape_A(mma_dk, Shape<Int<kN>, Int<kM>>{}));
  // The same registers in the accumulator's layout, for the copy to smem: the A-operand and
  // accumulator fragments order a thread's elements identically (as P in the forward).
  Tensor reg_ds_c = make_tensor(reg_ds.data(), acc_s.layout());
  const auto c_s = fragment_coords(mma_s, tid, Shape<Int<kN>, Int<kM>>{});
  const auto c_dq = fragment_coords(mma_dq, tid, Shape<Int<kM>, Int<T::kHeadDim>>{});
  clear(acc_dv);
  clear(acc_dk);

  auto issue = [](auto& mma, const auto& a, const auto& b, auto& c, bool zero) {
    warpgroup_fence_operand(c);
    warpgroup_arrive();
    mma.accumulate_ = zero ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < size<2>(a); ++k) {
      gemm(mma, a(_, _, k), b(_, _, k), c);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  };

  const BwdParams& p = kp.p;
  const FwdParams& f = p.fwd;
  const int64_t row0_ws = kp.ws.row_offset(b, seq.offset_q, 0);  // first workspace row
  auto q_state = typename T::Pipeline::PipelineState{};
  auto do_state = q_state;
  int m_begin, m_end;
  q_blocks_seeing<T>(mask, n, m_begin, m_end);
  ss.kv_full.wait(0);
  for (int g = 0; g < kp.group; ++g) {
    const int head = head_kv * kp.group + g;
    const float* lse2 = kp.ws.lse2(head) + row0_ws;
    const float* dpsum = kp.ws.dpsum(head) + row0_ws;
    float* dq_acc = kp.ws.dq(head) + row0_ws * f.head_dim;
    for (int m = m_begin; m < m_end; ++m) {
      // Row statistics of this Q block into shared memory (both warpgroups read all 64).
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kDsRead);  // previous block done
      if (tid < kM) ss.lse2[tid] = lse2[m * kM + tid];
      if (tid >= kM && tid < 2 * kM) ss.dpsum[tid - kM] = dpsum[m * kM + tid - kM];
      pipe_q.consumer_wait(q_state);
      pipe_do.consumer_wait(do_state);
      issue(mma_s, tSrK, tSrQ(_, _, _, q_state.index()), acc_s, true);
      issue(mma_dp, tPrV, tPrDO(_, _, _, do_state.index()), acc_dp, true);
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kStatsWritten);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      warpgroup_fence_operand(acc_dp);
      const bool masked = block_range<kM, kN>(mask, m).needs_mask(n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int kv = n * kN + get<0>(c_s(i));
        const int qi = get<1>(c_s(i));
        float x = acc_s(i);
        if (kp.score.softcap) x = tanhf(x * kp.score.pre);
        const bool visible = !masked || mask.is_visible(m * kM + qi, kv);
        // lse₂ is +inf for rows that saw no key: P = 2^-inf = 0 (Note [empty rows]).
        const float pv = visible ? exp2_hw(fmaf(x, kp.score.scale_log2, -ss.lse2[qi])) : 0.0f;
        float ds = pv * (acc_dp(i) - ss.dpsum[qi]);
        if (kp.score.softcap) ds *= 1.0f - x * x;
        reg_p(i) = Element(pv);
        reg_ds(i) = Element(ds);
      }
      // dSᵀ to shared memory for dQ = dS·K (both warpgroups' kv rows form the K dimension).
      copy(reg_ds_c, tSsDSt);
      cutlass::arch::fence_view_async_shared();
      issue(mma_dv, reg_p, tVrDOt(_, _, _, do_state.index()), acc_dv, false);
      issue(mma_dk, reg_ds, tKrQt(_, _, _, q_state.index()), acc_dk, false);
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kDsWritten);
      issue(mma_dq, tQrDS, tQrKt, acc_dq, true);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dv);
      warpgroup_fence_operand(acc_dk);
      warpgroup_fence_operand(acc_dq);
      pipe_q.consumer_release(q_state);
      pipe_do.consumer_release(do_state);
      ++q_state;
      ++do_state;
      // Note [dQ reduce]: float2 atomics on adjacent columns, one per two elements; rows past the
      // sequence land in the workspace's per-sequence padding and are never read back.
      int* sem = f.deterministic ? kp.ws.sem(head, row0_ws + m * kM) : nullptr;
      if (sem != nullptr) {
        dq_turn_wait(sem, n - block_range<kM, kN>(mask, m).n_begin, tid, T::kConsumerThreads);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_dq); i += 2) {
        const int row = m * kM + get<0>(c_dq(i));
        const int col = get<1>(c_dq(i));
        atomicAdd(reinterpret_cast<float2*>(dq_acc + int64_t(row) * f.head_dim + col),
                  make_float2(acc_dq(i), acc_dq(i + 1)));
      }
      if (sem != nullptr) dq_turn_pass(sem, tid, T::kConsumerThreads);
    }
  }
  // dK and dV of this tile, summed over the group: dK scaled by softmax_scale (dS is the
  // gradient w.r.t. the scaled scores), written as the dtype; rows past seqlen_k skipped.
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int bidb = varlen ? 0 : b;
  Element* dk = static_cast<Element*>(p.dk) + int64_t(bidb) * p.dk_batch_stride +
                (int64_t(seq.offset_k) + int64_t(n) * kN) * p.dk_row_stride +
                int64_t(head_kv) * p.dk_head_stride;
  Element* dv = static_cast<Element*>(p.dv) + int64_t(bidb) * p.dv_batch_stride +
                (int64_t(seq.offset_k) + int64_t(n) * kN) * p.dv_row_stride +
                int64_t(head_kv) * p.dv_head_stride;
  const int rows_valid = seq.seqlen_k - n * kN;
  store_rows<T>(dk, p.dk_row_stride, rows_valid, f.softmax_scale, acc_dk,
                fragment_coords(mma_dk, tid, Shape<Int<kN>, Int<T::kHeadDim>>{}));
  store_rows<T>(dv, p.dv_row_stride, rows_valid, 1.0f, acc_dv,
                fragment_coords(mma_dv, tid, Shape<Int<kN>, Int<T::kHeadDimV>>{}));
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdKernelParams<T> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem);
  const FwdParams& f = kp.p.fwd;
  int n, head_kv, b;
  kp.grid.decode(blockIdx.x, n, head_kv, b);
  const SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  const Mask mask = Mask::from_params(f, seq.seqlen_q, seq.seqlen_k);
  const auto role = static_cast<WarpGroupRole>(threadIdx.x / 128);
  if (threadIdx.x == 0) ss.kv_full.init(1);
  using Pipe = typename T::Pipeline;
  typename Pipe::Params pq;
  pq.role = role == WarpGroupRole::kProducer ? Pipe::ThreadCategory::Producer
                                             : Pipe::ThreadCategory::Consumer;
  pq.is_leader = threadIdx.x == 0;
  pq.num_consumers = T::kConsumerThreads;
  typename Pipe::Params pd = pq;
  pq.transaction_bytes = T::kQBytes;
  pd.transaction_bytes = T::kDOBytes;
  Pipe pipe_q(ss.pipe_q, pq, Shape<_1, _1, _1>{});
  Pipe pipe_do(ss.pipe_do, pd, Shape<_1, _1, _1>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  // A tile past this sequence's keys (varlen: grid sized by the longest) has nothing to do;
  // its dK/dV rows do not exist.
  if (n * T::kBlockN >= seq.seqlen_k) return;
  if (role == WarpGroupRole::kProducer) {
    cutlass::arch::warpgroup_reg_dealloc<kBwdProducerRegs>();
    if (threadIdx.x == 0) {
      const int bidb = f.cu_seqlens_q != nullptr ? 0 : b;
      bwd_producer(kp, ss, pipe_q, pipe_do, seq, mask, n, head_kv, bidb);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kBwdConsumerRegs>();
    bwd_consumer(kp, ss, pipe_q, pipe_do, seq, mask, n, head_kv, b, threadIdx.x - 128);
  }
#endif
}

}  // namespace fa4::sm90

namespace fa4::sm90 {

// Pre/main/postprocess on `stream`. Only d = d_v <= 128 (see the header note).
template <class T>
Status launch_bwd(const BwdParams& p, const DeviceInfo&, void* workspace, cudaStream_t stream) {
  using Element = typename T::Element;
  const FwdParams& f = p.fwd;
  BwdKernelParams<T> kp;
  kp.p = p;
  kp.ws = workspace_of(f, workspace);
  kp.score = ScoreScale::make(f.softmax_scale, f.softcap);
  kp.group = f.heads_q / f.heads_kv;
  const GmemView q =
      gmem_view(f, f.q, false, T::kHeadDim, f.q_row_stride, f.q_head_stride, f.q_batch_stride);
  const GmemView dout = gmem_view(f, p.dout, false, T::kHeadDimV, p.dout_row_stride,
                                  p.dout_head_stride, p.dout_batch_stride);
  const GmemView k =
      gmem_view(f, f.k, true, T::kHeadDim, f.k_row_stride, f.k_head_stride, f.k_batch_stride);
  const GmemView v =
      gmem_view(f, f.v, true, T::kHeadDimV, f.v_row_stride, f.v_head_stride, f.v_batch_stride);
  kp.shape_q = q.shape();
  kp.shape_do = dout.shape();
  kp.shape_k = k.shape();
  kp.shape_v = v.shape();
  kp.tma_q = make_tma_tile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>(q);
  kp.tma_do = make_tma_tile<Element, typename T::SmemLayoutDO, T::kBlockM, T::kHeadDimV>(dout);
  kp.tma_k = make_tma_tile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>(k);
  kp.tma_v = make_tma_tile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>(v);
  // Grids flattened into x (at most 2^31 - 1 blocks: a 2^31-row problem is far past memory).
  const RowBlockGrid rows = RowBlockGrid::of(f);
  const int64_t pp_blocks = rows.blocks(f);
  if (pp_blocks > 0)
    bwd_preprocess<Element><<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, rows);
  kp.grid = {(f.seqlen_k + T::kBlockN - 1) / T::kBlockN, f.heads_kv};
  const int64_t blocks = int64_t(kp.grid.n_tiles) * f.heads_kv * f.batch;
  if (blocks > 0) {
    const Status s = launch_kernel("bwd_sm90", bwd_kernel<T>, dim3(unsigned(blocks)), T::kThreads,
                                   T::kSmemBytes, stream, kp);
    if (s != Status::kOk) return s;
  }
  if (pp_blocks > 0) {
    bwd_postprocess<Element><<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, rows);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return kernel_fail(Status::kCudaError, "bwd_sm90 postprocess launch: %s",
                       cudaGetErrorString(e));
  }
  return Status::kOk;
}

template <int D, int DV>
Status launch_bwd_dtype(const BwdParams& p, const DeviceInfo& dev, void* ws, cudaStream_t s) {
  if (p.fwd.dtype == DType::kBFloat16) {
    return launch_bwd<BwdTraits<D, DV, cutlass::bfloat16_t>>(p, dev, ws, s);
  }
  return launch_bwd<BwdTraits<D, DV, cutlass::half_t>>(p, dev, ws, s);
}

}  // namespace fa4::sm90
