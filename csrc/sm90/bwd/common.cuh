// Pieces of the SM90 backward shared by its two consumer variants (sm90/bwd/consumer.cuh for
// d <= 128, sm90/bwd/consumer_split.cuh for larger head dims): traits, kernel parameters, grid,
// named barriers, the producer (TMA loads), the dQ reducer warp and small fragment helpers; the
// dK/dV stores are in sm90/bwd/epilogue.cuh. The algorithm, the pipelines and the Notes are in
// sm90/bwd/kernel.cuh's header.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/bwd_blocks.cuh"
#include "common/bwd_prepost.cuh"
#include "common/fragment.cuh"
#include "common/mask.cuh"
#include "common/params.h"
#include "common/softmax.cuh"
#include "common/tile_ring.cuh"
#include "sm90/bwd/trace.cuh"
#include "sm90/common.cuh"

namespace fa4::sm90 {

template <int kHeadDim_, int kHeadDimV_, class Element_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static_assert(kHeadDim <= 128 && kHeadDimV <= 128, "register budget: see the header note");
  static constexpr bool kSplitD = false;
  // Query rows per step (wgmma N of Sᵀ): 128 at d <= 64, where the registers allow it and each
  // step then carries twice the FLOPs per synchronization; 64 above.
  static constexpr int kBlockM = kHeadDim <= 64 && kHeadDimV <= 64 ? 128 : 64;
  static constexpr int kBlockN = 128;  // kv rows per CTA, 64 per consumer warpgroup
  static constexpr int kStages = 2;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 128 + kConsumerThreads;

  using AtomM2 = Layout<Shape<_2, _1, _1>>;  // the two warpgroups split the kv rows (M)
  using AtomN2 = Layout<Shape<_1, _2, _1>>;  // ... or, for dQ, the head dim (N)
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(),
      AtomM2{}));
  using MmaDP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDimV>>>(),
      AtomM2{}));
  using MmaDV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomM2{}));
  using MmaDK = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomM2{}));
  // Note [dQ split by rows]: with 128-row Q blocks (d <= 64) each warpgroup computes dQ for 64
  // of the rows over the whole head dim (wgmma N = d) instead of all 128 rows over half of it
  // (N = d / 2 = 32): per k-step of 16 kv rows an SS wgmma reads A (64 x 16) and B (N x 16)
  // from shared memory, so N = 32 moves 3 KB per 16 cycles of tensor work (192 B/clk, above
  // the 128 B/clk shared memory gives), N = 64 4 KB per 32 (128 B/clk): the dQ GEMM's reads per
  // block fall from 96 to 64 KB at hd64, with half the HGMMAs: +1.5-2.3 % at hd64. With 64-row
  // blocks there is one 64-row atom, so the warpgroups keep splitting the head dim.
  static constexpr bool kDqByRows = kBlockM == 128;
  // Note [dQ from registers]: only where dQ is split by rows (hd64).
  static constexpr bool kDqFromRegisters = kDqByRows;
  // Note [early dPᵀ]: with 64-row blocks only (d 96, 128: hd128 +1-5.5 % at 1k-16k; at hd64
  // -1.6 to -3.5 % at 512 / 1k; the split variant, d > 128, has its own consumer without it).
  static constexpr bool kEarlyDp = !kDqByRows;
  // Note [dK/dV from registers]: with 128-row blocks only (hd64: +1.3-1.8 % at 512-2k; hd128
  // lost 6-10 % at 512-2k with it). Note [postprocess from registers]: wherever its fragment is
  // whole transpose groups (kPostFromRegisters: hd 64, 128; hd96's 48 columns per warpgroup are
  // not; hd128 +1-2.6 % at 512 / 1k).
  static constexpr bool kDkDvRegs = kDqByRows;
  static constexpr bool kPostRegs = true;
  using MmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kDqByRows ? kHeadDim : kHeadDim / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      std::conditional_t<kDqByRows, AtomM2, AtomN2>{}));

  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutDO = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                              Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStages>>{}));
  using SmemLayoutK = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutV = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, _1>{}));
  static constexpr int kDsStages = 2;  // see kDsWritten in the header
  using SmemLayoutDS = decltype(tile_to_shape(smem_atom_k<Element, kBlockN>(),
                                              Shape<Int<kBlockM>, Int<kBlockN>, Int<kDsStages>>{}));
  // dQ of one block in fp32, in fragment order (Note [dQ reduce]).
  static constexpr int kDqFloats = kBlockM * kHeadDim;
  static constexpr uint32_t kDqBytes = kDqFloats * sizeof(float);
  static_assert(kDqFloats % (4 * 256) == 0, "each consumer thread stores whole float4s");
  using SmemLayoutQt = TransposedSmem<SmemLayoutQ, kBlockM, kHeadDim, kStages>;
  using SmemLayoutDOt = TransposedSmem<SmemLayoutDO, kBlockM, kHeadDimV, kStages>;
  using SmemLayoutKt = TransposedSmem<SmemLayoutK, kBlockN, kHeadDim, 1>;
  using SmemLayoutDSt = TransposedSmem<SmemLayoutDS, kBlockM, kBlockN, kDsStages>;

  // Note [persistent bwd]: one CTA per SM walks kv tiles; dK/dV are staged over dS, stage_pad
  // and dQ's buffer, which the next tile's loads do not touch, dV's rows first and within dS and
  // the pad (Note [dK/dV epilogue]: they are staged before the reducer has read the last dQ).
  static constexpr int kDvStageElems = kBlockN * (kHeadDimV + 8);
  static constexpr int kStageElems = kBlockN * (kHeadDim + 8) + kDvStageElems;
  static constexpr int kDsElems = cosize_v<SmemLayoutDS>;
  static constexpr int kDqElems = kDqBytes / sizeof(Element);
  static constexpr int kStagePad =
      cute::max(0, cute::max(kDvStageElems - kDsElems, kStageElems - kDsElems - kDqElems));
  // Note [TMA-store dK/dV]: dense problems stage dV over dS and dK over dQ's buffer in the K/V
  // swizzled layouts (column-block-major atoms: one TMA box per 64 columns) and store each with
  // TMA. Trace builds keep the row stores (Note [bwd trace] writes its marks into dV's rows), which
  // also keeps kDkDvRead off the barrier id it shares with the trace's dump (BwdBarrier).
  using SmemLayoutDKst = decltype(tile_to_shape(smem_atom_k<Element, kHeadDim>(),
                                                Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutDVst = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                                Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
#ifdef FA4_TRACE
  static constexpr bool kTmaStoreDkDv = false;
#else
  static constexpr bool kTmaStoreDkDv =
      !kDkDvRegs && cosize_v<SmemLayoutDVst> <= kDsElems && cosize_v<SmemLayoutDKst> <= kDqElems;
#endif

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDO>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDS>> ds;
    Element stage_pad[kStagePad + 8];        // ds, this and dq: the dK/dV staging rows (staging())
    alignas(1024) float4 dq[kDqFloats / 4];  // 1024: dK's swizzled staging (kTmaStoreDkDv)
    alignas(16) float lse2[kStages][kBlockM];   // with Q's stage (bulk copy, pipe_q)
    alignas(16) float dpsum[kStages][kBlockM];  // with dO's stage (pipe_do)
    typename Pipeline::SharedStorage pipe_q;
    typename Pipeline::SharedStorage pipe_do;
    cutlass::arch::ClusterTransactionBarrier kv_full;
    cutlass::arch::ClusterBarrier kv_empty;  // consumers -> producer, the tile's last GEMM done
    uint64_t tile_full[kTileSlots];          // Note [dynamic tiles] (common/tile_ring.cuh)
    uint64_t tile_empty[kTileSlots];
    int tile_item[kTileSlots];
    BwdTrace trace;  // Note [bwd trace]
    __device__ Element* staging() { return ds.data(); }
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM90)");
  static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element) + kRowStatBytes;
  static constexpr uint32_t kDOBytes = kBlockM * kHeadDimV * sizeof(Element) + kRowStatBytes;
  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);
};

