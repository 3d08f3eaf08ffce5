// SM100 tensor memory (TMEM): the forward's and the backward's column plans, allocation, and
// tcgen05.ld / st helpers.
//
// TMEM is 128 lanes × 512 columns × 32 bit per SM. A tile row lives in one lane; an fp32 S or O
// row of n elements takes n columns, a 16-bit P row n / 2 columns (two values per 32-bit cell).
// Each warp of a warpgroup reaches only its quarter of the lanes (32 × (warp % 4) onward), which
// is why the softmax and correction roles are whole warpgroups: one 128-row tile, one
// warpgroup.
//
// Note [TMEM plan]: per CTA two Q tiles of 128 rows ping-pong (DESIGN §1): S0 | S1 | O0 | O1.
//   d_v = 64,  kBlockN 128: 128 + 128 +  64 +  64 = 384 columns
//   d_v = 128, kBlockN 128: 128 + 128 + 128 + 128 = 512 columns (the whole TMEM)
//   d_v = 192, kBlockN  64:  64 +  64 + 192 + 192 = 512 columns
//   (d, d_v) = (192, 128), kBlockN 64 (shared memory, fwd_block_n): 64 + 64 + 128 + 128 = 384
//   d_v = 256: the two O tiles alone take 512 columns, so hd 256 runs one Q tile per CTA with
//              its S double-buffered instead (kQTiles = 1, kBlockN 64 for shared memory):
//              S0 | S1 | O0 = 64 + 64 + 256 = 384 columns; S(i + 1) is computed into the other
//              buffer while the softmax works on S(i) (Note [one-tile order] in
//              sm100/fwd/kernel.cuh).
// P (16-bit) is written over the first kBlockN / 2 columns of its S: the softmax warpgroup has
// loaded its whole S row into registers (one tcgen05.ld per 32 columns, all waited for) before
// it stores P (then arrives on kPFull), and the MMA thread issues the next S = Q·Kᵀ into that
// region after the P·V that reads P: tcgen05 MMAs of one thread execute in issue order, so no
// barrier separates the two (sm100/fwd/kernel.cuh, mma_role).
//
// The plan (FwdTmemPlan) compiles on the host too, so tests/models/test_tmem_plan.py checks every
// head dim's plan for overlaps and the 512-column limit, next to the static_asserts here.
#pragma once

#include <stdint.h>

#include "common/host_device.cuh"

