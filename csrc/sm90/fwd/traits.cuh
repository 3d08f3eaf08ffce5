// SM90 forward: the compile-time traits of one kernel (tiles, layouts, registers, shared
// memory), its parameters and the per-tile geometry every role derives (tile_work). The
// kernel's roles are sm90/fwd/kernel.cuh, its epilogue sm90/fwd/epilogue.cuh.
//
// Shared memory (bf16/fp16, kStages = 2; the O staging of Note [TMA-store epilogue] and the second
// Q buffer of Note [two Q buffers] where they fit, in that order):
//   hd 64:  Q 2×24 KB + K 2×16 KB + V 2×16 KB + O 24 KB = 136 KB  (kBlockM 192, kBlockN 128)
//           three CTAs per SM (Note [several CTAs per SM]): Q 2×8 KB + K 3×8 KB + V 3×8 KB
//           + O 8 KB = 72 KB each (kBlockM 64, kBlockN 64, kStages 3)
//   hd 128: Q 2×32 KB + K 2×32 KB + V 2×32 KB + O 32 KB = 224 KB  (kBlockN 128)
//   hd 192: Q 48 KB + K 2×24 KB + V 2×(16|24) KB + O 32|48 KB = 160..192 KB, plus a second Q
//           at (192, 128): 208 KB (kBlockN 64: S registers)
//   hd 256: Q 64 KB + K 2×40 KB + V 2×40 KB = 224 KB  (kBlockN 80: 227 KB limit)
// The S accumulator costs kBlockN/2 registers per consumer thread and O kHeadDimV/2; with
// 240 registers per thread, kBlockN 128 leaves room for hd ≤ 128, hd 192 takes kBlockN 64 and
// hd 256 80.

#pragma once

// kBlockN 80 at hd 256 needs the 64×80 wgmma, one of CuTe's "extended" shapes; the instantiation
// files reach this header before any CuTe header, so the switch reaches all of them.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/mask.cuh"
#include "common/params.h"
#include "common/softmax.cuh"
#include "common/tile_ring.cuh"
#include "common/tile_scheduler.cuh"
#include "sm90/common.cuh"
#include "sm90/fwd/fp8_vt.cuh"
#include "sm90/fwd/heuristics.cuh"
#include "sm90/fwd/trace.cuh"

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
//   several CTAs per SM (Note [several CTAs per SM]): the launch gives 65536 / kCtasPerSm over
//                the CTA's threads (rounded down to 8 each), the producer keeps 32 and the
//                consumers share the rest: 1 consumer, 3 CTAs: 32·128 + 128·128 = 20480 = 80·256
template <int kConsumerWGs, int kHeadDimV, int kCtasPerSm = 1>
struct RegisterSplit {
  static constexpr int kLaunchRegs = 65536 / kCtasPerSm / (128 * (kConsumerWGs + 1)) / 8 * 8;
  static constexpr int kProducer =
      kCtasPerSm > 1 ? 32 : (kConsumerWGs == 3 ? 32 : (kHeadDimV <= 128 ? 56 : 40));
  static constexpr int kConsumer =
      kCtasPerSm > 1 ? (kLaunchRegs * (kConsumerWGs + 1) - kProducer) / kConsumerWGs / 8 * 8
                     : (kConsumerWGs == 3 ? 160 : (kHeadDimV <= 128 ? 224 : 232));
  static_assert(kConsumerWGs >= 1 && kConsumerWGs <= 3, "one to three consumer warpgroups");
  static_assert(kConsumer <= 256, "setmaxnreg");
  static_assert((kProducer + kConsumer * kConsumerWGs) <= kLaunchRegs * (kConsumerWGs + 1),
                "register file");
};

// The ring of Note [dynamic tiles] (common/tile_ring.cuh): the producer thread publishes the
// decoded tile (batch < 0: the end marker), the consumer warpgroups read it (kConsumerThreads
// arrivals on empty). Decoded by the producer because TileScheduler::at's int64 divisions sat on
// the consumers' tile boundary, where the tensor cores wait (Note [fwd trace] measured it).
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

