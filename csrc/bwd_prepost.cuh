// Backward pre/postprocess kernels and the workspace layout, shared by the SM90 and SM100
// backward kernels (plain CUDA, no arch-specific instructions).
//
// STATUS: compiled, NOT YET EXECUTED (see bwd_sm90_kernel.cuh).
//
// Workspace (fp32, sized by fa4::bwd_workspace_size): per query head, `rows` padded rows of
//   dq   [heads][rows][head_dim]   the dQ accumulator, zeroed by the preprocess
//   lse2 [heads][rows]             lse · log2(e); +inf for rows that saw no key or padding
//   dpsum[heads][rows]             D = rowsum(dO ∘ O) − dlse; 0 for padding
// Each sequence's rows start at a multiple of kRowPad (128) and own a whole number of 128-row
// blocks, so no kernel needs a row bound check inside the workspace: dense b·round_up(s_q), varlen
// round_up(total_q + 128·batch) with sequence b at round_down(cu_seqlens_q[b] + 128·b).
#pragma once

#include <math.h>
#include <stdint.h>

#include <cutlass/numeric_types.h>

#include "fa4.h"
#include "mask.cuh"
#include "softmax.cuh"

namespace fa4 {

struct BwdWorkspace {
  static constexpr int kRowPad = 128;
  float* base = nullptr;
  int64_t rows = 0;  // padded rows per head
  int heads = 0;
  int head_dim = 0;

  __host__ __device__ static int64_t padded_rows(const FwdParams& f) {
    if (f.cu_seqlens_q != nullptr) {
      return (int64_t(f.total_q) + int64_t(kRowPad) * f.batch + kRowPad - 1) / kRowPad * kRowPad;
    }
    return int64_t(f.batch) * ((int64_t(f.seqlen_q) + kRowPad - 1) / kRowPad * kRowPad);
  }
  __host__ __device__ static BwdWorkspace make(const FwdParams& f, void* ws) {
    BwdWorkspace w;
    w.base = static_cast<float*>(ws);
    w.rows = padded_rows(f);
    w.heads = f.heads_q;
    w.head_dim = f.head_dim;
    return w;
  }
  // Workspace row of row i of sequence b (seq: its SeqInfo).
  __host__ __device__ int64_t row_offset(const FwdParams& f, const SeqInfo& seq, int b,
                                         int i) const {
    if (f.cu_seqlens_q != nullptr) {
      return (int64_t(seq.offset_q) + int64_t(kRowPad) * b) / kRowPad * kRowPad + i;
    }
    return int64_t(b) * ((int64_t(f.seqlen_q) + kRowPad - 1) / kRowPad * kRowPad) + i;
  }
  __host__ __device__ float* dq(int head, int d) const { return base + int64_t(head) * rows * d; }
  __host__ __device__ float* lse2(int head) const {
    return base + int64_t(heads) * rows * head_dim + int64_t(head) * rows;
  }
  __host__ __device__ float* dpsum(int head) const {
    return base + int64_t(heads) * rows * (head_dim + 1) + int64_t(head) * rows;
  }
};

// One warp per row: D, lse2, and a zeroed dq row; padding rows get D = 0, lse2 = +inf, dq = 0.
// Grid (ceil(max_seqlen_q / 128) row blocks, heads_q, batch), 256 threads (8 warps, 16 rows each).
template <class Element>
__global__ void bwd_preprocess(BwdParams p, BwdWorkspace ws) {
  const FwdParams& f = p.fwd;
  const int head = blockIdx.y, b = blockIdx.z;
  SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < BwdWorkspace::kRowPad; r += 8) {
    const int i = blockIdx.x * BwdWorkspace::kRowPad + r;  // row within the sequence
    // Rows past this sequence's padded extent belong to the next varlen sequence (warp-uniform).
    if (blockIdx.x * BwdWorkspace::kRowPad >= seq.seqlen_q) return;
    const int64_t wrow = ws.row_offset(f, seq, b, i);
    float d = 0.0f;
    if (i < seq.seqlen_q) {
      const int64_t grow = int64_t(seq.offset_q) + i;
      const int64_t bo = varlen ? 0 : int64_t(b);
      const Element* o = static_cast<const Element*>(f.out) + bo * f.out_batch_stride +
                         grow * f.out_row_stride + int64_t(head) * f.out_head_stride;
      const Element* go = static_cast<const Element*>(p.dout) + bo * p.dout_batch_stride +
                          grow * p.dout_row_stride + int64_t(head) * p.dout_head_stride;
      for (int c = lane; c < f.head_dim_v; c += 32) d += float(o[c]) * float(go[c]);
    }
    for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    float* dq = ws.dq(head, f.head_dim) + wrow * f.head_dim;
    for (int c = lane; c < f.head_dim; c += 32) dq[c] = 0.0f;
    if (lane != 0) continue;
    float lse2 = INFINITY;  // padding: P = 0
    if (i < seq.seqlen_q) {
      const int64_t grow = int64_t(seq.offset_q) + i;
      const float* lse = f.lse + int64_t(head) * f.lse_head_stride +
                         (varlen ? grow : int64_t(b) * f.lse_batch_stride + i);
      const float* dlse = p.dlse == nullptr
                              ? nullptr
                              : p.dlse + int64_t(head) * f.lse_head_stride +
                                    (varlen ? grow : int64_t(b) * f.lse_batch_stride + i);
      // Note [empty rows]: lse = -inf (no key) must give P = 0, i.e. lse2 = +inf.
      lse2 = *lse == -INFINITY ? INFINITY : *lse * kLog2e;
      if (dlse != nullptr) d -= *dlse;
    } else {
      d = 0.0f;
    }
    ws.lse2(head)[wrow] = lse2;
    ws.dpsum(head)[wrow] = d;
  }
}

// dq (fp32 accumulator) · softmax_scale -> the dtype, rows < seqlen_q. Same grid as above.
template <class Element>
__global__ void bwd_postprocess(BwdParams p, BwdWorkspace ws) {
  const FwdParams& f = p.fwd;
  const int head = blockIdx.y, b = blockIdx.z;
  SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < BwdWorkspace::kRowPad; r += 8) {
    const int i = blockIdx.x * BwdWorkspace::kRowPad + r;
    if (i >= seq.seqlen_q) return;
    const float* acc = ws.dq(head, f.head_dim) + ws.row_offset(f, seq, b, i) * f.head_dim;
    Element* dq = static_cast<Element*>(p.dq) + (varlen ? 0 : int64_t(b) * p.dq_batch_stride) +
                  (int64_t(seq.offset_q) + i) * p.dq_row_stride + int64_t(head) * p.dq_head_stride;
    for (int c = lane; c < f.head_dim; c += 32) dq[c] = Element(acc[c] * f.softmax_scale);
  }
}

}  // namespace fa4
