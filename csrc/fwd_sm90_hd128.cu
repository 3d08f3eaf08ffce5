// SM90 forward for head dims (128, 128): the dispatch and the bf16 kernels (see
// sm90/fwd/kernel.cuh; the fp16 kernels are in fwd_sm90_hd128_fp16.cu).
#include "sm90/fwd/kernel.cuh"

namespace fa4::sm90 {
extern template Status launch_element<128, 128, cutlass::half_t>(const FwdParams&,
                                                                 const DeviceInfo&, cudaStream_t);
template Status launch_element<128, 128, cutlass::bfloat16_t>(const FwdParams&, const DeviceInfo&,
                                                              cudaStream_t);
template Status launch_dtype<128, 128>(const FwdParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fa4::sm90
