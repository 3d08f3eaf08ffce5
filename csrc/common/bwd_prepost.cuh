// The backward's preprocess kernel, shared by the SM90 and SM100 backward kernels (plain CUDA, no
// arch-specific instructions), and the postprocess of the kernels whose dQ accumulator is
// row-major (SM100). The SM90 kernel stores its accumulator in wgmma fragment order, so its
// postprocess lives with it (bwd_postprocess_sm90).
//
// Workspace layout: common/bwd_workspace.h (Note [bwd workspace]).
#pragma once

#include <math.h>
#include <stdint.h>

#include <cutlass/array.h>
#include <cutlass/numeric_types.h>

#include "common/bwd_workspace.h"
#include "api/fa4.h"
#include "common/mask.cuh"
#include "common/softmax.cuh"

namespace fa4 {

// Make the workspace view of the problem `f` over `ws`, for a kernel instance of head dim
// kernel_d (>= f.head_dim: Note [padded head dims]), the dQ accumulator's row width, and
// kv_dim (0: kernel_d), the dK / dV accumulators' (Note [GQA head slices]).
__host__ __device__ inline BwdWorkspace workspace_of(const FwdParams& f, void* ws, int kernel_d,
                                                     int kv_dim = 0) {
  return BwdWorkspace::make(f.cu_seqlens_q != nullptr, f.batch, f.seqlen_q, f.total_q, f.heads_q,
                            kernel_d, f.deterministic, f.seqlen_k, f.total_k, f.heads_kv,
                            kv_dim > 0 ? kv_dim : kernel_d, ws);
}

// Grid of the preprocess kernel: (row blocks of 128, heads_q, batch) flattened into x with
// the row block fastest, so that no grid dimension limits heads or batch.
struct RowBlockGrid {
  int row_blocks, heads;
  __host__ __device__ static RowBlockGrid of(const FwdParams& f) {
    return {(f.seqlen_q + BwdWorkspace::kRowPad - 1) / BwdWorkspace::kRowPad, f.heads_q};
  }
  __host__ int64_t blocks(const FwdParams& f) const {
    return int64_t(row_blocks) * heads * f.batch;
  }
  __device__ void decode(int64_t bid, int& block, int& head, int& b) const {
    block = int(bid % row_blocks);
    const int64_t rest = bid / row_blocks;
    head = int(rest % heads);
    b = int(rest / heads);
  }
};

// Note [preprocess layout]: per 128-row block, D = rowsum(dO ∘ O) (− dlse), lse2 and a zeroed dq
// accumulator; padding rows get D = 0, lse2 = +inf, dq = 0, and the block's turn counters are
// zeroed. 256 threads; grid RowBlockGrid. Where O and dO allow 16-byte loads (d_v % 8 == 0,
// 16-byte aligned bases and strides), the block's rows × d_v/8 chunks are spread over all threads
// with several loads in flight per thread, and each row's chunk sums are added in chunk order by
// one thread (fixed order: deterministic mode needs D bit-identical run to run); otherwise one
// warp per row with 2-byte loads. One warp per row, a row at a time, for every layout left half
// the lanes idle at d_v = 128 and waited on each row's loads in turn: 5× flash-attn-4's
// instructions, 1.5× its time (ncu; docs/decisions.md, 2026-11-29).
template <class Element>
__global__ void bwd_preprocess(BwdParams p, BwdWorkspace ws, RowBlockGrid grid) {
  constexpr int kRows = BwdWorkspace::kRowPad;
  constexpr int kThreads = 256;
  constexpr int kMaxChunks = 32;                 // d_v <= 256, 8 elements per chunk
  __shared__ float part[kRows][kMaxChunks + 1];  // + 1: the per-row reads hit distinct banks
  const FwdParams& f = p.fwd;
  int block, head, b;
  grid.decode(blockIdx.x, block, head, b);
  const SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  // Blocks past this sequence's padded extent belong to the next varlen sequence.
  if (block * kRows >= seq.seqlen_q) return;
  const int row0 = block * kRows;  // first row of the block within the sequence
  const int rows = min(kRows, seq.seqlen_q - row0);
  const int64_t bo = f.cu_seqlens_q != nullptr ? 0 : int64_t(b);
  const int64_t wrow0 = ws.row_offset(b, seq.offset_q, row0);
  if (f.deterministic && threadIdx.x < kRows / BwdWorkspace::kSemRows) {
    *ws.sem(head, wrow0 + threadIdx.x * BwdWorkspace::kSemRows) = 0;
  }
  const Element* o0 = static_cast<const Element*>(f.out) + bo * f.out_batch_stride +
                      (int64_t(seq.offset_q) + row0) * f.out_row_stride +
                      int64_t(head) * f.out_head_stride;
  const Element* g0 = static_cast<const Element*>(p.dout) + bo * p.dout_batch_stride +
                      (int64_t(seq.offset_q) + row0) * p.dout_row_stride +
                      int64_t(head) * p.dout_head_stride;

  // The block's dq rows are contiguous in the workspace: one coalesced zero fill.
  float* dq0 = ws.dq(head) + wrow0 * ws.head_dim;
  if (ws.head_dim % 4 == 0) {  // rows start 16-byte aligned (the workspace base is)
    for (int j = threadIdx.x; j < kRows * ws.head_dim / 4; j += kThreads) {
      reinterpret_cast<float4*>(dq0)[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  } else {
    for (int j = threadIdx.x; j < kRows * ws.head_dim; j += kThreads) dq0[j] = 0.0f;
  }

  auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool vec = f.head_dim_v % 8 == 0 && f.head_dim_v / 8 <= kMaxChunks && aligned16(o0) &&
                   aligned16(g0) && f.out_row_stride % 8 == 0 && p.dout_row_stride % 8 == 0;
  const int chunks = vec ? f.head_dim_v / 8 : 1;
  if (vec) {
#pragma unroll 4
    for (int j = threadIdx.x; j < rows * chunks; j += kThreads) {
      const int r = j / chunks, c = j - r * chunks;
      const uint4 ov = *reinterpret_cast<const uint4*>(o0 + r * f.out_row_stride + 8 * c);
      const uint4 gv = *reinterpret_cast<const uint4*>(g0 + r * p.dout_row_stride + 8 * c);
      const Element* oe = reinterpret_cast<const Element*>(&ov);
      const Element* ge = reinterpret_cast<const Element*>(&gv);
      float d = 0.0f;
      FA4_UNROLL
      for (int e = 0; e < 8; ++e) d += float(oe[e]) * float(ge[e]);
      part[r][c] = d;
    }
  } else {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < rows; r += kThreads / 32) {
      const Element* o = o0 + r * f.out_row_stride;
      const Element* g = g0 + r * p.dout_row_stride;
      float d = 0.0f;
      for (int c = lane; c < f.head_dim_v; c += 32) d += float(o[c]) * float(g[c]);
      for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
      if (lane == 0) part[r][0] = d;
    }
  }
  __syncthreads();
  if (threadIdx.x >= kRows) return;
  const int r = threadIdx.x;
  float d = 0.0f;
  float lse2 = INFINITY;  // padding: P = 0
  if (r < rows) {
    for (int c = 0; c < chunks; ++c) d += part[r][c];
    const int64_t grow = int64_t(seq.offset_q) + row0 + r;
    const int64_t at = int64_t(head) * f.lse_head_stride +
                       (f.cu_seqlens_q != nullptr ? grow : bo * f.lse_batch_stride + row0 + r);
    const float lse = f.lse[at];
    // Note [empty rows]: lse = -inf (no key) must give P = 0, i.e. lse2 = +inf.
    lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
    if (p.dlse != nullptr) d -= p.dlse[at];
  }
  ws.lse2(head)[wrow0 + r] = lse2;
  ws.dpsum(head)[wrow0 + r] = d;
}

// dq = softmax_scale · (row-major fp32 accumulator) as the dtype: one warp per row, 16-byte
// loads, rows past the sequence skipped. Grid RowBlockGrid, 256 threads, as the preprocess.
template <class Element, int kHeadDim>
__global__ void bwd_postprocess_rows(BwdParams p, BwdWorkspace ws, RowBlockGrid grid) {
  static_assert(kHeadDim % 4 == 0, "float4 loads");
  const FwdParams& f = p.fwd;
  int block, head, b;
  grid.decode(blockIdx.x, block, head, b);
  const SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  if (block * BwdWorkspace::kRowPad >= seq.seqlen_q) return;
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t wrow0 = ws.row_offset(b, seq.offset_q, block * BwdWorkspace::kRowPad);
  for (int r = warp; r < BwdWorkspace::kRowPad; r += 8) {
    const int i = block * BwdWorkspace::kRowPad + r;
    if (i >= seq.seqlen_q) break;
    const float4* acc = reinterpret_cast<const float4*>(ws.dq(head) + (wrow0 + r) * kHeadDim);
    Element* dq = static_cast<Element*>(p.dq) + (varlen ? 0 : int64_t(b) * p.dq_batch_stride) +
                  (int64_t(seq.offset_q) + i) * p.dq_row_stride + int64_t(head) * p.dq_head_stride;
    for (int c = lane; c < f.head_dim / 4; c += 32) {  // Note [padded head dims]
      const float4 v = acc[c];
      cutlass::Array<Element, 4> out;
      out[0] = Element(v.x * f.softmax_scale);
      out[1] = Element(v.y * f.softmax_scale);
      out[2] = Element(v.z * f.softmax_scale);
      out[3] = Element(v.w * f.softmax_scale);
      *reinterpret_cast<cutlass::Array<Element, 4>*>(dq + 4 * c) = out;
    }
  }
}

}  // namespace fa4
