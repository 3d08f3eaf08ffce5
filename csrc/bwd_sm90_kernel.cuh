// SM90 (Hopper) backward main kernel: dK, dV per KV tile, dQ by fp32 TMA reduce-add.
//
// One CTA per (kv tile of kBlockN rows, kv head, batch). K and V stay in shared memory; the CTA
// loops over every query head of the GQA group and every Q block of kBlockM rows that sees the
// tile, so dK and dV are summed over the group in registers and written once (no atomics, exact
// and deterministic). Per Q block, each consumer warpgroup (64 of the kv rows) computes, with the
// scores transposed so that kv rows are the wgmma M dimension:
//   Sᵀ  = K·Qᵀ                 (SS)      Pᵀ = exp2(Sᵀ·c − lse₂)           (softmax.cuh exp2)
//   dPᵀ = V·dOᵀ                (SS)      dSᵀ = Pᵀ ∘ (dPᵀ − D) [∘ (1 − x²) with softcap]
//   dV += Pᵀ·dO                (RS: Pᵀ from registers)
//   dK += dSᵀ·Q                (RS: dSᵀ from registers)
//   dQ  = dS·K                 (SS: dS through shared memory, each warpgroup half of d)
// The consumers put dQ (fp32) in shared memory and a reducer warp of the producer warpgroup adds
// it to the workspace's accumulator with TMA reduce-add (Note [dQ reduce]).
// Overlap inside a warpgroup (Note [bwd issue order]): P is computed while dPᵀ is on the tensor
// cores, dS while dV is; the two warpgroups interleave naturally.
// lse₂ = lse·log2(e) (+inf for rows that saw no key, so P = 0) and D = rowsum(dO∘O) − dlse come
// from the preprocess kernel (bwd_prepost.cuh) and travel with Q and dO through the pipelines.
//
// Pipelines and barriers (from X to Y, protects Z):
//   kv_full     producer -> consumers, K and V (once per CTA)
//   pipe_q      producer -> consumers, kStages buffers of Q and its lse₂ rows
//   pipe_do     producer -> consumers, kStages buffers of dO and its D rows
//   kDsWritten  consumers -> consumers (named), dS of this block in smem before the dQ GEMM
//               (two dS buffers: a warpgroup reaching block m+2's dS store has passed block
//               m+1's kDsWritten, which the other warpgroup reaches only after its dQ GEMM of
//               block m completed, so no buffer is overwritten while read)
//   kDqFull     consumers -> reducer (named), dQ of this block in smem
//   kDqEmpty    reducer -> consumers (named), the TMA has read dQ's smem
//
// Head dims: d <= 128 (kBlockN 128, kBlockM 64). Registers per consumer thread at d = 128: dK
// 64 + dV 64 + Sᵀ/P 32 + dPᵀ 32 + Pᵀ/dSᵀ as 16-bit 16 + dQ 32 (not all live at once) of 232;
// larger d needs dK/dV split across warpgroups and is not in this kernel.
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
  static constexpr int kDsStages = 2;  // see kDsWritten in the header
  using SmemLayoutDS = decltype(tile_to_shape(smem_atom_k<Element, kBlockN>(),
                                              Shape<Int<kBlockM>, Int<kBlockN>, Int<kDsStages>>{}));
  // dQ of one block in fp32, in fragment order (Note [dQ reduce]).
  static constexpr int kDqFloats = kBlockM * kHeadDim;
  static constexpr uint32_t kDqBytes = kDqFloats * sizeof(float);
  static_assert(kDqFloats % (4 * 256) == 0, "each consumer thread stores whole float4s");
  using SmemLayoutQt = TransposedSmem<SmemLayoutQ, kBlockM, kHeadDim, kStages>;
  using SmemLayoutDOt = TransposedSmem<SmemLayoutDO, kBlockM, kHeadDimV, kStages>;
  using SmemLayoutKt = TransposedSmem<SmemLayoutK, kBlockN, kHeadDim, 1>;
  using SmemLayoutDSt = TransposedSmem<SmemLayoutDS, kBlockM, kBlockN, kDsStages>;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDO>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDS>> ds;
    alignas(128) float4 dq[kDqFloats / 4];
    alignas(16) float lse2[kStages][kBlockM];   // with Q's stage (bulk copy, pipe_q)
    alignas(16) float dpsum[kStages][kBlockM];  // with dO's stage (pipe_do)
    typename Pipeline::SharedStorage pipe_q;
    typename Pipeline::SharedStorage pipe_do;
    cutlass::arch::ClusterTransactionBarrier kv_full;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM90)");
  static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element) + kRowStatBytes;
  static constexpr uint32_t kDOBytes = kBlockM * kHeadDimV * sizeof(Element) + kRowStatBytes;
  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);
};

