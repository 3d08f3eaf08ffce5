// PyTorch binding of the KV-cache append (api/kv_append.h): the op fa4::_kv_append_kernel, called
// by fa4/kvcache.py once Python has validated the inputs. Glue only: the invariants the launch
// relies on are checked again here (a direct call of the op gets an error, not a bad memory
// access), the tensors become KvAppendParams, the launch runs on the current stream. No host sync
// and no allocation: q_out is the caller's, so the op is capturable in a CUDA graph.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "api/kv_append.h"

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

bool given(const OptTensor& t) {
  return t.has_value() && t->defined();
}

// The messages are literals: formatting int64_t arguments into a TORCH_CHECK message crashed on
// the H100 device's torch 2.11 (bindings.cpp check_knobs). fa4/kvcache.py has already raised the
// detailed error for anything caught here.
void check_rows(const Tensor& t, const Tensor& q, const char* msg) {
  TORCH_CHECK(t.dim() == 4 && (t.stride(3) == 1 || t.size(3) <= 1), msg);
  TORCH_CHECK(t.scalar_type() == q.scalar_type() && t.device() == q.device(), msg);
}

void check_index(const Tensor& t, int64_t dim, const Tensor& q, const char* msg) {
  TORCH_CHECK(t.scalar_type() == at::kInt && t.dim() == dim && t.stride(dim - 1) == 1, msg);
  TORCH_CHECK(t.device() == q.device(), msg);
}

void set_strides(const Tensor& t, int64_t& batch, int64_t& row, int64_t& head) {
  batch = t.stride(0), row = t.stride(1), head = t.stride(2);
}

