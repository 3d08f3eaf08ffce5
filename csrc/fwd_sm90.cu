// SM90 forward: picks the instance for the head dims and dtype among those this build compiled
// (fa4_instances.h, generated from fa4/kernels.json). The kernel is sm90/fwd/kernel.cuh.
#include "common/head_dims.h"
#include "common/params.h"
#include "fa4_instances.h"

namespace fa4 {

Status run_fwd_sm90(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  // Note [padded head dims]: the compiled instance of the problem's dtype that covers its head
  // dims (the FP8 forward has fewer head dims than the 16-bit ones).
  constexpr TypedHeadDims kCompiled[] = {FA4_INSTANCES_SM90_FWD(FA4_TYPED_HEAD_DIMS_ENTRY)};
  const HeadDims k = cover_of_dtype(kCompiled, int(p.dtype), p.head_dim, p.head_dim_v);
#define FA4_CASE(D, DV, E)                                      \
  if (k.d == D && k.dv == DV && p.dtype == DType::E) {          \
    return sm90::fwd_instance<D, DV, DType::E>(p, dev, stream); \
  }
  FA4_INSTANCES_SM90_FWD(FA4_CASE)
#undef FA4_CASE
  return kernel_fail(
      Status::kUnsupported,
      "fa4: head dims (%d, %d) are covered by no %s instance of this build's SM90 forward "
      "(FA4_HDIMS; the FP8 forward has hd 64, 128, 256)",
      p.head_dim, p.head_dim_v, p.dtype == DType::kE4M3 ? "e4m3" : "16-bit");
}

}  // namespace fa4