// As the forward: the producer's TMA and index arithmetic spill at 24 registers.
constexpr int kBwdProducerRegs = 40;
constexpr int kBwdConsumerRegs = 232;  // 40·128 + 232·256 = 64512 = 168·384

// Named barrier ids (user range, above CUTLASS's reserved ones); see the header.
enum BwdBarrier : uint32_t { kDsWritten = 0, kDqFull = 1, kDqEmpty = 2 };
constexpr int kReducerThreads = 32;  // one warp of the producer warpgroup

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
                                             const Mask& mask, int n, int head_kv, int b) {
  const bool varlen = kp.p.fwd.cu_seqlens_q != nullptr;
  const int bidb = varlen ? 0 : b;
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
  const int64_t row0_ws = kp.ws.row_offset(b, seq.offset_q, 0);
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
    const float* lse2 = kp.ws.lse2(head) + row0_ws;
    const float* dpsum = kp.ws.dpsum(head) + row0_ws;
    for (int m = m_begin; m < m_end; ++m) {
      // Q with its rows' lse₂, dO with its rows' D: each pair completes one stage's barrier.
      pipe_q.producer_acquire(q_state);
      uint64_t* bar_q = pipe_q.producer_get_barrier(q_state);
      copy(kp.tma_q.with(*bar_q, 0), tQgQ(_, m), tQsQ(_, q_state.index()));
      SM90_BULK_COPY_G2S::copy(lse2 + m * T::kBlockM, bar_q, ss.lse2[q_state.index()],
                               T::kRowStatBytes);
      ++q_state;
      pipe_do.producer_acquire(do_state);
      uint64_t* bar_do = pipe_do.producer_get_barrier(do_state);
      copy(kp.tma_do.with(*bar_do, 0), tDgD(_, m), tDsD(_, do_state.index()));
      SM90_BULK_COPY_G2S::copy(dpsum + m * T::kBlockM, bar_do, ss.dpsum[do_state.index()],
                               T::kRowStatBytes);
      ++do_state;
    }
  }
  pipe_q.producer_tail(q_state);
  pipe_do.producer_tail(do_state);
}

// Pins a 16-bit register fragment's packed 32-bit registers here: without it the compiler packs
// pairs lazily between the wgmmas that read them, and ptxas then serializes every wgmma.
template <class Frag>
__device__ __forceinline__ void fence_packed(Frag& frag) {
  Tensor words = recast<uint32_t>(frag);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(words); ++i) warpgroup_fence_operand(words(i));
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

// Note [dQ reduce]: each 64-row Q block's dQ (kBlockM × d fp32, summed over the tile's kv rows
// by the dQ GEMM) is added to the workspace accumulator by one bulk reduce-add
// (cp.reduce.async.bulk .add.f32) of the whole block: 1 operation per 64 × d block, where a
// per-element scheme issues 64·d atomics (8192 at d = 128) and float2 atomics half that. The
// block is stored in fragment order, both in shared memory and in the workspace: float4 j of
// consumer thread t at (j·256 + t)·4, so that the consumers' stores are conflict-free 16-byte
// stores at fixed offsets (a row-major buffer would cost 8-way bank conflicts, a swizzled one
// per-element address registers), and the reduce is one contiguous copy. The postprocess
// kernel, which knows the fragment's coordinates (dq_coords), turns it back into rows. Rows
// past the sequence land in the workspace's per-sequence padding and are never read back.
//
// Note [deterministic dQ]: with FwdParams::deterministic, the kv tiles that see a 64-row query
// block add their dQ to it in increasing tile order. The reducer of tile n waits, before its
// reduce-add, until the block's turn counter (BwdWorkspace::sem) equals the number of tiles
// before it that see the block (the range [n_begin, n), Note [mask alignment]), and increments
// it once the add has completed. The float adds to each address then happen in one fixed order,
// so dQ is bitwise reproducible. A tile only waits on tiles of lower block index, which the
// in-order block dispatch started earlier (BwdGrid), so the waits cannot deadlock. Only the
// reducer warp waits; the consumers run on until they need the dQ buffer again.
__device__ __forceinline__ void dq_turn_wait(const int* sem, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(sem) : "memory");
  } while (seen != turn);
}

__device__ __forceinline__ void dq_turn_pass(int* sem) {
  // The reduce-add has completed (wait_group without .read); order it before the release.
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  __threadfence();
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
}

