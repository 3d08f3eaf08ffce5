// Tensor-core rate of one SM90 wgmma shape, as the kernels issue it: two warpgroups per CTA, one
// CTA per SM, each warpgroup issuing back-to-back 64 x N x 64 batches (4 k-slices of 16) from
// shared memory (SS) or with A from registers (RS), accumulating in registers. It measures what
// fa4/perfmodel charges at the large-GEMM rate: the backward's 64 x 64 and 64 x 32 GEMMs
// (docs/perfmodel.md, "Backward"). Operands are uninitialized shared memory: only the rate is
// measured (a checksum keeps the work alive).
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -I<cutlass>/include bench/wgmma_rate.cu -o /tmp/wgmma_rate && /tmp/wgmma_rate
//
// Prints one line per shape: N, SS/RS, TFLOP/s (132 SMs at the clock the GPU runs).
#include <cstdio>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

using namespace cute;
using Element = cutlass::bfloat16_t;

template <int N, bool kRS>
struct Shape_ {
  static constexpr int kN = N;
  using Atom = decltype(GMMA::Layout_K_SW128_Atom<Element>{});
  using LayoutA = decltype(tile_to_shape(Atom{}, Shape<_64, _64>{}));
  using LayoutB = decltype(tile_to_shape(Atom{}, Shape<Int<N>, _64>{}));
  using Mma = decltype(make_tiled_mma(
      std::conditional_t<kRS,
                         decltype(GMMA::rs_op_selector<Element, Element, float,
                                                       Shape<_64, Int<N>, _64>>()),
                         decltype(GMMA::ss_op_selector<Element, Element, float,
                                                       Shape<_64, Int<N>, _64>>())>{}));
};

template <class S, bool kRS>
__global__ void __launch_bounds__(256, 1) rate_kernel(int iters, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  // Each warpgroup its own A and B (as the backward's two warpgroups read their own operands).
  Element* base = reinterpret_cast<Element*>(smem) + wg * (64 + S::kN) * 64;
  Tensor sA = make_tensor(make_smem_ptr(base), typename S::LayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(base + 64 * 64), typename S::LayoutB{});
  typename S::Mma mma;
  auto thr = mma.get_thread_slice(tid);
  Tensor tB = thr.partition_fragment_B(sB);
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<S::kN>>{});
  clear(acc);
  auto body = [&](auto& a) {
    for (int it = 0; it < iters; ++it) {
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      gemm(mma, a, tB, acc);
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // one batch in flight behind the one being issued
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
  };
  if constexpr (kRS) {
    Tensor tA = thr.partition_fragment_A(sA);  // register fragment of A
    for (int i = 0; i < size(tA); ++i) tA(i) = Element(float(tid + i) * 1e-3f);
    body(tA);
  } else {
    Tensor tA = thr.partition_fragment_A(sA);  // smem descriptors
    body(tA);
  }
  float s = 0.0f;
  for (int i = 0; i < size(acc); ++i) s += acc(i);
  if (s == 1.2345f) sink[blockIdx.x] = s;
#endif
}

template <int N, bool kRS>
void run(int sms) {
  using S = Shape_<N, kRS>;
  const int smem = 2 * (64 + N) * 64 * int(sizeof(Element));
  auto kernel = rate_kernel<S, kRS>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  float* sink;
  cudaMalloc(&sink, sms * sizeof(float));
  const int iters = 20000;
  kernel<<<sms, 256, smem>>>(100, sink);  // warm-up
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventRecord(t0);
  kernel<<<sms, 256, smem>>>(iters, sink);
  cudaEventRecord(t1);
  cudaEventSynchronize(t1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, t0, t1);
  const double flop = 2.0 * 64 * N * 64 * double(iters) * 2 * sms;
  const cudaError_t e = cudaGetLastError();
  std::printf("N=%3d %s %7.1f TFLOP/s %s\n", N, kRS ? "RS" : "SS", flop / (ms * 1e-3) / 1e12,
              e == cudaSuccess ? "" : cudaGetErrorString(e));
  cudaFree(sink);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  run<32, false>(sms);
  run<64, false>(sms);
  run<128, false>(sms);
  run<256, false>(sms);
  run<64, true>(sms);
  run<128, true>(sms);
  run<256, true>(sms);
  return 0;
}