// Vᵀ as the B operand of P·V (FwdTraits::SmemLayoutVt). A specialization, so that the FP8 kernel,
// whose V buffer is already Vᵀ, never instantiates the transposed view of its (d_v, kBlockN)
// layout (which does not divide at kBlockN 160).
template <bool kFp8, class SmemLayoutV, int kBlockN, int kHeadDimV, int kStages>
struct VtSmemOf {
  using type = TransposedSmem<SmemLayoutV, kBlockN, kHeadDimV, kStages>;
};
template <class SmemLayoutV, int kBlockN, int kHeadDimV, int kStages>
struct VtSmemOf<true, SmemLayoutV, kBlockN, kHeadDimV, kStages> {
  using type = SmemLayoutV;
};

// Compile-time options of one forward kernel; kConsumerWGs_ and kBlockN_ 0 take the head dim's
// defaults (sm90/fwd/heuristics.cuh); kCtasPerSm_ > 1 is Note [several CTAs per SM];
// kEmuSixteenths_ is Note [SM90 exp2 split]'s variant.
template <int kHeadDim_, int kHeadDimV_, class Element_, int kConsumerWGs_ = 0, int kBlockN_ = 0,
          int kCtasPerSm_ = 1, int kEmuSixteenths_ = 0>
struct FwdTraits {
  using Element = Element_;
  // Note [fp8 forward]: e4m3 q, k, v with fp32 accumulation and a bf16 out; P·V runs in e4m3 on a
  // Vᵀ that run_fwd writes first (sm90/fwd/fp8_vt.cuh), since FP8 wgmma takes K-major B only.
  static constexpr bool kFp8 = sizeof_bits_v<Element> == 8;
  using OutElement = std::conditional_t<kFp8, cutlass::bfloat16_t, Element>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  // Note [three consumers at hd64]: at d = 64 a 128 × 128 block is as long on MUFU (16384
  // exponentials at 16/clk) as on the tensor cores (two 64-deep GEMMs), so two warpgroups in
  // ping-pong leave no slack; a third warpgroup (192-row tiles, 160 registers each: S 64 + P 32
  // + O 32) gives the scheduler another's softmax or GEMMs to fill each gap (hd64 16k +15 %).
  static constexpr int kConsumerWGs =
      kConsumerWGs_ != 0 ? kConsumerWGs_ : default_consumer_warpgroups(kHeadDim);
  static constexpr int kBlockM = 64 * kConsumerWGs;
  // Note [hd256 kBlockN 80]: at hd 256, 80 keys per block (S 40 registers per thread, K and V
  // 2 × 40 KB each, 224 KB of shared memory with Q) run +8 % at 16k against 64; hd 192 keeps 64.
  // Short problems may take 64 instead (Note [hd256 narrow blocks], sm90/fwd/kernel.cuh).
  // FP8: Note [fp8 kBlockN] (sm90/fwd/heuristics.cuh), a multiple of 32.
  static constexpr int kBlockN =
      kBlockN_ != 0 ? kBlockN_ : (kFp8 ? fp8_block_n(kHeadDim) : default_block_n(kHeadDim));
  static_assert(!kFp8 || kBlockN % 32 == 0, "FP8 P·V: 32 keys per wgmma K step");
  // Note [three-CTA stages]: the three-CTA kernel has 75 KB of shared memory per CTA, of which
  // two 8 KB K and V stages at hd64 use 32 KB; a third stage fits (72 KB with both Q buffers and
  // the O staging) and lets the producer run a block further ahead of the one consumer
  // warpgroup, whose 64-key blocks are short (causal 1k +3.9 % against two; a fourth stage does
  // not fit: 88 KB).
  static constexpr int kStages = kCtasPerSm_ == 3 ? kThreeCtaStages : 2;
  // Note [several CTAs per SM]: a short tile is a chain of latencies (Q load, the first S, a few
  // blocks' softmax, the epilogue) that one CTA's warpgroups, all on the same tile, reach
  // together, so nothing fills the tensor cores at its ends. kCtasPerSm CTAs share an SM
  // (registers by RegisterSplit, shared memory 228 KB per SM less 1 KB per CTA), and the
  // hardware interleaves their independent chains. With one consumer warpgroup (64-row tiles)
  // there is no ping-pong. Three CTAs of one consumer with 64-key blocks (128 registers: S 32,
  // P 16, O 32) run hd64 causal 512 +6.8 % against two warpgroups; two CTAs of two consumers
  // (104 registers) and two of one consumer with 128-key blocks lost. (A producer warp without
  // setmaxnreg instead of a warpgroup gives fewer registers, not more: 96 for two CTAs of 288
  // threads, a sub-partition's 16384 over its 5 warps.)
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static_assert(kCtasPerSm == 1 || kConsumerWGs_ != 0, "several CTAs: an explicit consumer count");
  using Regs = RegisterSplit<kConsumerWGs, kHeadDimV, kCtasPerSm>;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerThreads = 128 * kConsumerWGs;
  static constexpr int kSmemLimit = kCtasPerSm == 1 ? 227 * 1024 : 228 * 1024 / kCtasPerSm - 1024;
  // Note [SM90 exp2 split]: every exponential on MUFU.EX2. Hopper's MUFU (16/clk/SM) keeps up
  // with its wgmma rate at these tile shapes while the FMA pipe carries the rest of the softmax,
  // so exp2_poly would only lengthen it: 2 of 16 emulated cost hd128 4-10 % at every point.
  // The FP8 kernel too (twice the MMA rate against the same 16 exponentials per clock): 2 and 4
  // of 16 emulated lost 1-10 % at 3 of 4 points on an H100 (docs/decisions.md, 2026-12-07).
  static constexpr int kEmuSixteenths = kEmuSixteenths_;
  // Note [conditional rescale]; FP8: 0, so each row's P·2^8 peaks at exactly 256 <= 448 (Note
  // [fp8 forward], docs/numerics.md "FP8").
  static constexpr float kTau = kFp8 ? 0.0f : 8.0f;
  // Note [right-edge mask]: the one-compare test in masked blocks that no left edge cuts, at
  // every head dim but 96 (default_right_edge_mask has the numbers).
  static constexpr bool kRightEdgeMask = default_right_edge_mask(kHeadDim);
  // Note [warpgroup ping-pong]: the consumer warpgroups take turns issuing their GEMMs (one
  // named barrier each), so one's softmax runs while another's GEMMs hold the tensor cores.
  // Kept for the structure the loop is built on: against no turns it measured within 1.5 %.
  static constexpr bool kPingPong = kConsumerWGs > 1;

