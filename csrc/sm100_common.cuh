// Pieces shared by the SM100 forward and backward kernels: mbarrier rings and waits,
// tcgen05.commit, the generic-to-async proxy fence, and the 16-bit packing of fp32 rows that
// their epilogues write. Device code only (sm_100a).
#pragma once

#include <stdint.h>

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "host_device.cuh"

namespace fa4::sm100 {

// Compile-time checks of the kernels' tables: the device-side role function follows the role
// table, and the barrier table's rows come in the order of their enum.
template <class Role, int N, class Fn>
constexpr bool roles_match(const Role (&table)[N], Fn role_of) {
  for (int w = 0; w < N; ++w) {
    if (role_of(w) != table[w]) return false;
  }
  return true;
}
template <class Spec, int N>
constexpr bool rows_in_enum_order(const Spec (&rows)[N]) {
  for (int i = 0; i < N; ++i) {
    if (int(rows[i].bar) != i) return false;
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
  cutlass::arch::ClusterBarrier::wait(bar, parity);
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  cutlass::arch::ClusterBarrier::arrive(bar);
}
// tcgen05.commit: the barrier's arrival happens when every tcgen05 operation this thread has
// issued so far has completed (issued by the single MMA thread).
__device__ __forceinline__ void umma_commit(uint64_t* bar) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(addr)
      : "memory");
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

// The 16 packed words of scale_pack_32 (32 elements, 64 bytes) as four 16-byte stores.
__device__ __forceinline__ void store_64_bytes(void* dst, const uint32_t (&r)[32]) {
  FA4_UNROLL
  for (int v = 0; v < 4; ++v) {
    reinterpret_cast<uint4*>(dst)[v] =
        make_uint4(r[4 * v], r[4 * v + 1], r[4 * v + 2], r[4 * v + 3]);
  }
}

}  // namespace fa4::sm100
