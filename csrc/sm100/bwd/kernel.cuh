// SM100 (Blackwell) backward kernel: tcgen05 MMA with S, P, dP, dS, dQ, dK and dV in tensor
// memory. Compiled, not executed: no Blackwell GPU is available to this project (DESIGN §2);
// docs/sm100.md has the timeline, the TMEM plan, the smem budget and the barrier protocol.
//
// One CTA per (kv tile of 128 rows, kv head, batch), as the SM90 backward (BwdGrid), or two at
// d > 128 (Note [bwd head-dim split]): K and V stay in shared memory while the CTA walks every
// query head of the GQA group and every Q block (128 rows, 64 when split) that sees the tile, so dK
// and dV are summed over the group in TMEM and written once (exact, no atomics). The
// pre/postprocess kernels are the SM90 backward's (common/bwd_prepost.cuh). Per Q block i, with kv
// rows as the M dimension (TMEM lanes) of the first four MMAs:
//   S  = K·Qᵀ      (SS)                    P  = exp2(S·c − lse₂)        compute warpgroups
//   dP = V·dOᵀ     (SS)                    dS = P ∘ (dP − D) [∘ (1 − x²) with softcap]
//   dV += P·dO     (TS: P from TMEM)
//   dK += dS·Q     (TS: dS from TMEM)
//   dQ  = dSᵀ·K    (SS: dS through shared memory; query rows as lanes) -> reduce warpgroup ->
//                  TMA reduce-add (UTMAREDG) of kBlockM × 32 fp32 sub-tiles into the workspace
// 16 warps, one role each (Role, kWarpRole):
//   compute0, compute1  a warpgroup per half of the query columns: thread t holds kv row t of S
//                       and dP (tcgen05.ld 32x32b), writes P and dS (16-bit) over them, dS also
//                       to shared memory; at the end, dK (compute0) and dV (compute1) to global
//   reduce              loads dQ from TMEM (thread t: query row t, or Note [M = 64 dQ]), stages
//                       it in shared memory
//                       in 32-column sub-tiles and issues the TMA reduce-adds (Note [sm100 dQ])
//   mma                 one thread issues every tcgen05.mma, in the order of Note [bwd MMA order]
//   load                one thread issues every TMA load: K, V once; Q (with lse₂, D) and dO per
//                       Q block
//   idle                warps 14 and 15 complete the fourth warpgroup (setmaxnreg is per
//                       warpgroup)
//
// Note [bwd MMA order]: per Q block i the MMA thread issues
//   dV(i), S(i+1), dK(i), dQ(i), dP(i+1)
// tcgen05 MMAs of one thread execute in issue order, so S(i+1) overwrites P(i) only after dV(i)
// read it, and dQ(i) overwrites dS(i) (they share the dP columns, Note [bwd TMEM plan]) only after
// dK(i) read it; the compute warpgroups turn S(i+1) into P(i+1) while dK(i), dQ(i) and dP(i+1)
// run, which is the overlap of the five stages. dP(i+1) overwrites dQ(i), so it waits for the
// reduce warpgroup to have loaded dQ(i) (kDqEmpty). With one Q stage (d = 256, kStageTable)
// S(i+1) needs the stage dK(i) reads, refilled after dK(i)'s kQEmpty commit: the order is then
//   dV(i), dK(i), dQ(i), S(i+1), dP(i+1)
// (the load of Q(i+1) overlaps dQ(i); the compute warpgroups wait for S(i+1) longer).
//
// Head dims: d = d_v in {64, 96} here and (dispatched to sm100/bwd/kernel_2cta.cuh) 128; 192, (192,
// 128) and 256 with the head dim split over two CTAs (Note [bwd head-dim split]).
#pragma once

#include <utility>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm100_umma.hpp>
#include <cute/atom/mma_traits_sm100.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "common/barrier_table.cuh"
#include "common/bwd_blocks.cuh"
#include "common/bwd_prepost.cuh"
#include "common/bwd_workspace.h"
#include "common/mask.cuh"
#include "common/params.h"
#include "sm100/common.cuh"
#include "common/tma.cuh"
#include "common/softmax.cuh"
#include "tmem.cuh"

