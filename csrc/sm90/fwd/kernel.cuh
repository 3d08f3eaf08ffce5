// SM90 (Hopper) forward kernel: warp-specialized TMA + wgmma attention with FA4 numerics.
// launch_element (the end of this file) is instantiated once per head-dim pair and element type,
// each in a translation unit of its own, so that ninja compiles them in parallel.
//
// Roles (one enum, WarpGroupRole): warpgroup 0 is the producer (one thread issues every TMA
// load: Q once per tile, into one of two buffers where they fit (Note [two Q buffers]), K and V
// per KV block through two mbarrier pipelines), the others are consumers (two; three at hd 64,
// Note [three consumers at hd64]; one in the three-CTA kernel, Note [several CTAs per SM]),
// each owning 64 of the tile's query rows: S = Q·Kᵀ (wgmma, both operands in shared memory), online
// softmax with conditional rescaling (common/softmax.cuh), P kept in registers as the A operand of
// O += P·V (register-A wgmma), then the epilogue. setmaxnreg moves registers from the producer to
// the consumers (RegisterSplit).
//
// Pipelines (from X to Y, protects Z):
//   q_full   producer -> consumers, per Q buffer (kQStages: Note [two Q buffers]), protects it
//            (TMA transaction barrier, one phase per use)
//   q_empty  consumers -> producer, per Q buffer, protects it from a later tile's load
//            (kConsumerThreads)
//   pipe_k   producer -> consumers, kStages K buffers (PipelineTmaAsync full/empty pairs)
//   pipe_v   producer -> consumers, kStages V buffers
// K and V have separate pipelines so that S = Q·Kᵀ starts before V has landed.
//
// Shared memory, tiles and registers per head dim: sm90/fwd/traits.cuh.
//
// The persistent grid walks tiles with the shared TileScheduler (common/tile_scheduler.cuh):
// m-block-fastest for L2 reuse, longest-processing-time first for causal masks. Which CTA takes
// which tile is decided at run time when FwdParams::tile_counter is set (Note [dynamic tiles]).
#pragma once

#include "sm90/fwd/epilogue.cuh"

