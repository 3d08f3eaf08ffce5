// SM100 (Blackwell) backward, 2-CTA variant (Note [bwd 2-CTA]): a cluster of two CTAs owns two
// adjacent kv tiles of 128 rows, and the even CTA's MMA warp issues tcgen05.mma.cta_group::2 over
// both. Compiled, not executed: no Blackwell GPU is available to this project (DESIGN §2);
// docs/sm100.md has the layout of every operand, the smem budget and the barrier protocol.
//
// Note [bwd 2-CTA]: per Q block of 128 query rows, with the pair's 256 kv rows as M of the first
// four MMAs (each CTA's TMEM lanes its own 128 rows), each CTA staging half of every B operand:
//   S  = K·Qᵀ    M 256, N 128 q  B: this CTA's 64 query rows of Q       (sQ,   64 × d)
//   dP = V·dOᵀ   M 256, N 128 q  B: its 64 query rows of dO              (sDO,  64 × d)
//   dV += P·dO   M 256, N d      B: all 128 query rows, its d/2 columns  (sDOd, 128 × d/2)
//   dK += dS·Q   M 256, N d      B: likewise of Q                        (sQd,  128 × d/2)
//   dQ  = dSᵀ·K  M 128 q (64 per CTA), N d, K the pair's 256 kv rows
//                A: dS of this CTA's 64 query rows for all 256 kv rows    (sDS,  256 × 64)
//                B: K of the pair's 256 kv rows, its d/2 columns         (sKd,  256 × d/2)
// The compute warpgroup w of each CTA holds query columns [64 w, 64 w + 64) of its kv rows' dS:
// exactly the A operand rows of CTA w's dQ. It stores them into CTA w's sDS (rows rank · 128 +
// kv row): into its own CTA's shared memory or, through distributed shared memory
// (st.shared::cluster), into the peer's. That is the dS exchange; both CTAs' kDsFull arrivals
// go to the even CTA's barrier, which the dQ MMA waits for. dQ lands in each CTA's TMEM in the
// 2 × 2 layout of a 2-CTA M = 128 MMA (query row r < 64 of the CTA: lane r holds columns
// [0, d/2), lane 64 + r columns [d/2, d)), and each CTA's reduce warpgroup adds its 64 rows.
//
// The odd CTA's loads reach the even CTA's MMA warp through a relay warp: it waits for its own
// CTA's TMA transactions and arrives on the even CTA's kPeer* barriers. Commits go to both CTAs
// (tcgen05.commit multicast), the compute and reduce arrivals of both CTAs to the even CTA.
// Q and dO are single-staged (shared memory: 225 KB of 227), so the MMA order per block is
// dV(i), dK(i), dQ(i), S(i + 1), dP(i + 1): S(i + 1) needs the Q buffer dK(i) frees.
//
// Head dims: d = d_v = 128. 192 and 256 need a different TMEM plan (S, dP, dK, dV exceed 512
// columns at 128 query rows), not written.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/tmem_allocator_sm100.hpp>

#include "sm100/bwd/kernel.cuh"