// The largest K-major swizzle atom whose row divides half of kCols: operands that the two
// warpgroups split along the head dim (each reads kCols / 2 columns as an MN-major operand) must
// start each half on an atom boundary; 192 / 2 = 96 needs the 32-element (64-byte) atom.
template <class Element, int kCols>
auto smem_atom_halves() {
  if constexpr ((kCols / 2) % 64 == 0) {
    return GMMA::Layout_K_SW128_Atom<Element>{};
  } else {
    return GMMA::Layout_K_SW64_Atom<Element>{};
  }
}

// Traits of the split-d variant (sm90/bwd/consumer_split.cuh) for d or d_v > 128: 64 kv rows
// per CTA; the two warpgroups split the query columns of Sᵀ/dPᵀ (32 each) and the head dim of dK,
// dV and dQ, so each keeps dK, dV, dQ for half the head dim (64 + 64 + 64 registers at d = 256).
// Pᵀ and dSᵀ go through shared memory (both warpgroups read all of them); dQ is added from
// registers with 16-byte reduce-adds in fragment order (no smem left for a dQ buffer at d = 256:
// K, V 32 KB each, Q and dO 2 × 32 KB each, P and dS 2 × 8 KB each = 224 KB).
template <int kHeadDim_, int kHeadDimV_, class Element_>
struct BwdTraitsSplit {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr bool kSplitD = true;
  // Persistent as BwdTraits (Note [persistent bwd]); no shared memory is left to stage dK/dV
  // in, so they leave from registers (Note [split epilogue]).
  static constexpr int kBlockM = 64;  // query rows per step, 32 per warpgroup in Sᵀ and dPᵀ
  static constexpr int kBlockN = 64;  // kv rows per CTA
  static constexpr int kStages = 2;
  static constexpr int kDsStages = 2;  // see kDsWritten in the header
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "halves of whole 32-column atoms");
  static constexpr bool kPostRegs = false;  // Note [postprocess from registers]: not measured here
  static constexpr bool kTmaStoreDkDv = false;  // Note [split epilogue]

  using AtomN2 = Layout<Shape<_1, _2, _1>>;  // the two warpgroups split N
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM / 2>, Int<kHeadDim>>>(),
      AtomN2{}));
  using MmaDP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM / 2>, Int<kHeadDimV>>>(),
      AtomN2{}));
  using MmaDV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV / 2>, Int<kBlockM>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      AtomN2{}));
  using MmaDK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, Int<kBlockM>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      AtomN2{}));
  using MmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomN2{}));

  using SmemLayoutQ = decltype(tile_to_shape(smem_atom_halves<Element, kHeadDim>(),
                                             Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutDO = decltype(tile_to_shape(smem_atom_halves<Element, kHeadDimV>(),
                                              Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStages>>{}));
  using SmemLayoutK = decltype(tile_to_shape(smem_atom_halves<Element, kHeadDim>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutV = decltype(tile_to_shape(smem_atom_k<Element, kHeadDimV>(),
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, _1>{}));
  // P and dS as (q, kv), kv contiguous; read as Pᵀ, dSᵀ (kv, q) by dV, dK and as dS by dQ.
  using SmemLayoutPdS = decltype(tile_to_shape(
      smem_atom_k<Element, kBlockN>(), Shape<Int<kBlockM>, Int<kBlockN>, Int<kDsStages>>{}));
  using SmemLayoutPdSt = TransposedSmem<SmemLayoutPdS, kBlockM, kBlockN, kDsStages>;
  using SmemLayoutQt = TransposedSmem<SmemLayoutQ, kBlockM, kHeadDim, kStages>;
  using SmemLayoutDOt = TransposedSmem<SmemLayoutDO, kBlockM, kHeadDimV, kStages>;
  using SmemLayoutKt = TransposedSmem<SmemLayoutK, kBlockN, kHeadDim, 1>;
  // dQ of one block in fragment order, as in BwdTraits (Note [dQ reduce]), added by atomics.
  static constexpr int kDqFloats = kBlockM * kHeadDim;
  static_assert(kDqFloats % (4 * 256) == 0, "each consumer thread adds whole float4s");

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDO>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutPdS>> p;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutPdS>> ds;
    alignas(16) float lse2[kStages][kBlockM];   // with Q's stage (bulk copy, pipe_q)
    alignas(16) float dpsum[kStages][kBlockM];  // with dO's stage (pipe_do)
    typename Pipeline::SharedStorage pipe_q;
    typename Pipeline::SharedStorage pipe_do;
    cutlass::arch::ClusterTransactionBarrier kv_full;
    cutlass::arch::ClusterBarrier kv_empty;  // as BwdTraits'
    uint64_t tile_full[kTileSlots];          // Note [dynamic tiles] (common/tile_ring.cuh)
    uint64_t tile_empty[kTileSlots];
    int tile_item[kTileSlots];
    BwdTrace trace;  // the producer's marks only (Note [bwd trace] covers d <= 128)
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget (227 KB per CTA on SM90)");
  static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element) + kRowStatBytes;
  static constexpr uint32_t kDOBytes = kBlockM * kHeadDimV * sizeof(Element) + kRowStatBytes;
  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);
};

// As the forward: the producer's TMA and index arithmetic spill at 24 registers.
constexpr int kBwdProducerRegs = 40;
constexpr int kBwdConsumerRegs = 232;  // 40·128 + 232·256 = 64512 = 168·384

// Named barrier ids (user range, above CUTLASS's reserved ones); see the header.
// kDqFull / kDqEmpty are warpgroup 0's (and the split variant's consumer-only barriers),
// kDqFull1 / kDqEmpty1 warpgroup 1's, in the d <= 128 variant.
// Budget: 16 hardware barriers per CTA; 0 is __syncthreads' and CUTLASS reserves 1-7 for its
// collectives (NamedBarrier adds ReservedNamedBarrierCount = 8 to these ids), so ids 0-7 here are
// hardware 8-15, all taken. An id of 8 is hardware barrier 16, which does not exist: ptxas encodes
// it as 0, __syncthreads' barrier, without a warning. So kDkDvRead shares kTraceDump's id, which
// is safe because the two never exist in one build: kDkDvRead is used only where kTmaStoreDkDv,
// kTraceDump only in trace builds (FA4_TRACE), whose kTmaStoreDkDv is false (Note [bwd trace]
// writes its marks into dV's rows, so trace builds keep the row stores).
enum BwdBarrier : uint32_t {
  kDsWritten = 0,
  kDqFull = 1,
  kDqEmpty = 2,
  kDqFull1 = 3,
  kDqEmpty1 = 4,
  kTraceDump = 5,         // consumers and reducer, after a tile's epilogue: Note [bwd trace]
  kEpilogue = 6,          // consumers, Note [dK/dV epilogue]
  kDkDvStaged = 7,        // consumers -> reducer, Note [TMA-store dK/dV]
  kDkDvRead = kTraceDump  // reducer -> consumers, the same; see above for the shared id
};
static_assert(kDkDvStaged + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <
                  cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers,
              "named barrier ids of the backward exceed the hardware's 16");
constexpr int kReducerThreads = 32;  // one warp of the producer warpgroup

// The TMA stores of dK and dV (Note [TMA-store dK/dV]); on: set for dense problems.
template <class T, bool = T::kTmaStoreDkDv>
struct BwdTmaStores {
  static constexpr bool on = false;
};
template <class T>
struct BwdTmaStores<T, true> {
  using Element = typename T::Element;
  using TmaDK = TmaStoreTile<Element, typename T::SmemLayoutDKst, T::kBlockN, T::kHeadDim>;
  using TmaDV = TmaStoreTile<Element, typename T::SmemLayoutDVst, T::kBlockN, T::kHeadDimV>;
  TmaDK tma_dk;
  TmaDV tma_dv;
  Shape<int, int, int, int> shape_dk, shape_dv;
  bool on = false;
};

template <class T>
struct BwdKernelParams {
  using Element = typename T::Element;
  using TmaQ = TmaTile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>;
  using TmaDO = TmaTile<Element, typename T::SmemLayoutDO, T::kBlockM, T::kHeadDimV>;
  using TmaK = TmaTile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>;
  using TmaV = TmaTile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>;
  TmaQ tma_q;
  TmaDO tma_do;
  TmaK tma_k;
  TmaV tma_v;
  Shape<int, int, int, int> shape_q, shape_do, shape_k, shape_v;
  BwdParams p;
  BwdWorkspace ws;
  ScoreScale score;
  BwdGrid grid;
  int group;
  int slice_heads;  // q heads per item (Note [GQA head slices]); group when grid.slices == 1
  int tiles;        // the grid's items (Note [persistent bwd])
  BwdTmaStores<T> out;
};

// One kv tile (an item of the grid) as every role needs it; skip: past its sequence's keys
// (varlen grids are sized by the longest sequence), nothing to load or write. The item's q heads
// are head0 .. head0 + heads - 1 (the whole group, or a slice: Note [GQA head slices]).
struct BwdTile {
  int n, head_kv, b;
  int head0, heads;
  SeqInfo seq;
  Mask mask;
  bool skip;
  template <class KP>
  __device__ static BwdTile of(const KP& kp, int item, int kBlockN) {
    BwdTile t;
    const FwdParams& f = kp.p.fwd;
    int slice;
    kp.grid.decode(item, t.n, t.head_kv, t.b, slice);
    const int first = slice * kp.slice_heads;
    t.head0 = t.head_kv * kp.group + first;
    t.heads = min(kp.slice_heads, kp.group - first);
    t.seq = SeqInfo::get(t.b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
    t.mask = Mask::from_params(f, t.seq.seqlen_q, t.seq.seqlen_k);
    t.skip = t.n * kBlockN >= t.seq.seqlen_k;
    return t;
  }
};

// The TMA partitions of this kv tile's K and V: (global K, smem K, global V, smem V).
template <class T>
__device__ __forceinline__ auto kv_partitions(const BwdKernelParams<T>& kp,
                                              typename T::SharedStorage& ss, const SeqInfo& seq,
                                              int n, int head_kv, int b) {
  const int bidb = kp.p.fwd.cu_seqlens_q != nullptr ? 0 : b;
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);
  Tensor mV = kp.tma_v.get_tma_tensor(kp.shape_v);
  Tensor gK = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mK(_, _, head_kv, bidb)),
                         Shape<Int<T::kBlockN>, Int<T::kHeadDim>>{}, make_coord(n, _0{}));
  Tensor gV = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mV(_, _, head_kv, bidb)),
                         Shape<Int<T::kBlockN>, Int<T::kHeadDimV>>{}, make_coord(n, _0{}));
  auto [tKgK, tKsK] =
      tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] =
      tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  return cute::make_tuple(tKgK, tKsK, tVgV, tVsV);
}