  using TileQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using AtomLayout = Layout<Shape<Int<kConsumerWGs>, _1, _1>>;
  using MmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayout{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>,
                           GMMA::Major::K, kFp8 ? GMMA::Major::K : GMMA::Major::MN>(),
      AtomLayout{}));

  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V as TMA writes it: (kBlockN, d_v), d_v contiguous; FP8: Vᵀ from its own tensor, (d_v,
  // kBlockN) with the keys contiguous.
  using SmemLayoutV = std::conditional_t<
      kFp8,
      decltype(tile_to_shape(smem_atom_k<Element, kBlockN>(),
                             Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{})),
      decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                             Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}))>;
  // Vᵀ as the B operand of P·V: (d_v, kBlockN); 16-bit: d_v contiguous, i.e. MN-major, a view of
  // V; FP8: K-major, the buffer itself.
  using SmemLayoutVt = typename VtSmemOf<kFp8, SmemLayoutV, kBlockN, kHeadDimV, kStages>::type;

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
      decltype(tile_to_shape(smem_atom_k<OutElement, kHeadDimV>(), Shape<_64, Int<kHeadDimV>>{}));
  using SmemLayoutO =
      decltype(tile_to_shape(SmemLayoutOHalf{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
  static constexpr int kQKVBytes =
      int(cosize_v<SmemLayoutQ> + cosize_v<SmemLayoutK> + cosize_v<SmemLayoutV>) *
      int(sizeof(Element));
  static constexpr int kOBytes = kBlockM * kHeadDimV * int(sizeof(OutElement));
  static constexpr bool kTmaStoreO = kQKVBytes + kOBytes + 1024 <= kSmemLimit;
  // Note [two Q buffers]: the next tile's Q goes to the other buffer, issued by the producer
  // between the current tile's last K and V loads (it claims the next item there), where with
  // one buffer it waited for the current tile's last S. The trace (Note [fwd trace]) had that Q
  // load (~2.2-3.4 k cycles) land only after the epilogue and the next tile's decode at hd128
  // 1k. Where the buffer fits after the O staging. Together with the 64 × 64 O boxes of Note
  // [TMA-store epilogue]: +3.8 % at hd128 1k against one buffer and 8-row boxes.
  static constexpr int kQStages = kQKVBytes + int(cosize_v<SmemLayoutQ> * sizeof(Element)) +
                                              (kTmaStoreO ? kOBytes : 0) + 1024 <=
                                          kSmemLimit
                                      ? 2
                                      : 1;
  using SmemLayoutQS = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                              Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQStages>>{}));
  static_assert(cosize_v<SmemLayoutOHalf> * kConsumerWGs == cosize_v<SmemLayoutO>,
                "one contiguous block of rows per warpgroup");

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQS>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<OutElement, kTmaStoreO ? cosize_v<SmemLayoutO> : 8> o;
    alignas(16) typename PipelineKV::SharedStorage pipe_k;
    typename PipelineKV::SharedStorage pipe_v;
    cutlass::arch::ClusterTransactionBarrier q_full[kQStages];
    cutlass::arch::ClusterBarrier q_empty[kQStages];
    alignas(8) TileRing tiles;
    FwdTrace trace;  // Note [fwd trace]
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= kSmemLimit,
                "shared memory budget (227 KB per CTA; 75 KB at three per SM)");

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);
};