namespace fa4::sm100::bwd {

using namespace cute;

// ---- Warp roles --------------------------------------------------------------------------
enum class Role : int { kCompute0, kCompute1, kReduce, kMma, kLoad, kIdle };
constexpr int kWarps = 16;
constexpr Role kWarpRole[kWarps] = {
    Role::kCompute0, Role::kCompute0, Role::kCompute0, Role::kCompute0,  // warps 0-3
    Role::kCompute1, Role::kCompute1, Role::kCompute1, Role::kCompute1,  // warps 4-7
    Role::kReduce,   Role::kReduce,   Role::kReduce,   Role::kReduce,    // warps 8-11
    Role::kMma,      Role::kLoad,     Role::kIdle,     Role::kIdle,      // warps 12-15
};
__host__ __device__ constexpr Role warp_role(int warp) {
  return warp < 12 ? Role(warp / 4)
                   : (warp == 12 ? Role::kMma : (warp == 13 ? Role::kLoad : Role::kIdle));
}
static_assert(roles_match(kWarpRole, warp_role), "warp_role() must follow kWarpRole");

// Registers per thread after setmaxnreg, per warpgroup. (160 + 160 + 144 + 48) · 128 = 65536.
//   compute 160: S (64 fp32), P or P·(1 − x²) kept for dS (64), dP (64, loaded after S died)
//   reduce 144: a dQ row of 128 columns (d = 128, or the split's d / 2 = 128 at d = 256) is 128
//               fp32 per thread, all loaded before kDqEmpty so that the next dP may start, plus
//               the staging addresses (no spill at 144; at 136 the hd 256 reduce spills)
//   mma / load 48: descriptors and barrier counters; at 40 the hd 256 split's MMA warp, which
//               walks 16 K slices of S and dP, spilled 28 bytes (4 at 48)
constexpr int kRegsCompute = 160;
constexpr int kRegsReduce = 144;
constexpr int kRegsOther = 48;
static_assert((2 * kRegsCompute + kRegsReduce + kRegsOther) * 128 == 65536,
              "the per-warpgroup budgets must add up to the 64 K register file");

// ---- Barriers ----------------------------------------------------------------------------
// Every mbarrier of the kernel: one row per producer -> consumer connection (sRowStats: the
// stage's lse₂ and D rows; the table type: common/barrier_table.cuh). The protocol model
// (tools/protocol_model_bwd.py) reads this table; keep one entry per line, in this format.
//   kOnce: one barrier; kPerQStage / kPerDoStage: one per Q / dO shared-memory stage
//   arrivals: the arrive count at init; "tx" barriers also count TMA bytes
enum class Bar : int {
  kKVFull,   // from load to mma, protects sK, sV: the tile's K and V landed (TMA tx)
  kQFull,    // from load to mma and compute, protects sQ[s], sRowStats[s]: Q, lse₂, D (TMA tx)
  kQEmpty,   // from mma to load, protects sQ[s], sRowStats[s]: dK(i) done (commit), after kDsFull
  kDoFull,   // from load to mma, protects sDO[s]: dO block landed (TMA tx)
  kDoEmpty,  // from mma to load, protects sDO[s]: dV += P·dO done (commit)
  kSFull,    // from mma to compute, protects TMEM S: S = K·Qᵀ done (commit)
  kPFull,    // from compute to mma, protects TMEM P: P stored over S by both warpgroups (256)
  kDpFull,   // from mma to compute, protects TMEM dP: dP = V·dOᵀ done (commit)
  kDsFull,   // from compute to mma, protects TMEM dS, sDS: dS stored to both (256)
  kDsEmpty,  // from mma to compute, protects sDS: dQ = dSᵀ·K done (commit)
  kDqFull,   // from mma to reduce, protects TMEM dQ: dQ = dSᵀ·K done (commit)
  kDqEmpty,  // from reduce to mma, protects TMEM dQ: loaded into registers (128)
  kDkvFull,  // from mma to compute, protects TMEM dK, dV: the last dK and dV MMAs done (commit)
  kCount
};
enum class BarCopies : int { kOnce, kPerQStage, kPerDoStage };
// clang-format off
inline constexpr BarSpec<Bar, BarCopies> kBarriers[] = {
    {Bar::kKVFull,  BarCopies::kOnce,         1},
    {Bar::kQFull,   BarCopies::kPerQStage,    1},
    {Bar::kQEmpty,  BarCopies::kPerQStage,    1},
    {Bar::kDoFull,  BarCopies::kPerDoStage,   1},
    {Bar::kDoEmpty, BarCopies::kPerDoStage,   1},
    {Bar::kSFull,   BarCopies::kOnce,         1},
    {Bar::kPFull,   BarCopies::kOnce,       256},
    {Bar::kDpFull,  BarCopies::kOnce,         1},
    {Bar::kDsFull,  BarCopies::kOnce,       256},
    {Bar::kDsEmpty, BarCopies::kOnce,         1},
    {Bar::kDqFull,  BarCopies::kOnce,         1},
    {Bar::kDqEmpty, BarCopies::kOnce,       128},
    {Bar::kDkvFull, BarCopies::kOnce,         1},
};
// clang-format on
static_assert(rows_follow_enum(kBarriers), "kBarriers: one row per barrier, in the order of Bar");
// The copies policy of kBarriers for kStagesQ Q stages and kStagesDo dO stages.
template <int kStagesQ, int kStagesDo>
struct BwdBarCopies {
  static constexpr int copies(BarCopies c) {
    return c == BarCopies::kOnce ? 1 : (c == BarCopies::kPerQStage ? kStagesQ : kStagesDo);
  }
};

// ---- Traits ------------------------------------------------------------------------------
// Note [bwd head-dim split] (the TMEM plans: BwdShape in tmem.cuh): at d or d_v > 128 a kv tile
// is done by kSplit = 2 CTAs, adjacent in the grid so that they share K, V, Q and dO through
// L2, CTA h owning columns [h·d/2, (h+1)·d/2) of dK and dQ and [h·d_v/2, (h+1)·d_v/2) of dV.
// Both compute the whole of S, dP, P and dS (the reductions of S and dP run over all of d and
// d_v); the dV, dK and dQ MMAs take N = d/2 (d_v/2) with their B operand (dO, Q, K) sliced to the
// CTA's columns. The recomputation costs 2 of the 5 MMAs and the elementwise work once more per
// tile: 7 instead of 5 MMA units of 2·128·kBlockM·d/2 per CTA pair. K and V resident take
// 96-128 KB, so Q blocks are 64 rows and dQ an M = 64 MMA (Note [M = 64 dQ] in the reduce role).
// The smem atoms of Q, K and dO are the widest whose row divides the slice (96 -> 32 elements),
// so a slice starts on an atom.

// Q and dO shared-memory stages per (d, d_v), from the budget in BwdTraits::SharedStorage; the
// protocol model (tools/protocol_model_bwd.py) reads this table. One Q stage changes the MMA
// order (Note [bwd MMA order]).
struct StageSpec {
  int d, dv, q, dout;
};
// clang-format off
constexpr StageSpec kStageTable[] = {
    { 64,  64, 2, 2},
    { 96,  96, 2, 2},
    {128, 128, 2, 1},
    {192, 192, 2, 2},
    {192, 128, 2, 2},
    {256, 256, 1, 1},
};
// clang-format on
constexpr StageSpec stage_spec(int d, int dv) {
  for (const StageSpec& s : kStageTable) {
    if (s.d == d && s.dv == dv) return s;
  }
  return {d, dv, 0, 0};
}

template <int kHeadDim_, int kHeadDimV_, class Element_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  using Split = BwdShape<kHeadDim, kHeadDimV>;
  static constexpr int kSplit = Split::kSplit;
  static constexpr int kSliceD = Split::kSliceD;    // dK and dQ columns of this CTA
  static constexpr int kSliceDV = Split::kSliceDV;  // dV columns of this CTA
  static_assert(kSplit == 1 ? kHeadDim == kHeadDimV : kSliceD <= 128 && kSliceDV <= 128,
                "SM100 backward (1-CTA): d = d_v <= 128, or d, d_v <= 256 split in two CTAs");
  static constexpr int kBlockM = Split::kBlockM;  // query rows per Q block
  static constexpr int kBlockN = 128;             // kv rows per CTA = TMEM lanes
  using Plan = typename Split::Plan;
  // Stages (kStageTable): two Q stages so that S(i+1) finds Q(i+1) while dK(i) still reads Q(i),
  // except at d = 256 where one Q stage is all that fits; one dO stage where a second does not
  // fit.
  static constexpr int kStagesQ = stage_spec(kHeadDim, kHeadDimV).q;
  static constexpr int kStagesDo = stage_spec(kHeadDim, kHeadDimV).dout;
  static_assert(kStagesQ > 0 && kStagesDo > 0, "(d, d_v) missing from kStageTable");
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kComputeThreads = 256;
  static constexpr int kDqCols = 32;  // fp32 columns per TMA reduce-add sub-tile (128 bytes)
  static constexpr int kDqBuffers = 2;

