// The decode kernel: picks the instance for the head dims and dtype among those this build
// compiled (fa4_instances.h, generated from fa4/kernels.json). The kernel is decode/kernel.cuh.
#include "common/params.h"
#include "fa4_instances.h"

namespace fa4 {

Status run_fwd_decode(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
#define FA4_CASE(D, DV, E)                                            \
  if (p.head_dim == D && p.head_dim_v == DV && p.dtype == DType::E) { \
    return decode::fwd_instance<D, DV, DType::E>(p, dev, stream);     \
  }
  FA4_INSTANCES_DECODE_FWD(FA4_CASE)
#undef FA4_CASE
  return kernel_fail(Status::kUnsupported,
                     "fa4: head dims (%d, %d) are not compiled into this build's decode kernel "
                     "(FA4_HDIMS)",
                     p.head_dim, p.head_dim_v);
}

}  // namespace fa4