// The loads of one kv tile (the producer thread): Q and dO of every block that sees the tile
// through the pipelines, whose states continue across tiles, and K and V once (kv_full) after
// the first block's (Note [Q/dO before the K/V wait]). wait_kv(): until the K/V buffer is free.
//
// Note [Q/dO before the K/V wait]: a tile's first Q and dO need only a free pipeline stage, which
// the previous tile's second-to-last block frees, not the K/V buffer, which its last GEMM frees;
// they were issued after K and V, after that wait, and the consumers then waited on the first
// dO (ncu at hd128 causal 2k: ~0.9 % of a consumer warp's time there, the K/V wait 0.3 %). Now
// they go first, and K and V of a tile after the first are prefetched into L2 when the tile is
// claimed (the previous tile's last loads are out by then), so that their load after the wait
// reads L2. One block only: a second one's stage is freed by the previous tile's last block,
// right before the K/V buffer, and would go ahead of K and V.
template <class T, class State, class WaitKv>
__device__ __forceinline__ void bwd_producer_tile(const BwdKernelParams<T>& kp,
                                                  typename T::SharedStorage& ss,
                                                  typename T::Pipeline& pipe_q,
                                                  typename T::Pipeline& pipe_do, const BwdTile& t,
                                                  State& q_state, State& do_state, int kv_use,
                                                  WaitKv&& wait_kv) {
  const SeqInfo& seq = t.seq;
  const Mask& mask = t.mask;
  const int n = t.n, head_kv = t.head_kv, b = t.b;
  const bool varlen = kp.p.fwd.cu_seqlens_q != nullptr;
  const int bidb = varlen ? 0 : b;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename T::SmemLayoutDO{});
  // (gK, sK, gV, sV), a tuple: a lambda may not capture structured bindings before C++20.
  const auto kv = kv_partitions(kp, ss, seq, n, head_kv, b);
  if (kv_use > 0) {
    cute::prefetch(kp.tma_k, get<0>(kv));
    cute::prefetch(kp.tma_v, get<2>(kv));
  }
  bool kv_issued = false;
  auto load_kv = [&] {
    wait_kv();
    ss.kv_full.arrive_and_expect_tx(T::kKVBytes);
    copy(kp.tma_k.with(reinterpret_cast<uint64_t&>(ss.kv_full), 0), get<0>(kv), get<1>(kv)(_, 0));
    copy(kp.tma_v.with(reinterpret_cast<uint64_t&>(ss.kv_full), 0), get<2>(kv), get<3>(kv)(_, 0));
    kv_issued = true;
  };

  Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);
  Tensor mDO = kp.tma_do.get_tma_tensor(kp.shape_do);
  const int64_t row0_ws = kp.ws.row_offset(b, seq.offset_q, 0);
  int m_begin, m_end;
  q_blocks_seeing<T>(mask, n, m_begin, m_end);
  for (int g = 0; g < t.heads; ++g) {
    const int head = t.head0 + g;
    Tensor gQ = local_tile(domain_offset(make_coord(seq.offset_q, _0{}), mQ(_, _, head, bidb)),
                           Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gDO = local_tile(domain_offset(make_coord(seq.offset_q, _0{}), mDO(_, _, head, bidb)),
                            Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{}, make_coord(_, _0{}));
    auto [tQgQ, tQsQ] =
        tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tDgD, tDsD] = tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sDO),
                                      group_modes<0, 2>(gDO));
    const float* lse2 = kp.ws.lse2(head) + row0_ws;
    const float* dpsum = kp.ws.dpsum(head) + row0_ws;
    for (int m = m_begin; m < m_end; ++m) {
      // Q with its rows' lse₂, dO with its rows' D: each pair completes one stage's barrier.
      pipe_q.producer_acquire(q_state);
      uint64_t* bar_q = pipe_q.producer_get_barrier(q_state);
      copy(kp.tma_q.with(*bar_q, 0), tQgQ(_, m), tQsQ(_, q_state.index()));
      SM90_BULK_COPY_G2S::copy(lse2 + m * T::kBlockM, bar_q, ss.lse2[q_state.index()],
                               T::kRowStatBytes);
      ++q_state;
      pipe_do.producer_acquire(do_state);
      uint64_t* bar_do = pipe_do.producer_get_barrier(do_state);
      copy(kp.tma_do.with(*bar_do, 0), tDgD(_, m), tDsD(_, do_state.index()));
      SM90_BULK_COPY_G2S::copy(dpsum + m * T::kBlockM, bar_do, ss.dpsum[do_state.index()],
                               T::kRowStatBytes);
      ++do_state;
      if (!kv_issued) load_kv();
    }
  }
  if (!kv_issued) load_kv();  // a tile that no Q block sees
}

