// SM90 forward for head dims (192, 192), the fp16 kernels (fwd_sm90_hd192.cu has the bf16 ones
// and the dispatch; see sm90/fwd/kernel.cuh).
#include "sm90/fwd/kernel.cuh"

namespace fa4::sm90 {
template Status launch_element<192, 192, cutlass::half_t>(const FwdParams&, const DeviceInfo&,
                                                          cudaStream_t);
}  // namespace fa4::sm90
