// Pieces shared by the SM100 forward and backward kernels: mbarrier rings and waits,
// tcgen05.commit, the generic-to-async proxy fence, and the 16-bit packing of fp32 rows that
// their epilogues write. Device code only (sm_100a).
#pragma once

#include <stdint.h>

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "common/host_device.cuh"
#ifdef FA4_SM100_DEBUG
#include "common/debug_wait.cuh"
#endif

// Bring-up builds (-DFA4_SM100_DEBUG, setup.py's FA4_SM100_DEBUG=1): every wait is bounded and
// names itself on expiry (common/debug_wait.cuh, Note [debug area]); the kernels register their
// barrier table and each role its loop position. Without the flag these expand to nothing.
#ifdef FA4_SM100_DEBUG
#define FA4_SM100_DEBUG_BEGIN(KERNEL, TABLE, BARS, ROLE) \
  ::fa4::debug::kernel_begin<TABLE>(::fa4::debug::KernelId::KERNEL, BARS, int(ROLE))
#define FA4_SM100_DEBUG_TILE(B, H, T) ::fa4::debug::site_tile(B, H, T)
#define FA4_SM100_DEBUG_BLOCK(N) ::fa4::debug::site_block(N)
#define FA4_SM100_DEBUG_ATTACH(STREAM) ::fa4::debug::attach(STREAM)
#else
#define FA4_SM100_DEBUG_BEGIN(KERNEL, TABLE, BARS, ROLE) ((void)0)
#define FA4_SM100_DEBUG_TILE(B, H, T) ((void)0)
#define FA4_SM100_DEBUG_BLOCK(N) ((void)0)
#define FA4_SM100_DEBUG_ATTACH(STREAM) ((void)0)
#endif

namespace fa4::sm100 {

// Compile-time check of the kernels' role tables: the device-side role function follows the
// table (the barrier tables' checks: common/barrier_table.cuh).
template <class Role, int N, class Fn>
constexpr bool roles_match(const Role (&table)[N], Fn role_of) {
  for (int w = 0; w < N; ++w) {
    if (role_of(w) != table[w]) return false;
  }
  return true;
}

// Phase parity of the k-th completion a consumer waits for on a barrier with `copies` copies
// used round robin: copy k % copies, parity (k / copies) & 1. A producer waiting for a free
// buffer waits on the opposite parity, which a fresh barrier satisfies at once.
struct Ring {
  uint32_t count = 0;
  __device__ int index(int copies) const { return int(count % uint32_t(copies)); }
  __device__ uint32_t parity(int copies) const { return (count / uint32_t(copies)) & 1u; }
};

__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
#ifdef FA4_SM100_DEBUG
  debug::wait<false>(bar, parity);
#else
  cutlass::arch::ClusterBarrier::wait(bar, parity);
#endif
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
#ifdef FA4_SM100_DEBUG
  debug::trace(debug::Event::kArrive, debug::smem_addr(bar), 0);
#endif
  cutlass::arch::ClusterBarrier::arrive(bar);
}
// tcgen05.commit: the barrier's arrival happens when every tcgen05 operation this thread has
// issued so far has completed (issued by the single MMA thread).
__device__ __forceinline__ void umma_commit(uint64_t* bar) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
#ifdef FA4_SM100_DEBUG
  debug::trace(debug::Event::kCommit, addr, 0);