// Note [persistent bwd]: the producer thread walks the CTA's items (common/tile_ring.cuh: the first
// is blockIdx.x, each next one claimed once the current tile's loads are issued) and publishes each
// that has keys to the consumers (and at d <= 128 the reducer) before loading it. A tile's K and V
// go into the single K/V buffer once the consumers have finished the previous tile's GEMMs
// (kv_empty), while they still run its epilogue, so the next tile's loads overlap that epilogue.
// The one-CTA-per-tile grid paid, per CTA at hd128 1k of ~42 us, K/V landing 1.8 us, the first
// Q/dO 1.3, barrier init 0.5 and 1.0 between CTAs of an SM; with this walk the first Q/dO and the
// init are hidden and K/V still land ~1.5 us into the next tile (+7 % at 1k). K/V take ~5.9 us
// from issue to landing at hd128 1k, 5.4 without the next Q/dO loads behind them and 4.1 without
// the dK/dV stores, so neither copy is what delays them, and reordering the tile boundary's
// copies would not pay. The split variant (d > 128) walks the same way since its epilogue left
// shared memory (Note [split epilogue]). An item past kp.tiles ends the walk; the end marker (-1)
// tells the readers.
template <class T>
__device__ __forceinline__ void bwd_producer(const BwdKernelParams<T>& kp,
                                             typename T::SharedStorage& ss,
                                             typename T::Pipeline& pipe_q,
                                             typename T::Pipeline& pipe_do) {
  auto q_state = cutlass::make_producer_start_state<typename T::Pipeline>();
  auto do_state = q_state;
  int64_t* counter = kp.p.fwd.tile_counter;
  int t = 0;  // tiles published: the K/V buffer's uses (kv_full's and kv_empty's phases)
  for (int64_t item = blockIdx.x; item < kp.tiles; item = next_item(counter, item)) {
    const BwdTile tile = BwdTile::of(kp, int(item), T::kBlockN);
    if (tile.skip) continue;  // not published: the readers see only tiles with keys
    publish_item(ss.tile_full, ss.tile_empty, ss.tile_item, t, int(item));
    bwd_producer_tile(kp, ss, pipe_q, pipe_do, tile, q_state, do_state, t, [&] {
      ss.trace.producer_mark(t, 8);
      if (t > 0) ss.kv_empty.wait(uint32_t((t - 1) & 1));
      ss.trace.producer_mark(t, 9);
    });
    ++t;
  }
  finish_claims(counter);
  publish_item(ss.tile_full, ss.tile_empty, ss.tile_item, t, -1);
  pipe_q.producer_tail(q_state);
  pipe_do.producer_tail(do_state);
}

