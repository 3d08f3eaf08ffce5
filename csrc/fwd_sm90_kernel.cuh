// SM90 (Hopper) forward kernel: warp-specialized TMA + wgmma attention with FA4 numerics.
// Included by the per-head-dim instantiation files csrc/fwd_sm90_hd*.cu (one per head-dim pair,
// so that ninja compiles them in parallel); fwd_sm90.cu dispatches to them.
//
// Roles (one enum, WarpGroupRole): warpgroup 0 is the producer (one thread issues every TMA
// load: Q once per tile, into one of two buffers where they fit (Note [two Q buffers]), K and V
// per KV block through two mbarrier pipelines), the others are
// consumers (two, or three at hd 64: Note [three consumers at hd64]), each owning 64 of the
// tile's query rows: S = Q·Kᵀ (wgmma, both operands in shared memory), online softmax with
// conditional rescaling (softmax.cuh), P kept in registers as the A operand of O += P·V
// (register-A wgmma), then the epilogue. setmaxnreg moves registers from the producer to the
// consumers (RegisterSplit).
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
// Shared memory (bf16/fp16, kStages = 2; the O staging of Note [TMA-store epilogue] and the second
// Q buffer of Note [two Q buffers] where they fit, in that order):
//   hd 64:  Q 2×24 KB + K 2×16 KB + V 2×16 KB + O 24 KB = 136 KB  (kBlockM 192, kBlockN 128)
//   hd 128: Q 2×32 KB + K 2×32 KB + V 2×32 KB + O 32 KB = 224 KB  (kBlockN 128)
//   hd 192: Q 48 KB + K 2×24 KB + V 2×(16|24) KB + O 32|48 KB = 160..192 KB, plus a second Q
//           at (192, 128): 208 KB (kBlockN 64: S registers)
//   hd 256: Q 64 KB + K 2×40 KB + V 2×40 KB = 224 KB  (kBlockN 80: 227 KB limit)
// The S accumulator costs kBlockN/2 registers per consumer thread and O kHeadDimV/2; with
// 240 registers per thread, kBlockN 128 leaves room for hd ≤ 128, hd 192 takes kBlockN 64 and
// hd 256 80.
//
// The persistent grid walks tiles with the shared TileScheduler (tile_scheduler.cuh):
// m-block-fastest for L2 reuse, longest-processing-time first for causal masks. Which CTA takes
// which tile is decided at run time when FwdParams::tile_counter is set (Note [dynamic tiles]).
#pragma once

// kBlockN 80 at hd 256 needs the 64×80 wgmma, one of CuTe's "extended" shapes; the instantiation
// files include this header first, so the switch reaches every CuTe header.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "fwd_sm90_trace.cuh"
#include "mask.cuh"
#include "params.h"
#include "sm90_common.cuh"
#include "softmax.cuh"
#include "tile_ring.cuh"
#include "tile_scheduler.cuh"

// Compile-time switch for measurements (docs/perf-notes.md: on and off measured within noise).
#ifndef FA4_SM90_PINGPONG
#define FA4_SM90_PINGPONG 1
#endif
// Note [SM90 exp2 split]: exponentials per 16 through exp2_poly, at every head dim (A/B switch).
#ifndef FA4_SM90_EMU_SIXTEENTHS
#define FA4_SM90_EMU_SIXTEENTHS 0
#endif
// Note [three consumers at hd64]; 0 keeps two consumer warpgroups at every head dim.
#ifndef FA4_SM90_THREE_CONSUMERS
#define FA4_SM90_THREE_CONSUMERS 1
#endif
// Note [short causal hd64]: causal or local hd64 problems with at most this many query rows per
// sequence run the two-warpgroup kernel (0: never; an A/B switch).
#ifndef FA4_SM90_HD64_TWO_WG_ROWS
#define FA4_SM90_HD64_TWO_WG_ROWS 1024
#endif

