// Pieces shared by the SM90 forward and backward kernels: warp roles, wgmma descriptor steps,
// pipelined TMA loads and thread-index helpers (the TMA tensors are common/tma.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "api/fa4.h"
#include "common/tma.cuh"

namespace fa4::sm90 {

using namespace cute;

// One producer warpgroup (TMA) and the consumer warpgroups after it (wgmma and the elementwise
// work): one to three in the forward (FwdTraits::kConsumerWGs), two in the backward.
enum class WarpGroupRole : int { kProducer = 0, kConsumer0 = 1, kConsumer1 = 2 };

// Note [64-bit descriptor steps]: CuTe's GMMA::DescriptorIterator steps a shared-memory
// descriptor by adding to its low 32 bits and copying the high word, a compile-time constant
// (layout type, stride offset), which ptxas then rematerializes with a UMOV per operand per wgmma:
// two UMOVs beside the two UIADD3s of every SS wgmma (the hd128 backward executed 19.8 M UMOVs
// against flash-attn-4's 6.4 M, 2.2 per HGMMA against 0.7; ncu opcode census). Desc64
// steps the whole 64-bit descriptor instead, one UIADD3.64 per operand, as flash-attn-4's code
// does. The two agree: a step moves the start address field (bits 0-13, the byte address / 16)
// within shared memory, so it never carries out of those 14 bits (228 KB / 16 < 2^14).
// Where ptxas splits the 64-bit add into an add with carry (UIADD3, UIADD3.X and the UMOVs of
// both halves: six instructions per wgmma instead of four), the caller keeps CuTe's steps
// (desc64<false>): the hd128 backward's early dPᵀ at the end of the Q-block loop, whose stage
// index is decided there. Counted in the SASS of the backward's unmasked block per consumer warp:
// 489 instructions with CuTe's steps everywhere, 471 with Desc64 everywhere, 450 with the early
// dPᵀ excepted. The forward keeps CuTe's steps: there ptxas already holds Q's descriptors across
// the KV-block loop, and Desc64 made its loop 7 instructions longer (hd128).
struct Desc64 {
  using reference = GmmaDescriptor;
  using element_type = GmmaDescriptor;
  using value_type = GmmaDescriptor;
  GmmaDescriptor desc_;
  __device__ reference operator*() const { return desc_; }
  template <class Index>
  __device__ reference operator[](const Index& i) const {
    return *(*this + i);
  }
  template <class Index>
  __device__ Desc64 operator+(const Index& offset) const {
    return {GmmaDescriptor(desc_.desc_ + uint64_t(int64_t(offset)))};
  }
};
// mma_unpack reads a descriptor operand as uint64_t (found by argument-dependent lookup, as
// CuTe's own overload for DescriptorIterator).
template <class NewT>
__device__ Desc64 recast_ptr(const Desc64& it) {
  static_assert(std::is_same_v<NewT, uint64_t>, "a descriptor operand is read as uint64_t");
  return it;
}

// A wgmma operand with Desc64 steps (Note [64-bit descriptor steps]); register operands as they
// are.
template <bool kOn = true, class Engine, class Layout>
__device__ decltype(auto) desc64(const Tensor<Engine, Layout>& t) {
  if constexpr (kOn && std::is_base_of_v<GMMA::DescriptorIterator, typename Engine::iterator>) {
    return make_tensor(Desc64{t.data().desc_}, t.layout());
  } else {
    return (t);
  }
}

// One TMA load through a PipelineTmaAsync stage: wait for the stage to be free, load `src` into
// the stage's buffer of `dst` (its last mode indexes stages), advance the state.
template <class Pipeline, class State, class Tma, class Src, class Dst>
__device__ __forceinline__ void pipelined_tma_load(Pipeline& pipe, State& state, const Tma& tma,
                                                   const Src& src, Dst&& dst) {
  pipe.producer_acquire(state);
  copy(tma.with(*pipe.producer_get_barrier(state), 0), src, dst(_, state.index()));
  ++state;
}

// Note [uniform descriptors]: the wgmma descriptor of a shared-memory operand depends only on
// the warpgroup, so such operand fragments are sliced with the warpgroup's first thread index,
// broadcast from lane 0 (tid: the thread's index among the consumer threads). The compiler then
// keeps the descriptors in uniform registers; sliced with tid itself, every HGMMA of a loop
// rebuilt its descriptor in ordinary registers and moved it over (R2UR, IMAD.MOV, VIADD: ~5
// instructions per HGMMA in the backward). Accumulator and copy partitions still need tid.
__device__ __forceinline__ int warpgroup_slice_index(int tid) {
  return __shfl_sync(0xffffffff, tid, 0) & ~127;
}

// Note [fresh tid]: threadIdx.x read by a volatile asm, which the compiler cannot hoist out of a
// loop. Per-thread offsets derived from it inside the loop are rebuilt with a few integer
// instructions each iteration instead of being kept live across it: the SM90 backward spilled
// two of them (its registers are full), and each reload went to L2 (shared memory takes most of
// L1), the loop's top stall in ncu.
__device__ __forceinline__ int fresh_thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Note [known thread range]: a consumer's thread index (threadIdx.x - 128, passed in or read by
// fresh_thread_index) is a signed int whose range the compiler does not know, so each division
// and remainder by a power of two that CuTe's layouts make of it (fragment coordinates, stmatrix
// addresses) became the signed form: a shift for the sign, a LEA.HI and a mask where the unsigned
// form is one instruction. Stating the range lets it use the unsigned forms: the backward's block
// loop (static SASS, bf16) 20 instructions shorter at hd 96 / 128 (hd128's unmasked block 450 ->
// 430 per consumer warp) and 37 at hd64 (whose spills went 286 -> 250 bytes). Not in the split
// consumer (d > 128), whose thread offsets are computed once: there the stated range made its
// block loop ~55 instructions longer. Measured on H100 against the loop without it: hd64
// backward +1.8 / +3.3 / +3.8 % at 1k / 16k / causal 2k, hd128 level (means within 1 %).
template <int kThreads>
__device__ __forceinline__ int known_thread_range(int tid) {
  __builtin_assume(tid >= 0 && tid < kThreads);
  return tid;
}

// Note [quad transpose]: in the accumulator a quad's four lanes hold one row, lane q the pair of
// columns 8g + 2q (g = 0 .. d_v/8 - 1): a 4-byte store each, half of every 32-byte sector per
// warp instruction. Over four consecutive groups the quad exchanges pairs (two xor-shuffle
// rounds, a 4 × 4 transpose of 32-bit words: round 1 swaps bit 1 of the lane with bit 1 of the
// group, round 2 bit 0), after which lane q holds group 4j + q's four pairs, 8 consecutive
// columns: one 16-byte store. The forward's register epilogue (d_v / 8 a multiple of 4 at every
// head dim) and the split backward's dK/dV epilogue (d / 16 per warpgroup, Note [split
// epilogue]) use it.
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int quad_lane) {
  CUTLASS_PRAGMA_UNROLL
  for (int bit = 2; bit >= 1; bit /= 2) {
    const bool upper = quad_lane & bit;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < 4; ++k) {
      if (k & bit) continue;  // the pair (k, k + bit)
      const uint32_t send = upper ? w[k] : w[k + bit];
      const uint32_t recv = __shfl_xor_sync(0xffffffffu, send, bit);
      if (upper) {
        w[k] = recv;
      } else {
        w[k + bit] = recv;
      }
    }
  }
}

}  // namespace fa4::sm90
