// SM90 backward consumer for d, d_v <= 128 (BwdTraits): two warpgroups of 64 kv rows each, Sᵀ
// and dPᵀ per warpgroup, dV/dK from registers, dQ through the reducer warp (sm90/bwd/kernel.cuh
// has the algorithm and the Notes).
#pragma once

#include "sm90/bwd/epilogue.cuh"

namespace fa4::sm90 {

template <class T>
__device__ __forceinline__ void bwd_consumer(const BwdKernelParams<T>& kp,
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
  Tensor sDS = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDS{});
  Tensor sDSt = make_tensor(make_smem_ptr(ss.ds.data()), typename T::SmemLayoutDSt{});

  typename T::MmaSdP mma_s;
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
  Tensor tVrDOt = thr_dv.partition_fragment_B(sDOt);
  Tensor tKrQt = thr_dk.partition_fragment_B(sQt);
  Tensor tQrDS = thr_dq.partition_fragment_A(sDS);
  Tensor tQrKt = thr_dq.partition_fragment_B(sKt(_, _, 0));
  // dSᵀ to smem with stmatrix.trans: 16 bytes per instruction, the 8×8 transposes done by the
  // hardware; the position-independent swizzle keeps the addresses 32-bit shared-window offsets
  // (an elementwise copy became 32 generic 2-byte stores with 64-bit swizzle arithmetic each).
  auto copy_ds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_s);
  auto thr_copy_ds = copy_ds.get_thread_slice(tid);

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

  constexpr int kHalfBarrierThreads = 128 + kReducerThreads;
  const uint32_t dq_full = tid < 128 ? kDqFull : kDqFull1;
  const uint32_t dq_empty = tid < 128 ? kDqEmpty : kDqEmpty1;
  auto q_state = typename T::Pipeline::PipelineState{};
  auto do_state = q_state;
  const bool leader = tid % 128 == 0;  // the marks of Note [bwd trace]
  const int wg = tid / 128;
  constexpr bool kEarlyDp = T::kEarlyDp;                             // Note [early dPᵀ]
  const bool reds = T::kDqFromRegisters && !kp.p.fwd.deterministic;  // Note [dQ from registers]
  // Note [dK/dV from registers]: the reducer's hand-back of this warpgroup's last dQ is waited for
  // at the next dQ store (or after the last tile), and the dS stages count blocks across tiles.
  constexpr bool kDkDvRegs = T::kDkDvRegs;
  bool dq_owed = false;        // a dQ handed to the reducer whose dq_empty is not yet waited for
  bool store_pending = false;  // Note [TMA-store dK/dV]: a store may still read dS / dQ's buffer
  int ds_use = 0;              // blocks of the earlier tiles (the dS stage of the tile's block i)
  // Note [persistent bwd]: the tiles the producer publishes, each a use of the K/V buffer.
  for (int t = 0;; ++t) {
    const int item = take_item(ss.tile_full, ss.tile_empty, ss.tile_item, t);
    if (item < 0) break;
    if (t > 0) {  // a later tile's start stands in for the kernel entry and barrier init
      ss.trace.cta_mark(tid == 0, 0);
      ss.trace.cta_mark(tid == 0, 1);
    }
    // The loop needs the mask and n only; the epilogue decodes the item again (the sequence,
    // head and batch kept live across the loop cost two spilled registers).
    const BwdTile tile = BwdTile::of(kp, item, T::kBlockN);
    const Mask mask = tile.mask;
    const int n = tile.n;
    clear(acc_dv);
    clear(acc_dk);
    int m_begin, m_end;
    q_blocks_seeing<T>(mask, n, m_begin, m_end);
    const int blocks = tile.heads * (m_end - m_begin);
    // This thread's float4s of the tile's first query head's dQ rows (fragment order, Note [dQ
    // reduce]); g: the block's query head within the item's.
    float* const dq_tile = kp.ws.dq(tile.head0) +
                           kp.ws.row_offset(tile.b, tile.seq.offset_q, 0) * T::kHeadDim + 4 * tid;
    int g = 0;
    ss.kv_full.wait(uint32_t(t & 1));
    ss.trace.cta_mark(tid == 0, 2);
    if (store_pending) {  // the block loop writes dS and dQ's buffer (Note [TMA-store dK/dV])
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads + kReducerThreads, kDkDvRead);
      store_pending = false;
    }
    if (kEarlyDp && blocks > 0) {  // Note [early dPᵀ]: the tile's first dPᵀ
      pipe_do.consumer_wait(do_state);
      issue_gemm(mma_dp, tPrV, tPrDO(_, _, _, do_state.index()), acc_dp, true);
    }
    // Note [bwd issue order]: a block's dPᵀ goes out beside its Sᵀ, or is already on the tensor
    // cores then (Note [early dPᵀ], d 96 and 128); once both are done, one pass turns P (computed
    // in place in acc_s) and dPᵀ into the 16-bit Pᵀ and dSᵀ operands (the fp32 registers die as the
    // 16-bit ones are made, which keeps the peak at dK + dV + Sᵀ + dPᵀ). dV goes out, then, once
    // both warpgroups' dS is in smem, dQ and dK; dQ is stored for the reducer while dK runs, and
    // the next block's dPᵀ is issued behind dK where kEarlyDp. The other warpgroup's GEMMs fill the
    // tensor cores while this one computes (p_and_ds has the elementwise part and its softcap
    // exception).
    //
    // Note [early dPᵀ]: dPᵀ = V·dOᵀ of block i + 1 is issued right after block i's dQ store,
    // before the wait for dK(i), instead of next to Sᵀ(i + 1) after the loop's back edge. The
    // trace (Note [bwd trace]) had the tensor cores idle ~350 cycles per
    // block between dK's end and the next Sᵀ's issue (the Q/dO waits and the per-block address
    // work of Note [fresh tid]); dPᵀ now fills that gap. Its accumulator is free there (dS was
    // made from it before dV), so the register peak is unchanged. The issue is unconditional,
    // because ptxas serialized every wgmma of the loop (C7512) when it was issued only where a
    // next block exists: a tile's last block repeats its own dPᵀ (its dO stage is held until the
    // loop ends) and the result is dropped, 1/blocks of the tile's dPᵀ work. Measured: hd128
    // +1-5.5 % at 1k-16k (level at 512); with 128-row blocks (hd64) -1.6 to -3.5 % at 512 / 1k
    // and -2 % at causal 2k, so BwdTraits::kEarlyDp holds for 64-row blocks only (hd96 follows
    // hd128). In the split variant after its dQ reduce-adds it cost 2-3 % at hd256.
    //
    // m: the Q block, cycling through [m_begin, m_end) once per query head of the group (counted,
    // not i % (m_end - m_begin): an integer division per block).
    for (int i = 0, m = m_begin; i < blocks; ++i, m = m + 1 == m_end ? (++g, m_begin) : m + 1) {
      // Note [fresh tid]: the score coordinates and the dSᵀ store addresses per iteration (the
      // consumers are threads 128.., tid = threadIdx.x - 128 as bwd_kernel passes it; Note
      // [known thread range]).
      ss.trace.mark(leader, wg, i, 0);
      const int ltid = known_thread_range<T::kConsumerThreads>(fresh_thread_index() - 128);
      const auto c_s = fragment_coords(mma_s, ltid, Shape<Int<kN>, Int<kM>>{});
      Tensor tDSsDSt =
          copy_ds.get_thread_slice(ltid).partition_D(as_position_independent_swizzle_tensor(sDSt));
      // Note [block needs mask]: asked before the waits, off the path from Sᵀ to the softmax.
      const bool masked = block_needs_mask<kM, kN>(mask, m, n);
      pipe_q.consumer_wait(q_state);
      if constexpr (!kEarlyDp) pipe_do.consumer_wait(do_state);
      ss.trace.mark(leader, wg, i, 1);
      ss.trace.cta_mark(tid == 0 && i == 0, 3);
      const int sq = q_state.index(), sdo = do_state.index();
      const int sds = (ds_use + i) % T::kDsStages;  // ds_use stays 0 without kDkDvRegs
      issue_gemm(mma_s, tSrK, tSrQ(_, _, _, sq), acc_s, true);
      if constexpr (kEarlyDp) {
        warpgroup_wait<0>();  // Sᵀ, and dPᵀ issued a block early
        warpgroup_fence_operand(acc_dp);
      } else {
        issue_gemm(mma_dp, tPrV, tPrDO(_, _, _, sdo), acc_dp, true);
        warpgroup_wait<1>();
      }
      warpgroup_fence_operand(acc_s);
      ss.trace.mark(leader, wg, i, 2);
      p_and_ds(kp.score, mask, masked, n * kN, m * kM, c_s, ss.lse2[sq], ss.dpsum[sdo], acc_s,
               acc_dp, reg_p, reg_ds);
      fence_packed(reg_p);
      fence_packed(reg_ds);
      ss.trace.mark(leader, wg, i, 3);
      issue_gemm(mma_dv, reg_p, tVrDOt(_, _, _, sdo), acc_dv, false);
      // dSᵀ to shared memory for dQ = dS·K (both warpgroups' kv rows form the K dimension).
      copy(copy_ds, reg_ds_c, tDSsDSt(_, _, _, sds));
      cutlass::arch::fence_view_async_shared();
      ss.trace.mark(leader, wg, i, 4);
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, kDsWritten);
      ss.trace.mark(leader, wg, i, 5);
      // dQ before dK, so that dQ's trip to shared memory overlaps dK on the tensor cores.
      issue_gemm(mma_dq, tQrDS(_, _, _, sds), tQrKt, acc_dq, true);
      issue_gemm(mma_dk, reg_ds, tKrQt(_, _, _, sq), acc_dk, false);
      warpgroup_wait<1>();  // dV and dQ done
      warpgroup_fence_operand(acc_dv);
      warpgroup_fence_operand(acc_dq);
      ss.trace.mark(leader, wg, i, 6);
      const bool next = !kEarlyDp || i + 1 < blocks;
      if (next) {  // the last block's stage is held for its repeated dPᵀ (Note [early dPᵀ])
        pipe_do.consumer_release(do_state);
        ++do_state;
      }
      // Each warpgroup hands its own part of the block to the reducer (Note [dQ reduce]): the two
      // warpgroups do not wait for each other here.
      if (reds) {
        ss.trace.mark(leader, wg, i, 7);
        float* dq = dq_tile + (int64_t(g) * kp.ws.rows + int64_t(m) * kM) * T::kHeadDim;
        red_add_fragment<T::kConsumerThreads>(dq, acc_dq);
      } else {
        if (kDkDvRegs ? dq_owed : i > 0) {
          cutlass::arch::NamedBarrier::sync(kHalfBarrierThreads, dq_empty);
        }
        ss.trace.mark(leader, wg, i, 7);
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size(acc_dq) / 4; ++j) {
          ss.dq[j * T::kConsumerThreads + tid] =
              make_float4(acc_dq(4 * j), acc_dq(4 * j + 1), acc_dq(4 * j + 2), acc_dq(4 * j + 3));
        }
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::arrive(kHalfBarrierThreads, dq_full);
        dq_owed = true;
      }
      ss.trace.mark(leader, wg, i, 8);
      if constexpr (kEarlyDp) {
        if (next) pipe_do.consumer_wait(do_state);
        // CuTe's 32-bit steps here: Note [64-bit descriptor steps] has why.
        issue_gemm<false>(mma_dp, tPrV, tPrDO(_, _, _, do_state.index()), acc_dp, true);
        warpgroup_wait<1>();  // dK done
      } else {
        warpgroup_wait<0>();  // dK done
      }
      warpgroup_fence_operand(acc_dk);
      ss.trace.mark(leader, wg, i, 9);
      pipe_q.consumer_release(q_state);
      ++q_state;
    }
    if constexpr (kEarlyDp) {
      warpgroup_wait<0>();  // the last block's repeated dPᵀ (Note [early dPᵀ])
      if (blocks > 0) {
        pipe_do.consumer_release(do_state);
        ++do_state;
      }
    }
    // This thread's GEMMs of the tile are done: K and V may be reloaded.
    ss.kv_empty.arrive();
    ss.trace.cta_mark(leader, wg == 0 ? 4 : 7);
    const BwdTile out = BwdTile::of(kp, item, T::kBlockN);
    if constexpr (kDkDvRegs) {
      ds_use += blocks;
      if (kp.grid.slices > 1) {  // Note [GQA head slices]
        red_dk_dv(kp, out, tid, acc_dk, acc_dv);
      } else {
        store_dk_dv_regs(kp, out.seq, n, out.head_kv, out.b, tid, mma_dk, acc_dk, mma_dv, acc_dv);
      }
    } else if (kp.grid.slices > 1) {  // Note [GQA head slices]
      // As the staged epilogue, the reducer must have read the last dQ (the next tile's first dQ
      // store does not wait). No barrier between the warpgroups: the next tile's dS stores
      // (stages restarted per tile) come after its kv_full, whose load waited for both
      // warpgroups' kv_empty, after their last GEMMs (the protocol model's hd128-slices case
      // finds no race without one).
      if (blocks > 0 && !reds) cutlass::arch::NamedBarrier::sync(kHalfBarrierThreads, dq_empty);
      red_dk_dv(kp, out, tid, acc_dk, acc_dv);
    } else {
      // The staged epilogue writes over dQ's buffer too: the reducer must have read the last
      // block's dQ (Note [dV staged first]; Note [dK/dV from registers] waits for it at the next
      // dQ store instead).
      const bool wait = blocks > 0 && !reds;
      auto wait_dq = [&] {
        if (wait) cutlass::arch::NamedBarrier::sync(kHalfBarrierThreads, dq_empty);
      };
      if (kp.out.on) {  // Note [TMA-store dK/dV]
        if constexpr (T::kTmaStoreDkDv) {
          stage_dk_dv_tma(kp, ss, tid, mma_dk, acc_dk, mma_dv, acc_dv, wait_dq);
          store_pending = true;
        }
      } else {
        store_dk_dv(kp, ss, out.seq, n, out.head_kv, out.b, tid, mma_dk, acc_dk, mma_dv, acc_dv,
                    wait_dq);
      }
    }
    ss.trace.cta_mark(tid == 0, 5);
    ss.trace.dump(dv_tile<T>(kp, out.seq, n, out.head_kv, out.b), kp.p.dv_row_stride,
                  out.seq.seqlen_k - n * kN, tid, kTraceDump, t);
  }
  // Every arrival of the reducer on dq_empty is matched (Note [dK/dV from registers]; the staged
  // epilogue waited for each tile's last one already).
  if (kDkDvRegs && dq_owed) cutlass::arch::NamedBarrier::sync(kHalfBarrierThreads, dq_empty);
  // The reducer's last kDkDvRead is matched too.
  if (store_pending) {
    cutlass::arch::NamedBarrier::sync(T::kConsumerThreads + kReducerThreads, kDkDvRead);
  }
}

}  // namespace fa4::sm90
