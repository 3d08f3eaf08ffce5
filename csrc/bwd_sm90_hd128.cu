// SM90 backward for head dims (128, 128), bf16 and fp16 (see sm90/bwd/kernel.cuh).
#include "sm90/bwd/kernel.cuh"

namespace fa4::sm90 {
template Status launch_bwd_dtype<128, 128>(const BwdParams&, const DeviceInfo&, void*,
                                           cudaStream_t);
}  // namespace fa4::sm90