namespace fa4::sm100::bwd2 {

using namespace cute;

// ---- Warp roles --------------------------------------------------------------------------
enum class Role : int { kCompute0, kCompute1, kReduce, kMma, kLoad, kRelay, kIdle };
constexpr int kWarps = 16;
constexpr Role kWarpRole[kWarps] = {
    Role::kCompute0, Role::kCompute0, Role::kCompute0, Role::kCompute0,  // warps 0-3
    Role::kCompute1, Role::kCompute1, Role::kCompute1, Role::kCompute1,  // warps 4-7
    Role::kReduce,   Role::kReduce,   Role::kReduce,   Role::kReduce,    // warps 8-11
    Role::kMma,      Role::kLoad,     Role::kRelay,    Role::kIdle,      // warps 12-15
};
__host__ __device__ constexpr Role warp_role(int warp) {
  return warp < 12 ? Role(warp / 4)
                   : (warp == 12
                          ? Role::kMma
                          : (warp == 13 ? Role::kLoad : (warp == 14 ? Role::kRelay : Role::kIdle)));
}
static_assert(roles_match(kWarpRole, warp_role), "warp_role() must follow kWarpRole");

// Registers per thread after setmaxnreg, per warpgroup: (176 + 176 + 104 + 56) · 128 = 65536.
// The compute warpgroups run the 1-CTA kernel's per-element work plus eight 64-bit DSMEM
// addresses of their dS stores, which ptxas keeps across the per-block loop: at 160 it reloaded
// five of them from local memory per block, at 176 none. The reduce thread holds half a dQ row
// (64 fp32, the 2 × 2 layout) in 104; the MMA warp's operand descriptors and the load thread
// fit 56 (the load thread's per-block loop spills at 48).
constexpr int kRegsCompute = 176;
constexpr int kRegsReduce = 104;
constexpr int kRegsOther = 56;
static_assert((2 * kRegsCompute + kRegsReduce + kRegsOther) * 128 == 65536,
              "the per-warpgroup budgets must add up to the 64 K register file");

// ---- Barriers ----------------------------------------------------------------------------
// Every mbarrier of the kernel, one row per connection, in each CTA's shared memory; "(even)":
// only the even CTA's copy is used. Commits arrive on both CTAs' copies. One copy of each (Q and
// dO are single-staged); the table type: common/barrier_table.cuh. The protocol model
// (tools/protocol_model_bwd2.py) reads this table; keep one entry per line, in this format.
enum class Bar : int {
  kKVFull,      // from load to mma and relay, protects sK, sV, sKd: this CTA's loads (TMA tx)
  kPeerKVFull,  // from relay to mma, protects sK, sV, sKd: the odd CTA's landed (even)
  kQFull,       // from load to mma, compute and relay, protects sQ, sQd, sRowStats: Q(i) (tx)
  kPeerQFull,   // from relay to mma, protects sQ, sQd: the odd CTA's Q(i) landed (even)
  kQEmpty,      // from mma to load, protects sQ, sQd, sRowStats: dK(i) done (commit)
  kDoFull,      // from load to mma and relay, protects sDO, sDOd: dO(i) (TMA tx)
  kPeerDoFull,  // from relay to mma, protects sDO, sDOd: the odd CTA's dO(i) landed (even)
  kDoEmpty,     // from mma to load, protects sDO, sDOd: dV(i) done (commit)
  kSFull,       // from mma to compute, protects TMEM S: S(i) done (commit)
  kPFull,       // from compute to mma, protects TMEM P: both CTAs' P stored (512, even)
  kDpFull,      // from mma to compute, protects TMEM dP: dP(i) done (commit)
  kDsFull,      // from compute to mma, protects TMEM dS, sDS: dS in TMEM and both sDS (512, even)
  kDsEmpty,     // from mma to compute, protects sDS: dQ(i) read both CTAs' sDS (commit)
  kDqFull,      // from mma to reduce, protects TMEM dQ: dQ(i) done (commit)
  kDqEmpty,     // from reduce to mma, protects TMEM dQ: both CTAs loaded it (256, even)
  kDkvFull,     // from mma to compute, protects TMEM dK, dV: the last dK, dV done (commit)
  kCount
};
enum class BarCopies : int { kOnce };
// clang-format off
inline constexpr BarSpec<Bar, BarCopies> kBarriers[] = {
    {Bar::kKVFull,      BarCopies::kOnce,   1},
    {Bar::kPeerKVFull,  BarCopies::kOnce,   1},
    {Bar::kQFull,       BarCopies::kOnce,   1},
    {Bar::kPeerQFull,   BarCopies::kOnce,   1},
    {Bar::kQEmpty,      BarCopies::kOnce,   1},
    {Bar::kDoFull,      BarCopies::kOnce,   1},
    {Bar::kPeerDoFull,  BarCopies::kOnce,   1},
    {Bar::kDoEmpty,     BarCopies::kOnce,   1},
    {Bar::kSFull,       BarCopies::kOnce,   1},
    {Bar::kPFull,       BarCopies::kOnce, 512},
    {Bar::kDpFull,      BarCopies::kOnce,   1},
    {Bar::kDsFull,      BarCopies::kOnce, 512},
    {Bar::kDsEmpty,     BarCopies::kOnce,   1},
    {Bar::kDqFull,      BarCopies::kOnce,   1},
    {Bar::kDqEmpty,     BarCopies::kOnce, 256},
    {Bar::kDkvFull,     BarCopies::kOnce,   1},
};
// clang-format on
static_assert(rows_follow_enum(kBarriers), "kBarriers: one row per barrier, in the order of Bar");

// ---- Traits ------------------------------------------------------------------------------
template <class Element_>
struct Traits2 {
  using Element = Element_;
  static constexpr int kHeadDim = 128;
  static constexpr int kHeadDimV = 128;
  static constexpr int kBlockM = 128;  // query rows per Q block
  static constexpr int kBlockN = 128;  // kv rows per CTA = TMEM lanes
  static constexpr int kPairN = 2 * kBlockN;
  static constexpr int kHalfM = kBlockM / 2;   // query rows of S's and dP's B, and of dQ, per CTA
  static constexpr int kHalfD = kHeadDim / 2;  // columns of dV's, dK's and dQ's B per CTA
  static constexpr int kSliceD = kHeadDim, kSliceDV = kHeadDimV;  // dK, dV columns per CTA
  // The TMEM plan of the 1-CTA kernel: S | dP | dK | dV per CTA, P over S, dS and dQ over dP
  // (dQ in the 2 × 2 layout takes kHeadDim / 2 columns of all 128 lanes).
  using Plan = BwdTmemPlan<kHeadDim, kHeadDimV, kBlockM>;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kComputeThreads = 256;
  static constexpr int kDqCols = 32;  // fp32 columns per TMA reduce-add sub-tile (128 bytes)
  static constexpr int kDqChunks = kHeadDim / kDqCols;
  static constexpr int kMmaK = 16;
  // Block shapes for the pair as one tile (the Q blocks it visits, the dQ turn order).
  struct PairTile {
    static constexpr int kBlockM = 128;
    static constexpr int kBlockN = 256;
  };