namespace fa4::sm100 {

constexpr uint32_t kTmemColumns = 512;
constexpr uint32_t kTmemLanes = 128;

// The smallest legal allocation (a power of two, >= 32 columns) that holds `columns`.
__host__ __device__ constexpr uint32_t tmem_alloc_columns(uint32_t columns) {
  uint32_t n = 32;
  while (n < columns) n *= 2;
  return n;
}

// Column offsets of the forward's TMEM regions (Note [TMEM plan]).
template <int kHeadDimV, int kBlockN>
struct FwdTmemPlan {
  static constexpr int kQTiles = 2 * (kBlockN + kHeadDimV) <= int(kTmemColumns) ? 2 : 1;
  enum : uint32_t {
    kS0 = 0,
    kS1 = kS0 + kBlockN,  // Q tile 1's S, or with one Q tile the second S buffer
    kO0 = kS0 + 2 * kBlockN,
    kO1 = kO0 + kHeadDimV,  // unused when kQTiles == 1
    kEnd = kO0 + kQTiles * kHeadDimV,
    kP0 = kS0,  // 16-bit P over its S
    kP1 = kS1,
    kPColumns = kBlockN / 2,
  };
  static constexpr uint32_t kAllocColumns = tmem_alloc_columns(kEnd);
  static_assert(kBlockN % 32 == 0 && kHeadDimV % 32 == 0, "tcgen05.ld moves 32-column chunks");
  static_assert(kEnd <= kTmemColumns, "TMEM plan: S and O tiles exceed 512 columns");
  static_assert(kAllocColumns <= kTmemColumns, "TMEM allocation above 512 columns");
  static_assert(kPColumns <= kBlockN, "P must fit inside its S region");
};

// The plans the SM100 forward instantiates (kBlockN per head dim, Note [TMEM plan]). kHeadDim
// (of Q and K) matters through shared memory: (192, 128) at kBlockN 128 would need Q 2×48 KB +
// K 2×48 KB + V 2×32 KB = 256 KB > 227 KB, so it runs at 64 like hd 192.
// hd 256 runs at 64 too: Q 64 KB + K 2 × 32 KB + V 2 × 32 KB = 192 KB.
template <int kHeadDimV, int kHeadDim = kHeadDimV>
__host__ __device__ constexpr int fwd_block_n() {
  return kHeadDimV <= 128 && kHeadDim <= 128 ? 128 : 64;
}
static_assert(FwdTmemPlan<64, fwd_block_n<64>()>::kQTiles == 2, "hd64 ping-pongs two Q tiles");
static_assert(FwdTmemPlan<128, fwd_block_n<128>()>::kEnd == 512, "hd128 uses all of TMEM");
static_assert(FwdTmemPlan<192, fwd_block_n<192>()>::kQTiles == 2, "hd192 ping-pongs at N=64");
static_assert(FwdTmemPlan<128, fwd_block_n<128, 192>()>::kEnd == 384, "(192, 128): N=64, 384");
static_assert(FwdTmemPlan<256, fwd_block_n<256>()>::kQTiles == 1, "hd256: one Q tile per CTA");
static_assert(FwdTmemPlan<256, fwd_block_n<256>()>::kEnd == 384, "hd256: S0 | S1 | O0");

// Note [bwd TMEM plan]: the SM100 backward (sm100/bwd/kernel.cuh), one CTA per 128-row kv tile,
// 128-row Q blocks. Lanes are kv rows for S, P, dP, dS, dK, dV and query rows for dQ:
//   S | dP | dK | dV, with P (16-bit) over S, dS (16-bit) over dP and dQ (fp32) over dP/dS:
//   d = 64:  128 + 128 +  64 +  64 = 384 columns
//   d = 96:  128 + 128 +  96 +  96 = 448
//   d = 128: 128 + 128 + 128 + 128 = 512 (the whole TMEM)
// dQ = dSᵀ·K may overwrite dS because the MMA thread issues it after dK += dS·Q, which reads dS
// (tcgen05 MMAs of one thread execute in order); the next dP may overwrite dQ only after the
// reduce warpgroup has loaded it (barrier kDqEmpty). Each compute warpgroup owns half of the
// query columns of S and dP and writes its P / dS (half as many columns) over the first half of
// its own S / dP columns, so neither warpgroup overwrites a value the other has not loaded yet;
// the MMA thread addresses P and dS per 16-column K slice accordingly (p_column). d > 128 does
// not fit (dK and dV alone take 2·d columns next to S and dP): Note [bwd head-dim split].
template <int kHeadDim, int kHeadDimV, int kBlockM>
struct BwdTmemPlan {
  static constexpr int kDqCols = kHeadDim > kBlockM ? kHeadDim : kBlockM;
  enum : uint32_t {
    kS = 0,              // S, then P over its columns
    kDP = kS + kBlockM,  // dP, then dS over it, then dQ (query rows as lanes)
    kDQ = kDP,
    kDK = kDP + kDqCols,
    kDV = kDK + kHeadDim,
    kEnd = kDV + kHeadDimV,
  };
  static constexpr uint32_t kAllocColumns = tmem_alloc_columns(kEnd);
  static_assert(kBlockM % 64 == 0 && kHeadDim % 32 == 0 && kHeadDimV % 32 == 0,
                "two warpgroups of 32-column tcgen05.ld chunks");
  static_assert(kEnd <= kTmemColumns, "bwd TMEM plan: S, dP, dK, dV exceed 512 columns");
  // Column of 16-bit K slice k (16 query columns) of P (region kS) or dS (region kDP): warpgroup
  // w = k / (kBlockM / 32) wrote its slices over the first half of its own kBlockM / 2 columns.
  __host__ __device__ static constexpr uint32_t slice_column(uint32_t region, int k) {
    constexpr int kSlicesPerWg = kBlockM / 2 / 16;
    return region + uint32_t(k / kSlicesPerWg) * (kBlockM / 2) + uint32_t(k % kSlicesPerWg) * 8;
  }
};
// BwdShape: at d or d_v > 128 no plan above fits (dK and dV alone take 2·d columns next to S
// and dP), so each of kSplit = 2 CTAs per kv tile owns half of the dK, dQ and dV columns (Note
// [bwd head-dim split] in sm100/bwd/kernel.cuh) and has the plan of the halves, with 64-row Q
// blocks (set by shared memory):
//   d = 192:     S 64 | dP, dQ 96 | dK 96 | dV 96 = 352 columns
//   (192, 128):  S 64 | dP, dQ 96 | dK 96 | dV 64 = 320
//   d = 256:     S 64 | dP, dQ 128 | dK 128 | dV 128 = 448
// The dQ of a 64-row Q block is an M = 64 MMA, in lanes 0-15 of each 32-lane quarter of its
// columns (Note [M = 64 dQ] in sm100/bwd/roles.cuh).
template <int kHeadDim, int kHeadDimV>
struct BwdShape {
  static constexpr int kSplit = kHeadDim > 128 || kHeadDimV > 128 ? 2 : 1;
  static constexpr int kSliceD = kHeadDim / kSplit;    // dK and dQ columns of one CTA
  static constexpr int kSliceDV = kHeadDimV / kSplit;  // dV columns of one CTA
  static constexpr int kBlockM = kSplit == 1 ? 128 : 64;
  using Plan = BwdTmemPlan<kSliceD, kSliceDV, kBlockM>;
};
static_assert(BwdShape<256, 256>::Plan::kEnd == 448, "bwd hd256 split: 448 columns");
static_assert(BwdShape<192, 128>::Plan::kDV == 256, "bwd (192, 128) split: dV after dK's 96");
static_assert(BwdTmemPlan<128, 128, 128>::kEnd == 512, "bwd hd128 uses all of TMEM");
static_assert(BwdTmemPlan<64, 64, 128>::kEnd == 384, "bwd hd64: 384 columns");
static_assert(BwdTmemPlan<128, 128, 128>::slice_column(BwdTmemPlan<128, 128, 128>::kS, 4) == 64,
              "warpgroup 1's first P slice starts on its own S half");

// TMEM address of (lane, column): lane in bits 31..16, column in 15..0.
__host__ __device__ constexpr uint32_t tmem_addr(uint32_t base, uint32_t lane, uint32_t column) {
  return base + (lane << 16) + column;
}

// Declared in both of nvcc's passes: the kernels' templates name these helpers with
// non-dependent arguments, which the host pass looks up too (guarded by __CUDA_ARCH__ instead,
// the host pass of every SM100 kernel translation unit stops at "identifier undefined"). g++ (the
// host harnesses of tests/cpp) sees only the plan above.
#if defined(__CUDACC__)

// Allocation by one full warp, which must also free it (the same warp, at the end); the
// address is written to shared memory, read by the other roles after a barrier.
__device__ __forceinline__ void tmem_allocate(uint32_t* smem_dst, uint32_t columns) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(dst),
               "r"(columns));
}
__device__ __forceinline__ void tmem_relinquish() {
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::);
}
__device__ __forceinline__ void tmem_free(uint32_t base, uint32_t columns) {
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(base), "r"(columns));
}