#endif
  asm volatile(
      "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(addr)
      : "memory");
}
// Note [single-thread MMA issue]: tcgen05.mma is issued by one thread. CuTe's SM100_MMA_* atoms
// wrap it in elect.sync over the full warp, which waits for every lane of its mask: called from
// a role run by lane 0 alone (the forward's MMA role) it would never return (ptxas lowered it to
// WARPSYNC.COLLECTIVE 0xffffffff). umma_ss / umma_ts issue from the calling thread; the
// elected_ versions below serve roles run by the whole warp (the backward's).
// idesc as make_runtime_instr_desc returns it (the 32-bit descriptor in the upper half);
// kCtaGroup 2: the pair of CTAs of a cluster (the even CTA issues; M = 256 or 128 over both).
// kF8: kind::f8f6f4 (e4m3 operands, the FP8 forward), else kind::f16.
template <int kCtaGroup = 1, bool kF8 = false>
__device__ __forceinline__ void umma_ss(uint64_t desc_a, uint64_t desc_b, uint32_t tmem_d,
                                        uint32_t accumulate, uint64_t idesc) {
  static_assert(kCtaGroup == 1 || kCtaGroup == 2, "cta_group::1 or ::2");
  static_assert(!kF8 || kCtaGroup == 1, "FP8: the 1-CTA kernel's");
  if constexpr (kF8) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::1.kind::f8f6f4 [%0], %1, %2, %3, p;\n\t}" ::"r"(tmem_d),
        "l"(desc_a), "l"(desc_b), "r"(uint32_t(idesc >> 32)), "r"(accumulate));
  } else if constexpr (kCtaGroup == 1) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n\t}" ::"r"(tmem_d),
        "l"(desc_a), "l"(desc_b), "r"(uint32_t(idesc >> 32)), "r"(accumulate));
  } else {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::2.kind::f16 [%0], %1, %2, %3, p;\n\t}" ::"r"(tmem_d),
        "l"(desc_a), "l"(desc_b), "r"(uint32_t(idesc >> 32)), "r"(accumulate));
  }
}
// A from tensor memory (the TS form).
template <int kCtaGroup = 1, bool kF8 = false>
__device__ __forceinline__ void umma_ts(uint32_t tmem_a, uint64_t desc_b, uint32_t tmem_d,
                                        uint32_t accumulate, uint64_t idesc) {
  static_assert(kCtaGroup == 1 || kCtaGroup == 2, "cta_group::1 or ::2");
  static_assert(!kF8 || kCtaGroup == 1, "FP8: the 1-CTA kernel's");
  if constexpr (kF8) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::1.kind::f8f6f4 [%0], [%1], %2, %3, p;\n\t}" ::"r"(tmem_d),
        "r"(tmem_a), "l"(desc_b), "r"(uint32_t(idesc >> 32)), "r"(accumulate));
  } else if constexpr (kCtaGroup == 1) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::1.kind::f16 [%0], [%1], %2, %3, p;\n\t}" ::"r"(tmem_d),
        "r"(tmem_a), "l"(desc_b), "r"(uint32_t(idesc >> 32)), "r"(accumulate));
  } else {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::2.kind::f16 [%0], [%1], %2, %3, p;\n\t}" ::"r"(tmem_d),
        "r"(tmem_a), "l"(desc_b), "r"(uint32_t(idesc >> 32)), "r"(accumulate));
  }
}

// The same from a converged warp: one elected lane issues. Its commits must come from the lane
// that issued the MMAs; elect.sync over the same full warp elects the same lane, which CUTLASS's
// own MMA atoms and umma_arrive rely on as well.
template <int kCtaGroup = 1>
__device__ __forceinline__ void elected_umma_ss(uint64_t desc_a, uint64_t desc_b, uint32_t tmem_d,
                                                uint32_t accumulate, uint64_t idesc) {
  if (cute::elect_one_sync()) umma_ss<kCtaGroup>(desc_a, desc_b, tmem_d, accumulate, idesc);
}
template <int kCtaGroup = 1>
__device__ __forceinline__ void elected_umma_ts(uint32_t tmem_a, uint64_t desc_b, uint32_t tmem_d,
                                                uint32_t accumulate, uint64_t idesc) {
  if (cute::elect_one_sync()) umma_ts<kCtaGroup>(tmem_a, desc_b, tmem_d, accumulate, idesc);
}
__device__ __forceinline__ void elected_umma_commit(uint64_t* bar) {
  if (cute::elect_one_sync()) umma_commit(bar);
}

// Generic-proxy shared-memory writes made visible to the async proxy (tcgen05 MMA operands,
// TMA store and reduce sources).
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

template <class Element>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  cutlass::NumericArrayConverter<Element, float, 2> cvt;
  cutlass::Array<float, 2> in;
  in[0] = a;
  in[1] = b;
  const cutlass::Array<Element, 2> out = cvt(in);
  return reinterpret_cast<const uint32_t&>(out);
}

