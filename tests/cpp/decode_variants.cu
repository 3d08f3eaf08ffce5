// The decode producer variants that the build does not dispatch yet (Note [row gather],
// [tma blocks]: 2, the batched gather; 3, TMA tiles), instantiated at hd128 for
// tests/sass/test_sass_decode.py, which keeps them compiled and checks their SASS until an A/B
// on the GPU picks one for decode/instance.cuh. The 16-bit TMA variant at one consumer warp per
// block is the most register-bound (168 at two CTAs per SM: Note [swizzle steps]).
#include "decode/kernel.cuh"

namespace fa4::decode {

template __global__ void decode_kernel<128, 128, cutlass::bfloat16_t, 4, false, 2>(
    const __grid_constant__ KernelArgs<128, 128, cutlass::bfloat16_t, 4, false, 2>);
template __global__ void decode_kernel<128, 128, cutlass::bfloat16_t, 4, false, 3>(
    const __grid_constant__ KernelArgs<128, 128, cutlass::bfloat16_t, 4, false, 3>);
template __global__ void decode_kernel<128, 128, cutlass::bfloat16_t, 1, false, 3>(
    const __grid_constant__ KernelArgs<128, 128, cutlass::bfloat16_t, 1, false, 3>);
template __global__ void decode_kernel<128, 128, cutlass::bfloat16_t, 1, true, 2>(
    const __grid_constant__ KernelArgs<128, 128, cutlass::bfloat16_t, 1, true, 2>);
template __global__ void decode_kernel<128, 128, cutlass::bfloat16_t, 1, true, 3>(
    const __grid_constant__ KernelArgs<128, 128, cutlass::bfloat16_t, 1, true, 3>);

}  // namespace fa4::decode
