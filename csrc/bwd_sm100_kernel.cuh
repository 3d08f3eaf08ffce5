// SM100 (Blackwell) backward kernel: tcgen05 MMA with S, P, dP, dS, dQ, dK and dV in tensor
// memory. Compiled, not executed: no Blackwell GPU is available to this project (DESIGN §2);
// docs/sm100.md has the timeline, the TMEM plan, the smem budget and the barrier protocol.
//
// One CTA per (kv tile of 128 rows, kv head, batch), as the SM90 backward (BwdGrid): K and V stay
// in shared memory while the CTA walks every query head of the GQA group and every 128-row Q
// block that sees the tile, so dK and dV are summed over the group in TMEM and written once
// (exact, no atomics). The pre/postprocess kernels are the SM90 backward's (bwd_prepost.cuh). Per
// Q block i, with kv rows as the M dimension (TMEM lanes) of the first four MMAs:
//   S  = K·Qᵀ      (SS)                    P  = exp2(S·c − lse₂)        compute warpgroups
//   dP = V·dOᵀ     (SS)                    dS = P ∘ (dP − D) [∘ (1 − x²) with softcap]
//   dV += P·dO     (TS: P from TMEM)
//   dK += dS·Q     (TS: dS from TMEM)
//   dQ  = dSᵀ·K    (SS: dS through shared memory; query rows as lanes) -> reduce warpgroup ->
//                  TMA reduce-add (UTMAREDG) of 128 × 32 fp32 sub-tiles into the workspace
// 16 warps, one role each (Role, kWarpRole):
//   compute0, compute1  a warpgroup per half of the query columns: thread t holds kv row t of S
//                       and dP (tcgen05.ld 32x32b), writes P and dS (16-bit) over them, dS also
//                       to shared memory; at the end, dK (compute0) and dV (compute1) to global
//   reduce              loads dQ from TMEM (thread t: query row t), stages it in shared memory
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
// reduce warpgroup to have loaded dQ(i) (kDqEmpty).
//
// Head dims: d = d_v in {64, 96, 128} (TMEM, Note [bwd TMEM plan]). d >= 192 needs the 2-CTA
// variant (cta_group::2, dS exchanged through distributed shared memory), not written yet.
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

#include "bwd_common.cuh"
#include "bwd_prepost.cuh"
#include "bwd_workspace.h"
#include "mask.cuh"
#include "params.h"
#include "sm100_common.cuh"
#include "sm90_common.cuh"
#include "softmax.cuh"
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

// Registers per thread after setmaxnreg, per warpgroup. (160 + 160 + 152 + 40) · 128 = 65536.
//   compute 160: S (64 fp32), P or P·(1 − x²) kept for dS (64), dP (64, loaded after S died)
//   reduce 152: a 128-row dQ at d = 128 is 128 fp32 per thread, all loaded before kDqEmpty so
//               that the next dP may start, plus the staging addresses
//   mma / load 40: descriptors, barrier counters (the SM90 producer runs at 40)
constexpr int kRegsCompute = 160;
constexpr int kRegsReduce = 152;
constexpr int kRegsOther = 40;
static_assert((2 * kRegsCompute + kRegsReduce + kRegsOther) * 128 == 65536,
              "the per-warpgroup budgets must add up to the 64 K register file");

