// SM100 backward: the head-dim dispatch and instantiations; the kernel is bwd_sm100_kernel.cuh.
// Compiled, not executed (no Blackwell GPU here). hd 64, 96 and 128 (1-CTA kernel), each when
// FA4_HDIMS has it; hd 192, (192, 128) and 256 need the 2-CTA variant, not written yet, and
// answer kUnsupported.
#include "bwd_sm100_kernel.cuh"

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
    return sm100::bwd::launch_bwd_dtype<128, 128>(p, dev, workspace, stream);
  }
#endif
  return kernel_fail(Status::kUnsupported,
                     "fa4: head dims (%d, %d) are not compiled into the SM100 backward", d, dv);
}

}  // namespace fa4
