// What a generated instance translation unit needs (fa4/manifest.py writes one per instance of
// fa4/kernels.json): the element type of a DType and the explicit instantiation of one family's
// entry point. A unit is two lines, e.g.
//   #include "sm90/fwd/instance.cuh"
//   FA4_INSTANCE_FWD(sm90, 128, 128, kBFloat16)
#pragma once

#include <type_traits>

#include <cutlass/numeric_types.h>

#include "common/params.h"

namespace fa4 {

template <DType E>
using ElementOf = std::conditional_t<
    E == DType::kBFloat16, cutlass::bfloat16_t,
    std::conditional_t<E == DType::kE4M3, cutlass::float_e4m3_t, cutlass::half_t>>;

}  // namespace fa4

#define FA4_INSTANCE_FWD(FAMILY, D, DV, E)                              \
  template fa4::Status fa4::FAMILY::fwd_instance<D, DV, fa4::DType::E>( \
      const fa4::FwdParams&, const fa4::DeviceInfo&, cudaStream_t);
#define FA4_INSTANCE_BWD(FAMILY, D, DV, E)                              \
  template fa4::Status fa4::FAMILY::bwd_instance<D, DV, fa4::DType::E>( \
      const fa4::BwdParams&, const fa4::DeviceInfo&, void*, cudaStream_t);