  // kv rows are M of S, dP, dV, dK; query rows are M of dQ.
  using AtomS = SM100_MMA_F16BF16_SS<Element, Element, float, kBlockN, kBlockM, UMMA::Major::K,
                                     UMMA::Major::K>;
  using AtomDV = SM100_MMA_F16BF16_TS<Element, Element, float, kBlockN, kSliceDV, UMMA::Major::K,
                                      UMMA::Major::MN>;
  using AtomDK = SM100_MMA_F16BF16_TS<Element, Element, float, kBlockN, kSliceD, UMMA::Major::K,
                                      UMMA::Major::MN>;
  using AtomDQ = SM100_MMA_F16BF16_SS<Element, Element, float, kBlockM, kSliceD, UMMA::Major::MN,
                                      UMMA::Major::MN>;
  static constexpr int kMmaK = 16;

  // Q, K and dO: atoms whose row divides the slice; the atoms tile the rows first, so columns
  // [h·slice, (h+1)·slice) of a stage are one contiguous block, and the *Slices layouts view a
  // stage as kSplit such blocks (stage index s·kSplit + h).
  using AtomQK = decltype(smem_atom_k<Element, kSliceD>());
  using AtomDO = decltype(smem_atom_k<Element, kSliceDV>());
  using SmemLayoutK = decltype(tile_to_shape(AtomQK{}, Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutV = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, _1>{}));
  using SmemLayoutQ =
      decltype(tile_to_shape(AtomQK{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStagesQ>>{}));
  using SmemLayoutDO =
      decltype(tile_to_shape(AtomDO{}, Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStagesDo>>{}));
  using SmemLayoutKSlices =
      decltype(tile_to_shape(AtomQK{}, Shape<Int<kBlockN>, Int<kSliceD>, Int<kSplit>>{}));
  using SmemLayoutQSlices = decltype(tile_to_shape(
      AtomQK{}, Shape<Int<kBlockM>, Int<kSliceD>, Int<kSplit * kStagesQ>>{}));
  using SmemLayoutDOSlices = decltype(tile_to_shape(
      AtomDO{}, Shape<Int<kBlockM>, Int<kSliceDV>, Int<kSplit * kStagesDo>>{}));
  static_assert(cosize_v<SmemLayoutQSlices> == cosize_v<SmemLayoutQ> &&
                    cosize_v<SmemLayoutDOSlices> == cosize_v<SmemLayoutDO> &&
                    cosize_v<SmemLayoutKSlices> == cosize_v<SmemLayoutK>,
                "a slice view covers the same buffer");
  // dS as (kv, q), q contiguous: the compute threads (one kv row each) store 16-byte chunks of
  // their row; dQ reads it transposed, (q, kv), as an MN-major A operand.
  using SmemLayoutDS = decltype(tile_to_shape(smem_atom_k<Element, kBlockM>(),
                                              Shape<Int<kBlockN>, Int<kBlockM>, _1>{}));
  using SmemLayoutKt = TransposedSmem<SmemLayoutKSlices, kBlockN, kSliceD, kSplit>;
  using SmemLayoutQt = TransposedSmem<SmemLayoutQSlices, kBlockM, kSliceD, kSplit * kStagesQ>;
  using SmemLayoutDOt = TransposedSmem<SmemLayoutDOSlices, kBlockM, kSliceDV, kSplit * kStagesDo>;
  using SmemLayoutDSt = TransposedSmem<SmemLayoutDS, kBlockN, kBlockM, 1>;
  // dQ staging: kBlockM query rows × 32 fp32, 128-byte swizzled (a thread writes its row's 128
  // bytes as 16-byte chunks, spread over the banks by the swizzle), kDqBuffers of them.
  using SmemLayoutDQ = decltype(tile_to_shape(UMMA::Layout_K_SW128_Atom<float>{},
                                              Shape<Int<kBlockM>, Int<kDqCols>>{}));

  using Barriers = BarrierTable<kBarriers, BwdBarCopies<kStagesQ, kStagesDo>>;
  // Shared memory (KB, 16-bit elements; kBlockM 128 up to d = 128, 64 above):
  //   d = 64:  K 16 + V 16 + Q 2×16 + dO 2×16 + dS 32 + dQ 2×16 = 160 + 2
  //   d = 96:  K 24 + V 24 + Q 2×24 + dO 2×24 + dS 32 + dQ 2×16 = 208 + 2
  //   d = 128: K 32 + V 32 + Q 2×32 + dO 1×32 + dS 32 + dQ 2×16 = 224 + 2
  //   d = 192: K 48 + V 48 + Q 2×24 + dO 2×24 + dS 16 + dQ 2×8  = 224 + 1
  //   (192, 128): K 48 + V 32 + Q 2×24 + dO 2×16 + dS 16 + dQ 2×8 = 192 + 1
  //   d = 256: K 64 + V 64 + Q 1×32 + dO 1×32 + dS 16 + dQ 2×8  = 224 + 1 (a second Q stage
  //            would need 256)
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDO>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDS>> ds;
    alignas(1024) cute::array_aligned<float, cosize_v<SmemLayoutDQ>> dq[kDqBuffers];
    alignas(16) float lse2[kStagesQ][kBlockM];
    alignas(16) float dpsum[kStagesQ][kBlockM];
    alignas(8) uint64_t bars[Barriers::kCount];
    uint32_t tmem_base;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM100)");

  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);
  static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element) + 2 * kRowStatBytes;
  static constexpr uint32_t kDoBytes = kBlockM * kHeadDimV * sizeof(Element);
};

