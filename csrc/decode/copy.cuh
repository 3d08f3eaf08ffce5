// The decode producer's copies (decode/kernel.cuh, Note [row gather], [tma blocks]) and the FP8
// cache's dequantization (Note [fp8 cache]): 16-byte cp.async chunks, whole blocks by TMA tile,
// the swizzled layout both write and the consumers read, and the e4m3 -> fp16 conversions.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cutlass/arch/barrier.h>

#include "common/host_device.cuh"
#include "common/tma.cuh"
#include "decode/plan.h"

namespace fa4::decode {

// Byte offset of (row, col) in a swizzled TMA tile of kBytes-byte elements (col a multiple of
// 16 / kBytes: a 16-byte chunk, which every swizzle keeps whole). GMMA's swizzle atoms permute
// byte addresses (Sw<3,4,3> at 128 bytes: chunk bits 4-6 ^= row bits 7-9, whatever the element
// size), so the swizzle applies to the element offset times kBytes; the tile's base is
// 1024-byte aligned, as the hardware's address-based swizzle of the TMA writes assumes.
template <class Layout, int kBytes>
__host__ __device__ __forceinline__ int swizzled(int row, int col) {
  return get_swizzle_portion(Layout{})(kBytes * get_nonswizzle_portion(Layout{})(row, col));
}

// Note [swizzle steps]: the consumers' ldmatrix addresses move from a thread's own (row0, col0)
// by compile-time steps: dr a multiple of 8 rows, dc a multiple of 16 elements (two chunks), with
// col0 in the first two chunks of its atom row. A swizzle atom of kAtomCols columns XORs a
// chunk's index with bits of row % 8, which dr keeps, so the step within an atom row is an XOR
// of the step's chunk bits (disjoint from col0's) and the rest is a constant offset: one LOP3 per
// ldmatrix instead of the layout's arithmetic (hd128 bf16 at one consumer warp per block: 232
// bytes of spills on sm_100a without it). decode_swizzle_harness checks it against swizzled.
// dr and dc are constants after the consumers' loops unroll.
template <class Layout, int kBytes, int kAtomCols>
__host__ __device__ __forceinline__ int swizzled_step(int base, int dr, int dc) {
  const int in_row = dc % kAtomCols;
  return (base ^ swizzled<Layout, kBytes>(0, in_row)) + swizzled<Layout, kBytes>(dr, dc - in_row);
}

namespace detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes = 0 writes 16 zero bytes and reads nothing.
// No "memory" clobber: the producer's loads of its row offsets may move ahead of earlier copies
// (the copies stay ordered against the barrier operations, volatile asm as well; the consumers
// read a stage only after its full barrier).
__device__ __forceinline__ void cp_async_16_free(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// One K (which = 0) or V (which = 1) block of kBlockN rows to dst(row, chunk) (shared-memory
// addresses of 16-byte chunks: padded rows, or the TMA variant's swizzled tile): copy i of
// a lane is chunk c % kChunks of row c / kChunks, c = lane + 32 i, so each warp instruction
// copies 512 contiguous bytes of 512 / (16 kChunks) rows (2 at hd128). Offsets from row_off
// (-1: a row past the sequence); chunks past the row's first `bytes` bytes are zero-filled. The
// offsets of kBatch copies are loaded into registers before any of them is issued: ptxas keeps a
// shared-memory load behind an earlier cp.async (both touch shared memory), so a load per copy
// costs one dependent round trip per 512 bytes (the SASS of 7136377), a batch of 8 one per 4 KB.
template <int kChunks, class Dst>
__device__ __forceinline__ void copy_block(Dst dst, const void* base, const int64_t* row_off,
                                           int which, int lane, int bytes) {
  constexpr int kIters = kBlockN * kChunks / 32;
  constexpr int kBatch = kIters % 8 == 0 ? 8 : kIters % 4 == 0 ? 4 : kIters % 2 == 0 ? 2 : 1;
  static_assert(kBlockN * kChunks % 32 == 0, "whole warp instructions");
  const char* src = static_cast<const char*>(base);
#pragma unroll 1
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    int64_t off[kBatch];
    FA4_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const int c = lane + 32 * (i0 + j);
      off[j] = (c % kChunks) * 16 < bytes ? row_off[2 * (c / kChunks) + which] : -1;
    }
    FA4_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const int c = lane + 32 * (i0 + j);
      const int r = c / kChunks, x = c % kChunks;
      cp_async_16_free(dst(r, x), src + (off[j] < 0 ? 0 : off[j] + x * 16), off[j] < 0 ? 0 : 16);
    }
  }
}

// Note [fp8 fragments]: the FP8 cache's MMA operands straight from the ring's e4m3 bytes, with
// no fp16 copy in shared memory. ldmatrix of an 8-row x 16-byte e4m3 matrix gives lane l the
// four bytes 4 (l % 4) .. + 3 of row l / 4, where m16n8k16's B fragment wants elements k =
// 2 (l % 4) + {0, 1} and + {8, 9} of column l / 4.
// - K (S = Q Kᵀ: rows are keys, n; bytes are d, k): the four bytes become b0 (the first two) and
//   b1 (the last two), which is the B fragment of the k order in which 16 d's read d 0, 1, 4, 5,
//   8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15. A reduction may take any order: the query tile is
//   stored in the same one (fp8_q_order), so S is unchanged.
// - V (O += P V: rows are keys, k; bytes are d, n): ldmatrix .trans of the same matrix gives lane
//   l keys 2 (l % 4) + {0, 1} at d 2 (l / 4) + {0, 1}: one byte permute turns the word into the
//   B fragments of two MMAs, one over the even d's of the 16 and one over the odd ones, so O's
//   columns come back interleaved (fp8_o_column) and the epilogue puts them in order.

