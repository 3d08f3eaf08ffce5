// SM100 backward: the head-dim dispatch and instantiations. Compiled, not executed (no Blackwell
// GPU here). hd 64 and 96: the 1-CTA kernel (sm100/bwd/kernel.cuh); hd 128: the 2-CTA kernel
// (sm100/bwd/kernel_2cta.cuh); hd 192, (192, 128) and 256: the 1-CTA kernel with the head dim split over
// two CTAs per kv tile (Note [bwd head-dim split]); each when FA4_HDIMS has it.
#include "sm100/bwd/kernel_2cta.cuh"

namespace fa4 {

Status run_bwd_sm100(const BwdParams& p, const DeviceInfo& dev, void* workspace,
                     cudaStream_t stream) {
  const int d = p.fwd.head_dim, dv = p.fwd.head_dim_v;
#ifdef FA4_HDIM_64
  if (d == 64 && dv == 64) return sm100::bwd::launch_bwd_dtype<64, 64>(p, dev, workspace, stream);
#endif
#ifdef FA4_HDIM_96
  if (d == 96 && dv == 96) return sm100::bwd::launch_bwd_dtype<96, 96>(p, dev, workspace, stream);
#endif
#ifdef FA4_HDIM_128
  if (d == 128 && dv == 128) {
    return sm100::bwd2::launch_bwd_dtype<128, 128>(p, dev, workspace, stream);
  }
#endif
#ifdef FA4_HDIM_192
  if (d == 192 && dv == 192) {
    return sm100::bwd::launch_bwd_dtype<192, 192>(p, dev, workspace, stream);
  }
#endif
#ifdef FA4_HDIM_192X128
  if (d == 192 && dv == 128) {
    return sm100::bwd::launch_bwd_dtype<192, 128>(p, dev, workspace, stream);
  }
#endif
#ifdef FA4_HDIM_256
  if (d == 256 && dv == 256) {
    return sm100::bwd::launch_bwd_dtype<256, 256>(p, dev, workspace, stream);
  }
#endif
  return kernel_fail(Status::kUnsupported,
                     "fa4: head dims (%d, %d) are not compiled into the SM100 backward", d, dv);
}

}  // namespace fa4
