// Masks: causal, sliding window and sequence ends, for the forward (and backward) kernels of
// every architecture. Block level: which KV blocks a Q tile visits, and which of those need
// the per-element mask (the rest are fully visible, so the kernel skips the mask there).
// Element level: the predicate and its application to a register fragment (common/fragment.cuh).
// Varlen: SeqInfo, one sequence's offsets and lengths. All __host__ __device__; the host tests
// (tests/api/test_shared_headers.py) compare them with fa4.reference.allowed_keys element by
// element.
//
// Note [mask alignment] (as in fa4/reference.py): query row i of a sequence sees key j iff
//   j >= i + (seqlen_k - seqlen_q) - window_left     (no bound when window_left == -1)
//   j <= i + (seqlen_k - seqlen_q) + window_right    (no bound when window_right == -1)
// causal is window_right = 0; masks are aligned to the bottom-right corner when
// seqlen_q != seqlen_k. Half-open: row i sees [i + diag_lo, i + diag_hi) ∩ [0, seqlen_k) with
// diag_lo = seqlen_k - seqlen_q - window_left, diag_hi = seqlen_k - seqlen_q + window_right + 1.
// Note [window entries]: -1 is the one unbounded value; every other entry is literal, and a
// negative one shifts that edge past the diagonal (flash-attn-4's shifted windows: left = -98
// sees keys from 98 past the diagonal on). A band of width left + right + 1 <= 0 sees no key:
// Mask::make stores it as the empty band diag_lo = diag_hi = -seqlen_q. Otherwise the interval
// is left + right + 1 >= 1 wide and both ends move right by one column per row, so consecutive
// rows' intervals touch or overlap: the columns seen by a band of rows form one interval, and
// the KV blocks a Q tile visits one contiguous range [n_begin, n_end).
//
// Note [mask clamping]: the unbounded side and windows longer than the sequence are clamped:
// diag_lo, diag_hi into [-seqlen_q, seqlen_k]. For rows 0 <= i < seqlen_q, a diag_lo <= -seqlen_q
// gives a lower end i + diag_lo < 0 (no bound, like any smaller one) and a diag_hi >= seqlen_k an
// upper end >= seqlen_k, so the clamp changes no element, and row + diag stays within int32 for
// seqlen_q + seqlen_k < 2^31 (FwdParams lengths are int: 1e9-token sequences would be needed to
// break it). window_left = INT_MAX, say, would otherwise overflow i + diag_lo.
#pragma once

#include <stdint.h>

#include <math.h>

#include "common/fragment.cuh"

namespace fa4 {

// The window entry that leaves its side unbounded (Note [window entries]).
constexpr int kWindowUnbounded = -1;

// Whether a mask can hide keys left or right of the whole row range (causal or a window edge):
// the schedulers order such problems longest-first and the SM90 forward picks kernels by it.
template <class Params>
__host__ __device__ bool is_banded(const Params& p) {
  return p.causal || p.window_left != kWindowUnbounded || p.window_right != kWindowUnbounded;
}

namespace detail {
__host__ __device__ __forceinline__ int imin(int a, int b) {
  return a < b ? a : b;
}
__host__ __device__ __forceinline__ int imax(int a, int b) {
  return a > b ? a : b;
}
__host__ __device__ __forceinline__ int clamp_diag(int64_t d, int seqlen_q, int seqlen_k) {
  return static_cast<int>(d < -seqlen_q ? -seqlen_q : (d > seqlen_k ? seqlen_k : d));
}
}  // namespace detail

// Visible key columns [lo, hi) of one query row; empty when lo >= hi.
struct RowBounds {
  int lo, hi;
  __host__ __device__ bool contains(int col) const { return col >= lo && col < hi; }
};

// The mask of one sequence (for varlen: lengths from SeqInfo, after seqused_k).
struct Mask {
  int seqlen_q = 0, seqlen_k = 0;
  int diag_lo = 0, diag_hi = 0;  // Note [mask alignment], clamped (Note [mask clamping])

