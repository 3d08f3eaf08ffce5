// The planted-bug kernel of tests/gpu/test_debug_wait.py: common/debug_wait.cuh's bounded wait,
// as the SM100 kernels use it in a FA4_SM100_DEBUG build, run where a GPU exists (SM90).
// Built by the test as a shared library (nvcc -shared) and called through ctypes; no torch.
//
// One CTA of two warps and a two-stage ring, with a barrier table like the kernels' (common/
// barrier_table.cuh): the producer (warp 0, lane 0) publishes blocks 0..blocks-1, each into stage
// n % 2 once the consumer released the stage's previous block; the consumer (warp 1, all lanes)
// waits for each block, writes its index, and releases the stage. `skip` >= 0 plants the bug:
// the producer leaves out block skip's arrival, so the consumer waits on kFull[skip % 2] phase
// (skip / 2) & 1 for ever, and (blocks > skip + 2) the producer on kEmpty of the same stage.
#include <stdint.h>

#include <cuda_runtime.h>

#include "common/barrier_table.cuh"
#include "common/debug_wait.cuh"

namespace probe {

enum class Bar : int {
  kFull,   // from producer to consumer, protects slot[stage]: block published
  kEmpty,  // from consumer to producer, protects slot[stage]: block read
  kCount
};
enum class BarCopies : int { kPerStage };
constexpr int kStages = 2;
struct Copies {
  static constexpr int copies(BarCopies) { return kStages; }
};
// clang-format off
inline constexpr fa4::BarSpec<Bar, BarCopies> kBarriers[] = {
    {Bar::kFull,  BarCopies::kPerStage, 1},
    {Bar::kEmpty, BarCopies::kPerStage, 1},
};
// clang-format on
using Table = fa4::BarrierTable<kBarriers, Copies>;
enum class Role : int { kProducer, kConsumer };  // fa4/debug.py KERNELS[90]

__device__ __forceinline__ void arrive(uint64_t* bar) {
  fa4::debug::trace(fa4::debug::Event::kArrive, fa4::debug::smem_addr(bar), 0);
  cutlass::arch::ClusterBarrier::arrive(bar);
}

__global__ void probe_kernel(int blocks, int skip, int* out) {
  __shared__ alignas(8) uint64_t bars[Table::kCount];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Role role = warp == 0 ? Role::kProducer : Role::kConsumer;
  fa4::debug::kernel_begin<Table>(fa4::debug::KernelId::kProbe, bars, int(role));
  if (threadIdx.x == 0) {
    Table::init(bars);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  fa4::debug::site_tile(0, 2, 1);  // the tile (b 0, h 2, m 1) the message must name
  if (role == Role::kProducer) {
    if (lane != 0) return;
    for (int n = 0; n < blocks; ++n) {
      const int s = n % kStages;
      fa4::debug::site_block(n);
      if (n >= kStages) {
        fa4::debug::wait(Table::at<Bar::kEmpty>(bars, s), uint32_t((n / kStages - 1) & 1));
      }
      if (n != skip) arrive(Table::at<Bar::kFull>(bars, s));
    }
  } else {
    for (int n = 0; n < blocks; ++n) {
      const int s = n % kStages;
      fa4::debug::site_block(n);
      fa4::debug::wait(Table::at<Bar::kFull>(bars, s), uint32_t((n / kStages) & 1));
      if (lane == 0) {
        out[n] = n;
        arrive(Table::at<Bar::kEmpty>(bars, s));
      }
      __syncwarp();
    }
  }
}

}  // namespace probe

// Runs the kernel and waits for it: the CUDA error code (0 on success); out: blocks ints.
extern "C" int probe_run(int blocks, int skip, int* out) {
  int* d_out = nullptr;
  cudaError_t e = cudaMalloc(&d_out, sizeof(int) * blocks);
  if (e != cudaSuccess) return int(e);
  cudaMemset(d_out, 0xff, sizeof(int) * blocks);
  fa4::debug::attach(nullptr);
  probe::probe_kernel<<<1, 64>>>(blocks, skip, d_out);
  e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return int(e);
  e = cudaMemcpy(out, d_out, sizeof(int) * blocks, cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  return int(e);
}