  // Descriptor atoms: 1-CTA shapes of one CTA's halves, so that partition_fragment_A/B give the
  // shared-memory descriptors of this CTA's buffers, which the cta_group::2 MMA reads at the
  // same offsets in both CTAs. The instruction descriptors carry the pair's M and N.
  using DescS = SM100_MMA_F16BF16_SS<Element, Element, float, kBlockN, kHalfM, UMMA::Major::K,
                                     UMMA::Major::K>;
  using DescDKV = SM100_MMA_F16BF16_TS<Element, Element, float, kBlockN, kHalfD, UMMA::Major::K,
                                       UMMA::Major::MN>;
  using DescDQ = SM100_MMA_F16BF16_SS<Element, Element, float, kHalfM, kHalfD, UMMA::Major::MN,
                                      UMMA::Major::MN>;

  using SmemLayoutK = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutV = SmemLayoutK;
  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kHalfM>, Int<kHeadDim>, _1>{}));
  using SmemLayoutDO = SmemLayoutQ;
  // Row-major (q, d/2) and (kv, d/2) halves, read transposed as MN-major B operands.
  using SmemLayoutQd = decltype(tile_to_shape(smem_atom_k<Element, kHalfD>(),
                                              Shape<Int<kBlockM>, Int<kHalfD>, _1>{}));
  using SmemLayoutQdT = TransposedSmem<SmemLayoutQd, kBlockM, kHalfD, 1>;
  using SmemLayoutDOd = SmemLayoutQd;
  using SmemLayoutDOdT = SmemLayoutQdT;
  using SmemLayoutKd = decltype(tile_to_shape(smem_atom_k<Element, kHalfD>(),
                                              Shape<Int<kPairN>, Int<kHalfD>, _1>{}));
  using SmemLayoutKdT = TransposedSmem<SmemLayoutKd, kPairN, kHalfD, 1>;
  // dS as (pair kv row, this CTA's 64 query columns), q contiguous; dQ reads it as (q, kv).
  using SmemLayoutDS = decltype(tile_to_shape(smem_atom_k<Element, kHalfM>(),
                                              Shape<Int<kPairN>, Int<kHalfM>, _1>{}));
  using SmemLayoutDSt = TransposedSmem<SmemLayoutDS, kPairN, kHalfM, 1>;
  // dQ staging: 64 query rows × 32 fp32 per sub-tile, 128-byte swizzled, one per sub-tile.
  using SmemLayoutDQ = decltype(tile_to_shape(UMMA::Layout_K_SW128_Atom<float>{},
                                              Shape<Int<kHalfM>, Int<kDqCols>>{}));

  using Barriers = BarrierTable<kBarriers, OneCopyEach>;
  // Shared memory (KB): K 32 + V 32 + Kd 32 + Q 16 + Qd 16 + dO 16 + dOd 16 + dS 32 + dQ 4 × 8
  // = 224, + 1 for lse₂, D and the barriers.
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutKd>> kd;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQd>> qd;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDO>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDOd>> doutd;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDS>> ds;
    alignas(1024) cute::array_aligned<float, cosize_v<SmemLayoutDQ>> dq[kDqChunks];
    alignas(16) float lse2[kBlockM];
    alignas(16) float dpsum[kBlockM];
    alignas(8) uint64_t bars[Barriers::kCount];
    uint32_t tmem_base;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM100)");

  static constexpr uint32_t kKVBytes =
      (kBlockN * (kHeadDim + kHeadDimV) + kPairN * kHalfD) * sizeof(Element);
  static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
  static constexpr uint32_t kQBytes =
      (kHalfM * kHeadDim + kBlockM * kHalfD) * sizeof(Element) + 2 * kRowStatBytes;
  static constexpr uint32_t kDoBytes = (kHalfM * kHeadDimV + kBlockM * kHalfD) * sizeof(Element);
};