// Four e4m3 values (one 32-bit word, element 0 in the low byte) as two fp16x2 words, exactly
// (every e4m3 value, subnormals included, is an fp16 value).
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\t"
      "cvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// Note [fp8 fragments], V: a .trans word (key 2q at d 2g, 2g + 1; key 2q + 1 at d 2g, 2g + 1) as
// the fp16x2 B words of the even-d MMA (keys 2q, 2q + 1 at d 2g) and the odd-d one (at 2g + 1).
// kFp8TransPerm: __byte_perm's selector taking bytes (0, 1, 2, 3) to (0, 2, 1, 3).
constexpr uint32_t kFp8TransPerm = 0x3120;
__device__ __forceinline__ void e4m3_trans_to_f16(uint32_t w, uint32_t& even, uint32_t& odd) {
  e4m3x4_to_f16x4(__byte_perm(w, 0, kFp8TransPerm), even, odd);
}

// Note [fp8 fragments], K: the query tile's 16 fp16 values of d 16 c .. 16 c + 15 (two 16-byte
// chunks, d order) in the MMAs' k order: the first chunk holds d 0, 1, 4, 5, 8, 9, 12, 13, the
// second 2, 3, 6, 7, 10, 11, 14, 15.
__host__ __device__ __forceinline__ void fp8_q_order(uint4& lo, uint4& hi) {
  const uint4 a = lo, b = hi;
  lo = make_uint4(a.x, a.z, b.x, b.z);
  hi = make_uint4(a.y, a.w, b.y, b.w);
}

// Note [fp8 fragments], V: the d (within 16) of O accumulator register i (0-3: rows g, g, g + 8,
// g + 8) of the even (odd = 0) or odd (odd = 1) MMA of lane quad q = l % 4.
__host__ __device__ __forceinline__ int fp8_o_column(int odd, int i, int q) {
  return 4 * q + 2 * (i % 2) + odd;
}

// Eight 16-bit values of a query row (Element) as fp16, for the FP8-cache MMAs: bf16 values
// beyond fp16's range saturate to +-65504 (Note [fp8 cache]).
template <class Element>
__device__ __forceinline__ uint4 to_f16x8(uint4 v) {
  if constexpr (std::is_same_v<Element, cutlass::half_t>) {
    return v;
  } else {
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    FA4_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
      __half2 h = __floats2half2_rn(fminf(fmaxf(lo, -65504.0f), 65504.0f),
                                    fminf(fmaxf(hi, -65504.0f), 65504.0f));
      w[i] = *reinterpret_cast<uint32_t*>(&h);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// One TMA tile (kRows x kCols) of the tensor behind tma, at row `row` of batch entry `batch` and
// head `head`, into dst (layout Layout), completing on bar.
template <int kRows, int kCols, class Tma, class Shape, class Element, class Layout>
__device__ __forceinline__ void tma_load_block(const Tma& tma, const Shape& shape, int row,
                                               int batch, int head, uint64_t& bar, Element* dst,
                                               Layout) {
  Tensor m = tma.get_tma_tensor(shape);
  Tensor g = local_tile(domain_offset(make_coord(row, _0{}), m(_, _, head, batch)),
                        cute::Shape<Int<kRows>, Int<kCols>>{}, make_coord(_0{}, _0{}));
  Tensor sm = make_tensor(make_smem_ptr(dst), Layout{});
  auto [tg, ts] =
      tma_partition(tma, _0{}, cute::Layout<_1>{}, group_modes<0, 2>(sm), group_modes<0, 2>(g));
  copy(tma.with(bar, 0), tg, ts);
}

// One box (kRows x kCols, the descriptor's box) of the tensor behind tma at (row, col) of batch
// entry `batch` and head `head`, into dst (layout Layout), completing on bar (Note [tma boxes]).
template <int kRows, int kCols, class Tma, class Shape, class Element, class Layout>
__device__ __forceinline__ void tma_load_box(const Tma& tma, const Shape& shape, int row, int col,
                                             int batch, int head, uint64_t& bar, Element* dst,
                                             Layout) {
  Tensor m = tma.get_tma_tensor(shape);
  Tensor g = local_tile(domain_offset(make_coord(row, col), m(_, _, head, batch)),
                        cute::Shape<Int<kRows>, Int<kCols>>{}, make_coord(_0{}, _0{}));
  Tensor sm = make_tensor(make_smem_ptr(dst), Layout{});
  auto [tg, ts] =
      tma_partition(tma, _0{}, cute::Layout<_1>{}, group_modes<0, 2>(sm), group_modes<0, 2>(g));
  copy(tma.with(bar, 0), tg, ts);
}

// One arrival on bar once all of this thread's earlier cp.async have landed (.noinc: the
// barrier's count includes it).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}

}  // namespace detail

}  // namespace fa4::decode