// The dQ accumulator of the workspace as the TMA reduce-add sees it: (rows, d, heads), fp32.
inline auto gmem_dq_acc(const BwdWorkspace& ws) {
  return make_tensor(make_gmem_ptr(ws.base), make_shape(int(ws.rows), ws.head_dim, ws.heads),
                     make_stride(int64_t(ws.head_dim), _1{}, ws.rows * ws.head_dim));
}
template <class T>
auto make_tma_dq(const BwdWorkspace& ws) {
  return make_tma_copy(SM90_TMA_REDUCE_ADD{}, gmem_dq_acc(ws), typename T::SmemLayoutDQ{},
                       Shape<Int<T::kBlockM>, Int<T::kDqCols>>{}, _1{});
}

template <class T>
struct KernelParams {
  using Element = typename T::Element;
  using TmaQ = TmaTile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>;
  using TmaDO = TmaTile<Element, typename T::SmemLayoutDO, T::kBlockM, T::kHeadDimV>;
  using TmaK = TmaTile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>;
  using TmaV = TmaTile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>;
  using TmaDQ = decltype(make_tma_dq<T>(BwdWorkspace{}));
  TmaQ tma_q;
  TmaDO tma_do;
  TmaK tma_k;
  TmaV tma_v;
  TmaDQ tma_dq;
  Shape<int, int, int, int> shape_q, shape_do, shape_k, shape_v;
  Shape<int, int, int> shape_dq;
  BwdParams p;
  BwdWorkspace ws;
  ScoreScale score;
  BwdGrid grid;
  int group;
};