// Ordering of tcgen05 operations around thread synchronization (mbarrier waits and arrives,
// named barriers): "before" on the signalling side, "after" on the waiting side.
__device__ __forceinline__ void tmem_fence_before_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
__device__ __forceinline__ void tmem_fence_after_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}
// A kernel's TMEM lifetime: one warp (`alloc_warp`) allocates and the whole CTA reads the base
// address after a block-wide barrier (which also publishes the mbarrier inits made before it);
// after every role has returned, a block-wide barrier, then that warp frees the columns.
__device__ __forceinline__ uint32_t tmem_allocate_for_cta(bool alloc_warp, uint32_t* slot,
                                                          uint32_t columns) {
  if (alloc_warp) {
    tmem_allocate(slot, columns);
    tmem_relinquish();
  }
  tmem_fence_before_sync();
  __syncthreads();
  tmem_fence_after_sync();
  return *slot;
}
__device__ __forceinline__ void tmem_free_for_cta(bool alloc_warp, uint32_t base,
                                                  uint32_t columns) {
  tmem_fence_before_sync();
  __syncthreads();
  if (alloc_warp) {
    tmem_fence_after_sync();
    tmem_free(base, columns);
  }
}

// tcgen05.ld / st are asynchronous: registers are valid (ld) or TMEM written (st) only after
// these.
__device__ __forceinline__ void tmem_wait_ld() {
  asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void tmem_wait_st() {
  asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory");
}

// 32 consecutive columns of this warp's 32 lanes (32x32b shape, x32): thread t gets lane
// (32 × (warp % 4) + t) of `taddr`'s lane base, columns [col, col + 32) into r[0..31].
__device__ __forceinline__ void tmem_load_32(uint32_t taddr, uint32_t (&r)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]),
        "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]),
        "=r"(r[14]), "=r"(r[15]), "=r"(r[16]), "=r"(r[17]), "=r"(r[18]), "=r"(r[19]), "=r"(r[20]),
        "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]), "=r"(r[25]), "=r"(r[26]), "=r"(r[27]),
        "=r"(r[28]), "=r"(r[29]), "=r"(r[30]), "=r"(r[31])
      : "r"(taddr));
}

