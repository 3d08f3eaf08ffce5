// Pieces shared by the SM90 forward and backward kernels: warp roles, shared-memory atoms, and
// the global tensors as TMA sees them.
#pragma once

#include <cute/tensor.hpp>

namespace fa4::sm90 {

using namespace cute;

// One producer warpgroup (TMA) and two consumer warpgroups (wgmma + softmax) in both kernels.
enum class WarpGroupRole : int { kProducer = 0, kConsumer0 = 1, kConsumer1 = 2 };

// The largest GMMA K-major swizzle atom whose row (64, 32 or 16 elements) divides the head dim.
template <class Element, int kCols>
auto smem_atom_k() {
  if constexpr (kCols % 64 == 0) {
    return GMMA::Layout_K_SW128_Atom<Element>{};
  } else if constexpr (kCols % 32 == 0) {
    return GMMA::Layout_K_SW64_Atom<Element>{};
  } else {
    return GMMA::Layout_K_SW32_Atom<Element>{};
  }
}

// Global tensors as TMA sees them: (rows, d, heads, batch), d contiguous. Varlen passes batch 1
// and moves each sequence's rows by its offset (domain_offset).
template <class Element>
auto gmem_qkv(const void* ptr, int rows, int d, int heads, int batch, int64_t row_stride,
              int64_t head_stride, int64_t batch_stride) {
  return make_tensor(make_gmem_ptr(static_cast<const Element*>(ptr)),
                     make_shape(rows, d, heads, batch),
                     make_stride(row_stride, _1{}, head_stride, batch_stride));
}

// A transposed view (the two first modes swapped, the stage mode kept) of a K-major staged
// smem layout, for operands that read the same buffer MN-major (Vᵀ, Qᵀ, dOᵀ, Kᵀ).
template <class Layout, int kRows, int kCols, int kStages>
using TransposedSmem = decltype(composition(
    Layout{},
    make_ordered_layout(Shape<Int<kCols>, Int<kRows>, Int<kStages>>{}, Step<_2, _1, _3>{})));

// One TMA load through a PipelineTmaAsync stage: wait for the stage to be free, load `src` into
// the stage's buffer of `dst` (its last mode indexes stages), advance the state.
template <class Pipeline, class State, class Tma, class Src, class Dst>
__device__ __forceinline__ void pipelined_tma_load(Pipeline& pipe, State& state, const Tma& tma,
                                                   const Src& src, Dst&& dst) {
  pipe.producer_acquire(state);
  copy(tma.with(*pipe.producer_get_barrier(state), 0), src, dst(_, state.index()));
  ++state;
}

}  // namespace fa4::sm90