namespace fa4::sm90 {

using namespace cute;

// Per-thread registers after setmaxnreg, by the number of consumer warpgroups and d_v (the
// launch allocates 65536 / kThreads per thread, rounded down to 8):
//   2 consumers, d_v <= 128: producer 56, consumers 224: 56·128 + 224·256 = 64512 = 168·384
//                (the consumers' highest register is R186 at hd128; the producer, which claims
//                the next tile inside its block loop (Note [two Q buffers]), spilled at 40)
//   2 consumers, d_v > 128: producer 40 (its TMA and scheduler arithmetic spilled at 24),
//                consumers 232 (O alone is d_v / 2 registers)
//   3 consumers: producer 32, consumers 160: 32·128 + 160·384 = 65536 = 128·512
template <int kConsumerWGs, int kHeadDimV>
struct RegisterSplit {
  static constexpr int kProducer = kConsumerWGs == 3 ? 32 : (kHeadDimV <= 128 ? 56 : 40);
  static constexpr int kConsumer = kConsumerWGs == 3 ? 160 : (kHeadDimV <= 128 ? 224 : 232);
  static_assert(kConsumerWGs == 2 || kConsumerWGs == 3, "two or three consumer warpgroups");
  static_assert(kProducer * 128 + kConsumer * 128 * kConsumerWGs <= 65536, "register file");
};

// The ring of Note [dynamic tiles] (tile_ring.cuh): the producer thread publishes the decoded
// tile (batch < 0: the end marker), the consumer warpgroups read it (kConsumerThreads arrivals
// on empty). Decoded by the producer because TileScheduler::at's int64 divisions sat on the
// consumers' tile boundary, where the tensor cores wait (Note [fwd trace] measured it).
struct TileRing {
  uint64_t full[kTileSlots];
  uint64_t empty[kTileSlots];
  TileCoord item[kTileSlots];
  __device__ void init(int readers) {
    for (int i = 0; i < kTileSlots; ++i) {
      cutlass::arch::ClusterBarrier::init(&full[i], 1);
      cutlass::arch::ClusterBarrier::init(&empty[i], readers);
    }
  }
  __device__ void publish(int n, const TileCoord& c) { publish_item(full, empty, item, n, c); }
  __device__ TileCoord take(int n) { return take_item(full, empty, item, n); }
};

// Compile-time options of one forward kernel; kConsumerWGs_ 0 takes the head dim's default.
template <int kHeadDim_, int kHeadDimV_, class Element_, int kConsumerWGs_ = 0>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  // Note [three consumers at hd64]: at d = 64 a 128 × 128 block is as long on MUFU (16384
  // exponentials at 16/clk) as on the tensor cores (two 64-deep GEMMs), so two warpgroups in
  // ping-pong leave no slack; a third warpgroup (192-row tiles, 160 registers each: S 64 + P 32
  // + O 32) gives the scheduler another's softmax or GEMMs to fill each gap.
  static constexpr int kConsumerWGs =
      kConsumerWGs_ != 0 ? kConsumerWGs_ : (FA4_SM90_THREE_CONSUMERS && kHeadDim <= 64 ? 3 : 2);
  static constexpr int kBlockM = 64 * kConsumerWGs;
  // Note [hd256 kBlockN 80]: at hd 256, 80 keys per block (S 40 registers per thread, K and V
  // 2 × 40 KB each, 224 KB of shared memory with Q) measured +8 % at 16k against 64; hd 192
  // keeps 64 (not measured at 80).
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : (kHeadDim == 256 ? 80 : 64);
  static constexpr int kStages = 2;
  using Regs = RegisterSplit<kConsumerWGs, kHeadDimV>;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerThreads = 128 * kConsumerWGs;
  // Note [SM90 exp2 split]: Hopper's MUFU (16/clk/SM) keeps up with its wgmma rate at these
  // tile shapes, so the polynomial path starts switched off; docs/perf-notes.md records the
  // measurements that set it (forward step 4) and why small fractions are worth measuring again
  // on today's loop (step 16: the two warpgroups' overlapping softmaxes share each MUFU).
  static constexpr int kEmuSixteenths = FA4_SM90_EMU_SIXTEENTHS;
  static constexpr float kTau = 8.0f;  // Note [conditional rescale]
  // Note [warpgroup ping-pong]: the consumer warpgroups take turns issuing their GEMMs (one
  // named barrier each), so one's softmax runs while another's GEMMs hold the tensor cores.
  static constexpr bool kPingPong = FA4_SM90_PINGPONG;

