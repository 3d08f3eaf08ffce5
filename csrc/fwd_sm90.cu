// SM90 forward: the head-dim dispatch. The kernel is sm90/fwd/kernel.cuh; each head-dim pair is
// instantiated in its own files (fwd_sm90_hd*.cu: bf16 and the dtype dispatch; *_fp16.cu: fp16),
// compiled when FA4_HDIMS names it.
#include "common/params.h"

namespace fa4::sm90 {
template <int D, int DV>
Status launch_dtype(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream);
}  // namespace fa4::sm90

namespace fa4 {

Status run_fwd_sm90(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const int d = p.head_dim, dv = p.head_dim_v;
#ifdef FA4_HDIM_64
  if (d == 64 && dv == 64) return sm90::launch_dtype<64, 64>(p, dev, stream);
#endif
#ifdef FA4_HDIM_96
  if (d == 96 && dv == 96) return sm90::launch_dtype<96, 96>(p, dev, stream);
#endif
#ifdef FA4_HDIM_128
  if (d == 128 && dv == 128) return sm90::launch_dtype<128, 128>(p, dev, stream);
#endif
#ifdef FA4_HDIM_192
  if (d == 192 && dv == 192) return sm90::launch_dtype<192, 192>(p, dev, stream);
#endif
#ifdef FA4_HDIM_192X128
  if (d == 192 && dv == 128) return sm90::launch_dtype<192, 128>(p, dev, stream);
#endif
#ifdef FA4_HDIM_256
  if (d == 256 && dv == 256) return sm90::launch_dtype<256, 256>(p, dev, stream);
#endif
  return kernel_fail(Status::kUnsupported,
                     "fa4: head dims (%d, %d) are not compiled into this build's SM90 forward "
                     "(FA4_HDIMS)",
                     d, dv);
}

}  // namespace fa4