// What every role derives the same way from blockIdx: the tile, its sequence, its mask and the
// Q blocks that see it. Iteration i of the CTA is Q block m_begin + i % blocks of query head
// head_kv · group + i / blocks.
struct TileWork {
  int n, head_kv, b;
  int h;  // this CTA's column slice of dK, dV, dQ (Note [bwd head-dim split]); 0 when unsplit
  SeqInfo seq;
  Mask mask;
  int m_begin, m_end;
  int iters;
  int64_t row0_ws;  // workspace row of the sequence's row 0
  __device__ int m_of(int i) const { return m_begin + i % (m_end - m_begin); }
  __device__ int g_of(int i) const { return i / (m_end - m_begin); }
};

template <class T>
__device__ __forceinline__ TileWork tile_work(const KernelParams<T>& kp) {
  const FwdParams& f = kp.p.fwd;
  TileWork t;
  // The kSplit CTAs of a tile are adjacent in the grid: they read the same K, V, Q and dO.
  t.h = int(blockIdx.x % T::kSplit);
  kp.grid.decode(blockIdx.x / T::kSplit, t.n, t.head_kv, t.b);
  t.seq = SeqInfo::get(t.b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  t.mask = Mask::from_params(f, t.seq.seqlen_q, t.seq.seqlen_k);
  q_blocks_seeing<T>(t.mask, t.n, t.m_begin, t.m_end);
  t.iters = t.m_end > t.m_begin ? kp.group * (t.m_end - t.m_begin) : 0;
  t.row0_ws = kp.ws.row_offset(t.b, t.seq.offset_q, 0);
  return t;
}

}  // namespace fa4::sm100::bwd

#include "sm100/bwd/compute.cuh"
#include "sm100/bwd/roles.cuh"