  using TileQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using AtomLayout = Layout<Shape<Int<kConsumerWGs>, _1, _1>>;
  using MmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayout{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayout{}));

  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // Vᵀ as the B operand of P·V: (d_v, kBlockN) with d_v contiguous, i.e. MN-major.
  using SmemLayoutVt = TransposedSmem<SmemLayoutV, kBlockN, kHeadDimV, kStages>;

  // Note [TMA-store epilogue]: each consumer warpgroup puts its 64 rows of O in shared memory
  // and one of its threads stores them with a TMA store, so the warpgroup moves on to the next
  // tile while the copy drains (rows past the sequence are clipped by the tensor bounds). Not for
  // varlen problems, whose TMA tensor packs the sequences (a clipped tile would write into the
  // next sequence's rows), and not at d_v = 256, where O does not fit next to Q, K and V (64 KB
  // each): both write O from registers (store_tile).
  // One warpgroup's 64 rows, the atoms column-block-major: each 64-column block is 64 rows at
  // 128 bytes, one TMA box, so the store is d_v / 64 TMA instructions. (Row-block-major atoms
  // made it 8-row boxes, 16 instructions at d_v = 128, which kept the issuing thread ~1.7 k
  // cycles on the tile boundary: Note [fwd trace].) The whole tile stacks the halves, so rows
  // [64 w, 64 w + 64) are a contiguous block.
  using SmemLayoutOHalf =
      decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(), Shape<_64, Int<kHeadDimV>>{}));
  using SmemLayoutO =
      decltype(tile_to_shape(SmemLayoutOHalf{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
  static constexpr int kQKVBytes =
      int(cosize_v<SmemLayoutQ> + cosize_v<SmemLayoutK> + cosize_v<SmemLayoutV>) *
      int(sizeof(Element));
  static constexpr int kOBytes = kBlockM * kHeadDimV * int(sizeof(Element));
  static constexpr bool kTmaStoreO = kQKVBytes + kOBytes + 1024 <= 227 * 1024;
  // Note [two Q buffers]: the next tile's Q goes to the other buffer, issued by the producer
  // between the current tile's last K and V loads (it claims the next item there), where with
  // one buffer it waited for the current tile's last S. The trace (Note [fwd trace]) had that Q
  // load (~2.2-3.4 k cycles) land only after the epilogue and the next tile's decode at hd128
  // 1k. Where the buffer fits after the O staging. FA4_SM90_Q_STAGES=1 keeps one buffer (a
  // measurement switch, docs/perf-notes.md).
  static constexpr int kQStagesFit = kQKVBytes + int(cosize_v<SmemLayoutQ> * sizeof(Element)) +
                                                 (kTmaStoreO ? kOBytes : 0) + 1024 <=
                                             227 * 1024
                                         ? 2
                                         : 1;
#ifdef FA4_SM90_Q_STAGES
  static constexpr int kQStages = FA4_SM90_Q_STAGES < kQStagesFit ? FA4_SM90_Q_STAGES : kQStagesFit;
#else
  static constexpr int kQStages = kQStagesFit;
#endif
  using SmemLayoutQS = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                              Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQStages>>{}));
  static_assert(cosize_v<SmemLayoutOHalf> * kConsumerWGs == cosize_v<SmemLayoutO>,
                "one contiguous block of rows per warpgroup");

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQS>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, kTmaStoreO ? cosize_v<SmemLayoutO> : 8> o;
    alignas(16) typename PipelineKV::SharedStorage pipe_k;
    typename PipelineKV::SharedStorage pipe_v;
    cutlass::arch::ClusterTransactionBarrier q_full[kQStages];
    cutlass::arch::ClusterBarrier q_empty[kQStages];
    alignas(8) TileRing tiles;
    FwdTrace trace;  // Note [fwd trace]
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM90)");

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);
};

template <class T>
struct KernelParams {
  using Element = typename T::Element;
  using ShapeQKV = Shape<int, int, int, int>;
  using TmaQ = TmaTile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>;
  using TmaK = TmaTile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>;
  using TmaV = TmaTile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>;
  using TmaO = TmaStoreTile<Element, typename T::SmemLayoutOHalf, 64, T::kHeadDimV>;
  TmaQ tma_q;
  TmaK tma_k;
  TmaV tma_v;
  TmaO tma_o;  // set when T::kTmaStoreO and the problem is dense (Note [TMA-store epilogue])
  ShapeQKV shape_q, shape_k, shape_v, shape_o;
  FwdParams p;
  ScoreScale score;
  TileScheduler sched;
  int group;  // heads_q / heads_kv
};

// Copies the per-tile sequence geometry every role derives the same way.
struct TileWork {
  TileCoord tile;
  SeqInfo seq;
  Mask mask;
  int bidb_gmem;  // batch index of the TMA tensors (0 for varlen)
};

