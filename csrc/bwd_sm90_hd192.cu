// SM90 backward for head dims (192, 192), bf16 and fp16 (see sm90/bwd/kernel.cuh).
#include "sm90/bwd/kernel.cuh"

namespace fa4::sm90 {
template Status launch_bwd_dtype<192, 192>(const BwdParams&, const DeviceInfo&, void*,
                                           cudaStream_t);
}  // namespace fa4::sm90