// Pins a 16-bit register fragment's packed 32-bit registers here: without it the compiler packs
// pairs lazily between the wgmmas that read them, and ptxas then serializes every wgmma.
template <class Frag>
__device__ __forceinline__ void fence_packed(Frag& frag) {
  Tensor words = recast<uint32_t>(frag);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(words); ++i) warpgroup_fence_operand(words(i));
}

// Accumulator element i of a wgmma fragment at its (row, col) in the tile: identity tensors
// partitioned like the accumulator (no layout formulas repeated here).
template <class TiledMma, class Shape2>
__device__ __forceinline__ auto fragment_coords(const TiledMma& mma, int tid, Shape2 shape) {
  return mma.get_thread_slice(tid).partition_C(make_identity_tensor(shape));
}

// Note [dQ reduce]: each 64-row Q block's dQ (kBlockM × d fp32, summed over the tile's kv rows
// by the dQ GEMM) is added to the workspace accumulator by one bulk reduce-add
// (cp.reduce.async.bulk .add.f32) of the whole block: 1 operation per 64 × d block, where a
// per-element scheme issues 64·d atomics (8192 at d = 128) and float2 atomics half that (the split
// variant, d > 128, adds from registers with 16-byte reduce-adds: a quarter; at d <= 128 only the
// 128-row blocks gain from those, Note [dQ from registers]). The block is stored in fragment order,
// both in shared memory and in the workspace: float4 j of consumer thread t at (j·256 + t)·4, so
// that the consumers' stores are conflict-free 16-byte stores at fixed offsets (a row-major buffer
// would cost 8-way bank conflicts, a swizzled one per-element address registers), and the reduce is
// one contiguous copy. The postprocess kernel, which knows the fragment's coordinates
// (fragment_coords of MmaDQ), turns it back into rows; the split variant adds its own fragment's
// float4s at the same offsets. Rows past the sequence land in the workspace's per-sequence padding
// and are never read back.
//
// One 16-byte fp32 reduce-add (no return value: atomicAdd(float2*) compiled to ATOMG, which
// returns the old values): a quarter of the operations of a per-element scheme.
__device__ __forceinline__ void red_add_f32x4(float* at, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(at), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

// A thread's dQ fragment added to the workspace in fragment order (Note [dQ reduce]): float4 j
// of thread tid at dq + 4 (j * kThreads + tid); `dq` already holds the 4 * tid.
template <int kThreads, class Frag>
__device__ __forceinline__ void red_add_fragment(float* dq, const Frag& acc) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < size(acc) / 4; ++j) {
    red_add_f32x4(dq + 4 * j * kThreads, acc(4 * j), acc(4 * j + 1), acc(4 * j + 2),
                  acc(4 * j + 3));
  }
}