namespace fa4::sm90 {

using namespace cute;

// A claimed item: its tile and whether it has KV blocks, or the end (w >= total). The geometry
// (tile_work) is recomputed where needed: two of them live at once spilled the producer's 40
// registers.
struct ClaimedTile {
  int64_t w;
  TileCoord c;
  bool has_blocks;
};

template <class T>
__device__ __forceinline__ void producer(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                                         typename T::PipelineKV& pipe_k,
                                         typename T::PipelineKV& pipe_v) {
  using Element = typename T::Element;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQS{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);
  Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);
  Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_v);
  auto k_state = cutlass::make_producer_start_state<typename T::PipelineKV>();
  auto v_state = k_state;
  const int64_t total = kp.sched.total();
  int tiles_loaded = 0;  // tiles whose Q load was issued
  int n_items = 0;
  auto blocks = [&](const TileWork& t) {
    return block_range<T::kBlockM, T::kBlockN>(t.mask, t.tile.m_block);
  };
  // Publishes item w (the end marker past the last) for the consumers.
  auto claim_one = [&](int64_t w) {
    ClaimedTile x{w, TileCoord{-1, 0, 0}, false};
    if (w < total) x.c = kp.sched.at(w);
    ss.tiles.publish(n_items++, x.c);  // batch < 0: the end marker
    if (w < total) x.has_blocks = !blocks(tile_work(kp, x.c)).empty();
    return x;
  };
  // From item x on, the next one with KV blocks (the consumers write zeros for the others,
  // which load nothing), or the end.
  auto claim_from = [&](ClaimedTile x) {
    while (x.w < total && !x.has_blocks) x = claim_one(next_item(kp.p.tile_counter, x.w));
    return x;
  };
  auto load_q = [&](const TileCoord& c) {
    const TileWork t = tile_work(kp, c);
    Tensor gQ = local_tile(
        domain_offset(make_coord(t.seq.offset_q, _0{}), mQ(_, _, t.tile.head, t.bidb_gmem)),
        Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, make_coord(t.tile.m_block, _0{}));
    const int q_slot = tiles_loaded % T::kQStages, q_use = tiles_loaded / T::kQStages;
    auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, _0{}, Layout<_1>{},
                                      group_modes<0, 2>(sQ(_, _, q_slot)), group_modes<0, 2>(gQ));
    ss.trace.prod_mark(tiles_loaded, 0);
    // The slot is free once the consumers finished the last S = Q·Kᵀ of the tile before (one
    // buffer) or two before (Note [two Q buffers]).
    if (q_use > 0) ss.q_empty[q_slot].wait((q_use - 1) & 1);
    ss.q_full[q_slot].arrive_and_expect_tx(T::kQBytes);
    copy(kp.tma_q.with(reinterpret_cast<uint64_t&>(ss.q_full[q_slot]), 0), tQgQ, tQsQ);
    ss.trace.prod_mark(tiles_loaded, 1);
    ++tiles_loaded;
  };

  ClaimedTile cur = claim_from(claim_one(blockIdx.x));
  if (cur.w < total) load_q(cur.c);
  while (cur.w < total) {
    const int cur_k = tiles_loaded - 1;
    const TileWork t = tile_work(kp, cur.c);
    const BlockRange br = blocks(t);
    const int head_kv = t.tile.head / kp.group;
    Tensor gK =
        local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mK(_, _, head_kv, t.bidb_gmem)),
                   Shape<Int<T::kBlockN>, Int<T::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gV = [&] {
      if constexpr (T::kFp8) {  // Vᵀ (d_v, keys) from the sequence's first column (fp8_vt.cuh)
        const int first = int(kp.vt.start(kp.p.cu_seqlens_k, t.tile.batch));
        return local_tile(domain_offset(make_coord(_0{}, first), mV(_, _, head_kv, t.bidb_gmem)),
                          Shape<Int<T::kHeadDimV>, Int<T::kBlockN>>{}, make_coord(_0{}, _));
      } else {
        return local_tile(
            domain_offset(make_coord(t.seq.offset_k, _0{}), mV(_, _, head_kv, t.bidb_gmem)),
            Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>{}, make_coord(_, _0{}));
      }
    }();
    auto [tKgK, tKsK] =
        tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] =
        tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    // Note [two Q buffers]: with a free buffer, the next item is claimed between the last
    // block's K and V loads and its Q issued there, a block earlier than after the V load. Only
    // one item: publishing a second could wait for the consumers to take the item after this
    // tile, which they do only once the V load below is in. Claimed no earlier either (Note
    // [dynamic tiles]).
    ClaimedTile next{total, TileCoord{-1, 0, 0}, false};
    bool claimed = false;
    // Blocks from last to first: the masked diagonal block first, like the consumers.
    for (int n = br.n_end - 1; n >= br.n_begin; --n) {
      pipelined_tma_load(pipe_k, k_state, kp.tma_k, tKgK(_, n), tKsK);
      if (T::kQStages > 1 && n == br.n_begin) {
        next = claim_one(next_item(kp.p.tile_counter, cur.w));
        claimed = true;
        if (next.has_blocks) load_q(next.c);
      }
      pipelined_tma_load(pipe_v, v_state, kp.tma_v, tVgV(_, n), tVsV);
    }
    ss.trace.prod_mark(cur_k, 2);
    if (!claimed) {
      next = claim_from(claim_one(next_item(kp.p.tile_counter, cur.w)));
      if (next.w < total) load_q(next.c);
    } else if (next.w < total && !next.has_blocks) {
      next = claim_from(next);
      if (next.w < total) load_q(next.c);
    }
    cur = next;
  }
  finish_claims(kp.p.tile_counter);
  // Keep the CTA alive until the consumers released every buffer the TMA may still write.
  pipe_k.producer_tail(k_state);
  pipe_v.producer_tail(v_state);
}

// S = Q·Kᵀ over the head dim, overwriting the accumulator (first k-slice with ScaleOut::Zero).
template <class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_zero_acc(Mma& mma, const TA& a, const TB& b, TC& c) {
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
}