// ---- Barriers ----------------------------------------------------------------------------
// Every mbarrier of the kernel: one row per producer -> consumer connection (sRowStats: the
// stage's lse₂ and D rows). The protocol
// model (tools/protocol_model_bwd.py) reads this table; keep one entry per line, in this format.
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
struct BarSpec {
  Bar bar;
  BarCopies copies;
  int arrivals;
};
// clang-format off
constexpr BarSpec kBarriers[] = {
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
static_assert(sizeof(kBarriers) / sizeof(BarSpec) == int(Bar::kCount), "one row per barrier");
static_assert(rows_in_enum_order(kBarriers), "kBarriers rows in the order of enum Bar");

// ---- Traits ------------------------------------------------------------------------------
template <int kHeadDim_, int kHeadDimV_, class Element_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static_assert(kHeadDim == kHeadDimV && kHeadDim <= 128,
                "SM100 backward (1-CTA): d = d_v <= 128 (Note [bwd TMEM plan])");
  static constexpr int kBlockM = 128;  // query rows per Q block
  static constexpr int kBlockN = 128;  // kv rows per CTA = TMEM lanes
  using Plan = BwdTmemPlan<kHeadDim, kHeadDimV, kBlockM>;
  // Stages (smem budget below): two Q stages so that S(i+1) finds Q(i+1) while dK(i) still
  // reads Q(i); one dO stage at d = 128, where a second does not fit.
  static constexpr int kStagesQ = 2;
  static constexpr int kStagesDo = kHeadDim <= 96 ? 2 : 1;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kComputeThreads = 256;
  static constexpr int kDqCols = 32;  // fp32 columns per TMA reduce-add sub-tile (128 bytes)
  static constexpr int kDqBuffers = 2;

  // kv rows are M of S, dP, dV, dK; query rows are M of dQ.
  using AtomS = SM100_MMA_F16BF16_SS<Element, Element, float, kBlockN, kBlockM, UMMA::Major::K,
                                     UMMA::Major::K>;
  using AtomDV = SM100_MMA_F16BF16_TS<Element, Element, float, kBlockN, kHeadDimV, UMMA::Major::K,
                                      UMMA::Major::MN>;
  using AtomDK = SM100_MMA_F16BF16_TS<Element, Element, float, kBlockN, kHeadDim, UMMA::Major::K,
                                      UMMA::Major::MN>;
  using AtomDQ = SM100_MMA_F16BF16_SS<Element, Element, float, kBlockM, kHeadDim, UMMA::Major::MN,
                                      UMMA::Major::MN>;
  static constexpr int kMmaK = 16;

  using SmemLayoutK = decltype(tile_to_shape(sm90::smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutV = decltype(tile_to_shape(sm90::smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, _1>{}));
  using SmemLayoutQ = decltype(tile_to_shape(sm90::smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStagesQ>>{}));
  using SmemLayoutDO =
      decltype(tile_to_shape(sm90::smem_atom_k<Element, kHeadDimV>(),
                             Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStagesDo>>{}));
  // dS as (kv, q), q contiguous: the compute threads (one kv row each) store 16-byte chunks of
  // their row; dQ reads it transposed, (q, kv), as an MN-major A operand.
  using SmemLayoutDS = decltype(tile_to_shape(sm90::smem_atom_k<Element, kBlockM>(),
                                              Shape<Int<kBlockN>, Int<kBlockM>, _1>{}));
  using SmemLayoutKt = sm90::TransposedSmem<SmemLayoutK, kBlockN, kHeadDim, 1>;
  using SmemLayoutQt = sm90::TransposedSmem<SmemLayoutQ, kBlockM, kHeadDim, kStagesQ>;
  using SmemLayoutDOt = sm90::TransposedSmem<SmemLayoutDO, kBlockM, kHeadDimV, kStagesDo>;
  using SmemLayoutDSt = sm90::TransposedSmem<SmemLayoutDS, kBlockN, kBlockM, 1>;
  // dQ staging: 128 query rows × 32 fp32, 128-byte swizzled (thread t writes row t's 128 bytes
  // as 16-byte chunks, spread over the banks by the swizzle), kDqBuffers of them.
  using SmemLayoutDQ = decltype(tile_to_shape(UMMA::Layout_K_SW128_Atom<float>{},
                                              Shape<Int<kBlockM>, Int<kDqCols>>{}));

  static constexpr int kBarCount = [] {
    int n = 0;
    for (const BarSpec& b : kBarriers) {
      n += b.copies == BarCopies::kOnce
               ? 1
               : (b.copies == BarCopies::kPerQStage ? kStagesQ : kStagesDo);
    }
    return n;
  }();
  // Shared memory (16-bit elements):
  //   d = 64:  K 16 + V 16 + Q 2×16 + dO 2×16 + dS 32 + dQ 2×16 = 160 KB + 2 KB
  //   d = 96:  K 24 + V 24 + Q 2×24 + dO 2×24 + dS 32 + dQ 2×16 = 208 KB + 2 KB
  //   d = 128: K 32 + V 32 + Q 2×32 + dO 1×32 + dS 32 + dQ 2×16 = 224 KB + 2 KB
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDO>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDS>> ds;
    alignas(1024) cute::array_aligned<float, cosize_v<SmemLayoutDQ>> dq[kDqBuffers];
    alignas(16) float lse2[kStagesQ][kBlockM];
    alignas(16) float dpsum[kStagesQ][kBlockM];
    alignas(8) uint64_t bars[kBarCount];
    uint32_t tmem_base;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM100)");

  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);
  static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element) + 2 * kRowStatBytes;
  static constexpr uint32_t kDoBytes = kBlockM * kHeadDimV * sizeof(Element);
};

template <class T>
constexpr int bar_copies(BarCopies c) {
  return c == BarCopies::kOnce ? 1 : (c == BarCopies::kPerQStage ? T::kStagesQ : T::kStagesDo);
}

// Where barrier b's copies start in SharedStorage::bars (compile time only).
template <class T>
constexpr int bar_offset(Bar b) {
  int n = 0;
  for (const BarSpec& s : kBarriers) {
    if (s.bar == b) return n;
    n += bar_copies<T>(s.copies);
  }
  return -1;
}

template <class T, Bar b>
__device__ __forceinline__ uint64_t* bar_ptr(typename T::SharedStorage& ss, int i = 0) {
  constexpr int kOffset = bar_offset<T>(b);
  static_assert(kOffset >= 0, "barrier missing from kBarriers");
  return &ss.bars[kOffset + i];
}

template <class T, int... I>
__device__ __forceinline__ void init_barriers(typename T::SharedStorage& ss,
                                              std::integer_sequence<int, I...>) {
  auto init = [&](auto spec_index) {
    constexpr BarSpec spec = kBarriers[decltype(spec_index)::value];
    FA4_UNROLL
    for (int i = 0; i < bar_copies<T>(spec.copies); ++i) {
      cutlass::arch::ClusterBarrier::init(bar_ptr<T, spec.bar>(ss, i), spec.arrivals);
    }
  };
  (init(std::integral_constant<int, I>{}), ...);
}

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
  using TmaQ = sm90::TmaTile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>;
  using TmaDO = sm90::TmaTile<Element, typename T::SmemLayoutDO, T::kBlockM, T::kHeadDimV>;
  using TmaK = sm90::TmaTile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>;
  using TmaV = sm90::TmaTile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>;
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
  kp.grid.decode(blockIdx.x, t.n, t.head_kv, t.b);
  t.seq = SeqInfo::get(t.b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  t.mask = Mask::from_params(f, t.seq.seqlen_q, t.seq.seqlen_k);
  q_blocks_seeing<T>(t.mask, t.n, t.m_begin, t.m_end);
  t.iters = t.m_end > t.m_begin ? kp.group * (t.m_end - t.m_begin) : 0;
  t.row0_ws = kp.ws.row_offset(t.b, t.seq.offset_q, 0);
  return t;
}

}  // namespace fa4::sm100::bwd

#include "bwd_sm100_compute.cuh"
#include "bwd_sm100_roles.cuh"
