// The SM100 forward's entry point for one (head dims, dtype) instance (common/instance.cuh).
// Compiled, not executed: no Blackwell GPU is available to this project.
#pragma once

#include "common/instance.cuh"
#include "sm100/fwd/kernel.cuh"

namespace fa4::sm100 {

template <int D, int DV, DType E>
Status fwd_instance(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  return launch<FwdTraits<D, DV, ElementOf<E>>>(p, dev, stream);
}

}  // namespace fa4::sm100
