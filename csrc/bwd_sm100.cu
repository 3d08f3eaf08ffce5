// SM100 backward: picks the instance for the head dims and dtype among those this build compiled
// (fa4_instances.h, generated from fa4/kernels.json). The kernels are sm100/bwd/: the 1-CTA kernel
// (kernel.cuh), the 2-CTA cluster kernel at hd 128 (kernel_2cta.cuh), chosen in
// sm100/bwd/instance.cuh. Compiled, not executed: no Blackwell GPU is available to this project.
#include "common/head_dims.h"
#include "common/params.h"
#include "fa4_instances.h"

namespace fa4 {

Status run_bwd_sm100(const BwdParams& p, const DeviceInfo& dev, void* workspace,
                     cudaStream_t stream) {
  const FwdParams& f = p.fwd;
  constexpr HeadDims kCompiled[] = {FA4_INSTANCES_SM100_BWD(FA4_HEAD_DIMS_ENTRY)};
  // Note [padded head dims]: the compiled instance that covers the problem's head dims.
  const HeadDims k = cover(kCompiled, f.head_dim, f.head_dim_v);
#define FA4_CASE(D, DV, E)                                                  \
  if (k.d == D && k.dv == DV && f.dtype == DType::E) {                      \
    return sm100::bwd_instance<D, DV, DType::E>(p, dev, workspace, stream); \
  }
  FA4_INSTANCES_SM100_BWD(FA4_CASE)
#undef FA4_CASE
  return kernel_fail(
      Status::kUnsupported,
      "fa4: head dims (%d, %d) are covered by no instance of this build's SM100 backward "
      "(FA4_HDIMS)",
      f.head_dim, f.head_dim_v);
}

}  // namespace fa4
