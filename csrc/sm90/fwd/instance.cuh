// The SM90 forward's entry point for one (head dims, dtype) instance (common/instance.cuh). The
// FP8 forward (DType::kE4M3, Note [fp8 forward]) first writes Vᵀ into the workspace.
#pragma once

#include "common/instance.cuh"
#include "sm90/fwd/kernel.cuh"

namespace fa4::sm90 {

template <int D, int DV, DType E>
Status fwd_instance(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (E == DType::kE4M3) {
    const cudaError_t e = launch_fp8_transpose_v<DV>(p, stream);
    if (e != cudaSuccess) {
      return kernel_fail(Status::kCudaError, "fwd_sm90 FP8 Vᵀ: %s", cudaGetErrorString(e));
    }
    return launch<FwdTraits<D, DV, ElementOf<E>>>(p, dev, stream);
  } else {
    return launch_element<D, DV, ElementOf<E>>(p, dev, stream);
  }
}

}  // namespace fa4::sm90
