// The FP8 forward's Vᵀ (Note [fp8 forward], sm90/fwd/traits.cuh): FP8 wgmma reads its B operand
// K-major only, so P·V needs V with the keys contiguous. run_fwd writes it into the workspace
// before the attention kernel, with the keys of each 32-key chunk in the order of Note [fp8 P
// layout], and the attention kernel loads it with TMA like any other operand.
//
// Note [fp8 P layout]: the S accumulator of an m64nNk32 wgmma gives thread t (quad lane q = t % 4)
// of a row the columns 8 j + 2 q + {0, 1}, j = 0..3, of each 32-key chunk, while the A operand of
// an e4m3 wgmma wants keys 4 q + {0..3} and 16 + 4 q + {0..3} from it (both printed from CuTe's
// layouts: tests/cpp/fp8_layout_harness.cu). Rather than exchanging values between the lanes of
// a quad, the consumer takes its own eight values as the eight keys the A layout puts there (a
// register renaming, fp8_a_source) and the keys of V are permuted to match: column k of a chunk
// of Vᵀ holds key fp8_key_of(k). P·V sums over the keys, so the product is unchanged.
//
// Layout of Vᵀ (e4m3): dense (batch, heads_kv, d_v, cols), cols = seqlen_k rounded up to 32;
// varlen (heads_kv, d_v, cols), sequence b's keys from column start(b) = round_up(cu_seqlens_k[b],
// 32) + 64 b: 32-aligned, so that the transpose's 16-byte stores are aligned, and apart by at
// least round_up(length, 32) + 1 columns (its chunks start at its first key, the last one
// overhangs); cols = round_up(total_k, 32) + 64 batch. Keys past a sequence's end in its last
// chunk are zeros.
#pragma once

#include <stdint.h>

#include <cuda_runtime.h>

#include "api/fa4.h"
#include "common/fp8.cuh"
#include "common/host_device.cuh"

