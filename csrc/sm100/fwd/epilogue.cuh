// The SM100 forward's correction warpgroup and epilogue warp (roles in sm100/fwd/kernel.cuh):
// the O rescale, and the TMA-store epilogue (Note [sm100 TMA-store epilogue], in FwdTraits): the
// correction warpgroup stages O_t · 1/l in shared memory (stage_o) and the epilogue warp stores
// it with one TMA store per Q tile (epilogue_role). Included by sm100/fwd/kernel.cuh.
#pragma once

namespace fa4::sm100 {

// Called by the whole correction warpgroup (thread i: row i of the tile) once its O_t is final:
// waits for the staging buffer, writes the row scaled by inv_l (zeros when the tile saw no key,
// has_o false), then hands it to the epilogue warp. Rows past the sequence are staged too; the
// TMA store clips them.
template <class T>
__device__ __forceinline__ void stage_o(typename T::SharedStorage& ss, uint32_t o_addr, bool has_o,
                                        float inv_l, int row, Ring& staged) {
  using Element = typename T::OutElement;
  if constexpr (T::kTmaStoreO) {  // the traits without a staging buffer have no kOStage barriers
    bar_wait(bar_ptr<T, Bar::kOStageEmpty>(ss, 0), staged.parity(1) ^ 1u);
    ++staged.count;
    Tensor sO = make_tensor(make_smem_ptr(ss.o.data()), typename T::SmemLayoutO{});
    FA4_UNROLL
    for (int c = 0; c < T::kHeadDimV / 32; ++c) {
      uint32_t o[32];
      if (has_o) {
        tmem_load_32(o_addr + 32 * c, o);
        tmem_wait_ld();
      } else {
        FA4_UNROLL
        for (int j = 0; j < 32; ++j) o[j] = 0u;
      }
      scale_pack_32<Element>(o, inv_l);
      FA4_UNROLL
      for (int v = 0; v < 4; ++v) {
        *reinterpret_cast<uint4*>(&sO(row, 32 * c + 8 * v)) =
            make_uint4(o[4 * v], o[4 * v + 1], o[4 * v + 2], o[4 * v + 3]);
      }
    }
    fence_async_smem();  // generic-proxy writes, read by the TMA store
    bar_arrive(bar_ptr<T, Bar::kOStageFull>(ss, 0));
  }
}

// One thread: per work tile and Q tile (the correction warpgroup's order), the TMA store of the
// staged O, then the buffer back to the correction warpgroup once the store has read it.
template <class T>
__device__ void epilogue_role(const KernelParams<T>& kp, typename T::SharedStorage& ss) {
  Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_o);
  Tensor sO = make_tensor(make_smem_ptr(ss.o.data()), typename T::SmemLayoutO{});
  auto cta = kp.tma_o.get_slice(_0{});
  Ring staged;
  for (int n_item = 0;; ++n_item) {
    const TileCoord coord = take_tile<T>(ss, n_item);
    if (coord.batch < 0) break;
    FA4_SM100_DEBUG_TILE(coord.batch, coord.head, coord.m_block);
    const TileWork t = tile_work(kp, coord);
    for (int q = 0; q < T::kQTiles; ++q) {
      bar_wait(bar_ptr<T, Bar::kOStageFull>(ss, 0), staged.parity(1));
      ++staged.count;
      Tensor gO = local_tile(mO(_, _, t.tile.head, t.bidb_gmem),
                             Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{},
                             make_coord(t.tile.m_block * T::kQTiles + q, _0{}));
      copy(kp.tma_o, cta.partition_S(sO), cta.partition_D(gO));
      tma_store_arrive();
      tma_store_wait<0>();  // the store has read the staging buffer
      bar_arrive(bar_ptr<T, Bar::kOStageEmpty>(ss, 0));
    }
  }
}