  // window_* == kWindowUnbounded: no bound on that side (Note [window entries]); causal forces
  // window_right = 0, as flash-attn does with any right window.
  __host__ __device__ static Mask make(int seqlen_q, int seqlen_k, int window_left,
                                       int window_right, bool causal) {
    if (causal) window_right = 0;
    const int64_t offset = int64_t(seqlen_k) - seqlen_q;
    Mask m;
    m.seqlen_q = seqlen_q;
    m.seqlen_k = seqlen_k;
    m.diag_lo = window_left == kWindowUnbounded
                    ? -seqlen_q
                    : detail::clamp_diag(offset - int64_t(window_left), seqlen_q, seqlen_k);
    m.diag_hi = window_right == kWindowUnbounded
                    ? seqlen_k
                    : detail::clamp_diag(offset + int64_t(window_right) + 1, seqlen_q, seqlen_k);
    if (m.diag_hi <= m.diag_lo) m.diag_lo = m.diag_hi = -seqlen_q;
    return m;
  }
  // From FwdParams (or anything with window_left, window_right, causal) and one sequence's
  // lengths; a template so that this header does not need api/fa4.h (and with it the CUDA runtime).
  template <class Params>
  __host__ __device__ static Mask from_params(const Params& p, int seqlen_q, int seqlen_k) {
    return make(seqlen_q, seqlen_k, p.window_left, p.window_right, p.causal);
  }

