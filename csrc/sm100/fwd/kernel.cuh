// SM100 (Blackwell) forward kernel: tcgen05 MMA with S, P and O in tensor memory, two Q tiles
// ping-ponged per CTA, a correction warpgroup, software exp2. Compiled, not executed: no
// Blackwell GPU is available to this project (DESIGN §2); docs/sm100.md has the timeline, the
// barrier protocol and the budgets.
//
// One CTA owns 256 query rows as two Q tiles of 128 (Q0, Q1; at hd 256 one tile with its S
// double-buffered: sm100/fwd/one_tile.cuh, Note [one-tile order]) and walks the KV blocks both
// tiles see, last to first (the masked diagonal block first, as on SM90). 16 warps, one role
// each (Role, kWarpRole):
//   softmax0, softmax1  a warpgroup per Q tile: S row from TMEM (tcgen05.ld 32x32b: thread t
//                       holds row t), mask, row max, rescale decision, exp2, P (16-bit) to TMEM
//                       over its S
//   correction          one warpgroup for both tiles: rescales O_t in TMEM when a warp vote
//                       says a row of the warp needs it; at the end of a tile O · 1/l from TMEM
//                       into the staging buffer (or straight to global: Note [sm100 TMA-store
//                       epilogue]) and the LSE
//   mma                 one thread issues every tcgen05.mma: S_t = Q_t·Kᵀ (both operands from
//                       shared memory descriptors), O_t += P_t·V (P from TMEM: the TS form)
//   load                one thread issues every TMA load: Q0, Q1 per tile, K and V per block
//   epilogue            one thread: the TMA store of each staged O tile (sm100/fwd/epilogue.cuh)
//   idle                warp 15: fills the fourth warpgroup, whose registers go to the softmax
//                       warpgroups (setmaxnreg acts per warpgroup)
// The TMEM lane rule (a warp reaches lanes 32 · (warp % 4) onward) is why softmax and
// correction are whole, aligned warpgroups: thread i of either warpgroup owns row i of its tile.
//
// Per KV block the MMA thread issues, in order (tcgen05 MMAs of one thread execute in issue
// order, which makes the writes of S_t(i+1) over P_t(i) safe without a barrier):
//   PV0(i), S0(i+1), PV1(i), S1(i+1)
// so that S0(i+1) is in the tensor core while softmax1 still works on S1(i): the ping-pong.
#pragma once

#include <cute/arch/mma_sm100_umma.hpp>
#include <cute/atom/mma_traits_sm100.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "common/barrier_table.cuh"
#include "common/fp8.cuh"
#include "common/mask.cuh"
#include "common/params.h"
#include "sm100/common.cuh"
#include "common/tma.cuh"
#include "common/softmax.cuh"
#include "common/tile_ring.cuh"
#include "common/tile_scheduler.cuh"
#include "tmem.cuh"

