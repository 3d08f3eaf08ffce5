// SM90 backward consumer for d or d_v > 128 (BwdTraitsSplit): 64 kv rows per CTA; warpgroup w
// computes the query columns [32w, 32w + 32) of Sᵀ and dPᵀ, then, from Pᵀ and dSᵀ in shared
// memory, its half of the head dim of dV, dK and dQ (sm90/bwd/kernel.cuh has the algorithm and
// the Notes; BwdTraitsSplit the budget).
//
// Per Q block (Note [split issue order]):
//   Sᵀ_w = K·Q_wᵀ, dPᵀ_w = V·dO_wᵀ        SS, N = 32
//   P_w, dS_w elementwise                  as the d <= 128 consumer (compile-time variants)
//   Pᵀ_w, dSᵀ_w -> smem (stmatrix.trans); kDsWritten (both warpgroups)
//   dQ_w = dS·K_w, dV_w += Pᵀ·dO_w, dK_w += dSᵀ·Q_w    SS, N = d/2 (each warpgroup its half)
//   dQ_w -> workspace with 16-byte reduce-adds, in fragment order (Note [dQ reduce]), as soon
//   as dQ_w is done, while dV_w and dK_w still run (Note [split dQ first]); deterministic mode
//   orders them with the turn counters (Note [deterministic dQ]), waited here by the consumers
//   since there is no reducer warp.
//
// Per tile (Note [persistent bwd]): the item from the tile ring, K/V (kv_full), the blocks,
// kv_empty once the last GEMM is done, then dK_w, dV_w from registers (Note [split epilogue])
// while the producer loads the next tile's K/V and first Q/dO.
//
// Note [split dQ first]: with dQ issued last, the tensor cores idle while each thread issues its
// 16 reduce-adds (hd256) after the block's last wait, and then the next block's Sᵀ/dPᵀ (inferred
// from the code; the split variant has no trace build). Issued first and waited for alone, dQ's
// reduce-adds overlap dV and dK on the tensor cores; the Q/dO stages are released after dK as
// before. Registers are unchanged: all three accumulators are live across the GEMMs either way.
// Measured +8-12 % at hd256 over dQ issued last (512 to 16k, causal and not).
#pragma once

#include "sm90/bwd/epilogue.cuh"