// 8 consecutive columns (x8): an e4m3 P row of 32 elements, packed four per column.
__device__ __forceinline__ void tmem_store_8(uint32_t taddr, const uint32_t (&r)[8]) {
  asm volatile(
      "tcgen05.st.sync.aligned.32x32b.x8.b32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8};" ::"r"(taddr),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[4]), "r"(r[5]), "r"(r[6]), "r"(r[7]));
}

// 16 consecutive columns (x16): a 16-bit P row of 32 elements, packed two per column.
__device__ __forceinline__ void tmem_store_16(uint32_t taddr, const uint32_t (&r)[16]) {
  asm volatile(
      "tcgen05.st.sync.aligned.32x32b.x16.b32 [%0], "
      "{%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16};" ::"r"(taddr),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[4]), "r"(r[5]), "r"(r[6]), "r"(r[7]),
      "r"(r[8]), "r"(r[9]), "r"(r[10]), "r"(r[11]), "r"(r[12]), "r"(r[13]), "r"(r[14]), "r"(r[15]));
}

// 32 consecutive columns (x32): the correction warpgroup's O rescale writes back what it loaded.
__device__ __forceinline__ void tmem_store_32(uint32_t taddr, const uint32_t (&r)[32]) {
  asm volatile(
      "tcgen05.st.sync.aligned.32x32b.x32.b32 [%0], "
      "{%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
      "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32};" ::"r"(
          taddr),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[4]), "r"(r[5]), "r"(r[6]), "r"(r[7]),
      "r"(r[8]), "r"(r[9]), "r"(r[10]), "r"(r[11]), "r"(r[12]), "r"(r[13]), "r"(r[14]), "r"(r[15]),
      "r"(r[16]), "r"(r[17]), "r"(r[18]), "r"(r[19]), "r"(r[20]), "r"(r[21]), "r"(r[22]),
      "r"(r[23]), "r"(r[24]), "r"(r[25]), "r"(r[26]), "r"(r[27]), "r"(r[28]), "r"(r[29]),
      "r"(r[30]), "r"(r[31]));
}

#endif  // __CUDACC__

}  // namespace fa4::sm100
