// The SM90 backward's entry point for one (head dims, dtype) instance (common/instance.cuh).
#pragma once

#include "common/instance.cuh"
#include "sm90/bwd/kernel.cuh"

namespace fa4::sm90 {

template <int D, int DV, DType E>
Status bwd_instance(const BwdParams& p, const DeviceInfo& dev, void* ws, cudaStream_t stream) {
  return launch_bwd<BwdTraitsFor<D, DV, ElementOf<E>>>(p, dev, ws, stream);
}

}  // namespace fa4::sm90
