// SM90 backward: the head-dim dispatch (kernel: sm90/bwd/kernel.cuh, instantiated per head dim
// in bwd_sm90_hd*.cu).
#include "common/params.h"

namespace fa4::sm90 {
template <int D, int DV>
Status launch_bwd_dtype(const BwdParams&, const DeviceInfo&, void*, cudaStream_t);
}  // namespace fa4::sm90

namespace fa4 {

Status run_bwd_sm90(const BwdParams& p, const DeviceInfo& dev, void* workspace,
                    cudaStream_t stream) {
  const int d = p.fwd.head_dim, dv = p.fwd.head_dim_v;
#ifdef FA4_HDIM_64
  if (d == 64 && dv == 64) return sm90::launch_bwd_dtype<64, 64>(p, dev, workspace, stream);
#endif
#ifdef FA4_HDIM_96
  if (d == 96 && dv == 96) return sm90::launch_bwd_dtype<96, 96>(p, dev, workspace, stream);
#endif
#ifdef FA4_HDIM_128
  if (d == 128 && dv == 128) return sm90::launch_bwd_dtype<128, 128>(p, dev, workspace, stream);
#endif
#ifdef FA4_HDIM_192
  if (d == 192 && dv == 192) return sm90::launch_bwd_dtype<192, 192>(p, dev, workspace, stream);
#endif
#ifdef FA4_HDIM_256
  if (d == 256 && dv == 256) return sm90::launch_bwd_dtype<256, 256>(p, dev, workspace, stream);
#endif
#ifdef FA4_HDIM_192X128
  if (d == 192 && dv == 128) return sm90::launch_bwd_dtype<192, 128>(p, dev, workspace, stream);
#endif
  return kernel_fail(Status::kUnsupported,
                     "fa4: head dims (%d, %d) have no SM90 backward kernel in this build "
                     "(FA4_HDIMS)",
                     d, dv);
}

}  // namespace fa4