namespace fa4::sm90 {

// Deterministic mode for the atomics path: consumer thread 0 waits for the block's turn, all
// consumer threads add, and thread 0 passes the turn once every add is fenced.
__device__ __forceinline__ void dq_turn_wait_all(const int* sem, int turn, int tid, int threads) {
  if (tid == 0) dq_turn_wait(sem, turn);
  cutlass::arch::NamedBarrier::sync(threads, kDqFull);
}

__device__ __forceinline__ void dq_turn_pass_all(int* sem, int tid, int threads) {
  __threadfence();
  cutlass::arch::NamedBarrier::sync(threads, kDqEmpty);
  if (tid == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
}

template <class T>
__device__ __forceinline__ void bwd_consumer_split(const BwdKernelParams<T>& kp,
                                                   typename T::SharedStorage& ss,
                                                   typename T::Pipeline& pipe_q,
                                                   typename T::Pipeline& pipe_do, int tid) {
  using Element = typename T::Element;
  constexpr int kM = T::kBlockM, kN = T::kBlockN;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQt{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  Tensor sDOt = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDOt{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor sPt = make_tensor(make_smem_ptr(ss.p.data()), typename T::SmemLayoutPdSt{});
  Tensor sDS = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutPdS{});
  Tensor sDSt = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutPdSt{});

  typename T::MmaS mma_s;
  typename T::MmaDP mma_dp;
  typename T::MmaDV mma_dv;
  typename T::MmaDK mma_dk;
  typename T::MmaDQ mma_dq;
  const int wg_tid = warpgroup_slice_index(tid);  // Note [uniform descriptors]
  auto thr_s = mma_s.get_thread_slice(wg_tid);
  auto thr_dp = mma_dp.get_thread_slice(wg_tid);
  auto thr_dv = mma_dv.get_thread_slice(wg_tid);
  auto thr_dk = mma_dk.get_thread_slice(wg_tid);
  auto thr_dq = mma_dq.get_thread_slice(wg_tid);
  Tensor tSrK = thr_s.partition_fragment_A(sK(_, _, 0));
  Tensor tSrQ = thr_s.partition_fragment_B(sQ);
  Tensor tPrV = thr_dp.partition_fragment_A(sV(_, _, 0));
  Tensor tPrDO = thr_dp.partition_fragment_B(sDO);
  Tensor tVrPt = thr_dv.partition_fragment_A(sPt);
  Tensor tVrDOt = thr_dv.partition_fragment_B(sDOt);
  Tensor tKrDSt = thr_dk.partition_fragment_A(sDSt);
  Tensor tKrQt = thr_dk.partition_fragment_B(sQt);
  Tensor tQrDS = thr_dq.partition_fragment_A(sDS);
  Tensor tQrKt = thr_dq.partition_fragment_B(sKt(_, _, 0));
  // Pᵀ and dSᵀ to smem with stmatrix.trans (as dSᵀ in the d <= 128 consumer).
  auto copy_pds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_s);
  auto thr_copy_pds = copy_pds.get_thread_slice(tid);
  Tensor tPsPt = thr_copy_pds.partition_D(as_position_independent_swizzle_tensor(sPt));
  Tensor tDSsDSt = thr_copy_pds.partition_D(as_position_independent_swizzle_tensor(sDSt));

  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kN>, Int<kM>>{});
  Tensor acc_dp = partition_fragment_C(mma_dp, Shape<Int<kN>, Int<kM>>{});
  Tensor acc_dv = partition_fragment_C(mma_dv, Shape<Int<kN>, Int<T::kHeadDimV>>{});
  Tensor acc_dk = partition_fragment_C(mma_dk, Shape<Int<kN>, Int<T::kHeadDim>>{});
  Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kM>, Int<T::kHeadDim>>{});
  Tensor reg_p = make_tensor<Element>(acc_s.layout());
  Tensor reg_ds = make_tensor<Element>(acc_s.layout());
  Tensor reg_p_c = thr_copy_pds.retile_S(reg_p);
  Tensor reg_ds_c = thr_copy_pds.retile_S(reg_ds);
  const auto c_s = fragment_coords(mma_s, tid, Shape<Int<kN>, Int<kM>>{});

  const FwdParams& f = kp.p.fwd;
  auto q_state = typename T::Pipeline::PipelineState{};
  auto do_state = q_state;
  // The P/dS stage alternates over every block of every tile: restarted per tile, a tile with
  // an odd block count would put its last block and the next tile's first in one stage, which
  // the other warpgroup may still be reading (no barrier between tiles here, unlike the
  // staged epilogue of d <= 128).
  int k = 0;
  // Note [persistent bwd]: the tiles the producer publishes, each a use of the K/V buffer.
  for (int t = 0;; ++t) {
    const int item = take_item(ss.tile_full, ss.tile_empty, ss.tile_item, t);
    if (item < 0) break;
    const BwdTile tile = BwdTile::of(kp, item, T::kBlockN);
    const Mask& mask = tile.mask;
    const int n = tile.n;
    clear(acc_dv);
    clear(acc_dk);
    const int64_t row0_ws = kp.ws.row_offset(tile.b, tile.seq.offset_q, 0);
    int m_begin, m_end;
    q_blocks_seeing<T>(mask, n, m_begin, m_end);
    const int blocks = tile.heads * (m_end - m_begin);
    ss.kv_full.wait(uint32_t(t & 1));
    // Note [split issue order]: as the d <= 128 consumer up to dS (P computed while dPᵀ runs);
    // then both warpgroups' Pᵀ and dSᵀ must be in smem before any of the three GEMMs that read
    // them, which go out together under one wait.
    // (head, m) walk the item's query heads and their Q blocks, counted rather than divided.
    int head = tile.head0, m = m_begin;
    for (int i = 0; i < blocks; ++i, ++k, m = m + 1 == m_end ? (++head, m_begin) : m + 1) {
      const bool masked = block_needs_mask<kM, kN>(mask, m, n);  // Note [block needs mask]
      pipe_q.consumer_wait(q_state);
      pipe_do.consumer_wait(do_state);
      const int sq = q_state.index(), sdo = do_state.index(), sds = k % T::kDsStages;
      issue_gemm(mma_s, tSrK, tSrQ(_, _, _, sq), acc_s, true);
      issue_gemm(mma_dp, tPrV, tPrDO(_, _, _, sdo), acc_dp, true);
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc_s);
      p_and_ds(kp.score, mask, masked, n * kN, m * kM, c_s, ss.lse2[sq], ss.dpsum[sdo], acc_s,
               acc_dp, reg_p, reg_ds);
      copy(copy_pds, reg_p_c, tPsPt(_, _, _, sds));
      copy(copy_pds, reg_ds_c, tDSsDSt(_, _, _, sds));
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kDsWritten);
      issue_gemm(mma_dq, tQrDS(_, _, _, sds), tQrKt, acc_dq, true);
      issue_gemm(mma_dv, tVrPt(_, _, _, sds), tVrDOt(_, _, _, sdo), acc_dv, false);
      issue_gemm(mma_dk, tKrDSt(_, _, _, sds), tKrQt(_, _, _, sq), acc_dk, false);
      warpgroup_wait<2>();  // dQ done; its reduce-adds go out while dV and dK run
      warpgroup_fence_operand(acc_dq);
      const int64_t row = row0_ws + int64_t(m) * kM;
      int* sem = f.deterministic ? kp.ws.sem(head, row) : nullptr;
      if (sem != nullptr) {
        dq_turn_wait_all(sem, dq_turn(block_range<kM, kN>(mask, m), n), tid, T::kConsumerThreads);
      }
      float* dq = kp.ws.dq(head) + row * T::kHeadDim + 4 * tid;
      red_add_fragment<T::kConsumerThreads>(dq, acc_dq);
      if (sem != nullptr) dq_turn_pass_all(sem, tid, T::kConsumerThreads);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dv);
      warpgroup_fence_operand(acc_dk);
      pipe_q.consumer_release(q_state);
      pipe_do.consumer_release(do_state);
      ++q_state;
      ++do_state;
    }
    // Every GEMM of the tile has completed (the loop's last wait): K and V may be reloaded
    // while dK and dV leave from registers (Note [split epilogue]), or are added to the
    // workspace (Note [GQA head slices]).
    ss.kv_empty.arrive();
    if (kp.grid.slices > 1) {
      red_dk_dv(kp, tile, tid, acc_dk, acc_dv);
    } else {
      store_dk_dv_regs(kp, tile.seq, n, tile.head_kv, tile.b, tid, mma_dk, acc_dk, mma_dv, acc_dv);
    }
  }
}

}  // namespace fa4::sm90