namespace fa4::sm100 {

using namespace cute;

// ---- Warp roles --------------------------------------------------------------------------
enum class Role : int { kSoftmax0, kSoftmax1, kCorrection, kMma, kLoad, kEpilogue, kIdle };
constexpr int kWarps = 16;
constexpr Role kWarpRole[kWarps] = {
    Role::kSoftmax0,   Role::kSoftmax0,   Role::kSoftmax0,   Role::kSoftmax0,    // warps 0-3
    Role::kSoftmax1,   Role::kSoftmax1,   Role::kSoftmax1,   Role::kSoftmax1,    // warps 4-7
    Role::kCorrection, Role::kCorrection, Role::kCorrection, Role::kCorrection,  // warps 8-11
    Role::kMma,        Role::kLoad,       Role::kEpilogue,   Role::kIdle,        // warps 12-15
};
// The table as device code reads it (a host array is readable there only in constant
// expressions); the static_assert keeps the two equal.
__host__ __device__ constexpr Role warp_role(int warp) {
  return warp < 12    ? Role(warp / 4)
         : warp == 12 ? Role::kMma
         : warp == 13 ? Role::kLoad
         : warp == 14 ? Role::kEpilogue
                      : Role::kIdle;
}
static_assert(roles_match(kWarpRole, warp_role), "warp_role() must follow kWarpRole");

// Registers per thread after setmaxnreg, per warpgroup (setmaxnreg is warpgroup-wide). The sum
// is the register file: (192 + 192 + 80 + 48) · 128 = 65536. Launch: 512 threads at 128.
//   softmax 192: a 128-column S row is 128 fp32 registers, plus the 64 packed P words, which
//                reuse the S registers as they are converted, and addresses
//   correction 80: one 32-column O chunk (32) plus the row's factor, pointers, loop state
//   mma / load 48: descriptors, barrier counters and the tile scheduler's int64 division (the
//                SM90 producer spilled that at 24 and runs at 40)
constexpr int kRegsSoftmax = 192;
constexpr int kRegsCorrection = 80;
constexpr int kRegsOther = 48;
static_assert((2 * kRegsSoftmax + kRegsCorrection + kRegsOther) * 128 == 65536,
              "the per-warpgroup budgets must add up to the 64 K register file");

// ---- Barriers ----------------------------------------------------------------------------
// Every mbarrier of the kernel: one row per producer -> consumer connection (the table type:
// common/barrier_table.cuh). The protocol model (tools/protocol_model.py) reads this table; keep
// one entry per line, in this format.
//   kPerQTile: one barrier per Q tile (kQTiles); kPerStage: one per K/V stage (kStages);
//   kPerSBuffer: one per TMEM S buffer (2: Q tile t's S, or hd 256's double-buffered S);
//   kOnce: one barrier; kPerTileSlot: one per work-item ring slot (kTileSlots)
//   kNone: none in this kernel (the peer barriers of the 2-CTA forward, Note [fwd 2-CTA], whose
//          own table kBarriersPair in sm100/fwd/kernel_2cta.cuh marks the rows it does not use)
//   arrivals: the arrive count at init; "tx" barriers also count TMA bytes
enum class Bar : int {
  kQFull,        // from load to mma, protects sQ[t]: Q tile landed (TMA tx)
  kQEmpty,       // from mma to load, protects sQ[t]: last S_t of the tile done (commit)
  kKFull,        // from load to mma, protects sK[stage]: K block landed (TMA tx)
  kKEmpty,       // from mma to load, protects sK[stage]: S0 and S1 of the block done (commit)
  kVFull,        // from load to mma, protects sV[stage]: V block landed (TMA tx)
  kVEmpty,       // from mma to load, protects sV[stage]: PV0 and PV1 of the block done (commit)
  kSFull,        // from mma to softmax_t, protects TMEM S_b: S_b = Q·Kᵀ done (commit)
  kPFull,        // from softmax_t to mma, protects TMEM P_b: P stored over S_b (128 arrivals)
  kStatsFull,    // from softmax_t to correction, protects stats[t]: row factors / 1/l, lse (128)
  kStatsEmpty,   // from correction to softmax_t, protects stats[t]: read, may be rewritten (128)
  kOFull,        // from mma to correction, protects TMEM O_t: O_t += P_t·V done (commit)
  kORescaled,    // from correction to mma, protects TMEM O_t: rescaled, next P·V may add (128)
  kOEmpty,       // from correction to mma, protects TMEM O_t: epilogue read it, next tile's
                 // first P·V may overwrite (128)
  kOStageFull,   // from correction to epilogue, protects sO: O_t · 1/l staged for its TMA store
  kOStageEmpty,  // from epilogue to correction, protects sO: the TMA store has read it
  kTileFull,     // from load to every_role, protects tile_item[slot]: the CTA's next work item
  kTileEmpty,    // from every_role to load, protects tile_item[slot]: read by every role's
                 // threads (kTileReaders)
  kPeerQFull,    // from relay to mma, protects sQ (odd CTA): its Q tile landed (2-CTA, even)
  kPeerKFull,    // from relay to mma, protects sK[stage] (odd CTA): its K half landed (even)
  kPeerVFull,    // from relay to mma, protects sV[stage] (odd CTA): its V half landed (even)
  kCount
};
enum class BarCopies : int { kPerQTile, kPerStage, kPerSBuffer, kOnce, kPerTileSlot, kNone };
// clang-format off
inline constexpr BarSpec<Bar, BarCopies> kBarriers[] = {
    {Bar::kQFull,       BarCopies::kPerQTile,   1},
    {Bar::kQEmpty,      BarCopies::kPerQTile,   1},
    {Bar::kKFull,       BarCopies::kPerStage,   1},
    {Bar::kKEmpty,      BarCopies::kPerStage,   1},
    {Bar::kVFull,       BarCopies::kPerStage,   1},
    {Bar::kVEmpty,      BarCopies::kPerStage,   1},
    {Bar::kSFull,       BarCopies::kPerSBuffer, 1},
    {Bar::kPFull,       BarCopies::kPerSBuffer, 128},
    {Bar::kStatsFull,   BarCopies::kPerQTile, 128},
    {Bar::kStatsEmpty,  BarCopies::kPerQTile, 128},
    {Bar::kOFull,       BarCopies::kPerQTile,   1},
    {Bar::kORescaled,   BarCopies::kPerQTile, 128},
    {Bar::kOEmpty,      BarCopies::kPerQTile, 128},
    {Bar::kOStageFull,  BarCopies::kOnce,     128},
    {Bar::kOStageEmpty, BarCopies::kOnce,       1},
    {Bar::kTileFull,    BarCopies::kPerTileSlot, 1},
    {Bar::kTileEmpty,   BarCopies::kPerTileSlot, 386},
    {Bar::kPeerQFull,   BarCopies::kNone,       1},
    {Bar::kPeerKFull,   BarCopies::kNone,       1},
    {Bar::kPeerVFull,   BarCopies::kNone,       1},
};
// clang-format on
static_assert(rows_follow_enum(kBarriers), "kBarriers: one row per barrier, in the order of Bar");
// Note [dynamic tiles] (common/tile_ring.cuh): every thread of the softmax and correction
// warpgroups and the MMA and epilogue threads read each work item (the load thread publishes it);
// softmax1 at hd 256 and the epilogue thread without the TMA-store epilogue only pass them on.
constexpr int kTileReaders = 3 * 128 + 2;
static_assert(kBarriers[int(Bar::kTileEmpty)].arrivals == kTileReaders, "tile ring readers");
constexpr int kSBuffers = 2;
// The copies policy of kBarriers for kQTiles Q tiles and kStages K/V stages.
template <int kQTiles, int kStages>
struct FwdBarCopies {
  static constexpr int copies(BarCopies c) {
    return c == BarCopies::kPerQTile      ? kQTiles
           : c == BarCopies::kPerStage    ? kStages
           : c == BarCopies::kPerSBuffer  ? kSBuffers
           : c == BarCopies::kPerTileSlot ? kTileSlots
           : c == BarCopies::kNone        ? 0
                                          : 1;
  }
};

// ---- Traits ------------------------------------------------------------------------------
template <int kHeadDim_, int kHeadDimV_, class Element_>
struct FwdTraits {
  using Element = Element_;
  // Note [fp8 forward] (common/fp8.cuh): e4m3 q, k, v, kind::f8f6f4 MMAs (V MN-major as in
  // 16-bit: tcgen05 takes MN-major e4m3), P e4m3 in TMEM (four per column), bf16 out.
  static constexpr bool kFp8 = sizeof_bits_v<Element> == 8;
  using OutElement = std::conditional_t<kFp8, cutlass::bfloat16_t, Element>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = 128;  // one Q tile = one warpgroup's 128 TMEM lanes
  static constexpr int kBlockN = fwd_block_n<kHeadDimV, kHeadDim>();
  using Plan = FwdTmemPlan<kHeadDimV, kBlockN>;
  static constexpr int kQTiles = Plan::kQTiles;  // 1 at hd 256: Note [one-tile order]
  static constexpr int kItemTiles = kQTiles;     // Q tiles of one work item
  static constexpr int kCtaRows = kQTiles * kBlockM;
  static constexpr bool kPair = false;      // the 2-CTA forward's traits: sm100/fwd/kernel_2cta.cuh
  static constexpr int kKRows = kBlockN;    // K rows of a stage in this CTA
  static constexpr int kVCols = kHeadDimV;  // V columns of a stage in this CTA
  static constexpr int kStages = 2;
  static constexpr int kThreads = 32 * kWarps;
  // Note [exp2 column split], SM100 defaults (fa4/perfmodel/model.py EMU_SIXTEENTHS, chosen by
  // the cycle model, not measured): 4/16 of each row through exp2_poly for hd 64-192, where
  // MUFU's 16 ex2/clk/SM would otherwise outlast the tile's MMAs; 0 for hd 256.
  // FP8: every exponential on MUFU for now: with 4/16 emulated the hd 128 kernel spills 108
  // bytes (nvcc 13.0; the e4m3 packing next to the polynomial's temporaries), also without the
  // 2^8 multiplies (Note [fp8 P scale]).
  static constexpr int kEmuSixteenths = kHeadDim <= 192 && !kFp8 ? 4 : 0;
  // Note [conditional rescale]; FP8 0: each row's P·2^8 peaks at exactly 256 (common/fp8.cuh).
  static constexpr float kTau = kFp8 ? 0.0f : 8.0f;