// ---- Correction role (and epilogue) ---------------------------------------------------------
// Thread i of the warpgroup owns row i of both Q tiles' O.
template <class T>
__device__ void correction_role(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                                uint32_t tmem, int row_in_tile) {
  using Element = typename T::OutElement;  // bf16 for the FP8 forward
  using Plan = typename T::Plan;
  const FwdParams& p = kp.p;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const uint32_t lane_base = uint32_t(row_in_tile & ~31) << 16;
  Ring st_ready[2], o_done[2], o_staged;
  // Reads this row's next statistics message of tile q.
  auto take_stats = [&](int q, float& a, float& b) {
    bar_wait(bar_ptr<T, Bar::kStatsFull>(ss, q), st_ready[q].parity(1));
    ++st_ready[q].count;
    a = ss.stat_a[q][row_in_tile];
    b = ss.stat_b[q][row_in_tile];
    bar_arrive(bar_ptr<T, Bar::kStatsEmpty>(ss, q));
  };
  auto wait_o = [&](int q) {
    wait_any<T>(bar_ptr<T, Bar::kOFull>(ss, q), o_done[q].parity(1));
    ++o_done[q].count;
    tmem_fence_after_sync();
  };
  for (int n_item = 0;; ++n_item) {
    const TileCoord coord = take_tile<T>(ss, n_item);
    if (coord.batch < 0) break;
    FA4_SM100_DEBUG_TILE(coord.batch, coord.head, coord.m_block);
    const TileWork t = tile_work(kp, coord);
    const int nblk = t.blocks();
    for (int i = 0; i < nblk; ++i) {
      FA4_SM100_DEBUG_BLOCK(t.n_end - 1 - i);
      for (int q = 0; q < T::kQTiles; ++q) {
        float factor, unused;
        take_stats(q, factor, unused);
        // Block 0 has no O yet (its P·V overwrites); afterwards O_t holds P·V up to block i-1.
        if (i > 0) {
          wait_o(q);
          // Note [conditional rescale]: most blocks rescale no row; the vote skips the 2 x
          // d_v/32 TMEM round trips for warps whose 32 rows all keep their max.
          if (__any_sync(0xffffffffu, factor != 1.0f)) {
            const uint32_t o_addr = tmem + lane_base + (q == 0 ? Plan::kO0 : Plan::kO1);
            FA4_UNROLL
            for (int c = 0; c < T::kHeadDimV / 32; ++c) {
              uint32_t o[32];
              tmem_load_32(o_addr + 32 * c, o);
              tmem_wait_ld();
              FA4_UNROLL
              for (int j = 0; j < 32; ++j) o[j] = __float_as_uint(__uint_as_float(o[j]) * factor);
              tmem_store_32(o_addr + 32 * c, o);
            }
            tmem_wait_st();
          }
        }
        tmem_fence_before_sync();
        arrive_mma<T>(bar_ptr<T, Bar::kORescaled>(ss, q));
      }
    }
    // Epilogue: out = O · 1/l, row by row from TMEM (a thread writes its row's d_v contiguous
    // elements as 16-byte stores: dispatch requires 16-byte aligned rows of out).
    for (int q = 0; q < T::kQTiles; ++q) {
      float inv_l = 0.0f, lse = -INFINITY;  // Note [empty rows]: no block, no key
      if (nblk > 0) {
        take_stats(q, inv_l, lse);
        wait_o(q);
        // Note [fp8 forward] (common/fp8.cuh): v's descale and P's 2^-8.
        if constexpr (T::kFp8) inv_l *= fp8_scales(p, t.tile.batch, t.tile.head / kp.group).out;
      }
      const int row = q_tile_of<T>(t.tile, q) * T::kBlockM + row_in_tile;
      const bool in_seq = row < t.seq.seqlen_q;  // rows past the sequence are not written
      const int64_t grow = int64_t(t.seq.offset_q) + row;
      Element* out = static_cast<Element*>(p.out) + grow * p.out_row_stride +
                     int64_t(t.tile.head) * p.out_head_stride +
                     (varlen ? 0 : int64_t(t.tile.batch) * p.out_batch_stride);
      const uint32_t o_addr = tmem + lane_base + (q == 0 ? Plan::kO0 : Plan::kO1);
      // tcgen05.ld is .sync.aligned: the whole warp loads (a warp-uniform skip is allowed),
      // only the stores are per row.
      if (T::kTmaStoreO && kp.tma_store_o) {
        stage_o<T>(ss, o_addr, nblk > 0, inv_l, row_in_tile, o_staged);
      } else if (__any_sync(0xffffffffu, in_seq)) {
        FA4_UNROLL
        for (int c = 0; c < T::kHeadDimV / 32; ++c) {
          uint32_t o[32];
          if (nblk > 0) {
            tmem_load_32(o_addr + 32 * c, o);
            tmem_wait_ld();
          } else {
            FA4_UNROLL
            for (int j = 0; j < 32; ++j) o[j] = 0u;
          }
          // Packed in place (o[j] from o[2j], o[2j + 1], j <= 2j): 16 registers fewer.
          scale_pack_32<Element>(o, inv_l);
          if (in_seq) store_64_bytes(out + 32 * c, o, p.head_dim_v - 32 * c);
        }
      }
      if (in_seq && p.lse != nullptr) {
        p.lse[int64_t(t.tile.head) * p.lse_head_stride +
              (varlen ? grow : int64_t(t.tile.batch) * p.lse_batch_stride + row)] = lse;
      }
      // A pair runs one tile per cluster: no next tile's P·V waits for O.
      if constexpr (!T::kPair) {
        if (nblk > 0) {
          tmem_fence_before_sync();
          bar_arrive(bar_ptr<T, Bar::kOEmpty>(ss, q));
        }
      }
    }
  }
}

}  // namespace fa4::sm100
