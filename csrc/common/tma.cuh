// Shared-memory atoms and global tensors as TMA sees them, for the kernels of both architectures
// (the SM90 kernels load with TMA; the SM100 kernels describe their loads and stores the same way).
#pragma once

#include <cute/tensor.hpp>

#include "api/fa4.h"

namespace fa4 {

using namespace cute;

// The largest GMMA K-major swizzle atom whose row (128, 64 or 32 bytes: 64, 32 or 16 16-bit
// elements, twice as many e4m3) divides the row of kCols elements.
template <class Element, int kCols>
auto smem_atom_k() {
  constexpr int kBytes = kCols * int(sizeof_bits_v<Element>) / 8;
  if constexpr (kBytes % 128 == 0) {
    return GMMA::Layout_K_SW128_Atom<Element>{};
  } else if constexpr (kBytes % 64 == 0) {
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

// One of q, k, v, dO as TMA sees it (gmem_qkv's arguments). Varlen: batch 1, no batch stride.
// An empty tensor becomes one phantom row: TMA cannot describe an empty tensor, and with no rows
// no tile loads anything.
struct GmemView {
  const void* ptr = nullptr;
  int rows = 1, cols = 0, heads = 1, batch = 1;
  int64_t row_stride = 0, head_stride = 0, batch_stride = 0;
  auto shape() const { return make_shape(rows, cols, heads, batch); }
};
// kv: the tensor has key rows (k, v) rather than query rows (q, out, dO).
inline GmemView gmem_view(const FwdParams& f, const void* ptr, bool kv, int cols,
                          int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int rows = kv ? (varlen ? f.total_k : f.seqlen_k) : (varlen ? f.total_q : f.seqlen_q);
  return {ptr,
          rows > 0 ? rows : 1,
          cols,
          kv ? f.heads_kv : f.heads_q,
          varlen ? 1 : f.batch,
          row_stride,
          head_stride,
          varlen ? 0 : batch_stride};
}

// q, k, v (and the backward's dO) as TMA sees them, each with its true head dim (Note [padded
// head dims]): the views every kernel's launch builds its TMA tiles from.
struct FwdViews {
  GmemView q, k, v;
};
inline FwdViews fwd_views(const FwdParams& f) {
  return {gmem_view(f, f.q, false, f.head_dim, f.q_row_stride, f.q_head_stride, f.q_batch_stride),
          gmem_view(f, f.k, true, f.head_dim, f.k_row_stride, f.k_head_stride, f.k_batch_stride),
          gmem_view(f, f.v, true, f.head_dim_v, f.v_row_stride, f.v_head_stride, f.v_batch_stride)};
}
struct BwdViews {
  GmemView q, dout, k, v;
};
inline BwdViews bwd_views(const BwdParams& p) {
  const FwdParams& f = p.fwd;
  const FwdViews fv = fwd_views(f);
  return {fv.q,
          gmem_view(f, p.dout, false, f.head_dim_v, p.dout_row_stride, p.dout_head_stride,
                    p.dout_batch_stride),
          fv.k, fv.v};
}

// TMA loads of kRows × kCols tiles of a GmemView into one stage of SmemLayout (the stage mode,
// if any, dropped), and its type for kernel parameter structs. g.cols <= kCols: the columns of a
// box past g.cols are filled with zeros (Note [padded head dims], common/head_dims.h).
template <class Element, class SmemLayout, int kRows, int kCols>
auto make_tma_tile(const GmemView& g) {
  return make_tma_copy(SM90_TMA_LOAD{},
                       gmem_qkv<Element>(g.ptr, g.rows, g.cols, g.heads, g.batch, g.row_stride,
                                         g.head_stride, g.batch_stride),
                       take<0, 2>(SmemLayout{}), Shape<Int<kRows>, Int<kCols>>{}, _1{});
}
template <class Element, class SmemLayout, int kRows, int kCols>
using TmaTile = decltype(make_tma_tile<Element, SmemLayout, kRows, kCols>(GmemView{}));

// TMA loads of kRows × kCols tiles of a tensor with kFullCols columns in the kernel (column
// tiles: the d/2 halves) and g.cols <= kFullCols in memory (zero-filled past them: Note [padded
// head dims]); make_tma_tile's tiles span all columns.
template <class Element, class SmemLayout, int kRows, int kCols, int kFullCols>
auto make_tma_cols(const GmemView& g) {
  static_assert(kCols <= kFullCols, "a column tile of the kernel's columns");
  return make_tma_copy(SM90_TMA_LOAD{},
                       gmem_qkv<Element>(g.ptr, g.rows, g.cols, g.heads, g.batch, g.row_stride,
                                         g.head_stride, g.batch_stride),
                       take<0, 2>(SmemLayout{}), Shape<Int<kRows>, Int<kCols>>{}, _1{});
}
template <class Element, class SmemLayout, int kRows, int kCols, int kFullCols>
using TmaCols = decltype(make_tma_cols<Element, SmemLayout, kRows, kCols, kFullCols>(GmemView{}));

// TMA stores of kRows × kCols tiles from SmemLayout into a GmemView (the output); a box's columns
// past g.cols (<= kCols) are not written.
template <class Element, class SmemLayout, int kRows, int kCols>
auto make_tma_store_tile(const GmemView& g) {
  return make_tma_copy(SM90_TMA_STORE{},
                       make_tensor(make_gmem_ptr(static_cast<Element*>(const_cast<void*>(g.ptr))),
                                   make_shape(g.rows, g.cols, g.heads, g.batch),
                                   make_stride(g.row_stride, _1{}, g.head_stride, g.batch_stride)),
                       SmemLayout{}, Shape<Int<kRows>, Int<kCols>>{}, _1{});
}
template <class Element, class SmemLayout, int kRows, int kCols>
using TmaStoreTile = decltype(make_tma_store_tile<Element, SmemLayout, kRows, kCols>(GmemView{}));

// A transposed view (the two first modes swapped, the stage mode kept) of a K-major staged
// smem layout, for operands that read the same buffer MN-major (Vᵀ, Qᵀ, dOᵀ, Kᵀ).
template <class Layout, int kRows, int kCols, int kStages>
using TransposedSmem = decltype(composition(
    Layout{},
    make_ordered_layout(Shape<Int<kCols>, Int<kRows>, Int<kStages>>{}, Step<_2, _1, _3>{})));

}  // namespace fa4
