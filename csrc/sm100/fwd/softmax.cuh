// The SM100 forward's softmax warpgroups (roles in sm100/fwd/kernel.cuh): per KV block the S row
// from TMEM, mask, row max, the rescale decision for the correction warpgroup, exp2 and P (16-bit,
// or e4m3 for the FP8 forward) stored to TMEM over its S. Included by sm100/fwd/kernel.cuh; shared
// by the 2-CTA forward (T::kPair: wait_any, arrive_mma).
#pragma once

namespace fa4::sm100 {

// Warpgroup q (0 or 1) owns Q tile q; thread i holds row i: lanes 32 · (warp % 4) + lane.
template <class T>
__device__ void softmax_role(const KernelParams<T>& kp, typename T::SharedStorage& ss,
                             uint32_t tmem, int q, int row_in_tile) {
  using Element = typename T::Element;
  using Plan = typename T::Plan;
  using SFrag = RowMajorFrag<1, T::kBlockN>;
  const uint32_t lane_base = uint32_t(warp_uniform(row_in_tile & ~31)) << 16;
  tmem = uint32_t(warp_uniform(int(tmem)));
  q = warp_uniform(q);  // the stats barriers' addresses in uniform registers
  static_assert(
      Plan::kS1 == Plan::kS0 + T::kBlockN && Plan::kP0 == Plan::kS0 && Plan::kP1 == Plan::kS1,
      "S buffer b (and its P) at kS0 + b · kBlockN");
  uint64_t* st_full = bar_ptr<T, Bar::kStatsFull>(ss, q);
  uint64_t* st_empty = bar_ptr<T, Bar::kStatsEmpty>(ss, q);
  Ring s_ready, st_free;
  // Publishes this row's statistics to the correction warpgroup once it read the last ones.
  auto publish = [&](float a, float b) {
    bar_wait(st_empty, st_free.parity(1) ^ 1u);
    ++st_free.count;
    ss.stat_a[q][row_in_tile] = a;
    ss.stat_b[q][row_in_tile] = b;
    bar_arrive(st_full);
  };
  for (int n_item = 0;; ++n_item) {
    const TileCoord coord = warp_uniform(take_tile<T>(ss, n_item));
    if (coord.batch < 0) break;
    FA4_SM100_DEBUG_TILE(coord.batch, coord.head, coord.m_block);
    const TileWork t = tile_work(kp, coord);
    if (t.blocks() <= 0) continue;  // the correction warpgroup writes out = 0, lse = -inf
    // This tile's own range (recomputed: t.br[q] with a run-time q would sit in local memory).
    const int q_tile = q_tile_of<T>(t.tile, q);
    const BlockRange br = block_range<T::kBlockM, T::kBlockN>(t.mask, q_tile);
    const int row = q_tile * T::kBlockM + row_in_tile;
    // apply_mask's per-element test with its row_bounds(row) taken once per tile: the per-block
    // loop carries two ints for the mask instead of the Mask and the row (hd 128: 47 spill
    // instructions in the loop with apply_mask, 11 with this).
    const RowBounds rb = t.mask.row_bounds(row);
    const int full_begin = br.full_begin, full_end = br.full_end;
    // Note [fp8 forward] (common/fp8.cuh): this (batch, kv head)'s q and k descales scale the
    // scores, before the softcap.
    ScoreScale fp8_score;
    if constexpr (T::kFp8) {
      const Fp8Scales f = fp8_scales(kp.p, t.tile.batch, t.tile.head / kp.group);
      fp8_score = ScoreScale::make(kp.p.softmax_scale * f.qk, kp.p.softcap);
    }
    const ScoreScale& score = T::kFp8 ? fp8_score : kp.score;
    OnlineSoftmax<SFrag, T::kFp8 ? kFp8PLog2 : 0> softmax;  // Note [fp8 P scale]
    softmax.init();
    for (int n = t.n_end - 1; n >= t.n_begin; --n) {
      FA4_SM100_DEBUG_BLOCK(n);
      // S buffer b: Q tile q's with two tiles; with one (hd 256) the buffer of this block's
      // running count (Note [one-tile order]).
      const int b = T::kQTiles == 2 ? q : s_ready.index(kSBuffers);
      wait_any<T>(bar_ptr<T, Bar::kSFull>(ss, b),
                  T::kQTiles == 2 ? s_ready.parity(1) : s_ready.parity(kSBuffers));
      ++s_ready.count;
      const uint32_t s_addr = tmem + lane_base + Plan::kS0 + uint32_t(b) * T::kBlockN;
      const uint32_t p_addr = s_addr;  // 16-bit (or e4m3) P over its S
      tmem_fence_after_sync();
      float s[T::kBlockN];
      FA4_UNROLL
      for (int c = 0; c < T::kBlockN / 32; ++c) {
        tmem_load_32(s_addr + 32 * c, *reinterpret_cast<uint32_t (*)[32]>(&s[32 * c]));
      }
      tmem_wait_ld();
      if (score.softcap) apply_softcap<SFrag>(s, score.pre);
      // Blocks outside this tile's own range are in the union of both tiles' ranges only:
      // needs_mask is true there and the mask hides the whole block.
      // br.empty() || br.needs_mask(n): an empty range has full_begin == full_end == 0.
      if (n < full_begin || n >= full_end) {
        FA4_UNROLL
        for (int e = 0; e < T::kBlockN; ++e) {
          if (!rb.contains(n * T::kBlockN + e)) s[e] = -INFINITY;
        }
      }
      float o_scale[1];
      softmax.update_max(s, score.scale_log2, T::kTau, o_scale);
      publish(o_scale[0], 0.0f);  // early: correction rescales O while we exponentiate
      // Note [chunked exp2]: each 32 columns of P packed and stored as soon as they are
      // exponentiated, the finished columns' fp32 registers free for the next ones (with the
      // whole row exponentiated first: 5 STL + 6 LDL in this loop).
      auto sums = softmax.exp2_sums_begin();
      FA4_UNROLL
      for (int c = 0; c < T::kBlockN / 32; ++c) {
        softmax.template exp2_chunk<T::kEmuSixteenths, 32>(s, score.scale_log2, c, sums);
        if constexpr (T::kFp8) {  // e4m3 P, four per column, already scaled by 2^8 (fp8.cuh)
          uint32_t p[8];
          FA4_UNROLL
          for (int j = 0; j < 8; ++j) {
            const float* e = s + 32 * c + 4 * j;
            p[j] = pack4_e4m3(e[0], e[1], e[2], e[3]);
          }
          tmem_store_8(p_addr + 8 * c, p);
        } else {
          uint32_t p[16];
          FA4_UNROLL
          for (int j = 0; j < 16; ++j)
            p[j] = pack2<Element>(s[32 * c + 2 * j], s[32 * c + 2 * j + 1]);
          tmem_store_16(p_addr + 16 * c, p);
        }
      }
      softmax.exp2_sums_end(sums);
      tmem_wait_st();
      tmem_fence_before_sync();
      arrive_mma<T>(bar_ptr<T, Bar::kPFull>(ss, b));
    }
    float inv_l[1], lse[1];
    softmax.finalize(inv_l, lse);
    publish(inv_l[0], lse[0]);
  }
}

}  // namespace fa4::sm100