// The TMA of V's boxes, (kBlockN, d_v); FP8: of Vᵀ's, (d_v, kBlockN) (sm90/fwd/fp8_vt.cuh). A
// specialization, so that only the chosen one is instantiated.
template <bool kFp8, class Element, class SmemLayoutV, int kBlockN, int kHeadDimV>
struct TmaVOf {
  using type = TmaTile<Element, SmemLayoutV, kBlockN, kHeadDimV>;
};
template <class Element, class SmemLayoutV, int kBlockN, int kHeadDimV>
struct TmaVOf<true, Element, SmemLayoutV, kBlockN, kHeadDimV> {
  using type = TmaTile<Element, SmemLayoutV, kHeadDimV, kBlockN>;
};

template <class T>
struct KernelParams {
  using Element = typename T::Element;
  using ShapeQKV = Shape<int, int, int, int>;
  using TmaQ = TmaTile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>;
  using TmaK = TmaTile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>;
  using TmaV =
      typename TmaVOf<T::kFp8, Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>::type;
  using TmaO = TmaStoreTile<typename T::OutElement, typename T::SmemLayoutOHalf, 64, T::kHeadDimV>;
  TmaQ tma_q;
  TmaK tma_k;
  TmaV tma_v;
  TmaO tma_o;  // set when T::kTmaStoreO and the problem is dense (Note [TMA-store epilogue])
  ShapeQKV shape_q, shape_k, shape_v, shape_o;
  FwdParams p;
  ScoreScale score;
  TileScheduler sched;
  int group;    // heads_q / heads_kv
  VtLayout vt;  // the FP8 forward's Vᵀ (sm90/fwd/fp8_vt.cuh); unused otherwise
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

}  // namespace fa4::sm90