void kv_append_kernel(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const OptTensor& k_new, const OptTensor& v_new, const Tensor& cache_seqlens,
                      const OptTensor& rotary_cos, const OptTensor& rotary_sin,
                      const OptTensor& q_out, bool rotary_interleaved,
                      const OptTensor& cache_batch_idx, const OptTensor& page_table,
                      bool rotate_q_per_row) {
  TORCH_CHECK(q.is_cuda() && (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16),
              "fa4: q: the append kernel needs a float16 or bfloat16 CUDA tensor");
  check_rows(q, q, "fa4: q: expected (b, s_q, h, d) with a contiguous last dimension");
  check_rows(k_cache, q, "fa4: k_cache: expected 4 dims, q's dtype and device, stride(-1) 1");
  check_rows(v_cache, q, "fa4: v_cache: expected 4 dims, q's dtype and device, stride(-1) 1");
  const int64_t b = q.size(0), d = q.size(3);
  TORCH_CHECK(k_cache.size(3) == d, "fa4: k_cache: head dim must equal q's");
  TORCH_CHECK(v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == k_cache.size(1) &&
                  v_cache.size(2) == k_cache.size(2),
              "fa4: v_cache: shape must match k_cache except the last dim");
  check_index(cache_seqlens, 1, q, "fa4: cache_seqlens: expected int32 (b,) on q's device");
  TORCH_CHECK(cache_seqlens.size(0) == b, "fa4: cache_seqlens: expected int32 (b,) on q's device");
  TORCH_CHECK(given(k_new) == given(v_new), "fa4: v_new: must be given together with k_new");
  TORCH_CHECK(given(rotary_cos) == given(rotary_sin),
              "fa4: rotary_sin: must be given together with rotary_cos");
  TORCH_CHECK(given(rotary_cos) == given(q_out),
              "fa4: q_out: must be given exactly when rotary_cos is");

  fa4::KvAppendParams p;
  p.q = q.data_ptr();
  set_strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  set_strides(k_cache, p.k_cache_batch_stride, p.k_cache_row_stride, p.k_cache_head_stride);
  set_strides(v_cache, p.v_cache_batch_stride, p.v_cache_row_stride, p.v_cache_head_stride);
  p.cache_seqlens = cache_seqlens.data_ptr<int>();
  p.batch = static_cast<int>(b);
  p.seqlen_q = static_cast<int>(q.size(1));
  p.heads_q = static_cast<int>(q.size(2));
  p.head_dim = static_cast<int>(d);
  p.heads_kv = static_cast<int>(k_cache.size(2));
  p.cache_batch = static_cast<int>(k_cache.size(0));
  p.cache_rows = static_cast<int>(k_cache.size(1));
  p.bf16 = q.scalar_type() == at::kBFloat16;
  p.rotary_interleaved = rotary_interleaved;
  p.rotate_q_per_row = rotate_q_per_row;

  if (given(k_new)) {
    check_rows(*k_new, q, "fa4: k_new: expected 4 dims, q's dtype and device, stride(-1) 1");
    check_rows(*v_new, q, "fa4: v_new: expected 4 dims, q's dtype and device, stride(-1) 1");
    TORCH_CHECK(k_new->size(0) == b && k_new->size(2) == k_cache.size(2) && k_new->size(3) == d,
                "fa4: k_new: expected shape (b, s_new, h_kv, d)");
    TORCH_CHECK(v_new->size(0) == b && v_new->size(1) == k_new->size(1) &&
                    v_new->size(2) == k_cache.size(2) && v_new->size(3) == v_cache.size(3),
                "fa4: v_new: expected shape (b, s_new, h_kv, d_v)");
    p.k_new = k_new->data_ptr();
    p.v_new = v_new->data_ptr();
    set_strides(*k_new, p.k_new_batch_stride, p.k_new_row_stride, p.k_new_head_stride);
    set_strides(*v_new, p.v_new_batch_stride, p.v_new_row_stride, p.v_new_head_stride);
    p.seqlen_new = static_cast<int>(k_new->size(1));
    p.head_dim_v = static_cast<int>(v_cache.size(3));
  }
  if (given(rotary_cos)) {
    const Tensor& cos = *rotary_cos;
    const Tensor& sin = *rotary_sin;
    for (const Tensor* t : {&cos, &sin}) {
      TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->scalar_type() == q.scalar_type() &&
                      t->device() == q.device(),
                  "fa4: rotary_cos/rotary_sin: expected contiguous (seqlen_ro, rotary_dim / 2) "
                  "of q's dtype and device");
    }
    TORCH_CHECK(sin.sizes() == cos.sizes(), "fa4: rotary_sin: shape must equal rotary_cos's");
    TORCH_CHECK(cos.size(0) >= 1 && cos.size(1) >= 1 && 2 * cos.size(1) <= d,
                "fa4: rotary_cos: needs a row, and rotary_dim = 2 * size(1) in [2, head dim]");
    TORCH_CHECK(q_out->sizes() == q.sizes() && q_out->is_contiguous() &&
                    q_out->scalar_type() == q.scalar_type() && q_out->device() == q.device(),
                "fa4: q_out: must be a contiguous tensor of q's shape, dtype and device");
    p.rotary_cos = cos.data_ptr();
    p.rotary_sin = sin.data_ptr();
    p.rotary_dim = static_cast<int>(2 * cos.size(1));
    p.seqlen_ro = static_cast<int>(cos.size(0));
    p.q_out = q_out->data_ptr();
    set_strides(*q_out, p.q_out_batch_stride, p.q_out_row_stride, p.q_out_head_stride);
  }
  if (given(cache_batch_idx)) {
    check_index(*cache_batch_idx, 1, q, "fa4: cache_batch_idx: expected int32 (b,) on q's device");
    TORCH_CHECK(cache_batch_idx->size(0) == b,
                "fa4: cache_batch_idx: expected int32 (b,) on q's device");
    p.cache_batch_idx = cache_batch_idx->data_ptr<int>();
  }
  if (given(page_table)) {
    check_index(*page_table, 2, q,
                "fa4: page_table: expected int32 (rows, max_pages), rows contiguous");
    TORCH_CHECK(k_cache.size(1) >= 1, "fa4: k_cache: page size must be >= 1");
    TORCH_CHECK(given(cache_batch_idx) || page_table->size(0) == b,
                "fa4: page_table: needs one row per sequence without cache_batch_idx");
    p.page_table = page_table->data_ptr<int>();
    p.page_table_batch_stride = page_table->stride(0);
    p.page_table_rows = static_cast<int>(page_table->size(0));
    p.max_pages = static_cast<int>(page_table->size(1));
  } else if (!given(cache_batch_idx)) {
    TORCH_CHECK(k_cache.size(0) == b, "fa4: k_cache: batch must equal q's without cache_batch_idx");
  }
  TORCH_CHECK(fa4::kv_append_vector_width(p) >= 2,
              "fa4: _kv_append_kernel: every row must start 4-byte aligned and hold an even "
              "number of elements (and rotary_dim / 2 even when not interleaved); fa4.kvcache "
              "uses its torch path for other layouts");

  c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = fa4::run_kv_append(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err != cudaErrorInvalidValue,
              "fa4: _kv_append_kernel: more than 2^31 - 1 vectors in one append (split it)");
  C10_CUDA_CHECK(err);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fa4, m) {
  m.def(
      "_kv_append_kernel(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k_new, "
      "Tensor? v_new, Tensor cache_seqlens, Tensor? rotary_cos, Tensor? rotary_sin, "
      "Tensor(c!)? q_out, bool rotary_interleaved, Tensor? cache_batch_idx, Tensor? page_table, "
      "bool rotate_q_per_row) -> ()");
}

TORCH_LIBRARY_IMPL(fa4, CUDA, m) {
  m.impl("_kv_append_kernel", &kv_append_kernel);
}