  // kind::f8f6f4's SS operation is one type for every 8-bit format: its traits carry them.
  using AtomS = std::conditional_t<
      kFp8,
      MMA_Atom<MMA_Traits<SM100_MMA_F8F6F4_SS, Element, Element, float, Int<kBlockM>, Int<kBlockN>,
                          integral_constant<UMMA::Major, UMMA::Major::K>,
                          integral_constant<UMMA::Major, UMMA::Major::K>,
                          integral_constant<UMMA::ScaleIn, UMMA::ScaleIn::One>,
                          integral_constant<UMMA::ScaleIn, UMMA::ScaleIn::One>>>,
      SM100_MMA_F16BF16_SS<Element, Element, float, kBlockM, kBlockN, UMMA::Major::K,
                           UMMA::Major::K>>;
  // V is (kBlockN, d_v) with d_v contiguous: as the B operand (N = d_v, K = kBlockN) it is
  // MN-major.
  using AtomO = std::conditional_t<kFp8,
                                   SM100_MMA_F8F6F4_TS<Element, Element, float, kBlockM, kHeadDimV,
                                                       UMMA::Major::K, UMMA::Major::MN>,
                                   SM100_MMA_F16BF16_TS<Element, Element, float, kBlockM, kHeadDimV,
                                                        UMMA::Major::K, UMMA::Major::MN>>;
  static constexpr int kMmaK = 256 / sizeof_bits_v<Element>;  // 256 bits per tcgen05.mma
  // TMEM columns of P per K slice: 16 16-bit or 32 e4m3 elements, 8 columns either way.
  static constexpr int kPSliceColumns = kMmaK * sizeof_bits_v<Element> / 32;

  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQTiles>>{}));
  using SmemLayoutK = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  using SmemLayoutVt = TransposedSmem<SmemLayoutV, kBlockN, kHeadDimV, kStages>;

  using Barriers = BarrierTable<kBarriers, FwdBarCopies<kQTiles, kStages>>;
  // Shared memory (bf16/fp16, kStages = 2), the Q tiles, K and V stages, row statistics:
  //   hd 64:  Q 2×16 KB + K 2×16 KB + V 2×16 KB =  96 KB + 2 KB
  //   hd 128: Q 2×32 KB + K 2×32 KB + V 2×32 KB = 192 KB + 2 KB
  //   hd 192: Q 2×48 KB + K 2×24 KB + V 2×24 KB = 192 KB + 2 KB (kBlockN 64)
  //   (192, 128): Q 2×48 KB + K 2×24 KB + V 2×16 KB = 176 KB + 2 KB (kBlockN 64)
  //   hd 256: Q 1×64 KB + K 2×32 KB + V 2×32 KB = 192 KB + 1 KB (kBlockN 64, one Q tile)
  // Note [sm100 TMA-store epilogue]: the correction warpgroup stages O_t · 1/l (one Q tile at a
  // time) in shared memory and the epilogue warp stores it with one TMA store, where the
  // staging buffer fits next to Q, K and V (hd 64, 96, 128, (192, 128)) and the problem is
  // dense (a varlen TMA tensor packs the sequences: a clipped tile would write the next
  // sequence's rows); otherwise the correction warpgroup stores O itself.
  using SmemLayoutO = decltype(tile_to_shape(smem_atom_k<OutElement, kHeadDimV>(),
                                             Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
  static constexpr int kQKVBytes =
      int(cosize_v<SmemLayoutQ> + cosize_v<SmemLayoutK> + cosize_v<SmemLayoutV>) *
      int(sizeof(Element));
  static constexpr bool kTmaStoreO =
      kQKVBytes + kBlockM * kHeadDimV * int(sizeof(OutElement)) + 3 * 1024 <= 227 * 1024;
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<OutElement, kTmaStoreO ? cosize_v<SmemLayoutO> : 8> o;
    // Row statistics, softmax_t -> correction (Bar::kStatsFull): per block the O factor of
    // each row (stat_a); after the last block 1/l (stat_a) and the LSE (stat_b).
    alignas(16) float stat_a[kQTiles][kBlockM];
    float stat_b[kQTiles][kBlockM];
    alignas(8) uint64_t bars[Barriers::kCount];
    TileCoord tile_item[kTileSlots];  // Note [dynamic tiles]; batch < 0: the end marker
    uint32_t tmem_base;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM100)");

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);
};

