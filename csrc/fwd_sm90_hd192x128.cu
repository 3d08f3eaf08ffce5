// SM90 forward for head dims (192, 128), bf16 and fp16 (see fwd_sm90_kernel.cuh).
#include "fwd_sm90_kernel.cuh"

namespace fa4::sm90 {
template Status launch_dtype<192, 128>(const FwdParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fa4::sm90
