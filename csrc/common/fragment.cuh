// Register fragments: which elements of a tile (S, P or O) one thread holds, and in which
// registers. common/mask.cuh and common/softmax.cuh are written against this description so that
// the SM90 kernel (wgmma accumulators, a row spread over 4 lanes) and the SM100 kernel (TMEM loads,
// a whole row per thread) run the same code, and so does the g++ unit-test harness on the host.
//
// A fragment layout Frag provides
//   kRows            rows of the tile this thread holds
//   kCols            elements of each of those rows in this thread's registers
//   kThreadsPerRow   lanes that share a row: lanes l, l ^ 1, ..., l ^ (kThreadsPerRow - 1)
//                    (1, 2 or 4); row reductions combine them with __shfl_xor_sync
//   kSize            kRows * kCols, the register array's length
//   idx(r, e)        register index of element e of row r. constexpr, so that unrolled loops
//                    address registers directly: an array indexed at run time would be placed
//                    in local memory.
// Element e of a row is this thread's e-th element of the row in register order, not a column
// index; the caller supplies the column when one is needed (masking).
#pragma once

#include "common/host_device.cuh"

namespace fa4 {

// A thread holds kRows whole rows, elements in column order. SM100: a tcgen05.ld 32x32b load
// gives thread t of a warpgroup lane t of TMEM, i.e. row t of the 128-row tile, with the
// columns in registers in order (kRows = 1). Host harness: any kRows.
template <int kRows_, int kCols_>
struct RowMajorFrag {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kThreadsPerRow = 1;
  static constexpr int kSize = kRows * kCols;
  __host__ __device__ static constexpr int idx(int r, int e) { return r * kCols + e; }
};

// The fp32 accumulator of one SM90 wgmma m64nNk16 (N = kN) as a warpgroup holds it: thread t
// of warp w holds rows 16w + t/4 and 16w + t/4 + 8; of each 8-column group g it holds columns
// 8g + 2(t%4) and 8g + 2(t%4) + 1, in registers 4g + {0, 1} (first row) and 4g + {2, 3}
// (second row). A row is spread over the 4 lanes of a quad, kN/4 elements each; element e of a
// row is column 8(e/2) + 2(t%4) + e%2.
template <int kN>
struct QuadFrag {
  static_assert(kN % 8 == 0, "wgmma N is a multiple of 8");
  static constexpr int kRows = 2;
  static constexpr int kCols = kN / 4;
  static constexpr int kThreadsPerRow = 4;
  static constexpr int kSize = kRows * kCols;
  __host__ __device__ static constexpr int idx(int r, int e) { return (e / 2) * 4 + r * 2 + e % 2; }
};

// True iff Frag::idx maps the kRows x kCols elements one to one onto registers [0, kSize):
// the softmax and mask static_assert it, so a layout typo fails to compile instead of reading
// one register twice.
template <class Frag>
__host__ __device__ constexpr bool is_register_permutation() {
  bool seen[Frag::kSize] = {};
  for (int r = 0; r < Frag::kRows; ++r) {
    for (int e = 0; e < Frag::kCols; ++e) {
      const int i = Frag::idx(r, e);
      if (i < 0 || i >= Frag::kSize || seen[i]) return false;
      seen[i] = true;
    }
  }
  return true;
}

}  // namespace fa4