template <class T>
__device__ __forceinline__ void consumer(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                                         typename T::PipelineKV& pipe_k,
                                         typename T::PipelineKV& pipe_v, int tid) {
  using Element = typename T::Element;
  using OutElement = typename T::OutElement;
  using SFrag = QuadFrag<T::kBlockN>;
  using OFrag = QuadFrag<T::kHeadDimV>;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQS{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutVt{});
  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  const int wg_tid = warpgroup_slice_index(tid);  // Note [uniform descriptors]
  auto thr_qk = mma_qk.get_thread_slice(wg_tid);
  auto thr_pv = mma_pv.get_thread_slice(wg_tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrK = thr_qk.partition_fragment_B(sK);
  Tensor tOrVt = thr_pv.partition_fragment_B(sVt);
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<T::kBlockM>, Int<T::kBlockN>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{});
  Tensor tOrP =
      make_tensor<Element>(partition_shape_A(mma_pv, Shape<Int<T::kBlockM>, Int<T::kBlockN>>{}));
  static_assert(size(tSrS) == SFrag::kSize && size(tOrO) == OFrag::kSize, "QuadFrag layout");
  static_assert(size(tOrP) == SFrag::kSize, "P registers mirror the S accumulator");
  float* s = raw_pointer_cast(tSrS.data());
  float* o = raw_pointer_cast(tOrO.data());
  auto& s_arr = *reinterpret_cast<float (*)[SFrag::kSize]>(s);
  auto& o_arr = *reinterpret_cast<float (*)[OFrag::kSize]>(o);

  const int lane = tid % 32;
  const int row_in_tile0 = (tid / 128) * 64 + ((tid % 128) / 32) * 16 + lane / 4;
  const int quad_lane = lane % 4;
  auto k_state = typename T::PipelineKV::PipelineState{};
  auto v_state = k_state;
  int tiles_loaded = 0;
  // Note [warpgroup ping-pong]: warpgroup g waits on barrier g before issuing GEMMs and then
  // opens the next one's (g + 1 mod kConsumerWGs); all take the same number of turns (same
  // tiles, same blocks). The last warpgroup opens warpgroup 0's first turn; the last turn's
  // arrival is left over at exit.
  const int wg = tid / 128;
  constexpr uint32_t kTurnThreads = 256;  // the waiting warpgroup and the one before it
  const int next_wg = wg + 1 == T::kConsumerWGs ? 0 : wg + 1;
  auto turn_begin = [&]() {
    if constexpr (T::kPingPong) cutlass::arch::NamedBarrier::sync(kTurnThreads, wg);
  };
  auto turn_end = [&]() {
    if constexpr (T::kPingPong) cutlass::arch::NamedBarrier::arrive(kTurnThreads, next_wg);
  };
  if (T::kPingPong && next_wg == 0) cutlass::arch::NamedBarrier::arrive(kTurnThreads, 0);
  const bool leader = tid % 128 == 0;  // the marks of Note [fwd trace]
  // A K or V stage this warpgroup does not read: waited for and released in the tile's order (a
  // release before the stage is full would count towards the previous fill's phase and free a
  // stage that the others still read).
  auto pass_k = [&]() {
    pipe_k.consumer_wait(k_state);
    pipe_k.consumer_release(k_state);
    ++k_state;
  };
  auto pass_v = [&]() {
    pipe_v.consumer_wait(v_state);
    pipe_v.consumer_release(v_state);
    ++v_state;
  };
  ss.trace.clock_mark(tid == 0, 0);

  for (int n_items = 0;; ++n_items) {
    const TileCoord c = ss.tiles.take(n_items);
    if (c.batch < 0) break;
    const int tk = tiles_loaded;  // this consumer's tile count, for the trace marks
    ss.trace.tile_mark(leader, wg, tk, 0);
    const TileWork t = tile_work(kp, c);
    const BlockRange br = block_range<T::kBlockM, T::kBlockN>(t.mask, t.tile.m_block);
    // Note [idle warpgroup]: with three consumers (192-row tiles), a warpgroup whose 64 rows all
    // lie past the sequence (the last tile: 1k rows leave two of three idle there, 512 one)
    // issues no GEMM, no softmax and no store. It still takes every turn, so that the ring of
    // Note [warpgroup ping-pong] stays whole, and passes every K and V stage in the tile's order
    // (pass_k, pass_v). The test goes through lane 0 to be warp-uniform (per thread, ptxas spilled
    // in the consumers' loop); guards on the GEMMs inside the loop instead made ptxas wait for each
    // wgmma before issuing the next.
    if (T::kConsumerWGs == 3 && !br.empty() &&
        __shfl_sync(0xffffffffu, t.tile.m_block * T::kBlockM + wg * 64 - t.seq.seqlen_q, 0) >= 0) {
      const int q_slot = tiles_loaded % T::kQStages;
      ss.q_full[q_slot].wait((tiles_loaded / T::kQStages) & 1);
      ++tiles_loaded;
      ss.q_empty[q_slot].arrive();                            // Q is not read
      for (int n = br.n_end - 1; n >= br.n_begin - 1; --n) {  // the tile's blocks + 1 turns
        turn_begin();
        if (n >= br.n_begin) pass_k();
        if (n < br.n_end - 1) pass_v();
        turn_end();
      }
      continue;
    }
    OnlineSoftmax<SFrag, T::kFp8 ? kFp8PLog2 : 0> softmax;  // Note [fp8 P scale]
    softmax.init();
    clear(tOrO);
    // Note [fp8 forward]: this (batch, kv head)'s q and k descales scale the scores, before the
    // softcap as in the 16-bit kernel; v's descale multiplies 1/l.
    ScoreScale fp8_score;
    float fp8_out = 1.0f;
    if constexpr (T::kFp8) {
      const Fp8Scales f = fp8_scales(kp.p, t.tile.batch, t.tile.head / kp.group);
      fp8_score = ScoreScale::make(kp.p.softmax_scale * f.qk, kp.p.softcap);
      fp8_out = f.out;
    }
    const ScoreScale& score = T::kFp8 ? fp8_score : kp.score;
    if (!br.empty()) {
      ss.trace.tile_mark(leader, wg, tk, 1);
      // The slot as a warp-uniform value (lane 0's), so that the S descriptors stay in uniform
      // registers (Note [uniform descriptors]).
      const int q_slot = __shfl_sync(0xffffffffu, tiles_loaded % T::kQStages, 0);
      ss.q_full[q_slot].wait((tiles_loaded / T::kQStages) & 1);
      ++tiles_loaded;
      ss.trace.tile_mark(leader, wg, tk, 2);
      const int row_base = t.tile.m_block * T::kBlockM + row_in_tile0;
      // Note [slice block end]: blocks from n_end on are masked off for each of this
      // warpgroup's rows (causal: the tile's last block for the first 64 or 128 rows of a
      // 192-row tile). Their turns and stages pass as in Note [idle warpgroup]: K of block n and
      // V of block n + 1 in turn n, and V of block n_end before the first GEMM turn, so that
      // every warpgroup takes the tile's br.n_end - br.n_begin + 1 turns and frees its stages in
      // order.
      // Warp-uniform through lane 0, as the idle test is.
      int n_end = br.n_end;
      if constexpr (T::kConsumerWGs > 1) {
        const int wg_first = t.tile.m_block * T::kBlockM + wg * 64;
        const int wg_last = detail::imin(wg_first + 63, t.seq.seqlen_q - 1);
        n_end =
            __shfl_sync(0xffffffffu, slice_block_end<T::kBlockN>(br, t.mask, wg_first, wg_last), 0);
        for (int n = br.n_end - 1; n >= n_end; --n) {
          turn_begin();
          pass_k();
          if (n < br.n_end - 1) pass_v();
          turn_end();
        }
        if (n_end < br.n_end) pass_v();
      }
      // Note [intra-warpgroup overlap]: S of block n is issued before, and O += P·V of block
      // n + 1 right after, the softmax of block n runs on the CUDA cores while the tensor cores
      // finish P·V; wgmma groups retire in order, so wait<1> is "S done, P·V may still run".
      // P (tOrP) is rewritten only after wait<0>, when the P·V that reads it has finished.
      // In the SASS, ptxas moves that wait<0> (and the V release) after the row max (Note
      // [stale-max vote]), so the mask, softcap and row max overlap this warpgroup's P·V; a loop
      // that kept the wait behind the whole softmax measured no gain, and two P buffers that let
      // the softmax run beside its own P·V were slower.
      // i: the block's place in the tile for the trace marks (-1 outside the loop: none).
      auto issue_s = [&](int i) {
        pipe_k.consumer_wait(k_state);
        ss.trace.loop_mark(leader, wg, tk, i, 2);
        warpgroup_fence_operand(tSrS);
        warpgroup_arrive();
        gemm_zero_acc(mma_qk, tSrQ(_, _, _, q_slot), tSrK(_, _, _, k_state.index()), tSrS);
        warpgroup_commit_batch();
        ss.trace.loop_mark(leader, wg, tk, i, 3);
      };
      auto issue_pv = [&](int i) {
        pipe_v.consumer_wait(v_state);
        ss.trace.loop_mark(leader, wg, tk, i, 4);
        warpgroup_fence_operand(tOrO);
        // FP8: P's registers are written by inline asm (pack4_e4m3) through a pointer; the fence
        // keeps those writes before wgmma.fence, as the A operand from registers requires.
        if constexpr (T::kFp8) warpgroup_fence_operand(tOrP);
        warpgroup_arrive();
        gemm(mma_pv, tOrP, tOrVt(_, _, _, v_state.index()), tOrO);
        warpgroup_commit_batch();
      };
      auto s_done = [&](int n) {
        warpgroup_fence_operand(tSrS);
        pipe_k.consumer_release(k_state);
        ++k_state;
        if (n == br.n_begin) ss.q_empty[q_slot].arrive();  // last use of the slot in this tile
      };
      auto pv_done = [&]() {
        warpgroup_fence_operand(tOrO);
        pipe_v.consumer_release(v_state);
        ++v_state;
      };
      // Scores of block n -> P in fp32 (in tSrS); returns the rows' O factors.
      auto softmax_block = [&](int n, float (&o_scale)[2]) {
        if (score.softcap) apply_softcap<SFrag>(s_arr, score.pre);
        if (br.needs_mask(n)) {
          if (T::kRightEdgeMask && n >= br.left_end) {  // Note [right-edge mask]
            const int base = n * T::kBlockN + 2 * quad_lane;
            apply_mask_right<SFrag>(
                s_arr, [&](int r) { return t.mask.row_bounds(row_base + 8 * r).hi - base; },
                [](int e) { return 8 * (e / 2) + e % 2; });
          } else {
            apply_mask<SFrag>(
                s_arr, t.mask, [&](int r) { return row_base + 8 * r; },
                [&](int e) { return n * T::kBlockN + 8 * (e / 2) + 2 * quad_lane + e % 2; });
          }
        }
        float m_loc[SFrag::kRows];
        softmax.local_max(s_arr, m_loc);
        // Note [stale-max vote]: one vote of the warp instead of the row max's shuffles when
        // every lane keeps the stale max (after a tile's first block, nearly always); d then
        // says "nothing rescaled", as update_max_local would have. In the SASS the loop's wait
        // for its own P·V moved from before the row max to after it, so the max overlaps that
        // P·V: hd128 +2.7-6.2 % at 1k-16k, causal and not.
        RowDecisions d;
        if (!__all_sync(0xffffffffu, softmax.keeps_max(m_loc, score.scale_log2, T::kTau))) {
          d = softmax.update_max_local(m_loc, score.scale_log2, T::kTau, o_scale);
        }
        softmax.template exp2_and_sum<T::kEmuSixteenths>(s_arr, score.scale_log2);
        return d;
      };
      auto convert_p = [&]() {
        if constexpr (T::kFp8) {
          // Note [fp8 P layout] (sm90/fwd/fp8_vt.cuh): per 32 keys, A register m takes the four
          // S values fp8_a_source(4 m ..) of the same row; P already scaled by 2^8 (Note [fp8
          // forward]).
          uint32_t* p8 = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
          FA4_UNROLL
          for (int c = 0; c < SFrag::kSize / 16; ++c) {
            FA4_UNROLL
            for (int m = 0; m < 4; ++m) {
              const float* g = s + 16 * c;
              p8[4 * c + m] = pack4_e4m3(g[fp8_a_source(4 * m)], g[fp8_a_source(4 * m + 1)],
                                         g[fp8_a_source(4 * m + 2)], g[fp8_a_source(4 * m + 3)]);
            }
          }
        } else {
          FA4_UNROLL
          for (int i = 0; i < SFrag::kSize; ++i) tOrP(i) = Element(s[i]);
        }
      };

      float o_scale[2];
      turn_begin();
      issue_s(-1);
      turn_end();
      warpgroup_wait<0>();
      s_done(n_end - 1);
      ss.trace.tile_mark(leader, wg, tk, 3);
      softmax_block(n_end - 1, o_scale);  // O is still 0: nothing to rescale
      convert_p();
      for (int n = n_end - 2; n >= br.n_begin; --n) {
        const int i = br.n_end - 1 - n;  // the block's place in the tile, for the trace marks
        ss.trace.loop_mark(leader, wg, tk, i, 0);
        turn_begin();
        ss.trace.loop_mark(leader, wg, tk, i, 1);
        issue_s(i);
        issue_pv(i);  // P and V of block n + 1
        turn_end();
        ss.trace.loop_mark(leader, wg, tk, i, 5);
        warpgroup_wait<1>();
        s_done(n);
        ss.trace.loop_mark(leader, wg, tk, i, 6);
        const RowDecisions d = softmax_block(n, o_scale);
        ss.trace.loop_mark(leader, wg, tk, i, 7);
        warpgroup_wait<0>();
        pv_done();
        ss.trace.loop_mark(leader, wg, tk, i, 8);
        if (d.any_rescaled()) scale_rows<OFrag>(o_arr, o_scale);
        convert_p();
        ss.trace.loop_mark(leader, wg, tk, i, 9);
      }
      turn_begin();
      issue_pv(-1);
      turn_end();
      warpgroup_wait<0>();
      pv_done();
      ss.trace.tile_mark(leader, wg, tk, 4);
    }
    float inv_l[2], lse[2];
    const float* sink = kp.p.learnable_sink;  // Note [learnable sink]
    softmax.finalize(inv_l, lse, sink != nullptr ? sink[t.tile.head] * kLog2e : -INFINITY);
    if constexpr (T::kFp8) {
      inv_l[0] *= fp8_out;
      inv_l[1] *= fp8_out;
    }
    scale_rows<OFrag>(o_arr, inv_l);
    ss.trace.tile_mark(leader && !br.empty(), wg, tk, 5);
    const bool dense = kp.p.cu_seqlens_q == nullptr;
    if (T::kTmaStoreO && dense) {
      store_tile_tma<T>(kp, ss, t, mma_pv, tOrO, lse, row_in_tile0, quad_lane, wg, tid,
                        leader && !br.empty() ? tk : kFwdTraceTiles);
    } else {
      // No staging here: the trace's staging marks coincide and mark 8 follows the stores.
      ss.trace.tile_mark(leader && !br.empty(), wg, tk, 6);
      ss.trace.tile_mark(leader && !br.empty(), wg, tk, 7);
      store_tile<T, OFrag>(kp, t, o, lse, row_in_tile0, quad_lane);
      ss.trace.tile_mark(leader && !br.empty(), wg, tk, 8);
    }
    ss.trace.set_last_tile(tid == 0 && dense,
                           static_cast<OutElement*>(kp.p.out) +
                               int64_t(t.tile.m_block) * T::kBlockM * kp.p.out_row_stride +
                               int64_t(t.tile.head) * kp.p.out_head_stride +
                               int64_t(t.tile.batch) * kp.p.out_batch_stride,
                           t.seq.seqlen_q - t.tile.m_block * T::kBlockM);
    ss.trace.tile_mark(leader && !br.empty(), wg, tk, 9);
  }
  ss.trace.clock_mark(tid == 0, 1);
  ss.trace.dump(kp.p.out_row_stride * int64_t(sizeof(OutElement)), T::kHeadDimV / 2, tid,
                T::kConsumerThreads, 2 * T::kConsumerWGs);
  // The last TMA store must have read shared memory before the CTA exits.
  if (T::kTmaStoreO && threadIdx.x % 128 == 0) tma_store_wait<0>();
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kCtasPerSm)
    fwd_kernel(const __grid_constant__ KernelParams<T> kp) {
  // Only the sm_90a pass has wgmma and setmaxnreg; other archs of a multi-arch build (sm_100a)
  // compile an empty body, and dispatch never launches it there.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem);
  const int warp = threadIdx.x / 32;
  const auto role = static_cast<WarpGroupRole>(threadIdx.x / 128);
  if (warp == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    for (int i = 0; i < T::kQStages; ++i) {
      ss.q_full[i].init(1);
      ss.q_empty[i].init(T::kConsumerThreads);
    }
    ss.tiles.init(T::kConsumerThreads);
    ss.trace.init();
  }
  using Pipe = typename T::PipelineKV;
  typename Pipe::Params pk, pv;
  pk.role = role == WarpGroupRole::kProducer ? Pipe::ThreadCategory::Producer
                                             : Pipe::ThreadCategory::Consumer;
  pk.is_leader = threadIdx.x == 0;
  pk.num_consumers = T::kConsumerThreads;
  pv = pk;
  pk.transaction_bytes = T::kKBytes;
  pv.transaction_bytes = T::kVBytes;
  Pipe pipe_k(ss.pipe_k, pk, Shape<_1, _1, _1>{});
  Pipe pipe_v(ss.pipe_v, pv, Shape<_1, _1, _1>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (role == WarpGroupRole::kProducer) {
    cutlass::arch::warpgroup_reg_dealloc<T::Regs::kProducer>();
    if (threadIdx.x == 0) producer(kp, ss, pipe_k, pipe_v);
  } else {
    cutlass::arch::warpgroup_reg_alloc<T::Regs::kConsumer>();
    consumer(kp, ss, pipe_k, pipe_v, threadIdx.x - 128);
  }
#endif
}

template <class T>
Status launch(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using Element = typename T::Element;
  KernelParams<T> kp;
  kp.p = p;
  kp.group = p.heads_q / p.heads_kv;
  kp.score = ScoreScale::make(p.softmax_scale, p.softcap);
  const auto [q, k, v] = fwd_views(p);
  kp.shape_q = q.shape();
  kp.shape_k = k.shape();
  kp.shape_v = v.shape();
  kp.tma_q = make_tma_tile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>(q);
  kp.tma_k = make_tma_tile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>(k);
  if constexpr (T::kFp8) {  // Vᵀ in the workspace (sm90/fwd/fp8_vt.cuh)
    kp.vt = VtLayout::of(p);
    const GmemView vt{p.workspace,
                      p.head_dim_v,
                      int(kp.vt.cols),
                      p.heads_kv,
                      kp.vt.varlen ? 1 : p.batch,
                      kp.vt.cols,
                      kp.vt.head_stride(p.head_dim_v),
                      kp.vt.batch_stride(p.head_dim_v, p.heads_kv)};
    kp.shape_v = vt.shape();
    kp.tma_v = make_tma_tile<Element, typename T::SmemLayoutV, T::kHeadDimV, T::kBlockN>(vt);
  } else {
    kp.tma_v = make_tma_tile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>(v);
  }
  if (T::kTmaStoreO && p.cu_seqlens_q == nullptr) {
    const GmemView o = gmem_view(p, p.out, false, p.head_dim_v, p.out_row_stride, p.out_head_stride,
                                 p.out_batch_stride);
    kp.shape_o = o.shape();
    kp.tma_o =
        make_tma_store_tile<typename T::OutElement, typename T::SmemLayoutOHalf, 64, T::kHeadDimV>(
            o);
  }
  kp.sched = TileScheduler::for_forward(p, T::kBlockM, int(sizeof(Element)),
                                        dev.num_sms * T::kCtasPerSm, dev.tile_order);
  const int grid = kp.sched.grid(dev.num_sms * T::kCtasPerSm);
  if (grid == 0) return Status::kOk;
  if constexpr (T::kCtasPerSm > 1) {
    // The carveout is a hint the driver may override; ask for all of it so that the CTAs fit.
    const cudaError_t e =
        cudaFuncSetAttribute(fwd_kernel<T>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) {
      return kernel_fail(Status::kCudaError, "fwd_sm90: carveout: %s", cudaGetErrorString(e));
    }
  }
  return launch_kernel("fwd_sm90", fwd_kernel<T>, dim3(grid), T::kThreads, T::kSmemBytes, stream,
                       kp);
}

// Note [short causal hd64]: the 192-row tiles of Note [three consumers at hd64] fit short causal
// problems badly: 1024 rows are 5 1/3 tiles, and a sequence's last, partial tile holds its only
// diagonal block (-6 % at causal 1k against 128-row tiles).
//
// Note [three CTAs at short causal hd64]: so causal and local problems of at most
// kShortBandedRows query rows per sequence run the three-CTA kernel (Note [several CTAs per SM]:
// causal 512 +6.8 %, causal 1k +3.1 % against two warpgroups), bf16 and fp16 alike; non-causal
// ones keep the three-consumer kernel (the three-CTA one: -4.7 % at 512, -0.5..-8.6 % at 1k). The
// limit: up to 2048 rows the three-CTA kernel lost 3 % at causal 2k. With the skip of Note [slice
// block end] the three-consumer kernel still ran causal 512 / 1k at 0.906 / 0.952 of it.
inline bool short_banded(const FwdParams& p) {
  const bool banded = is_banded(p);
  return banded && p.seqlen_q <= kShortBandedRows;
}

// Note [hd256 narrow blocks]: 80-key blocks (Note [hd256 kBlockN 80]) do not divide the 128-row
// Q tiles' diagonal nor most sequence lengths: the S GEMMs compute every visited block whole, so
// at 512 keys a tile computes 560 columns (7 blocks, +9.4 %) and causal 512 1440 against 1280 with
// 64-key blocks (+12.5 %). Per column the 80-key block is the faster loop (+8 % at 16k, ~+4 % at
// 1k where its waste is 1.6 %), so the 64-key kernel runs where 80 computes more than
// kNarrowWaste times its columns over the longest sequence's tiles.
// Called only for kernels whose default kBlockN is 80 (launch_element's guard).
template <int D, int DV>
bool narrow_blocks(const FwdParams& p) {
  using Wide = FwdTraits<D, DV, cutlass::half_t>;
  const Mask mask = Mask::from_params(p, p.seqlen_q, p.seqlen_k);
  const int64_t wide = keys_computed<Wide::kBlockM, Wide::kBlockN>(mask);
  const int64_t narrow = keys_computed<Wide::kBlockM, 64>(mask);
  return double(wide) > kNarrowWaste * double(narrow);
}

// One element type's kernels: the three-CTA kernel for short banded problems where three
// consumers are the default (hd64), the 64-key kernel for short problems where 80-key blocks are
// (hd256), else the head dim's defaults.
template <int D, int DV, class Element>
Status launch_element(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (FwdTraits<D, DV, Element>::kConsumerWGs == 3) {
    if (short_banded(p)) {
      return launch<FwdTraits<D, DV, Element, 1, kShortBandedBlockN, kShortBandedCtasPerSm>>(
          p, dev, stream);
    }
  }
  if constexpr (FwdTraits<D, DV, Element>::kBlockN == 80) {
    if (narrow_blocks<D, DV>(p)) return launch<FwdTraits<D, DV, Element, 0, 64>>(p, dev, stream);
  }
  return launch<FwdTraits<D, DV, Element>>(p, dev, stream);
}

}  // namespace fa4::sm90
