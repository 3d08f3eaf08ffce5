// The KV-cache append with rotary of FA3's flash_attn_with_kvcache as a standalone launch
// (fa4/kvcache.py calls it through the op fa4::_kv_append_kernel, csrc/api/kv_append_binding.cpp).
// One launch: k_new rotated and v_new copied into the cache rows cache_seqlens[b] + t (dense or
// paged), and q rotated into q_out. Bandwidth bound; no host sync and no allocation, so the launch
// is capturable in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fa4 {

// Tensors are (b, s, h, d) with the last dim contiguous; strides in elements, int64 because a
// cache's offset (batch or page times its stride) can pass 2^31. A null pointer is an absent
// tensor: no k_new (then v_new is null too) skips the append, no rotary_cos skips every rotation
// (q_out is then null and k is copied as is).
struct KvAppendParams {
  const void* q = nullptr;           // (batch, seqlen_q, heads_q, head_dim)
  void* q_out = nullptr;             // as q, contiguous: q rotated
  const void* k_new = nullptr;       // (batch, seqlen_new, heads_kv, head_dim)
  const void* v_new = nullptr;       // (batch, seqlen_new, heads_kv, head_dim_v)
  void* k_cache = nullptr;           // (cache_batch, cache_rows, heads_kv, head_dim); paged: pages
  void* v_cache = nullptr;           // (cache_batch, cache_rows, heads_kv, head_dim_v)
  const void* rotary_cos = nullptr;  // (seqlen_ro, rotary_dim / 2), contiguous
  const void* rotary_sin = nullptr;  // as rotary_cos
  const int* cache_seqlens = nullptr;    // (batch,): the row where sequence b's append starts
  const int* cache_batch_idx = nullptr;  // (batch,): cache batch (or page-table row) of b; or b
  const int* page_table = nullptr;       // (page_table_rows, max_pages); null: dense cache

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t q_out_batch_stride = 0, q_out_row_stride = 0, q_out_head_stride = 0;
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;
  int64_t k_cache_batch_stride = 0, k_cache_row_stride = 0, k_cache_head_stride = 0;
  int64_t v_cache_batch_stride = 0, v_cache_row_stride = 0, v_cache_head_stride = 0;
  int64_t page_table_batch_stride = 0;

  int batch = 0, seqlen_q = 0, heads_q = 0, seqlen_new = 0, heads_kv = 0;
  int head_dim = 0, head_dim_v = 0;
  int rotary_dim = 0, seqlen_ro = 0;  // 0: no rotary
  int cache_batch = 0;                // k_cache.size(0): cache batch, or the number of pages
  int cache_rows = 0;                 // k_cache.size(1): cache length, or the page size
  int max_pages = 0, page_table_rows = 0;
  bool rotary_interleaved = false;  // pairs (2i, 2i+1); else (i, i + rotary_dim / 2)
  bool rotate_q_per_row = false;    // q row i at cache_seqlens[b] + i; else all at cache_seqlens[b]
  bool bf16 = false;                // element type: bfloat16, else float16
};

// The widest vector (8, 4, 2 or 1 elements) every row start, head dim and rotary half of `p`
// allows: 16-byte accesses where the layout allows. The launch needs 2 or more (4-byte rows).
int kv_append_vector_width(const KvAppendParams& p);

// Launches the append on `stream`; cudaErrorInvalidValue when the sizes fail the launch's
// limits (vector width under 2, more than 2^31 - 1 vector units), else the launch's error.
cudaError_t run_kv_append(const KvAppendParams& p, cudaStream_t stream);

}  // namespace fa4