template <class T>
__device__ __forceinline__ TileWork tile_work(const KernelParams<T>& kp, const TileCoord& c) {
  const FwdParams& p = kp.p;
  TileWork t;
  t.tile = c;
  t.seq = SeqInfo::get(t.tile.batch, p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.seqlen_q,
                       p.seqlen_k);
  t.mask = Mask::from_params(p, t.seq.seqlen_q, t.seq.seqlen_k);
  t.bidb_gmem = p.cu_seqlens_q == nullptr ? t.tile.batch : 0;
  return t;
}

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
    Tensor gV =
        local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mV(_, _, head_kv, t.bidb_gmem)),
                   Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>{}, make_coord(_, _0{}));
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
  // Keep the CTA alive until the consumers released every buffer the TMA may still write.
  pipe_k.producer_tail(k_state);
  pipe_v.producer_tail(v_state);
}

// Writes the consumer's rows of O (scaled by 1/l) and the LSE; rows past the sequence are
// skipped. o: the P·V accumulator (QuadFrag<kHeadDimV>), row r of this thread is
// row0 + 8r within the tile. 16-byte stores (Note [quad transpose]); every lane of the warp
// runs the shuffles, the row test guards only the stores.
template <class T, class Frag>
__device__ __forceinline__ void store_tile(const KernelParams<T>& kp, const TileWork& t,
                                           const float* o, const float (&lse)[2], int row_in_tile0,
                                           int quad_lane) {
  using Element = typename T::Element;
  static_assert(T::kHeadDimV % 32 == 0, "groups of four 8-column chunks");
  const FwdParams& p = kp.p;
  const bool varlen = p.cu_seqlens_q != nullptr;
  FA4_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = t.tile.m_block * T::kBlockM + row_in_tile0 + 8 * r;
    const bool in_seq = row < t.seq.seqlen_q;
    const int64_t grow = int64_t(t.seq.offset_q) + row;
    Element* out = static_cast<Element*>(p.out) + grow * p.out_row_stride +
                   int64_t(t.tile.head) * p.out_head_stride +
                   (varlen ? 0 : int64_t(t.tile.batch) * p.out_batch_stride);
    FA4_UNROLL
    for (int j = 0; j < T::kHeadDimV / 32; ++j) {
      uint32_t w[4];
      FA4_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int g = 4 * j + k;
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(o[Frag::idx(r, 2 * g)]);
        pair[1] = Element(o[Frag::idx(r, 2 * g + 1)]);
        w[k] = reinterpret_cast<const uint32_t&>(pair);
      }
      quad_transpose(w, quad_lane);
      if (in_seq) {
        *reinterpret_cast<uint4*>(out + 8 * (4 * j + quad_lane)) =
            make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    if (!in_seq) continue;
    if (p.lse != nullptr && quad_lane == 0) {
      float* l = p.lse + int64_t(t.tile.head) * p.lse_head_stride +
                 (varlen ? grow : int64_t(t.tile.batch) * p.lse_batch_stride + row);
      *l = lse[r];
    }
  }
}

