// The backward's workspace layout: one definition for bwd_workspace_size (api/dispatch.cu) and the
// kernels that address it (common/bwd_prepost.cuh, sm90/bwd/kernel.cuh). Plain C++ with __host__
// __device__ markers, no CUDA or CUTLASS headers.
//
// Note [bwd workspace]: per query head, over the same `rows` padded rows:
//   dq    [heads][rows][head_dim]  fp32 dQ accumulator, zeroed by the preprocess kernel, summed
//                                  over key blocks (atomics), cast to the dtype by the postprocess
//   lse2  [heads][rows]            lse · log2(e); +inf for rows that saw no key, and for padding
//   dpsum [heads][rows]            D = rowsum(dO ∘ O) − dlse; 0 for padding
//   sem   [heads][rows / 64]       int32 turn counters of deterministic mode (Note [deterministic
//                                  dQ]), one per 64-row query block, zeroed by the preprocess;
//                                  only with deterministic (otherwise its few KB can push the
//                                  allocation past a 2 MB step of torch's caching allocator)
// and, where kv_accumulated() (GQA outside deterministic mode: Note [GQA head slices],
// sm90/bwd/kernel.cuh), per kv head over `rows_k` padded key rows:
//   dk    [heads_kv][rows_k][kv_dim]  fp32 dK accumulators of the q-head slices, zeroed by the
//   dv    [heads_kv][rows_k][kv_dim]  launch, one fragment-order block per kv tile, cast by
//                                     the kv postprocess
// rows: dense, every batch entry padded to a multiple of kRowPad (128); varlen, sequence b starts
// at round_down(cu_seqlens_q[b] + 128·b, 128), which fits in round_up(total_q + 128·batch, 128).
// Every sequence thus owns whole 128-row blocks, so no kernel checks a row bound inside the
// workspace. rows is a multiple of 128, so each buffer is a multiple of 512 bytes and the next
// one stays 16-byte aligned.
#pragma once

#include <stdint.h>

#ifndef __CUDACC__
#define FA4_HD
#else
#define FA4_HD __host__ __device__
#endif

namespace fa4 {

struct BwdWorkspace {
  static constexpr int kRowPad = 128;
  static constexpr int kSemRows = 64;  // query rows per turn counter
  float* base = nullptr;
  int64_t rows = 0;  // padded rows per head
  int heads = 0;
  int heads_kv = 0;  // with kv_base
  int head_dim = 0;
  bool varlen = false;
  int64_t seqlen_q_padded = 0;  // dense: rows per batch entry
  float* kv_base = nullptr;     // the dk and dv accumulators, or null
  int64_t rows_k = 0;           // padded key rows per kv head
  int64_t seqlen_k_padded = 0;  // dense: key rows per batch entry
  int kv_dim = 0;               // row width of dk and dv: max(d, d_v) of the kernel

  FA4_HD static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
  // total_q is used for varlen (batch entries packed), seqlen_q for dense.
  FA4_HD static int64_t padded_rows(bool varlen, int batch, int seqlen_q, int64_t total_q) {
    if (varlen) return round_up(total_q + int64_t(kRowPad) * batch, kRowPad);
    return int64_t(batch) * round_up(seqlen_q, kRowPad);
  }
  // Whether the layout has the dk / dv accumulators (Note [GQA head slices]).
  FA4_HD static bool kv_accumulated(int heads_q, int heads_kv, bool deterministic) {
    return heads_q > heads_kv && !deterministic;
  }
  // kv_dim: the widest max(d, d_v) of the kernels that may run the problem.
  FA4_HD static int64_t bytes(bool varlen, int batch, int seqlen_q, int64_t total_q, int heads,
                              int head_dim, bool deterministic, int seqlen_k, int64_t total_k,
                              int heads_kv, int kv_dim) {
    const int64_t rows = padded_rows(varlen, batch, seqlen_q, total_q);
    const int64_t per_head = rows * head_dim + 2 * rows + (deterministic ? rows / kSemRows : 0);
    int64_t kv = 0;
    if (kv_accumulated(heads, heads_kv, deterministic)) {
      kv = 2 * int64_t(heads_kv) * padded_rows(varlen, batch, seqlen_k, total_k) * kv_dim;
    }
    return (int64_t(heads) * per_head + kv) * 4;  // fp32 and int32 elements
  }
  FA4_HD static BwdWorkspace make(bool varlen, int batch, int seqlen_q, int64_t total_q, int heads,
                                  int head_dim, bool deterministic, int seqlen_k, int64_t total_k,
                                  int heads_kv, int kv_dim, void* ws) {
    BwdWorkspace w;
    w.base = static_cast<float*>(ws);
    w.rows = padded_rows(varlen, batch, seqlen_q, total_q);
    w.heads = heads;
    w.head_dim = head_dim;
    w.varlen = varlen;
    w.seqlen_q_padded = round_up(seqlen_q, kRowPad);
    if (kv_accumulated(heads, heads_kv, deterministic)) {
      w.kv_base = w.base + int64_t(heads) * w.rows * (head_dim + 2);  // no sem: not deterministic
      w.rows_k = padded_rows(varlen, batch, seqlen_k, total_k);
      w.seqlen_k_padded = round_up(seqlen_k, kRowPad);
      w.kv_dim = kv_dim;
      w.heads_kv = heads_kv;
    }
    return w;
  }
  // Workspace row of row i of sequence b, whose rows start at offset_q of the packed tensor.
  FA4_HD int64_t row_offset(int b, int offset_q, int i) const {
    return padded_row(varlen, b, offset_q, seqlen_q_padded, i);
  }
  FA4_HD float* dq(int head) const { return base + int64_t(head) * rows * head_dim; }
  FA4_HD float* lse2(int head) const {
    return base + int64_t(heads) * rows * head_dim + int64_t(head) * rows;
  }
  FA4_HD float* dpsum(int head) const {
    return base + int64_t(heads) * rows * (head_dim + 1) + int64_t(head) * rows;
  }
  // Workspace key row of key row i of sequence b (keys from offset_k), as row_offset.
  FA4_HD int64_t row_offset_k(int b, int offset_k, int i) const {
    return padded_row(varlen, b, offset_k, seqlen_k_padded, i);
  }
  // The padded layout of the rows comment above, for query rows and key rows alike.
  FA4_HD static int64_t padded_row(bool varlen, int b, int offset, int64_t per_batch, int i) {
    if (varlen) return (int64_t(offset) + int64_t(kRowPad) * b) / kRowPad * kRowPad + i;
    return int64_t(b) * per_batch + i;
  }
  FA4_HD float* dk(int head_kv) const { return kv_base + int64_t(head_kv) * rows_k * kv_dim; }
  FA4_HD float* dv(int head_kv) const {
    return kv_base + int64_t(heads_kv + head_kv) * rows_k * kv_dim;
  }
  FA4_HD int64_t kv_bytes() const { return 2 * int64_t(heads_kv) * rows_k * kv_dim * 4; }
  // Turn counter of the 64-row query block holding workspace row `row` (deterministic only).
  FA4_HD int* sem(int head, int64_t row) const {
    int* s = reinterpret_cast<int*>(base + int64_t(heads) * rows * (head_dim + 2));
    return s + int64_t(head) * (rows / kSemRows) + row / kSemRows;
  }
};

}  // namespace fa4

#undef FA4_HD
