// SM90 forward for head dims (256, 256): the dispatch and the bf16 kernels (see
// sm90/fwd/kernel.cuh; the fp16 kernels are in fwd_sm90_hd256_fp16.cu).
#include "sm90/fwd/kernel.cuh"

namespace fa4::sm90 {
extern template Status launch_element<256, 256, cutlass::half_t>(const FwdParams&,
                                                                 const DeviceInfo&, cudaStream_t);
template Status launch_element<256, 256, cutlass::bfloat16_t>(const FwdParams&, const DeviceInfo&,
                                                              cudaStream_t);
template Status launch_dtype<256, 256>(const FwdParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fa4::sm90
