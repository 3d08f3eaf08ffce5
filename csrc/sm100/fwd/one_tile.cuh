// The MMA role of the SM100 forward for one Q tile per CTA (hd 256, FwdTraits::kQTiles == 1);
// included by sm100/fwd/kernel.cuh, whose other roles serve both shapes.
//
// Note [one-tile order]: at hd 256 the two O tiles of the ping-pong would take all 512 TMEM
// columns, so a CTA owns one 128-row Q tile and double-buffers its S instead: S0 | S1 | O0 (Note
// [TMEM plan]). The MMA thread issues, after S(0) and S(1) into buffers 0 and 1,
//   PV(i) (P from buffer i % 2), S(i + 2) (into buffer i % 2)
// per KV block, where "buffer" is a running count of S issues across work tiles. tcgen05 MMAs of
// one thread execute in issue order, so S(i + 2) overwrites P(i) only after PV(i) read it, while
// softmax0 works on S(i + 1) in the other buffer: the tensor core has S(i + 2) and PV(i) to run
// during the exponentials of block i + 1. softmax1 has no work at this head dim. The protocol
// model (tools/protocol_model.py, Config(q_tiles=1)) checks this order against the barrier
// table.
#pragma once

namespace fa4::sm100 {

template <class T>
__device__ void mma_role_one_tile(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                                  uint32_t tmem) {
  using Plan = typename T::Plan;
  static_assert(T::kQTiles == 1, "the two-tile kernel uses mma_role");
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutVt{});
  auto thr_s = make_tiled_mma(typename T::AtomS{}).get_slice(0);
  auto thr_o = make_tiled_mma(typename T::AtomO{}).get_slice(0);
  Tensor dQ = thr_s.partition_fragment_A(sQ);
  Tensor dK = thr_s.partition_fragment_B(sK);
  Tensor dV = thr_o.partition_fragment_B(sVt);
  constexpr int kKQk = T::kHeadDim / T::kMmaK;
  constexpr int kKPv = T::kBlockN / T::kMmaK;
  const uint64_t idesc_s = instr_desc_s<T>();
  const uint64_t idesc_o = instr_desc_o<T>();

  Ring q_ready, k_ready, v_ready, o_free, o_ok, s_issued, p_ready;
  // S(blk) into the next S buffer; K's stage is released as soon as it is read.
  auto issue_s = [&](int) {
    const int b = s_issued.index(kSBuffers);
    ++s_issued.count;
    const int ks = k_ready.index(T::kStages);
    bar_wait(bar_ptr<T, Bar::kKFull>(ss, ks), k_ready.parity(T::kStages));
    tmem_fence_after_sync();
    FA4_UNROLL
    for (int k = 0; k < kKQk; ++k) {
      umma_ss<1, T::kFp8>(dQ(_0{}, _0{}, k, 0), dK(_0{}, _0{}, k, ks),
                          tmem + Plan::kS0 + uint32_t(b) * T::kBlockN, k > 0 ? 1u : 0u, idesc_s);
    }
    umma_commit(bar_ptr<T, Bar::kSFull>(ss, b));
    umma_commit(bar_ptr<T, Bar::kKEmpty>(ss, ks));
    ++k_ready.count;
  };
  for (int n_item = 0;; ++n_item) {
    const TileCoord coord = take_tile<T>(ss, n_item);
    if (coord.batch < 0) break;
    FA4_SM100_DEBUG_TILE(coord.batch, coord.head, coord.m_block);
    const TileWork t = tile_work(kp, coord);
    const int nblk = t.blocks();
    if (nblk <= 0) continue;
    bar_wait(bar_ptr<T, Bar::kQFull>(ss, 0), q_ready.parity(1));
    ++q_ready.count;
    for (int blk = 0; blk < 2 && blk < nblk; ++blk) {
      issue_s(blk);
      if (blk + 1 == nblk) umma_commit(bar_ptr<T, Bar::kQEmpty>(ss, 0));  // the tile's last S
    }
    for (int i = 0; i < nblk; ++i) {
      FA4_SM100_DEBUG_BLOCK(t.n_end - 1 - i);
      const int vs = v_ready.index(T::kStages);
      bar_wait(bar_ptr<T, Bar::kVFull>(ss, vs), v_ready.parity(T::kStages));
      const int b = p_ready.index(kSBuffers);
      bar_wait(bar_ptr<T, Bar::kPFull>(ss, b), p_ready.parity(kSBuffers));
      ++p_ready.count;
      bar_wait(bar_ptr<T, Bar::kORescaled>(ss, 0), o_ok.parity(1));
      ++o_ok.count;
      // The tile's first P·V overwrites O: the epilogue of the previous tile must be done.
      if (i == 0) bar_wait(bar_ptr<T, Bar::kOEmpty>(ss, 0), o_free.parity(1) ^ 1u);
      tmem_fence_after_sync();
      FA4_UNROLL
      for (int k = 0; k < kKPv; ++k) {
        umma_ts<1, T::kFp8>(tmem + Plan::kS0 + uint32_t(b) * T::kBlockN + k * T::kPSliceColumns,
                            dV(_0{}, _0{}, k, vs), tmem + Plan::kO0, (i > 0 || k > 0) ? 1u : 0u,
                            idesc_o);
      }
      umma_commit(bar_ptr<T, Bar::kOFull>(ss, 0));
      umma_commit(bar_ptr<T, Bar::kVEmpty>(ss, vs));
      ++v_ready.count;
      if (i + 2 < nblk) {
        issue_s(i + 2);  // over P(i): in issue order after PV(i), which reads it
        if (i + 3 == nblk) umma_commit(bar_ptr<T, Bar::kQEmpty>(ss, 0));
      }
    }
    ++o_free.count;  // one kOEmpty completion per tile
  }
}

}  // namespace fa4::sm100