template <class T>
struct KernelParams {
  using Element = typename T::Element;
  using TmaQ = TmaTile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>;
  using TmaK = TmaTile<Element, typename T::SmemLayoutK, T::kKRows, T::kHeadDim>;
  using TmaV = TmaCols<Element, typename T::SmemLayoutV, T::kBlockN, T::kVCols, T::kHeadDimV>;
  using TmaO =
      TmaStoreTile<typename T::OutElement, typename T::SmemLayoutO, T::kBlockM, T::kHeadDimV>;
  TmaQ tma_q;
  TmaK tma_k;
  TmaV tma_v;
  TmaO tma_o;  // set when tma_store_o (Note [sm100 TMA-store epilogue])
  Shape<int, int, int, int> shape_q, shape_k, shape_v, shape_o;
  FwdParams p;
  ScoreScale score;
  TileScheduler sched;  // items of kCtaRows query rows (the pair's with T::kPair)
  int group;            // heads_q / heads_kv
  bool tma_store_o;     // T::kTmaStoreO and a dense problem
};

// The per-tile geometry every role derives the same way: sequence, mask, and the KV blocks of
// the union of both Q tiles' ranges (a pair's: both CTAs', Note [fwd 2-CTA]). A block outside one
// tile's own range is masked away entirely for that tile (BlockRange::needs_mask is true there), so
// one block list serves both.
struct TileWork {
  TileCoord tile;
  SeqInfo seq;
  Mask mask;
  BlockRange br[2];
  int n_begin, n_end;  // union of br[0], br[1]
  int bidb_gmem;       // batch index of the TMA tensors (0 for varlen)
  __device__ int blocks() const { return n_end - n_begin; }
};