namespace fa4::sm90 {

constexpr int kFp8Chunk = 32;  // keys per wgmma K step of P·V

// Key of column k (0..31) of a chunk of Vᵀ: the C column whose value the consumer's A register
// for key slot k holds.
__host__ __device__ constexpr int fp8_key_of(int k) {
  return 16 * (k / 16) + 2 * ((k % 16) / 4) + (k % 2) + 8 * ((k % 4) / 2);
}
// Index within a 16-value group of the S fragment (C layout, 32 keys) that A fragment element a
// (0..15) takes: a = a0 + 4 a1 + 8 a2 (a0: key within 4, a1: row + 8, a2: key + 16).
__host__ __device__ constexpr int fp8_a_source(int a) {
  return (a % 4) % 2 + 2 * ((a / 4) % 2) + 4 * (2 * (a / 8) + (a % 4) / 2);
}

struct VtLayout {
  int64_t cols = 0;  // keys per (d_v row), rounded up: the row stride in elements
  bool varlen = false;
  __host__ __device__ int64_t head_stride(int d_v) const { return int64_t(d_v) * cols; }
  __host__ __device__ int64_t batch_stride(int d_v, int heads_kv) const {
    return varlen ? 0 : int64_t(heads_kv) * head_stride(d_v);
  }
  // First column of sequence b (0 for dense).
  __host__ __device__ int64_t start(const int* cu_seqlens_k, int b) const {
    if (!varlen) return 0;
    const int64_t first = (int64_t(cu_seqlens_k[b]) + kFp8Chunk - 1) / kFp8Chunk * kFp8Chunk;
    return first + 2 * int64_t(kFp8Chunk) * b;
  }
  size_t bytes(const FwdParams& p) const {
    return size_t(varlen ? 1 : p.batch) * size_t(p.heads_kv) * size_t(head_stride(p.head_dim_v));
  }
  static VtLayout of(const FwdParams& p) {
    VtLayout l;
    l.varlen = p.cu_seqlens_k != nullptr;
    const int64_t keys =
        l.varlen ? int64_t(p.total_k) + 2 * int64_t(kFp8Chunk) * p.batch : int64_t(p.seqlen_k);
    // At least one chunk: a problem without keys still gets a valid TMA descriptor.
    l.cols = keys > 0 ? (keys + kFp8Chunk - 1) / kFp8Chunk * kFp8Chunk : kFp8Chunk;
    return l;
  }
};

// Chunk `chunk` of kv head h of sequence b. Varlen sequences are clamped to the keys that
// exist (cu_seqlens_k[b] <= cu_seqlens_k[b + 1] <= total_k, which the Python API checks and a
// CUDA graph's replay or the C++ API may not): a bad offset reads and writes nothing out of
// bounds.
template <int kMaxDv>
__device__ void fp8_transpose_chunk(const FwdParams& p, const VtLayout& l, uint8_t* vt,
                                    uint8_t (&tile)[kFp8Chunk][kMaxDv], int chunk, int h, int b) {
  int64_t first = 0, len = p.seqlen_k;
  if (l.varlen) {
    first = p.cu_seqlens_k[b];
    const int64_t end = p.cu_seqlens_k[b + 1] < p.total_k ? p.cu_seqlens_k[b + 1] : p.total_k;
    if (first < 0 || first > end) return;
    len = end - first;
  }
  if (int64_t(chunk) * kFp8Chunk >= len) return;
  const int d_v = p.head_dim_v;
  const int vecs = d_v / 16;  // 16-byte pieces per row (head dims are multiples of 16)
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + int64_t(h) * p.v_head_stride +
                     (l.varlen ? 0 : int64_t(b) * p.v_batch_stride);
  for (int i = threadIdx.x; i < kFp8Chunk * vecs; i += blockDim.x) {
    const int r = i / vecs, c = i % vecs;
    const int key = chunk * kFp8Chunk + r;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (key < len) x = *reinterpret_cast<const uint4*>(v + (first + key) * p.v_row_stride + 16 * c);
    *reinterpret_cast<uint4*>(&tile[r][16 * c]) = x;
  }
  __syncthreads();
  uint8_t* out = vt + int64_t(h) * l.head_stride(d_v) +
                 (l.varlen ? 0 : int64_t(b) * l.batch_stride(d_v, p.heads_kv)) +
                 l.start(p.cu_seqlens_k, b) + int64_t(chunk) * kFp8Chunk;
  for (int i = threadIdx.x; i < 2 * d_v; i += blockDim.x) {
    const int d = i / 2, half = i % 2;
    uint32_t w[4];
    FA4_UNROLL
    for (int j = 0; j < 4; ++j) {
      uint32_t word = 0;
      FA4_UNROLL
      for (int e = 0; e < 4; ++e) {
        word |= uint32_t(tile[fp8_key_of(16 * half + 4 * j + e)][d]) << (8 * e);
      }
      w[j] = word;
    }
    *reinterpret_cast<uint4*>(out + int64_t(d) * l.cols + 16 * half) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// One block per (32-key chunk, kv head) and sequence b = blockIdx.z + k gridDim.z (grid.z is at
// most 65535): the chunk's rows of V (d_v bytes each) into shared memory, then each d_v row of
// the chunk's Vᵀ as two 16-byte stores.
template <int kMaxDv>
__global__ void __launch_bounds__(128) fp8_transpose_v(const FwdParams p, VtLayout l, uint8_t* vt) {
  __shared__ alignas(16) uint8_t tile[kFp8Chunk][kMaxDv];
  for (int b = blockIdx.z; b < p.batch; b += gridDim.z) {
    fp8_transpose_chunk<kMaxDv>(p, l, vt, tile, blockIdx.x, blockIdx.y, b);
    __syncthreads();  // the tile is rewritten by the next sequence
  }
}

template <int kMaxDv>
cudaError_t launch_fp8_transpose_v(const FwdParams& p, cudaStream_t stream) {
  const VtLayout l = VtLayout::of(p);
  const int max_len = p.seqlen_k;  // the longest sequence (varlen: max_seqlen_k)
  const dim3 grid((max_len + kFp8Chunk - 1) / kFp8Chunk, p.heads_kv,
                  p.batch < 65535 ? p.batch : 65535);
  if (grid.x == 0) return cudaSuccess;
  // Varlen: the columns between sequences are read by the last block of a sequence (masked, P =
  // 0) and must hold no NaN pattern; dense blocks past the columns read TMA's zero fill.
  if (l.varlen) {
    const cudaError_t e = cudaMemsetAsync(p.workspace, 0, l.bytes(p), stream);
    if (e != cudaSuccess) return e;
  }
  fp8_transpose_v<kMaxDv><<<grid, 128, 0, stream>>>(p, l, static_cast<uint8_t*>(p.workspace));
  return cudaGetLastError();
}

}  // namespace fa4::sm90
