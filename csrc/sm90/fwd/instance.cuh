// The SM90 forward's entry point for one (head dims, dtype) instance (common/instance.cuh).
#pragma once

#include "common/instance.cuh"
#include "sm90/fwd/kernel.cuh"

namespace fa4::sm90 {

template <int D, int DV, DType E>
Status fwd_instance(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  return launch_element<D, DV, ElementOf<E>>(p, dev, stream);
}

}  // namespace fa4::sm90