template <class T>
__device__ __forceinline__ TileWork tile_work(const KernelParams<T>& kp, const TileCoord& tile) {
  const FwdParams& p = kp.p;
  TileWork t;
  t.tile = tile;
  t.seq = SeqInfo::get(t.tile.batch, p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.seqlen_q,
                       p.seqlen_k);
  t.mask = Mask::from_params(p, t.seq.seqlen_q, t.seq.seqlen_k);
  t.n_begin = 1 << 30;
  t.n_end = 0;
  for (int q = 0; q < T::kItemTiles; ++q) {
    t.br[q] = block_range<T::kBlockM, T::kBlockN>(t.mask, t.tile.m_block * T::kItemTiles + q);
    if (!t.br[q].empty()) {
      t.n_begin = detail::imin(t.n_begin, t.br[q].n_begin);
      t.n_end = detail::imax(t.n_end, t.br[q].n_end);
    }
  }
  if (t.n_end == 0) t.n_begin = 0;
  t.bidb_gmem = p.cu_seqlens_q == nullptr ? t.tile.batch : 0;
  return t;
}

// This CTA's n-th work tile (Note [dynamic tiles]), decoded by the load thread; every role but
// load loops
//   for (int n = 0;; ++n) { const TileCoord c = take_tile(ss, n); if (c.batch < 0) break; ... }
// Bring-up builds run take_item / publish_item's steps here, through the bounded bar_wait (the
// ring's own waits are CUTLASS's, unbounded). The normal build's branch comes first: the
// protocol extractor (tools/sync_extract.py) reads the first branch of a preprocessor block.
template <class T>
__device__ __forceinline__ TileCoord take_tile(typename T::SharedStorage& ss, int n) {
  if constexpr (T::kPair) {
    // The 2-CTA forward: one work item per cluster, written in slot 0 by the kernel's start.
    return n == 0 ? ss.tile_item[0] : TileCoord{-1, 0, 0};
  } else {
#ifndef FA4_SM100_DEBUG
    return take_item(bar_ptr<T, Bar::kTileFull>(ss, 0), bar_ptr<T, Bar::kTileEmpty>(ss, 0),
                     ss.tile_item, n);
#else
    const int slot = n % kTileSlots, use = n / kTileSlots;
    bar_wait(bar_ptr<T, Bar::kTileFull>(ss, slot), uint32_t(use & 1));
    const TileCoord c = ss.tile_item[slot];
    bar_arrive(bar_ptr<T, Bar::kTileEmpty>(ss, slot));
    return c;
#endif
  }
}
template <class T>
__device__ __forceinline__ void publish_tile(typename T::SharedStorage& ss, int n,
                                             const TileCoord& c) {
#ifndef FA4_SM100_DEBUG
  publish_item(bar_ptr<T, Bar::kTileFull>(ss, 0), bar_ptr<T, Bar::kTileEmpty>(ss, 0), ss.tile_item,
               n, c);
#else
  const int slot = n % kTileSlots, use = n / kTileSlots;
  if (use > 0) bar_wait(bar_ptr<T, Bar::kTileEmpty>(ss, slot), uint32_t((use - 1) & 1));
  ss.tile_item[slot] = c;
  bar_arrive(bar_ptr<T, Bar::kTileFull>(ss, slot));
#endif
}

// A reader with no work of its own (softmax1 at hd 256; the epilogue thread without the
// TMA-store epilogue) still releases every tile.
template <class T>
__device__ void pass_tiles(typename T::SharedStorage& ss) {
  for (int n = 0;; ++n) {
    if (take_tile<T>(ss, n).batch < 0) break;
  }
}

// Q tile q of a work item as a global Q tile index: of a pair's item, this CTA's (its rank).
template <class T>
__device__ __forceinline__ int q_tile_of(const TileCoord& c, int q) {
  if constexpr (T::kPair) {
    return c.m_block * T::kItemTiles + int(cute::block_rank_in_cluster());
  } else {
    return c.m_block * T::kItemTiles + q;
  }
}
// A wait on a barrier the other CTA of a pair completes too (its commits and arrivals): with
// cluster scope there.
template <class T>
__device__ __forceinline__ void wait_any(uint64_t* bar, uint32_t parity) {
  if constexpr (T::kPair) {
    bar_wait_cluster(bar, parity);
  } else {
    bar_wait(bar, parity);
  }
}
// An arrival for the MMA thread: on the even CTA's copy of a pair, whose MMA thread issues both
// CTAs' MMAs.
template <class T>
__device__ __forceinline__ void arrive_mma(uint64_t* bar) {
  if constexpr (T::kPair) {
    bar_arrive_cta(bar, 0);
  } else {
    bar_arrive(bar);
  }
}