// The reducer warp: one bulk reduce-add per Q block, in the consumers' order.
template <class T>
__device__ __forceinline__ void bwd_dq_reducer(const BwdKernelParams<T>& kp,
                                               typename T::SharedStorage& ss, const SeqInfo& seq,
                                               const Mask& mask, int n, int head_kv, int b) {
  constexpr int kBarrierThreads = T::kConsumerThreads + kReducerThreads;
  const bool leader = cute::elect_one_sync();
  const int64_t row0_ws = kp.ws.row_offset(b, seq.offset_q, 0);
  const uint32_t src = cute::cast_smem_ptr_to_uint(ss.dq);
  int m_begin, m_end;
  q_blocks_seeing<T>(mask, n, m_begin, m_end);
  const int blocks = kp.group * (m_end - m_begin);
  for (int i = 0; i < blocks; ++i) {
    const int head = head_kv * kp.group + i / (m_end - m_begin);
    const int64_t row = row0_ws + int64_t(m_begin + i % (m_end - m_begin)) * T::kBlockM;
    cutlass::arch::NamedBarrier::sync(kBarrierThreads, kDqFull);
    if (leader) {
      int* sem = kp.p.fwd.deterministic ? kp.ws.sem(head, row) : nullptr;
      if (sem != nullptr) {
        const int m = int(row - row0_ws) / T::kBlockM;
        dq_turn_wait(sem, n - block_range<T::kBlockM, T::kBlockN>(mask, m).n_begin);
      }
      float* dst = kp.ws.dq(head) + row * T::kHeadDim;
      asm volatile(
          "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
          "r"(src), "r"(T::kDqBytes)
          : "memory");
      tma_store_arrive();
      if (sem != nullptr) dq_turn_pass(sem);
      tma_store_wait<0>();  // the smem has been read
    }
    __syncwarp();
    if (i + 1 < blocks) cutlass::arch::NamedBarrier::arrive(kBarrierThreads, kDqEmpty);
  }
  // The last reduce-add must finish before the CTA (and its shared memory) goes away.
  if (leader) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
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
  Tensor tQrDS = thr_dq.partition_fragment_A(sDS);
  Tensor tQrKt = thr_dq.partition_fragment_B(sKt(_, _, 0));
  // dSᵀ to smem with stmatrix.trans: 16 bytes per instruction, the 8×8 transposes done by the
  // hardware; the position-independent swizzle keeps the addresses 32-bit shared-window offsets
  // (an elementwise copy became 32 generic 2-byte stores with 64-bit swizzle arithmetic each).
  auto copy_ds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_s);
  auto thr_copy_ds = copy_ds.get_thread_slice(tid);
  Tensor tDSsDSt = thr_copy_ds.partition_D(as_position_independent_swizzle_tensor(sDSt));

  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kN>, Int<kM>>{});
  Tensor acc_dp = partition_fragment_C(mma_dp, Shape<Int<kN>, Int<kM>>{});
  Tensor acc_dv = partition_fragment_C(mma_dv, Shape<Int<kN>, Int<T::kHeadDimV>>{});
  Tensor acc_dk = partition_fragment_C(mma_dk, Shape<Int<kN>, Int<T::kHeadDim>>{});
  Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kM>, Int<T::kHeadDim>>{});
  Tensor reg_p = make_tensor<Element>(partition_shape_A(mma_dv, Shape<Int<kN>, Int<kM>>{}));
  Tensor reg_ds = make_tensor<Element>(partition_shape_A(mma_dk, Shape<Int<kN>, Int<kM>>{}));
  // The same registers in the accumulator's layout, for the copy to smem: the A-operand and
  // accumulator fragments order a thread's elements identically (as P in the forward).
  Tensor reg_ds_c = thr_copy_ds.retile_S(make_tensor(reg_ds.data(), acc_s.layout()));
  const auto c_s = fragment_coords(mma_s, tid, Shape<Int<kN>, Int<kM>>{});
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

  constexpr int kBarrierThreads = T::kConsumerThreads + kReducerThreads;
  auto q_state = typename T::Pipeline::PipelineState{};
  auto do_state = q_state;
  int m_begin, m_end;
  q_blocks_seeing<T>(mask, n, m_begin, m_end);
  const int blocks = kp.group * (m_end - m_begin);
  ss.kv_full.wait(0);
  // Note [bwd issue order]: Sᵀ and dPᵀ go to the tensor cores together; P is computed in place
  // (in acc_s) once Sᵀ is done while dPᵀ still runs. After dPᵀ, one pass turns P and dPᵀ into the
  // 16-bit Pᵀ and dSᵀ operands (the fp32 registers die as the 16-bit ones are made, which keeps
  // the peak at dK + dV + Sᵀ + dPᵀ), then dV, dK and, once both warpgroups' dS is in smem, dQ go
  // out together; one wait covers the three. The other warpgroup's GEMMs fill the tensor cores
  // while this one computes. With softcap, P and the tanh derivative are both computed in the
  // second pass (keeping P and P·(1 − x²) across the wait would need 16 more registers, and
  // ptxas then serializes the wgmmas: checked by tests/test_sass_sm90.py).
  for (int i = 0; i < blocks; ++i) {
    const int m = m_begin + i % (m_end - m_begin);
    pipe_q.consumer_wait(q_state);
    pipe_do.consumer_wait(do_state);
    const int sq = q_state.index(), sdo = do_state.index(), sds = i % T::kDsStages;
    issue(mma_s, tSrK, tSrQ(_, _, _, sq), acc_s, true);
    issue(mma_dp, tPrV, tPrDO(_, _, _, sdo), acc_dp, true);
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_s);
    // P and dS, with the mask and softcap decided once per block (compile-time variants: with
    // run-time tests inside the unrolled loops the compiler kept branches per element, ~40
    // instructions per element instead of ~6).
    auto p_and_ds = [&](auto masked_c, auto softcap_c) {
      constexpr bool kMasked = decltype(masked_c)::value, kSoftcap = decltype(softcap_c)::value;
      // P of element e from its (softcapped) score x; lse₂ is +inf for rows that saw no key,
      // so P = 2^-inf = 0 there (Note [empty rows]).
      auto prob = [&](int e, float x) {
        const int qi = get<1>(c_s(e));
        const float pv = exp2_hw(fmaf(x, kp.score.scale_log2, -ss.lse2[sq][qi]));
        if constexpr (kMasked) {
          return mask.col_bounds(n * kN + get<0>(c_s(e))).contains(m * kM + qi) ? pv : 0.0f;
        } else {
          return pv;
        }
      };
      if constexpr (!kSoftcap) {
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < size(acc_s); ++e) acc_s(e) = prob(e, acc_s(e));
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dp);
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < size(acc_s); ++e) {
        float pv = acc_s(e), dpv = pv;  // dS = dpv · (dP − D): P, or P·(1 − x²) with softcap
        if constexpr (kSoftcap) {
          const float x = tanhf(acc_s(e) * kp.score.pre);
          pv = prob(e, x);
          dpv = pv * (1.0f - x * x);
        }
        reg_p(e) = Element(pv);
        reg_ds(e) = Element(dpv * (acc_dp(e) - ss.dpsum[sdo][get<1>(c_s(e))]));
      }
    };
    using True = cute::true_type;
    using False = cute::false_type;
    if (block_range<kM, kN>(mask, m).needs_mask(n)) {
      kp.score.softcap ? p_and_ds(True{}, True{}) : p_and_ds(True{}, False{});
    } else {
      kp.score.softcap ? p_and_ds(False{}, True{}) : p_and_ds(False{}, False{});
    }
    fence_packed(reg_p);
    fence_packed(reg_ds);
    issue(mma_dv, reg_p, tVrDOt(_, _, _, sdo), acc_dv, false);
    issue(mma_dk, reg_ds, tKrQt(_, _, _, sq), acc_dk, false);
    // dSᵀ to shared memory for dQ = dS·K (both warpgroups' kv rows form the K dimension).
    copy(copy_ds, reg_ds_c, tDSsDSt(_, _, _, sds));
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kDsWritten);
    issue(mma_dq, tQrDS(_, _, _, sds), tQrKt, acc_dq, true);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dq);
    pipe_q.consumer_release(q_state);
    pipe_do.consumer_release(do_state);
    ++q_state;
    ++do_state;
    if (i > 0) cutlass::arch::NamedBarrier::sync(kBarrierThreads, kDqEmpty);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size(acc_dq) / 4; ++j) {
      ss.dq[j * T::kConsumerThreads + tid] =
          make_float4(acc_dq(4 * j), acc_dq(4 * j + 1), acc_dq(4 * j + 2), acc_dq(4 * j + 3));
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::arrive(kBarrierThreads, kDqFull);
  }
  // dK and dV of this tile, summed over the group: dK scaled by softmax_scale (dS is the
  // gradient w.r.t. the scaled scores), written as the dtype; rows past seqlen_k skipped.
  const BwdParams& p = kp.p;
  const bool varlen = p.fwd.cu_seqlens_q != nullptr;
  const int bidb = varlen ? 0 : b;
  Element* dk = static_cast<Element*>(p.dk) + int64_t(bidb) * p.dk_batch_stride +
                (int64_t(seq.offset_k) + int64_t(n) * kN) * p.dk_row_stride +
                int64_t(head_kv) * p.dk_head_stride;
  Element* dv = static_cast<Element*>(p.dv) + int64_t(bidb) * p.dv_batch_stride +
                (int64_t(seq.offset_k) + int64_t(n) * kN) * p.dv_row_stride +
                int64_t(head_kv) * p.dv_head_stride;
  const int rows_valid = seq.seqlen_k - n * kN;
  store_rows<T>(dk, p.dk_row_stride, rows_valid, p.fwd.softmax_scale, acc_dk,
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
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) bwd_producer(kp, ss, pipe_q, pipe_do, seq, mask, n, head_kv, b);
    if (warp == 1) bwd_dq_reducer(kp, ss, seq, mask, n, head_kv, b);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kBwdConsumerRegs>();
    bwd_consumer(kp, ss, pipe_q, pipe_do, seq, mask, n, head_kv, b, threadIdx.x - 128);
  }
