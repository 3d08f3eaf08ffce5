// Compile-only probe of csrc/tmem.cuh for sm_100a (tests/sass/test_sass_tmem_probe.py reads its
// SASS): one warpgroup allocates the forward's TMEM plan, stores a P row chunk, loads an S chunk
// back, rescales and stores an O chunk, and frees the allocation, in the order the SM100 forward
// does.
// Never launched: no Blackwell GPU is available ("compiled, not executed").
#include "tmem.cuh"

namespace fa4::sm100 {

template <int kHeadDimV>
__global__ void tmem_probe(float* out, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
  using Plan = FwdTmemPlan<kHeadDimV, fwd_block_n<kHeadDimV>()>;
  __shared__ uint32_t tmem_base;
  const uint32_t warp = threadIdx.x / 32;
  if (warp == 0) {
    tmem_allocate(&tmem_base, Plan::kAllocColumns);
    tmem_relinquish();
  }
  tmem_fence_before_sync();
  __syncthreads();
  tmem_fence_after_sync();
  const uint32_t lane_base = 32 * (warp % 4);
  uint32_t s[32];
  tmem_load_32(tmem_addr(tmem_base, lane_base, Plan::kS0), s);
  tmem_wait_ld();
  uint32_t p[16];
  FA4_UNROLL
  for (int i = 0; i < 16; ++i) p[i] = s[2 * i] ^ s[2 * i + 1];
  tmem_store_16(tmem_addr(tmem_base, lane_base, Plan::kP0), p);
  uint32_t o[32];
  tmem_load_32(tmem_addr(tmem_base, lane_base, Plan::kO0), o);
  tmem_wait_ld();
  FA4_UNROLL
  for (int i = 0; i < 32; ++i) o[i] = __float_as_uint(__uint_as_float(o[i]) * scale);
  tmem_store_32(tmem_addr(tmem_base, lane_base, Plan::kO0), o);
  tmem_wait_st();
  out[threadIdx.x] = __uint_as_float(o[0]) + __uint_as_float(o[31]);
  tmem_fence_before_sync();
  __syncthreads();
  if (warp == 0) tmem_free(tmem_base, Plan::kAllocColumns);
#endif
}

template __global__ void tmem_probe<64>(float*, float);
template __global__ void tmem_probe<128>(float*, float);
template __global__ void tmem_probe<192>(float*, float);
template __global__ void tmem_probe<256>(float*, float);

}  // namespace fa4::sm100