// ---- Load role -----------------------------------------------------------------------------
template <class T>
__device__ void load_role(const KernelParams<T>& kp, typename T::SharedStorage& ss) {
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);
  Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);
  Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_v);
  Ring q_free, k_free, v_free;
  int n_items = 0;
  for (int64_t w = blockIdx.x; w < kp.sched.total(); w = next_item(kp.p.tile_counter, w)) {
    const TileCoord coord = kp.sched.at(w);
    FA4_SM100_DEBUG_TILE(coord.batch, coord.head, coord.m_block);
    publish_tile<T>(ss, n_items++, coord);
    const TileWork t = tile_work(kp, coord);
    if (t.blocks() <= 0) continue;  // correction writes zeros; nothing to load
    const int head_kv = t.tile.head / kp.group;
    Tensor gQ = local_tile(
        domain_offset(make_coord(t.seq.offset_q, _0{}), mQ(_, _, t.tile.head, t.bidb_gmem)),
        Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gK =
        local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mK(_, _, head_kv, t.bidb_gmem)),
                   Shape<Int<T::kBlockN>, Int<T::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gV =
        local_tile(domain_offset(make_coord(t.seq.offset_k, _0{}), mV(_, _, head_kv, t.bidb_gmem)),
                   Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>{}, make_coord(_, _0{}));
    auto [tQgQ, tQsQ] =
        tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tKgK, tKsK] =
        tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] =
        tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    for (int q = 0; q < T::kQTiles; ++q) {
      // Q tile q of this CTA is global Q tile m_block · kQTiles + q; rows past the sequence
      // are zero-filled (or the next sequence's, for varlen) and masked by the softmax.
      bar_wait(bar_ptr<T, Bar::kQEmpty>(ss, q), q_free.parity(1) ^ 1u);
      uint64_t& full = *bar_ptr<T, Bar::kQFull>(ss, q);
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full, T::kQBytes);
      copy(kp.tma_q.with(full, 0), tQgQ(_, t.tile.m_block * T::kQTiles + q), tQsQ(_, q));
    }
    ++q_free.count;
    for (int n = t.n_end - 1; n >= t.n_begin; --n) {
      FA4_SM100_DEBUG_BLOCK(n);
      const int ks = k_free.index(T::kStages);
      bar_wait(bar_ptr<T, Bar::kKEmpty>(ss, ks), k_free.parity(T::kStages) ^ 1u);
      uint64_t& kfull = *bar_ptr<T, Bar::kKFull>(ss, ks);
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&kfull, T::kKBytes);
      copy(kp.tma_k.with(kfull, 0), tKgK(_, n), tKsK(_, ks));
      ++k_free.count;
      const int vs = v_free.index(T::kStages);
      bar_wait(bar_ptr<T, Bar::kVEmpty>(ss, vs), v_free.parity(T::kStages) ^ 1u);
      uint64_t& vfull = *bar_ptr<T, Bar::kVFull>(ss, vs);
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&vfull, T::kVBytes);
      copy(kp.tma_v.with(vfull, 0), tVgV(_, n), tVsV(_, vs));
      ++v_free.count;
    }
  }
  finish_claims(kp.p.tile_counter);
  publish_tile<T>(ss, n_items, TileCoord{-1, 0, 0});  // the end marker
}

// ---- MMA role ------------------------------------------------------------------------------
// Instruction descriptors of the two MMAs of both MMA roles (mma_role, mma_role_one_tile):
// S = Q·Kᵀ with both operands K-major, O += P·V with V MN-major.
template <class T>
__device__ __forceinline__ uint64_t instr_desc_s() {
  return UMMA::make_runtime_instr_desc<>(
      UMMA::make_instr_desc<typename T::Element, typename T::Element, float, T::kBlockM, T::kBlockN,
                            UMMA::Major::K, UMMA::Major::K>());
}
template <class T>
__device__ __forceinline__ uint64_t instr_desc_o() {
  return UMMA::make_runtime_instr_desc<>(
      UMMA::make_instr_desc<typename T::Element, typename T::Element, float, T::kBlockM,
                            T::kHeadDimV, UMMA::Major::K, UMMA::Major::MN>());
}