// The inverse: a thread's fragment read back from fragment order (Note [GQA head slices]: the
// dK / dV accumulators); `src` already holds the 4 * tid.
template <int kThreads, class Frag>
__device__ __forceinline__ void load_fragment(const float* src, Frag& acc) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < size(acc) / 4; ++j) {
    const float4 v = reinterpret_cast<const float4*>(src)[j * kThreads];
    acc(4 * j) = v.x;
    acc(4 * j + 1) = v.y;
    acc(4 * j + 2) = v.z;
    acc(4 * j + 3) = v.w;
  }
}

// Note [dQ from registers]: with 128-row Q blocks (hd64, BwdTraits::kDqFromRegisters) and
// outside deterministic mode the consumers add their dQ fragment to the workspace with
// red_add_f32x4 (as the split variant), at the same fragment-order offsets, instead of storing it
// to ss.dq for the reducer's bulk reduce-add; the reducer then skips the tile. Measured at hd64
// with dQ split by rows: +2.4 % at 1k, +5-7 % causal 512 / 1k, level at 16k (the reducer's tail
// after a tile's last block goes away). At hd128 the same path measured -4 % at 2k and 16k, so
// 64-row blocks keep the reducer, whose shared-memory reads do not stretch the loop there (the
// trace without the bulk reduce-adds kept the 4078-cycle block period). Deterministic mode keeps
// the reducer (its turn order).