template <class T>
auto make_tma_dq(const BwdWorkspace& ws) {
  return make_tma_copy(SM90_TMA_REDUCE_ADD{}, bwd::gmem_dq_acc(ws), typename T::SmemLayoutDQ{},
                       Shape<Int<T::kHalfM>, Int<T::kDqCols>>{}, _1{});
}

template <class T>
struct KernelParams {
  using E = typename T::Element;
  static constexpr int D = T::kHeadDim;
  using TmaQ = TmaTile<E, typename T::SmemLayoutQ, T::kHalfM, D>;
  using TmaQd = TmaCols<E, typename T::SmemLayoutQd, T::kBlockM, T::kHalfD, D>;
  using TmaK = TmaTile<E, typename T::SmemLayoutK, T::kBlockN, D>;
  using TmaKd = TmaCols<E, typename T::SmemLayoutKd, T::kPairN, T::kHalfD, D>;
  using TmaDQ = decltype(make_tma_dq<T>(BwdWorkspace{}));
  TmaQ tma_q, tma_do;
  TmaQd tma_qd, tma_dod;
  TmaK tma_k, tma_v;
  TmaKd tma_kd;
  TmaDQ tma_dq;
  Shape<int, int, int, int> shape_q, shape_do, shape_k, shape_v;
  Shape<int, int, int> shape_dq;
  BwdParams p;
  BwdWorkspace ws;
  ScoreScale score;
  BwdGrid grid;  // over pairs of kv tiles
  int group;
};

// What every role of both CTAs derives the same way: the 1-CTA kernel's TileWork (n: this CTA's
// tile) plus the pair and this CTA's rank; the Q blocks are those that see either tile of the
// pair (both CTAs walk the same blocks: their MMAs are one).
struct TileWork : bwd::TileWork {
  int pair, rank;
};

template <class T>
__device__ __forceinline__ TileWork tile_work(const KernelParams<T>& kp) {
  const FwdParams& f = kp.p.fwd;
  TileWork t;
  t.rank = int(cute::block_rank_in_cluster());
  kp.grid.decode(blockIdx.x / 2, t.pair, t.head_kv, t.b);
  t.n = 2 * t.pair + t.rank;
  t.h = 0;  // no head-dim split
  t.seq = SeqInfo::get(t.b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  t.mask = Mask::from_params(f, t.seq.seqlen_q, t.seq.seqlen_k);
  q_blocks_seeing<typename T::PairTile>(t.mask, t.pair, t.m_begin, t.m_end);
  t.iters = t.m_end > t.m_begin ? kp.group * (t.m_end - t.m_begin) : 0;
  t.row0_ws = kp.ws.row_offset(t.b, t.seq.offset_q, 0);
  return t;
}

}  // namespace fa4::sm100::bwd2

#include "sm100/bwd/roles_2cta.cuh"