// Note [TMA-store epilogue]: this warpgroup's 64 rows of O (acc_o, already scaled by 1/l) to
// shared memory and out with one TMA store; the LSE as in store_tile. The issuing thread first
// waits until its previous store has read the buffer.
template <class T, class MmaPV, class AccO>
__device__ __forceinline__ void store_tile_tma(const KernelParams<T>& kp,
                                               typename T::SharedStorage& ss, const TileWork& t,
                                               const MmaPV& mma_pv, const AccO& acc_o,
                                               const float (&lse)[2], int row_in_tile0,
                                               int quad_lane, int wg, int tid, int trace_tile) {
  using Element = typename T::Element;
  constexpr uint32_t kBarrier = T::kConsumerWGs;  // + wg; below are the ping-pong turns
  const bool issuer = threadIdx.x % 128 == 0;
  if (issuer) tma_store_wait<0>();
  cutlass::arch::NamedBarrier::sync(128, kBarrier + wg);
  ss.trace.tile_mark(issuer, wg, trace_tile, 6);
  // stmatrix, 16 bytes per instruction (per-element stores kept ~30 swizzled addresses live
  // across the tile loop, which ptxas spilled).
  Tensor sO = as_position_independent_swizzle_tensor(
      make_tensor(make_smem_ptr(ss.o.data()), typename T::SmemLayoutO{}));
  auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
  auto thr_copy_o = copy_o.get_thread_slice(tid);
  Tensor r_o = make_tensor_like<Element>(acc_o);
  FA4_UNROLL
  for (int i = 0; i < size(acc_o); ++i) r_o(i) = Element(acc_o(i));
  copy(copy_o, thr_copy_o.retile_S(r_o), thr_copy_o.partition_D(sO));
  cutlass::arch::fence_view_async_shared();
  ss.trace.tile_mark(issuer, wg, trace_tile, 7);
  cutlass::arch::NamedBarrier::sync(128, kBarrier + wg);
  if (issuer) {
    Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_o);
    Tensor gO = local_tile(mO(_, _, t.tile.head, t.bidb_gmem), Shape<_64, Int<T::kHeadDimV>>{},
                           make_coord(t.tile.m_block * T::kConsumerWGs + wg, _0{}));
    Tensor sOh =
        make_tensor(make_smem_ptr(ss.o.data() + wg * cosize_v<typename T::SmemLayoutOHalf>),
                    typename T::SmemLayoutOHalf{});
    auto cta = kp.tma_o.get_slice(_0{});
    copy(kp.tma_o, cta.partition_S(sOh), cta.partition_D(gO));
    tma_store_arrive();
  }
  ss.trace.tile_mark(issuer, wg, trace_tile, 8);
  const FwdParams& p = kp.p;
  if (p.lse == nullptr || quad_lane != 0) return;
  FA4_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = t.tile.m_block * T::kBlockM + row_in_tile0 + 8 * r;
    if (row >= t.seq.seqlen_q) continue;
    p.lse[int64_t(t.tile.head) * p.lse_head_stride + int64_t(t.tile.batch) * p.lse_batch_stride +
          row] = lse[r];
  }
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
  ss.trace.clock_mark(tid == 0, 0);

  for (int n_items = 0;; ++n_items) {
    const TileCoord c = ss.tiles.take(n_items);
    if (c.batch < 0) break;
    const int tk = tiles_loaded;  // this consumer's tile count, for the trace marks
    ss.trace.tile_mark(leader, wg, tk, 0);
    const TileWork t = tile_work(kp, c);
    const BlockRange br = block_range<T::kBlockM, T::kBlockN>(t.mask, t.tile.m_block);
    OnlineSoftmax<SFrag> softmax;
    softmax.init();
    clear(tOrO);
    if (!br.empty()) {
      ss.trace.tile_mark(leader, wg, tk, 1);
      // The slot as a warp-uniform value (lane 0's), so that the S descriptors stay in uniform
      // registers (Note [uniform descriptors]).
      const int q_slot = __shfl_sync(0xffffffffu, tiles_loaded % T::kQStages, 0);
      ss.q_full[q_slot].wait((tiles_loaded / T::kQStages) & 1);
      ++tiles_loaded;
      ss.trace.tile_mark(leader, wg, tk, 2);
      const int row_base = t.tile.m_block * T::kBlockM + row_in_tile0;
      // Note [intra-warpgroup overlap]: S of block n is issued before, and O += P·V of block
      // n + 1 right after, the softmax of block n runs on the CUDA cores while the tensor cores
      // finish P·V; wgmma groups retire in order, so wait<1> is "S done, P·V may still run".
      // P (tOrP) is rewritten only after wait<0>, when the P·V that reads it has finished.
      // In the SASS, ptxas moves that wait<0> (and the V release) up to the start of the row
      // max, so only the mask and softcap code overlap this warpgroup's P·V; a loop that kept it
      // behind the softmax measured no gain, and two P buffers that let the softmax run beside
      // its own P·V were slower (docs/perf-notes.md, forward steps 9 and 15).
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
        if (kp.score.softcap) apply_softcap<SFrag>(s_arr, kp.score.pre);
        if (br.needs_mask(n)) {
          apply_mask<SFrag>(
              s_arr, t.mask, [&](int r) { return row_base + 8 * r; },
              [&](int e) { return n * T::kBlockN + 8 * (e / 2) + 2 * quad_lane + e % 2; });
        }
        const RowDecisions d = softmax.update_max(s_arr, kp.score.scale_log2, T::kTau, o_scale);
        softmax.template exp2_and_sum<T::kEmuSixteenths>(s_arr, kp.score.scale_log2);
        return d;
      };
      auto convert_p = [&]() {
        FA4_UNROLL
        for (int i = 0; i < SFrag::kSize; ++i) tOrP(i) = Element(s[i]);
      };

      float o_scale[2];
      turn_begin();
      issue_s(-1);
      turn_end();
      warpgroup_wait<0>();
      s_done(br.n_end - 1);
      ss.trace.tile_mark(leader, wg, tk, 3);
      softmax_block(br.n_end - 1, o_scale);  // O is still 0: nothing to rescale
      convert_p();
      for (int n = br.n_end - 2; n >= br.n_begin; --n) {
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
    softmax.finalize(inv_l, lse);
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
                           static_cast<Element*>(kp.p.out) +
                               int64_t(t.tile.m_block) * T::kBlockM * kp.p.out_row_stride +
                               int64_t(t.tile.head) * kp.p.out_head_stride +
                               int64_t(t.tile.batch) * kp.p.out_batch_stride,
                           t.seq.seqlen_q - t.tile.m_block * T::kBlockM);
    ss.trace.tile_mark(leader && !br.empty(), wg, tk, 9);
  }
  ss.trace.clock_mark(tid == 0, 1);
  ss.trace.dump(kp.p.out_row_stride * int64_t(sizeof(Element)), T::kHeadDimV / 2, tid,
                T::kConsumerThreads, 2 * T::kConsumerWGs);
  // The last TMA store must have read shared memory before the CTA exits.
  if (T::kTmaStoreO && threadIdx.x % 128 == 0) tma_store_wait<0>();
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
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
  const GmemView q =
      gmem_view(p, p.q, false, T::kHeadDim, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  const GmemView k =
      gmem_view(p, p.k, true, T::kHeadDim, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  const GmemView v =
      gmem_view(p, p.v, true, T::kHeadDimV, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
  kp.shape_q = q.shape();
  kp.shape_k = k.shape();
  kp.shape_v = v.shape();
  kp.tma_q = make_tma_tile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>(q);
  kp.tma_k = make_tma_tile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>(k);
  kp.tma_v = make_tma_tile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>(v);
  if (T::kTmaStoreO && p.cu_seqlens_q == nullptr) {
    const GmemView o = gmem_view(p, p.out, false, T::kHeadDimV, p.out_row_stride, p.out_head_stride,
                                 p.out_batch_stride);
    kp.shape_o = o.shape();
    kp.tma_o = make_tma_store_tile<Element, typename T::SmemLayoutOHalf, 64, T::kHeadDimV>(o);
  }
  kp.sched = TileScheduler::for_forward(p, T::kBlockM, int(sizeof(Element)));
  const int grid = kp.sched.grid(dev.num_sms);
  if (grid == 0) return Status::kOk;
  return launch_kernel("fwd_sm90", fwd_kernel<T>, dim3(grid), T::kThreads, T::kSmemBytes, stream,
                       kp);
}

// Note [short causal hd64]: the 192-row tiles of Note [three consumers at hd64] lost 6 % at
// causal 1k against two warpgroups' 128-row tiles (docs/perf-notes.md forward step 6: 1024 rows
// are 5 1/3 tiles of 192, and a causal sequence's last, partial tile holds its only diagonal
// block), while winning 5 % at causal 4k; short causal and local problems take the two. Measured
// with the two for <= 2048 rows (docs/perf.md, 2026-12-01 switch A/B): +11 % at causal 512, +10 %
// at 1k, but -3..-6 % at 2k (10 2/3 tiles of 192 against 16 of 128), so the limit is 1024 rows.
template <int D, int DV>
bool two_consumer_variant(const FwdParams& p) {
  if constexpr (FwdTraits<D, DV, cutlass::half_t>::kConsumerWGs != 3) {
    return false;
  } else {
    const bool banded = p.causal || p.window_left >= 0 || p.window_right >= 0;
    return banded && p.seqlen_q <= FA4_SM90_HD64_TWO_WG_ROWS;
  }
}

// One element type's kernels. fwd_sm90_hd*.cu instantiates the bf16 ones and fwd_sm90_hd*_fp16.cu
// the fp16 ones: one translation unit per (head dim, dtype) shortens the build's longest compile
// (hd64 on the CPU machine: 89 s for both dtypes in one file, 55 and 56 s for the two files; each
// pays the ~17 s front end and ~6 s host compile again).
template <int D, int DV, class Element>
Status launch_element(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (FwdTraits<D, DV, Element>::kConsumerWGs == 3) {
    if (two_consumer_variant<D, DV>(p)) return launch<FwdTraits<D, DV, Element, 2>>(p, dev, stream);
  }
  return launch<FwdTraits<D, DV, Element>>(p, dev, stream);
}

template <int D, int DV>
Status launch_dtype(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  if (p.dtype == DType::kBFloat16)
    return launch_element<D, DV, cutlass::bfloat16_t>(p, dev, stream);
  return launch_element<D, DV, cutlass::half_t>(p, dev, stream);
}

}  // namespace fa4::sm90