// One TMA store of this tile's kN rows of a kv-row tensor from `buf` (Layout).
template <class T, class Layout, int kCols, class Tma, class Shape4>
__device__ __forceinline__ void tma_store_rows(const Tma& tma, const Shape4& shape,
                                               typename T::Element* buf, int n, int head_kv,
                                               int b) {
  Tensor m = tma.get_tma_tensor(shape);
  Tensor g =
      local_tile(m(_, _, head_kv, b), Shape<Int<T::kBlockN>, Int<kCols>>{}, make_coord(n, _0{}));
  Tensor sbuf = make_tensor(make_smem_ptr(buf), Layout{});
  auto cta = tma.get_slice(_0{});
  copy(tma, cta.partition_S(sbuf), cta.partition_D(g));
}

// The reducer's part of Note [TMA-store dK/dV] (sm90/bwd/epilogue.cuh; its whole warp calls it
// after the tile's last reduce-add): both stores, then kDkDvRead once they have read shared
// memory.
template <class T>
__device__ __forceinline__ void issue_dk_dv_tma(const BwdKernelParams<T>& kp,
                                                typename T::SharedStorage& ss, const BwdTile& t,
                                                bool leader) {
  using Element = typename T::Element;
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads + kReducerThreads, kDkDvStaged);
  if (leader) {
    tma_store_rows<T, typename T::SmemLayoutDVst, T::kHeadDimV>(kp.out.tma_dv, kp.out.shape_dv,
                                                                ss.ds.data(), t.n, t.head_kv, t.b);
    tma_store_rows<T, typename T::SmemLayoutDKst, T::kHeadDim>(
        kp.out.tma_dk, kp.out.shape_dk, reinterpret_cast<Element*>(ss.dq), t.n, t.head_kv, t.b);
    tma_store_arrive();
    tma_store_wait<0>();
  }
  __syncwarp();
  cutlass::arch::NamedBarrier::arrive(T::kConsumerThreads + kReducerThreads, kDkDvRead);
}

// The reducer warp: one bulk reduce-add per Q block, in the consumers' order.
template <class T>
__device__ __forceinline__ void bwd_dq_reducer_tile(const BwdKernelParams<T>& kp,
                                                    typename T::SharedStorage& ss, const BwdTile& t,
                                                    bool leader) {
  const SeqInfo& seq = t.seq;
  const Mask& mask = t.mask;
  const int n = t.n, b = t.b;
  constexpr int kHalfBarrierThreads = 128 + kReducerThreads;  // one consumer warpgroup + this warp
  const int64_t row0_ws = kp.ws.row_offset(b, seq.offset_q, 0);
  const uint32_t src = cute::cast_smem_ptr_to_uint(ss.dq);
  int m_begin, m_end;
  q_blocks_seeing<T>(mask, n, m_begin, m_end);
  const int blocks = t.heads * (m_end - m_begin);
  const bool skip = T::kDqFromRegisters && !kp.p.fwd.deterministic;  // Note [dQ from registers]
  for (int i = 0; i < (skip ? 0 : blocks); ++i) {
    const int head = t.head0 + i / (m_end - m_begin);
    const int64_t row = row0_ws + int64_t(m_begin + i % (m_end - m_begin)) * T::kBlockM;
    cutlass::arch::NamedBarrier::sync(kHalfBarrierThreads, kDqFull);
    cutlass::arch::NamedBarrier::sync(kHalfBarrierThreads, kDqFull1);
    ss.trace.mark(leader, 2, i, 0);
    if (leader) {
      int* sem = kp.p.fwd.deterministic ? kp.ws.sem(head, row) : nullptr;
      if (sem != nullptr) {
        const int m = int(row - row0_ws) / T::kBlockM;
        dq_turn_wait(sem, dq_turn(block_range<T::kBlockM, T::kBlockN>(mask, m), n));
      }
      float* dst = kp.ws.dq(head) + row * T::kHeadDim;
      asm volatile(
          "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
          "r"(src), "r"(T::kDqBytes)
          : "memory");
      tma_store_arrive();
      if (sem != nullptr) dq_turn_pass(sem);
      tma_store_wait<0>();  // the smem has been read
    }
    ss.trace.mark(leader, 2, i, 1);
    __syncwarp();
    // Also after a tile's last block: the consumers wait for it before staging dK/dV over dQ's
    // buffer (Note [persistent bwd]).
    cutlass::arch::NamedBarrier::arrive(kHalfBarrierThreads, kDqEmpty);
    cutlass::arch::NamedBarrier::arrive(kHalfBarrierThreads, kDqEmpty1);
  }
  ss.trace.cta_mark(leader, 6);
  ss.trace.reducer_done(kTraceDump);
}