  // Rows outside [0, seqlen_q) (the padding rows of the last Q tile) see nothing, as in the
  // model's padded tile grid; the check is per row, not per element.
  __host__ __device__ RowBounds row_bounds(int row) const {
    if (row < 0 || row >= seqlen_q) return {0, 0};
    return {detail::imax(0, row + diag_lo), detail::imin(seqlen_k, row + diag_hi)};
  }
  __host__ __device__ bool is_visible(int row, int col) const {
    return row_bounds(row).contains(col);
  }
  // The transpose, for kernels whose fragment rows are keys (the backward's Sᵀ): the query rows
  // [lo, hi) that see key column col. From Note [mask alignment], i sees j iff
  // j - diag_hi < i <= j - diag_lo, with 0 <= i < seqlen_q and 0 <= j < seqlen_k.
  __host__ __device__ RowBounds col_bounds(int col) const {
    if (col < 0 || col >= seqlen_k) return {0, 0};
    return {detail::imax(0, col - diag_hi + 1), detail::imin(seqlen_q, col - diag_lo + 1)};
  }
  // Note [band test]: for 0 <= row < seqlen_q and col >= 0, is_visible(row, col) ==
  // in_band(col - row - diag_lo, key_width(col)): diag_lo <= col - row < diag_hi is one unsigned
  // compare, and keys past seqlen_k get width 0. The backward's masked blocks test each element
  // this way (col - row is the thread's base plus a compile-time offset per element: one add and
  // one compare, where col_bounds(col).contains(row) cost ~11 instructions per element in the
  // SASS); their rows past seqlen_q need no test (lse₂ = +inf there, so P = 0). The widths fit:
  // diag_hi - diag_lo <= seqlen_q + seqlen_k (Note [mask clamping]).
  __host__ __device__ unsigned key_width(int col) const {
    return col < seqlen_k ? unsigned(diag_hi - diag_lo) : 0u;
  }
  __host__ __device__ static bool in_band(int diff, unsigned width) {
    return unsigned(diff) < width;
  }
};

// The KV blocks one Q tile visits and the sub-range that needs no element mask:
//   [n_begin, full_begin)   masked: left edge of a sliding window
//   [full_begin, full_end)  every element visible for every row < seqlen_q of the tile
//   [full_end, n_end)       masked: the diagonal / right window edge and the partial last block
// n_begin == n_end: the tile sees no key (its rows get out = 0, lse = -inf: Note [empty rows]).
// From left_end on, no row's left edge hides an element of the block (Note [right-edge mask]):
// left_end = n_begin unless a sliding window has a left edge.
struct BlockRange {
  int n_begin = 0, n_end = 0;
  int full_begin = 0, full_end = 0;
  int left_end = 0;
  __host__ __device__ bool empty() const { return n_begin >= n_end; }
  __host__ __device__ int size() const { return n_end - n_begin; }
  __host__ __device__ bool needs_mask(int n_block) const {
    return n_block < full_begin || n_block >= full_end;
  }
};

// Q tile m_block covers rows [m_block * kBlockM, (m_block + 1) * kBlockM) ∩ [0, seqlen_q). The
// union of its rows' intervals is [lo(first row), hi(last row)) (Note [mask alignment]); a block
// is fully visible iff it lies inside [lo(last row), hi(first row)), the interval every row
// sees, since lo and hi grow with the row.
template <int kBlockM, int kBlockN>
__host__ __device__ BlockRange block_range(const Mask& mask, int m_block) {
  static_assert(kBlockM > 0 && kBlockN > 0, "block sizes must be positive");
  BlockRange br;
  const int row0 = m_block * kBlockM;
  if (row0 < 0 || row0 >= mask.seqlen_q) return br;
  const int row1 = detail::imin(row0 + kBlockM, mask.seqlen_q) - 1;
  const RowBounds first = mask.row_bounds(row0);
  const RowBounds last = mask.row_bounds(row1);
  if (first.lo >= last.hi) return br;  // first.lo >= 0, so last.hi > 0 below
  br.n_begin = first.lo / kBlockN;
  br.n_end = (last.hi + kBlockN - 1) / kBlockN;
  const int fb = detail::imax((last.lo + kBlockN - 1) / kBlockN, br.n_begin);
  const int fe = detail::imin(detail::imax(first.hi, 0) / kBlockN, br.n_end);
  br.full_begin = fb < fe ? fb : br.n_end;
  br.full_end = fb < fe ? fe : br.n_end;
  br.left_end = fb;  // the last row's left end is the rightmost: blocks from fb start past it
  return br;
}

// Note [slice block end]: the end of the KV blocks that a slice of a Q tile's rows, rows
// row_first to row_last (< seqlen_q), sees: blocks from it on are masked off for every row of the
// slice, since hi grows with the row. A warpgroup that owns the slice skips them; with causal
// 192-row tiles and 128-key blocks the first 64 or 128 rows skip the tile's last block. Rows
// past seqlen_k - diag_lo - 1 see nothing (a left edge shifted past the last key, Note [window
// entries]), so the slice's last row that can see a key stands in for row_last. At least
// n_begin + 1, so that a slice whose rows see no key still runs one (fully masked) block and
// writes what the whole tile would for them (zeros, LSE -inf). For a non-empty br only.
template <int kBlockN>
__host__ __device__ int slice_block_end(const BlockRange& br, const Mask& mask, int row_first,
                                        int row_last) {
  const int r = detail::imin(row_last, mask.seqlen_k - mask.diag_lo - 1);
  const int hi = r < row_first ? 0 : detail::imax(mask.row_bounds(r).hi, 0);
  return detail::imax(detail::imin((hi + kBlockN - 1) / kBlockN, br.n_end), br.n_begin + 1);
}

// Note [block needs mask]: block_range<kBlockM, kBlockN>(mask, m).needs_mask(n) for a Q block m
// of the sequence (0 <= m kBlockM < seqlen_q) and any KV block n >= 0, in three compares
// instead of a whole block_range. The backward asks it once per Q block, and block_range there
// was ~70 dependent uniform instructions per warp and block right after the Sᵀ wait (SASS of the
// hd128 loop). With first / last the block's first and last rows' bounds,
// block_range's full range holds n iff fb <= n < fe (none when fb >= fe), where
//   n < fe = min(max(first.hi, 0) / kBlockN, n_end) iff first.hi >= (n + 1) kBlockN (> 0), i.e.
//     seqlen_k and row0 + diag_hi are both >= (n + 1) kBlockN (then n_end > n as well);
//   fb = max(ceil(last.lo / kBlockN), n_begin) <= n iff last.lo <= n kBlockN, i.e.
//     row1 + diag_lo <= n kBlockN (last.lo = max(0, row1 + diag_lo) and n_begin <= fb).
// Both together contradict an empty block (first.lo >= last.hi), for which block_range says
// masked too. tests/api/test_shared_headers.py checks it against block_range over every Q block
// and every KV block up to two past the last.
template <int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ bool block_needs_mask(const Mask& mask, int m, int n) {
  const int row0 = m * kBlockM;
  const int row1 = detail::imin(row0 + kBlockM, mask.seqlen_q) - 1;
  const int end = (n + 1) * kBlockN;
  return end > mask.seqlen_k || row0 + mask.diag_hi < end || row1 + mask.diag_lo > n * kBlockN;
}

// Key columns the S GEMMs compute over every Q tile of one sequence: each KV block the tile
// visits counts whole, masked ones and the zero-filled tail past seqlen_k included (Note [hd256
// narrow blocks] compares two kBlockN by it).
template <int kBlockM, int kBlockN>
__host__ __device__ int64_t keys_computed(const Mask& mask) {
  int64_t keys = 0;
  for (int m = 0; m * kBlockM < mask.seqlen_q; ++m) {
    keys += int64_t(block_range<kBlockM, kBlockN>(mask, m).size()) * kBlockN;
  }
  return keys;
}

// The Q blocks of kBlockM rows that see KV block n (whose block_range contains n): [m_begin,
// m_end), or m_begin = the number of Q blocks and m_end = 0 when none does. The backward asks
// once per CTA and tile. Note [Q blocks in closed form]: block_range(m) holds n iff a row of
// block m sees a key of block n (its [n_begin, n_end) is the union of its rows' intervals, which
// is contiguous: both ends grow by at most one per row, Note [mask alignment]). Row i sees key j
// iff j - diag_hi < i <= j - diag_lo (0 <= i < seqlen_q), so with the block's keys [col0, col1]
// the rows seeing one are (col0 - diag_hi, col1 - diag_lo] ∩ [0, seqlen_q): for such a row both
// inequalities hold at some key of the block, since diag_lo < diag_hi (the empty band gives none).
// The Q blocks follow by two divisions by kBlockM. Two binary searches over block_range did this
// before: ~400 dependent uniform instructions per consumer warp and tile (ncu at hd128 causal 2k),
// and a scan of every Q block before them ~20 us per CTA at 16k rows.
// tests/api/test_shared_headers.py checks the result against the scan of block_range. Overflow:
// |diag| <= seqlen_q + seqlen_k (Note [mask clamping]).
template <int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ void q_blocks_seeing(const Mask& mask, int n, int& m_begin,
                                                         int& m_end) {
  const int m_blocks = (mask.seqlen_q + kBlockM - 1) / kBlockM;
  const int col0 = n * kBlockN;
  const int col1 = detail::imin(col0 + kBlockN, mask.seqlen_k) - 1;
  const int row0 = detail::imax(0, col0 - mask.diag_hi + 1);
  const int row1 = detail::imin(mask.seqlen_q - 1, col1 - mask.diag_lo);
  const bool none = n < 0 || col0 >= mask.seqlen_k || row0 > row1;
  m_begin = none ? m_blocks : row0 / kBlockM;
  m_end = none ? 0 : row1 / kBlockM + 1;
}

// Sets to -inf the elements of a fragment (common/fragment.cuh) that row/column masking hides.
// row_of(r): the query row (within the sequence) of the thread's row r; col_of(e): the key
// column of its element e, e.g. [=](int e) { return n_block * kBlockN + e; } for RowMajorFrag.
// Call it on the blocks BlockRange::needs_mask names, after softcap and before the row max.
template <class Frag, class RowOf, class ColOf>
__host__ __device__ __forceinline__ void apply_mask(float (&s)[Frag::kSize], const Mask& mask,
                                                    RowOf row_of, ColOf col_of) {
  static_assert(is_register_permutation<Frag>(), "Frag::idx must be one to one");
  FA4_UNROLL
  for (int r = 0; r < Frag::kRows; ++r) {
    const RowBounds b = mask.row_bounds(row_of(r));
    FA4_UNROLL
    for (int e = 0; e < Frag::kCols; ++e) {
      if (!b.contains(col_of(e))) s[Frag::idx(r, e)] = -INFINITY;
    }
  }
}

// Note [right-edge mask]: in a masked block that no row's left edge cuts (n >= left_end: every
// masked block of a causal mask without a left window), element e of row r is hidden iff its
// column is at or past the row's right end hi(r) (row_bounds: 0 for rows outside the sequence,
// which hides the whole row, as apply_mask does). With the column written as base + offset(e),
// base per thread and block and offset a compile-time constant per element, that is one compare
// of offset(e) against bound(r) = hi(r) - base: an immediate operand, where apply_mask
// computes the column and tests both ends (SM90 hd128: 237 instructions per thread and masked
// block). The bound is made opaque to the compiler, which otherwise folded it back into
// base + offset(e) < hi(r): an add per column pair. The SM90 forward takes it at every head dim
// but 96 (default_right_edge_mask in sm90/fwd/heuristics.cuh has the measurements); the SM100
// forward keeps apply_mask (an opaque bound there raised its spills at hd192, 36 -> 108 bytes).
__host__ __device__ __forceinline__ int opaque_int(int x) {
#if defined(__CUDA_ARCH__)
  asm("" : "+r"(x));
#endif
  return x;
}

// Sets to -inf the elements with offset_of(e) >= bound_of(r) (Note [right-edge mask]): for the
// blocks from BlockRange::left_end on, with bound_of(r) = row_bounds(row of r).hi - base and
// offset_of(e) = column of e - base.
template <class Frag, class BoundOf, class OffsetOf>
__host__ __device__ __forceinline__ void apply_mask_right(float (&s)[Frag::kSize], BoundOf bound_of,
                                                          OffsetOf offset_of) {
  static_assert(is_register_permutation<Frag>(), "Frag::idx must be one to one");
  FA4_UNROLL
  for (int r = 0; r < Frag::kRows; ++r) {
    const int bound = opaque_int(bound_of(r));
    FA4_UNROLL
    for (int e = 0; e < Frag::kCols; ++e) {
      if (offset_of(e) >= bound) s[Frag::idx(r, e)] = -INFINITY;
    }
  }
}

// One sequence of a batch: where its rows start in the packed tensors and its lengths.
// Dense (cu_seqlens_q == nullptr): offsets 0 (the kernel adds batch * batch_stride) and the
// problem's lengths. Varlen: rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and likewise of k;
// with seqused_k the sequence sees only its first seqused_k[b] keys, which also moves the
// causal diagonal (FwdParams: as if seqlen_k were seqused_k[b]). Offsets are int like
// cu_seqlens; multiply them by the int64 row strides.
struct SeqInfo {
  int offset_q = 0, offset_k = 0;
  int seqlen_q = 0, seqlen_k = 0;

  __host__ __device__ static SeqInfo get(int b, const int* cu_seqlens_q, const int* cu_seqlens_k,
                                         const int* seqused_k, int seqlen_q, int seqlen_k) {
    SeqInfo s;
    if (cu_seqlens_q == nullptr) {
      s.seqlen_q = seqlen_q;
      s.seqlen_k = seqlen_k;
      return s;
    }
    s.offset_q = cu_seqlens_q[b];
    s.offset_k = cu_seqlens_k[b];
    s.seqlen_q = cu_seqlens_q[b + 1] - s.offset_q;
    s.seqlen_k = seqused_k != nullptr ? seqused_k[b] : cu_seqlens_k[b + 1] - s.offset_k;
    return s;
  }
};

}  // namespace fa4