template <class T>
__device__ void mma_role(const KernelParams<T>& kp, typename T::SharedStorage& ss, uint32_t tmem) {
  using Plan = typename T::Plan;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutVt{});
  // Shared-memory descriptors, (atom, 1, k, stage): one per 16-element K slice.
  auto thr_s = make_tiled_mma(typename T::AtomS{}).get_slice(0);
  auto thr_o = make_tiled_mma(typename T::AtomO{}).get_slice(0);
  Tensor dQ = thr_s.partition_fragment_A(sQ);
  Tensor dK = thr_s.partition_fragment_B(sK);
  Tensor dV = thr_o.partition_fragment_B(sVt);
  constexpr int kKQk = T::kHeadDim / T::kMmaK;
  constexpr int kKPv = T::kBlockN / T::kMmaK;
  static_assert(size<2>(decltype(dQ){}) == kKQk && size<2>(decltype(dV){}) == kKPv, "K slices");
  const uint64_t idesc_s = instr_desc_s<T>();
  const uint64_t idesc_o = instr_desc_o<T>();
  const uint32_t s_col[2] = {Plan::kS0, Plan::kS1};
  const uint32_t o_col[2] = {Plan::kO0, Plan::kO1};

  // P_t and the rescaled O_t complete once per block and Q tile, as V once per block: their
  // waits take v_ready's parity (at hd 192 four more counters were reloaded per block).
  Ring q_ready, k_ready, v_ready, o_free;
  auto issue_s = [&](int q, int ks) {
    FA4_UNROLL
    for (int k = 0; k < kKQk; ++k) {
      umma_ss<1, T::kFp8>(dQ(_0{}, _0{}, k, q), dK(_0{}, _0{}, k, ks), tmem + s_col[q],
                          k > 0 ? 1u : 0u, idesc_s);
    }
    umma_commit(bar_ptr<T, Bar::kSFull>(ss, q));
  };
  for (int n_item = 0;; ++n_item) {
    const TileCoord coord = take_tile<T>(ss, n_item);
    if (coord.batch < 0) break;
    FA4_SM100_DEBUG_TILE(coord.batch, coord.head, coord.m_block);
    const TileWork t = tile_work(kp, coord);
    const int nblk = t.blocks();
    if (nblk <= 0) continue;
    for (int q = 0; q < T::kQTiles; ++q)
      bar_wait(bar_ptr<T, Bar::kQFull>(ss, q), q_ready.parity(1));
    ++q_ready.count;
    // Prologue: S0(0), S1(0).
    int ks = k_ready.index(T::kStages);
    bar_wait(bar_ptr<T, Bar::kKFull>(ss, ks), k_ready.parity(T::kStages));
    tmem_fence_after_sync();
    for (int q = 0; q < T::kQTiles; ++q) {
      issue_s(q, ks);
      if (nblk == 1) umma_commit(bar_ptr<T, Bar::kQEmpty>(ss, q));
    }
    umma_commit(bar_ptr<T, Bar::kKEmpty>(ss, ks));
    ++k_ready.count;
    for (int i = 0; i < nblk; ++i) {
      FA4_SM100_DEBUG_BLOCK(t.n_end - 1 - i);
      const bool next = i + 1 < nblk;
      if (next) {
        ks = k_ready.index(T::kStages);
        bar_wait(bar_ptr<T, Bar::kKFull>(ss, ks), k_ready.parity(T::kStages));
      }
      const int vs = v_ready.index(T::kStages);
      bar_wait(bar_ptr<T, Bar::kVFull>(ss, vs), v_ready.parity(T::kStages));
      for (int q = 0; q < T::kQTiles; ++q) {
        bar_wait(bar_ptr<T, Bar::kPFull>(ss, q), v_ready.parity(1));
        bar_wait(bar_ptr<T, Bar::kORescaled>(ss, q), v_ready.parity(1));
        // The tile's first P·V overwrites O_t: the epilogue of the previous tile must be done.
        if (i == 0) bar_wait(bar_ptr<T, Bar::kOEmpty>(ss, q), o_free.parity(1) ^ 1u);
        tmem_fence_after_sync();
        FA4_UNROLL
        for (int k = 0; k < kKPv; ++k) {
          // P_t: 16-bit two per column (e4m3 four), so K slice k starts 8 columns further on.
          umma_ts<1, T::kFp8>(tmem + s_col[q] + k * T::kPSliceColumns, dV(_0{}, _0{}, k, vs),
                              tmem + o_col[q], (i > 0 || k > 0) ? 1u : 0u, idesc_o);
        }
        umma_commit(bar_ptr<T, Bar::kOFull>(ss, q));
        if (next) {
          issue_s(q, ks);  // S_t(i+1) over P_t(i): issued after the P·V that reads it
          if (i + 2 == nblk) umma_commit(bar_ptr<T, Bar::kQEmpty>(ss, q));
        }
      }
      umma_commit(bar_ptr<T, Bar::kVEmpty>(ss, vs));
      ++v_ready.count;
      if (next) {
        umma_commit(bar_ptr<T, Bar::kKEmpty>(ss, ks));
        ++k_ready.count;
      }
    }
    ++o_free.count;  // one kOEmpty completion per tile and Q tile
  }
}

// ---- Warp-uniform values (the softmax role's, sm100/fwd/softmax.cuh) ----------------------
// Lane 0's value: ptxas treats a shuffle from a constant lane as warp-uniform and keeps what is
// derived from it (tile coordinates, block bounds, barrier and TMEM addresses, ring counters) in
// uniform registers, out of the softmax row's 192 (hd 128: 58 spill instructions outside the
// per-block loop without, 21 with). For values that are the same in every lane (the callers'),
// so the host branch is the identity; it comes first, as the branch the protocol extractor
// (tools/sync_extract.py) reads.
__device__ __forceinline__ int warp_uniform(int v) {
#ifndef __CUDA_ARCH__
  return v;
#else
  return __shfl_sync(0xffffffffu, v, 0);
#endif
}
__device__ __forceinline__ TileCoord warp_uniform(const TileCoord& c) {
#ifndef __CUDA_ARCH__
  return c;
#else
  return TileCoord{warp_uniform(c.batch), warp_uniform(c.head), warp_uniform(c.m_block)};
#endif
}

}  // namespace fa4::sm100