// The reducer warp's walk over the CTA's tiles, as published by the producer.
template <class T>
__device__ __forceinline__ void bwd_dq_reducer(const BwdKernelParams<T>& kp,
                                               typename T::SharedStorage& ss) {
  const bool leader = cute::elect_one_sync();
  for (int t = 0;; ++t) {
    const int item = take_item(ss.tile_full, ss.tile_empty, ss.tile_item, t);
    if (item < 0) break;
    const BwdTile tile = BwdTile::of(kp, item, T::kBlockN);
    bwd_dq_reducer_tile(kp, ss, tile, leader);
    if constexpr (T::kTmaStoreDkDv) {
      if (kp.out.on) issue_dk_dv_tma(kp, ss, tile, leader);
    }
  }
  // The last reduce-add must finish before the CTA (and its shared memory) goes away.
  if (leader) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// One GEMM of the backward on the tensor cores as one wgmma batch: k-slices of a and b into c,
// overwriting c first when zero. Not waited for (warpgroup_wait by the caller).
template <bool kDesc64 = true, class Mma, class A, class B, class C>
__device__ __forceinline__ void issue_gemm(Mma& mma, const A& a, const B& b, C& c, bool zero) {
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = zero ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  auto&& a64 = desc64<kDesc64>(a);  // Note [64-bit descriptor steps]
  auto&& b64 = desc64<kDesc64>(b);
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a64(_, _, k), b64(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// P and dS of one iteration, for both consumers. Called with Sᵀ done and dPᵀ still running (the
// Sᵀ/dPᵀ batches issued in that order): P in place in acc_s while dPᵀ runs, then, after waiting
// for dPᵀ, P and dS as 16-bit into reg_p and reg_ds (the fp32 registers die as the 16-bit ones are
// made). Mask and softcap are decided once per block: with run-time tests inside the unrolled
// loops the compiler kept branches per element (~40 instructions per element instead of ~6).
// With softcap, P and the tanh derivative are both computed after the wait (keeping P and
// P·(1 − x²) across it would need 16 more registers, and ptxas then serializes the wgmmas). lse₂
// is +inf for rows that saw no key, so P = 2^-inf = 0 there (Note [empty rows]). coords(e): the
// (kv row, query column) of element e in the block; lse2, dpsum: the block's 64 row statistics.
template <class Score, class Coords, class AccS, class AccDP, class RegP, class RegDS>
__device__ __forceinline__ void p_and_ds(const Score& score, const Mask& mask, bool masked, int kv0,
                                         int q0, const Coords& coords, const float* lse2,
                                         const float* dpsum, AccS& acc_s, AccDP& acc_dp,
                                         RegP& reg_p, RegDS& reg_ds) {
  using Element = typename RegP::value_type;
  // Note [band test] (common/mask.cuh): element e's key - query is band0 plus coords(e) -
  // coords(0), a compile-time offset (coords is an identity tensor partitioned by thread).
  const int band0 = kv0 + get<0>(coords(0)) - (q0 + get<1>(coords(0))) - mask.diag_lo;
  auto run = [&](auto masked_c, auto softcap_c) {
    constexpr bool kMasked = decltype(masked_c)::value, kSoftcap = decltype(softcap_c)::value;
    auto prob = [&](int e, float x) {
      const int qi = get<1>(coords(e));
      const float pv = exp2_hw(fmaf(x, score.scale_log2, -lse2[qi]));
      if constexpr (kMasked) {
        const int kv = get<0>(coords(e));
        const int diff = band0 + (kv - get<0>(coords(0))) - (qi - get<1>(coords(0)));
        return Mask::in_band(diff, mask.key_width(kv0 + kv)) ? pv : 0.0f;
      } else {
        return pv;
      }
    };
    if constexpr (!kSoftcap) {
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < size(acc_s); ++e) acc_s(e) = prob(e, acc_s(e));
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dp);
    // Elements 2j and 2j + 1 are one 32-bit register of the 16-bit operands: converted as a
    // pair (one F2FP each for P and dS), the compiler has no halves to shuffle (converted one by
    // one, it packed P with dS and sorted the halves out with PRMT and moves).
    using Pair = cutlass::Array<Element, 2>;
    cutlass::NumericArrayConverter<Element, float, 2, cutlass::FloatRoundStyle::round_to_nearest>
        convert;
    auto* p_pairs = reinterpret_cast<Pair*>(raw_pointer_cast(reg_p.data()));
    auto* ds_pairs = reinterpret_cast<Pair*>(raw_pointer_cast(reg_ds.data()));
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < size(acc_s); e += 2) {
      cutlass::Array<float, 2> pv, ds;
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        float p1 = acc_s(e + h), dpv = p1;  // dS = dpv · (dP − D): P, or P·(1 − x²) with softcap
        if constexpr (kSoftcap) {
          const float x = softcap_tanh(acc_s(e + h) * score.pre);
          p1 = prob(e + h, x);
          dpv = p1 * (1.0f - x * x);
        }
        pv[h] = p1;
        ds[h] = dpv * (acc_dp(e + h) - dpsum[get<1>(coords(e + h))]);
      }
      p_pairs[e / 2] = convert(pv);
      ds_pairs[e / 2] = convert(ds);
    }
  };
  using True = cute::true_type;
  using False = cute::false_type;
  if (masked) {
    score.softcap ? run(True{}, True{}) : run(True{}, False{});
  } else {
    score.softcap ? run(False{}, True{}) : run(False{}, False{});
  }
}

}  // namespace fa4::sm90
