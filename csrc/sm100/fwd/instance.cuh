// The SM100 forward's entry point for one (head dims, dtype) instance (common/instance.cuh).
// Compiled, not executed: no Blackwell GPU is available to this project. Which kernel runs is
// decided here: the 2-CTA kernel (Note [fwd 2-CTA]) at d = d_v = 192 and 256, where the cycle
// model finds it faster (docs/perfmodel.md: hd 256 1453 -> 1730 TFLOP/s, hd 192 1488 -> 1679 at
// 16k non-causal), when the query rows fill more than one 128-row tile; the 1-CTA kernel
// otherwise (a pair with one tile's rows would load every K and V block for one CTA's rows), and
// for the FP8 forward (Note [fp8 forward]: the 1-CTA kernel with kind::f8f6f4 MMAs).
#pragma once

#include "common/instance.cuh"
#include "sm100/fwd/kernel_2cta.cuh"

namespace fa4::sm100 {

template <int D, int DV, DType E>
Status fwd_instance(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (D == DV && (D == 192 || D == 256) && E != DType::kE4M3) {
    using Pair = FwdTraits2<D, DV, ElementOf<E>>;
    if (p.seqlen_q > Pair::kBlockM) return launch_pair<Pair>(p, dev, stream);
  }
  return launch<FwdTraits<D, DV, ElementOf<E>>>(p, dev, stream);
}

}  // namespace fa4::sm100