#include "sm100/fwd/epilogue.cuh"
#include "sm100/fwd/softmax.cuh"
#include "sm100/fwd/one_tile.cuh"

namespace fa4::sm100 {

// ---- Kernel --------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_kernel(const __grid_constant__ KernelParams<T> kp) {
  // Only the sm_100a pass has tcgen05; other archs of a multi-arch build (sm_90a) compile an
  // empty body, and dispatch never launches it there.
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem);
  // Warp-uniform (warp_uniform): the role switch is uniform control flow for ptxas.
  const int warp = warp_uniform(int(threadIdx.x / 32));
  const Role role = warp_role(warp);
  FA4_SM100_DEBUG_BEGIN(kFwdSm100, typename T::Barriers, ss.bars, role);
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    T::Barriers::init(ss.bars);
    cutlass::arch::fence_barrier_init();
  }
  // The MMA warp allocates TMEM and frees it at the end.
  const uint32_t tmem =
      tmem_allocate_for_cta(role == Role::kMma, &ss.tmem_base, T::Plan::kAllocColumns);
  const int lane = threadIdx.x % 32;

  switch (role) {
    case Role::kSoftmax0:
    case Role::kSoftmax1:
      cutlass::arch::warpgroup_reg_alloc<kRegsSoftmax>();
      // hd 256 has one Q tile: softmax1 has no work (Note [one-tile order]).
      if (T::kQTiles == 2 || role == Role::kSoftmax0) {
        softmax_role(kp, ss, tmem, role == Role::kSoftmax0 ? 0 : 1, threadIdx.x % 128);
      } else {
        pass_tiles<T>(ss);
      }
      break;
    case Role::kCorrection:
      cutlass::arch::warpgroup_reg_dealloc<kRegsCorrection>();
      correction_role(kp, ss, tmem, threadIdx.x % 128);
      break;
    default:
      cutlass::arch::warpgroup_reg_dealloc<kRegsOther>();
      if (role == Role::kMma && lane == 0) {
        if constexpr (T::kQTiles == 2) {
          mma_role(kp, ss, tmem);
        } else {
          mma_role_one_tile(kp, ss, tmem);
        }
      }
      if (role == Role::kLoad && lane == 0) load_role(kp, ss);
      if (role == Role::kEpilogue && lane == 0) {
        bool stores = false;
        if constexpr (T::kTmaStoreO) {
          stores = kp.tma_store_o;
          if (stores) epilogue_role(kp, ss);
        }
        if (!stores) pass_tiles<T>(ss);
      }
      break;
  }
  // Every tcgen05 operation has completed: the correction warpgroup waited for the last P·V
  // of each tile (kOFull) and for its own loads before arriving here.
  tmem_free_for_cta(role == Role::kMma, tmem, T::Plan::kAllocColumns);
#endif
}

// ---- Launch --------------------------------------------------------------------------------
// The parameters both forwards (1-CTA and 2-CTA) fill alike: the problem, the score scale and
// the TMA loads of a stage's Q tile, kKRows rows of K and kVCols columns of V.
template <class T>
KernelParams<T> load_params(const FwdParams& p) {
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
  kp.tma_k = make_tma_tile<Element, typename T::SmemLayoutK, T::kKRows, T::kHeadDim>(k);
  kp.tma_v =
      make_tma_cols<Element, typename T::SmemLayoutV, T::kBlockN, T::kVCols, T::kHeadDimV>(v);
  kp.tma_store_o = false;
  return kp;
}

template <class T>
Status launch(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using Element = typename T::Element;
  KernelParams<T> kp = load_params<T>(p);
  kp.tma_store_o = T::kTmaStoreO && p.cu_seqlens_q == nullptr;
  if (kp.tma_store_o) {
    const GmemView o = gmem_view(p, p.out, false, p.head_dim_v, p.out_row_stride, p.out_head_stride,
                                 p.out_batch_stride);
    kp.shape_o = o.shape();
    kp.tma_o = make_tma_store_tile<typename T::OutElement, typename T::SmemLayoutO, T::kBlockM,
                                   T::kHeadDimV>(o);
  }
  kp.sched =
      TileScheduler::for_forward(p, T::kCtaRows, int(sizeof(Element)), dev.num_sms, dev.tile_order);
  const int grid = kp.sched.grid(dev.num_sms);
  if (grid == 0) return Status::kOk;
  FA4_SM100_DEBUG_ATTACH(stream);
  return launch_kernel("fwd_sm100", fwd_kernel<T>, dim3(grid), T::kThreads, T::kSmemBytes, stream,
                       kp);
}

}  // namespace fa4::sm100
