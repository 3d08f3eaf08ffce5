// SM100 forward: the head-dim dispatch and instantiations; the kernel is sm100/fwd/kernel.cuh.
// Compiled, not executed (no Blackwell GPU here). hd 64, 96, 128, 192, (192, 128) and 256 (one Q
// tile per CTA, Note [one-tile order]) are instantiated, each when FA4_HDIMS has it.
#include "sm100/fwd/kernel.cuh"

namespace fa4 {

Status run_fwd_sm100(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const int d = p.head_dim, dv = p.head_dim_v;
#ifdef FA4_HDIM_64
  if (d == 64 && dv == 64) return sm100::launch_dtype<64, 64>(p, dev, stream);
#endif
#ifdef FA4_HDIM_96
  if (d == 96 && dv == 96) return sm100::launch_dtype<96, 96>(p, dev, stream);
#endif
#ifdef FA4_HDIM_128
  if (d == 128 && dv == 128) return sm100::launch_dtype<128, 128>(p, dev, stream);
#endif
#ifdef FA4_HDIM_192
  if (d == 192 && dv == 192) return sm100::launch_dtype<192, 192>(p, dev, stream);
#endif
#ifdef FA4_HDIM_256
  if (d == 256 && dv == 256) return sm100::launch_dtype<256, 256>(p, dev, stream);
#endif
#ifdef FA4_HDIM_192X128
  if (d == 192 && dv == 128) return sm100::launch_dtype<192, 128>(p, dev, stream);
#endif
  return kernel_fail(Status::kUnsupported,
                     "fa4: head dims (%d, %d) are not compiled into the SM100 forward", d, dv);
}

}  // namespace fa4