#endif
}

// dQ accumulator (fragment order, Note [dQ reduce]) · softmax_scale -> the dtype, rows <
// seqlen_q. One CTA of kConsumerThreads per 64-row block; thread t reads its own float4s
// (coalesced) and writes each pair of adjacent columns where the dQ GEMM's fragment puts it.
// Grid: (64-row blocks of the longest sequence, heads_q, batch) flattened, block fastest.
template <class T>
__global__ void __launch_bounds__(T::kConsumerThreads)
    bwd_postprocess_sm90(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename T::Element;
  const FwdParams& f = p.fwd;
  const int m_blocks = (f.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  const int m = int(blockIdx.x % m_blocks);
  const int head = int(blockIdx.x / m_blocks % f.heads_q);
  const int b = int(blockIdx.x / m_blocks / f.heads_q);
  const SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  if (m * T::kBlockM >= seq.seqlen_q) return;
  const int tid = threadIdx.x;
  const float4* acc = reinterpret_cast<const float4*>(
      ws.dq(head) + ws.row_offset(b, seq.offset_q, m * T::kBlockM) * T::kHeadDim);
  typename T::MmaDQ mma_dq;
  const auto coords = fragment_coords(mma_dq, tid, Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{});
  const bool varlen = f.cu_seqlens_q != nullptr;
  Element* dq = static_cast<Element*>(p.dq) + (varlen ? 0 : int64_t(b) * p.dq_batch_stride) +
                (int64_t(seq.offset_q) + int64_t(m) * T::kBlockM) * p.dq_row_stride +
                int64_t(head) * p.dq_head_stride;
  const int rows_valid = seq.seqlen_q - m * T::kBlockM;
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < T::kDqFloats / (4 * T::kConsumerThreads); ++j) {
    const float4 v = acc[j * T::kConsumerThreads + tid];
    const float pair[2][2] = {{v.x, v.y}, {v.z, v.w}};
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int row = get<0>(coords(4 * j + 2 * h));
      const int col = get<1>(coords(4 * j + 2 * h));
      if (row >= rows_valid) continue;
      cutlass::Array<Element, 2> out;
      out[0] = Element(pair[h][0] * f.softmax_scale);
      out[1] = Element(pair[h][1] * f.softmax_scale);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(dq + int64_t(row) * p.dq_row_stride + col) =
          out;
    }
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
  const RowBlockGrid row_grid = RowBlockGrid::of(f);
  const int64_t pp_blocks = row_grid.blocks(f);
  if (pp_blocks > 0) {
    bwd_preprocess<Element><<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, row_grid);
  }
  kp.grid = {(f.seqlen_k + T::kBlockN - 1) / T::kBlockN, f.heads_kv};
  const int64_t blocks = int64_t(kp.grid.n_tiles) * f.heads_kv * f.batch;
  if (blocks > 0) {
    const Status s = launch_kernel("bwd_sm90", bwd_kernel<T>, dim3(unsigned(blocks)), T::kThreads,
                                   T::kSmemBytes, stream, kp);
    if (s != Status::kOk) return s;
  }
  // As bwd_postprocess_sm90 decodes it: 64-row blocks of the longest sequence, heads, batch.
  const int64_t post_blocks =
      int64_t((f.seqlen_q + T::kBlockM - 1) / T::kBlockM) * f.heads_q * f.batch;
  if (post_blocks > 0) {
    bwd_postprocess_sm90<T><<<unsigned(post_blocks), T::kConsumerThreads, 0, stream>>>(p, kp.ws);
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