// 32 fp32 words (a tcgen05.ld chunk) times `scale` as 16-bit pairs in r[0..15], in place:
// r[j] comes from r[2j], r[2j + 1] with j <= 2j, which saves 16 registers.
template <class Element>
__device__ __forceinline__ void scale_pack_32(uint32_t (&r)[32], float scale) {
  FA4_UNROLL
  for (int j = 0; j < 16; ++j) {
    r[j] = pack2<Element>(__uint_as_float(r[2 * j]) * scale, __uint_as_float(r[2 * j + 1]) * scale);
  }
}

// The 16 packed words of scale_pack_32 (32 elements, 64 bytes) as four 16-byte stores, those of
// the first `cols` columns (a multiple of 8: Note [padded head dims]).
__device__ __forceinline__ void store_64_bytes(void* dst, const uint32_t (&r)[32], int cols) {
  FA4_UNROLL
  for (int v = 0; v < 4; ++v) {
    if (8 * v < cols) {
      reinterpret_cast<uint4*>(dst)[v] =
          make_uint4(r[4 * v], r[4 * v + 1], r[4 * v + 2], r[4 * v + 3]);
    }
  }
}

// ---- Cluster primitives (the 2-CTA kernels: a cluster of two CTAs, one MMA over both) ----
// Waits with cluster scope: the barriers here also complete through the other CTA's arrivals
// and commits, whose writes (shared memory of either CTA, TMEM) the waiter then uses.
__device__ __forceinline__ void bar_wait_cluster(uint64_t* bar, uint32_t parity) {
#ifdef FA4_SM100_DEBUG
  debug::wait<true>(bar, parity);
#else
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT_%=;\n\t}" ::"r"(addr),
      "r"(parity)
      : "memory");
#endif
}
// Arrival on CTA `cta`'s copy of a barrier (this CTA's own included), releasing this thread's
// earlier writes at cluster scope.
__device__ __forceinline__ void bar_arrive_cta(uint64_t* bar, uint32_t cta) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
#ifdef FA4_SM100_DEBUG
  debug::trace(debug::Event::kArrive, addr, 0);
#endif
  asm volatile(
      "{\n\t.reg .b32 r;\n\t"
      "mapa.shared::cluster.u32 r, %0, %1;\n\t"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];\n\t}" ::"r"(addr),
      "r"(cta)
      : "memory");
}
// 16 bytes into CTA `cta`'s copy of a shared-memory location (distributed shared memory).
__device__ __forceinline__ void st_cluster_16(const void* local, uint32_t cta, uint4 v) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  asm volatile(
      "{\n\t.reg .b32 r;\n\t"
      "mapa.shared::cluster.u32 r, %0, %1;\n\t"
      "st.shared::cluster.v4.b32 [r], {%2, %3, %4, %5};\n\t}" ::"r"(addr),
      "r"(cta), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
      : "memory");
}
// Generic-proxy writes to either CTA's shared memory, ordered before the async proxy's reads.
__device__ __forceinline__ void fence_async_smem_cluster() {
  asm volatile("fence.proxy.async.shared::cluster;" ::: "memory");
}
// tcgen05.commit to both CTAs' copies of `bar` (multicast), from the even CTA's MMA thread: its
// arrivals happen when every cta_group::2 operation this thread issued has completed.
__device__ __forceinline__ void umma_commit_pair(uint64_t* bar) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
#ifdef FA4_SM100_DEBUG
  debug::trace(debug::Event::kCommit, addr, 0);
#endif
  asm volatile(
      "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 "
      "[%0], %1;" ::"r"(addr),
      "h"(uint16_t(0x3))
      : "memory");
}
// The same from the whole MMA warp (the 2-CTA backward's): one elected lane commits.
__device__ __forceinline__ void elected_umma_commit_pair(uint64_t* bar) {
  if (cute::elect_one_sync()) umma_commit_pair(bar);
}

}  // namespace fa4::sm100
