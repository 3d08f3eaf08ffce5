// The SM100 backward's entry point for one (head dims, dtype) instance (common/instance.cuh).
// Compiled, not executed: no Blackwell GPU is available to this project. Which kernel runs a head
// dim is decided here: the 2-CTA cluster kernel (Note [bwd 2-CTA]) at d = d_v = 128, the only
// shape it is written for; the 1-CTA kernel elsewhere, with the head dim split over two CTAs per
// kv tile above 128 (Note [bwd head-dim split]).
#pragma once

#include "common/instance.cuh"
#include "sm100/bwd/kernel_2cta.cuh"

namespace fa4::sm100 {

template <int D, int DV, DType E>
Status bwd_instance(const BwdParams& p, const DeviceInfo& dev, void* ws, cudaStream_t stream) {
  if constexpr (D == 128 && DV == 128) {
    return bwd2::launch_bwd<bwd2::Traits2<ElementOf<E>>>(p, dev, ws, stream);
  } else {
    return bwd::launch_bwd<bwd::BwdTraits<D, DV, ElementOf<E>>>(p, dev, ws, stream);
  }
}

}  // namespace fa4::sm100
