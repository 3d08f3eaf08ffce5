// Lets the shared headers (exp2_poly.cuh, common/fragment.cuh, common/mask.cuh, common/softmax.cuh,
// common/tile_scheduler.cuh) compile unchanged with nvcc for the kernels and with g++ for the host
// test harnesses, so CI tests the exact code the kernels run.
#pragma once

#ifndef __CUDACC__
// Host-only compilers see the same functions. These match what CUDA's host_defines.h defines for
// non-CUDA compilation, so including CUDA headers after this one is harmless.
#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __forceinline__
#define __forceinline__ __inline__ __attribute__((always_inline))
#endif
#endif

// Full unrolling of the register loops: nvcc's device pass must see constant indices (an array
// indexed at run time would be placed in local memory). Host compilers (g++, and nvcc's host
// pass, which hands the pragma to g++) would warn about the unknown pragma, so only the device
// pass gets it.
#ifdef __CUDA_ARCH__
#define FA4_UNROLL _Pragma("unroll")
#else
#define FA4_UNROLL
#endif
