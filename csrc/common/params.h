// Internal interface between api/dispatch.cu and the kernel files: what a launch function gets
// besides the public params, and the launch functions each kernel file defines.
#pragma once

#include "api/fa4.h"
#include "common/tile_scheduler.cuh"

namespace fa4 {

// Resolved once by api/dispatch.cu so that kernels do not each query the device (or the
// environment).
struct DeviceInfo {
  int cc_major = 0;
  int cc_minor = 0;
  int num_sms = 0;              // FwdParams::num_sms if set, else the device's SM count
  TileOrderOptions tile_order;  // RunOptions or the process default (common/tile_scheduler.cuh)
};

using FwdLaunch = Status (*)(const FwdParams&, const DeviceInfo&, cudaStream_t);
using BwdLaunch = Status (*)(const BwdParams&, const DeviceInfo&, void* workspace, cudaStream_t);

// The per-arch entry points (csrc/fwd_sm90.cu, bwd_sm90.cu, fwd_sm100.cu, bwd_sm100.cu): each picks
// the instance for the head dims and dtype among those this build compiled (fa4_instances.h,
// generated from fa4/kernels.json) and is compiled only when the build has instances of it.
Status run_fwd_sm90(const FwdParams&, const DeviceInfo&, cudaStream_t);
Status run_bwd_sm90(const BwdParams&, const DeviceInfo&, void* workspace, cudaStream_t);
Status run_fwd_sm100(const FwdParams&, const DeviceInfo&, cudaStream_t);
Status run_bwd_sm100(const BwdParams&, const DeviceInfo&, void* workspace, cudaStream_t);
// The decode kernel (csrc/fwd_decode.cu; decode/plan.h says which problems take it), compiled
// for every arch of the build.
Status run_fwd_decode(const FwdParams&, const DeviceInfo&, cudaStream_t);

// One kernel instance: a family's kernels for head dims (D, DV) and one dtype, defined in the
// family's instance header (sm90/fwd/instance.cuh, ...) and instantiated by a generated translation
// unit per instance (common/instance.cuh).
namespace sm90 {
template <int D, int DV, DType E>
Status fwd_instance(const FwdParams&, const DeviceInfo&, cudaStream_t);
template <int D, int DV, DType E>
Status bwd_instance(const BwdParams&, const DeviceInfo&, void* workspace, cudaStream_t);
}  // namespace sm90
namespace decode {
template <int D, int DV, DType E>
Status fwd_instance(const FwdParams&, const DeviceInfo&, cudaStream_t);
}  // namespace decode
namespace sm100 {
template <int D, int DV, DType E>
Status fwd_instance(const FwdParams&, const DeviceInfo&, cudaStream_t);
template <int D, int DV, DType E>
Status bwd_instance(const BwdParams&, const DeviceInfo&, void* workspace, cudaStream_t);
}  // namespace sm100

// Sets last_error() for a kernel file's kUnsupported / kCudaError answers (api/dispatch.cu).
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
Status kernel_fail(Status s, const char* fmt, ...);

// Launches a kernel with `smem_bytes` of dynamic shared memory (opting in above 48 KB) and turns
// CUDA errors into kCudaError with the kernel's name. Host code; for the kernel files (.cu).
#ifdef __CUDACC__
template <class Kernel, class... Args>
Status launch_kernel(const char* name, Kernel kernel, dim3 grid, int threads, int smem_bytes,
                     cudaStream_t stream, const Args&... args) {
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (e != cudaSuccess) {
    return kernel_fail(Status::kCudaError, "%s: cudaFuncSetAttribute: %s", name,
                       cudaGetErrorString(e));
  }
  kernel<<<grid, threads, smem_bytes, stream>>>(args...);
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    return kernel_fail(Status::kCudaError, "%s launch: %s", name, cudaGetErrorString(e));
  }
  return Status::kOk;
}

// launch_kernel for a programmatic dependent launch (PDL; SM90+): the kernel may start while the
// stream's previous kernel still runs, once every CTA of that kernel has executed
// griddepcontrol.launch_dependents (or exited), and must execute griddepcontrol.wait
// (pdl_wait) before it reads anything that kernel writes. Captured into CUDA graphs as a
// programmatic edge. Kernels without shared memory only (no opt-in).
template <class Kernel, class... Args>
Status launch_dependent(const char* name, Kernel kernel, dim3 grid, int threads,
                        cudaStream_t stream, const Args&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, args...);
  if (e != cudaSuccess) {
    return kernel_fail(Status::kCudaError, "%s launch: %s", name, cudaGetErrorString(e));
  }
  return Status::kOk;
}

// The two sides of launch_dependent, as device code (no-ops for a kernel launched without it).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
#endif

}  // namespace fa4
