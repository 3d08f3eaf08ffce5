// The KV-cache append with rotary (api/kv_append.h): one thread per vector of a row, rows of three
// kinds in one launch (k_new rotated into the cache, v_new copied into the cache, q rotated into
// q_out). Memory bound: each element is read once and written once; cos/sin rows are shared by
// every head of a position, so they come from L1/L2 after the first head.
#include "api/kv_append.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

namespace fa4 {
namespace {

// 256 threads: 8 warps per block, enough blocks for every SM already at a 64-token prefill
// append (64 * 8 heads * (16 + 16) vectors of d = 128 = 64 blocks); a decode step of batch 1 is
// a single block either way.
constexpr int kThreads = 256;

template <class T>
struct Convert;
template <>
struct Convert<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};
template <>
struct Convert<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

// N elements accessed as one load or store of N * sizeof(T) bytes (16 bytes for N = 8).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <class T, int N>
__device__ __forceinline__ Pack<T, N> load(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <class T, int N>
__device__ __forceinline__ void store(T* p, const Pack<T, N>& x) {
  *reinterpret_cast<Pack<T, N>*>(p) = x;
}

// Note [rotary rounding]: the rotation is o1 = x1*c - x2*s, o2 = x1*s + x2*c in fp32 on the
// dtype's values of x, cos and sin, each product rounded to fp32 before the sum, then rounded to
// the dtype (round to nearest even). That is what fa4/kvcache.py's torch path computes (one torch
// op per product and per sum), so the two agree bit for bit. The PTX below is IEEE: nvcc may not
// contract it into an FMA, and it keeps fp32 subnormals, which --use_fast_math (-ftz=true) would
// flush in plain C++ arithmetic.
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

template <class T>
__device__ __forceinline__ void rotate(T& x1, T& x2, T c_t, T s_t, bool in_table) {
  using C = Convert<T>;
  // A position outside the cos/sin table (seqlen_ro) reads nothing: NaN marks the rotated dims.
  const float c = in_table ? C::to_float(c_t) : __int_as_float(0x7fffffff);
  const float s = in_table ? C::to_float(s_t) : __int_as_float(0x7fffffff);
  const float a = C::to_float(x1), b = C::to_float(x2);
  x1 = C::from_float(sub_rn(mul_rn(a, c), mul_rn(b, s)));
  x2 = C::from_float(add_rn(mul_rn(a, s), mul_rn(b, c)));
}

// Sizes of the launch, in vectors of V elements, computed once on the host.
struct Plan {
  int rot_units;     // non-interleaved rotary: vector pairs (c, c + rotary_dim / 2) of a row
  int row_units;     // vectors of a k_new or q row: rot_units pairs, then the other vectors
  int v_units;       // vectors of a v_new row
  int kv_row_units;  // row_units + v_units: one (b, t, h) of the append
  int kv_units, q_units;
  int kv_blocks, q_blocks;
};

// Vector `u` of a d-wide row (k_new or q) from src to dst, rotated at position `pos`.
template <class T, int V>
__device__ __forceinline__ void rotate_unit(const T* src, T* dst, int u, int64_t pos,
                                            const KvAppendParams& p, const Plan& plan) {
  const int half = p.rotary_dim / 2;
  const bool in_table = pos >= 0 && pos < p.seqlen_ro;
  const int64_t table_row = in_table ? pos * half : 0;
  const T* cos = static_cast<const T*>(p.rotary_cos) + table_row;
  const T* sin = static_cast<const T*>(p.rotary_sin) + table_row;
  if (!p.rotary_interleaved && u < plan.rot_units) {  // GPT-NeoX: x[c] with x[c + half]
    const int c = u * V;
    Pack<T, V> x1 = load<T, V>(src + c), x2 = load<T, V>(src + c + half);
    Pack<T, V> cs = x1, sn = x1;  // any value: unread outside the table
    if (in_table) cs = load<T, V>(cos + c), sn = load<T, V>(sin + c);
#pragma unroll
    for (int j = 0; j < V; ++j) rotate(x1.v[j], x2.v[j], cs.v[j], sn.v[j], in_table);
    store<T, V>(dst + c, x1);
    store<T, V>(dst + c + half, x2);
    return;
  }
  // Interleaved vectors are rotary up to rotary_dim; non-interleaved ones follow the pairs (with
  // no rotary, rotary_dim = rot_units = 0: every vector is copied).
  const int c = p.rotary_interleaved ? u * V : p.rotary_dim + (u - plan.rot_units) * V;
  Pack<T, V> x = load<T, V>(src + c);
  if (p.rotary_interleaved && c < p.rotary_dim) {  // pairs (c + 2j, c + 2j + 1)
    static_assert(V % 2 == 0, "an interleaved vector holds whole pairs");
    Pack<T, V / 2> cs{}, sn{};
    if (in_table) cs = load<T, V / 2>(cos + c / 2), sn = load<T, V / 2>(sin + c / 2);
#pragma unroll
    for (int j = 0; j < V / 2; ++j) rotate(x.v[2 * j], x.v[2 * j + 1], cs.v[j], sn.v[j], in_table);
  }
  store<T, V>(dst + c, x);
}

// The cache slot of sequence b's position `pos`: (batch, row) of a dense cache, (page, row in the
// page) of a paged one. False outside the cache (bad cache_batch_idx, position past the cache or
// the page table, page number outside [0, num_pages)): the append drops the row and touches no
// memory outside the tensors. fa4/kvcache.py documents these inputs as errors.
__device__ __forceinline__ bool cache_slot(const KvAppendParams& p, int b, int64_t pos,
                                           int64_t& batch, int64_t& row) {
  const int cb = p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b;
  if (p.page_table == nullptr) {
    if (cb < 0 || cb >= p.cache_batch || pos < 0 || pos >= p.cache_rows) return false;
    batch = cb, row = pos;
    return true;
  }
  if (cb < 0 || cb >= p.page_table_rows || pos < 0) return false;
  // pos <= INT_MAX + seqlen_new < 2^32: an unsigned 32-bit division.
  const uint32_t upos = static_cast<uint32_t>(pos);
  const uint32_t page_idx = upos / static_cast<uint32_t>(p.cache_rows);
  if (page_idx >= static_cast<uint32_t>(p.max_pages)) return false;
  const int page = p.page_table[cb * p.page_table_batch_stride + page_idx];
  if (page < 0 || page >= p.cache_batch) return false;
  batch = page, row = upos - page_idx * static_cast<uint32_t>(p.cache_rows);
  return true;
}

// Vector idx of the append: row (b, t, h) of k_new then v_new.
template <class T, int V>
__device__ __forceinline__ void append_unit(const KvAppendParams& p, const Plan& plan, int idx) {
  const int row = idx / plan.kv_row_units, u = idx - row * plan.kv_row_units;
  const int h = row % p.heads_kv, bt = row / p.heads_kv;
  const int t = bt % p.seqlen_new, b = bt / p.seqlen_new;
  const int64_t pos = static_cast<int64_t>(p.cache_seqlens[b]) + t;
  int64_t batch, crow;
  if (!cache_slot(p, b, pos, batch, crow)) return;
  if (u < plan.row_units) {
    const T* src = static_cast<const T*>(p.k_new) + b * p.k_new_batch_stride +
                   t * p.k_new_row_stride + h * p.k_new_head_stride;
    T* dst = static_cast<T*>(p.k_cache) + batch * p.k_cache_batch_stride +
             crow * p.k_cache_row_stride + h * p.k_cache_head_stride;
    rotate_unit<T, V>(src, dst, u, pos, p, plan);
    return;
  }
  const int c = (u - plan.row_units) * V;
  const T* src = static_cast<const T*>(p.v_new) + b * p.v_new_batch_stride +
                 t * p.v_new_row_stride + h * p.v_new_head_stride;
  T* dst = static_cast<T*>(p.v_cache) + batch * p.v_cache_batch_stride +
           crow * p.v_cache_row_stride + h * p.v_cache_head_stride;
  store<T, V>(dst + c, load<T, V>(src + c));
}

// Vector idx of q's rotation: row (b, i, h), at cache_seqlens[b] + i (per row) or cache_seqlens[b].
template <class T, int V>
__device__ __forceinline__ void q_unit(const KvAppendParams& p, const Plan& plan, int idx) {
  const int row = idx / plan.row_units, u = idx - row * plan.row_units;
  const int h = row % p.heads_q, bi = row / p.heads_q;
  const int i = bi % p.seqlen_q, b = bi / p.seqlen_q;
  const int64_t pos = static_cast<int64_t>(p.cache_seqlens[b]) + (p.rotate_q_per_row ? i : 0);
  const T* src =
      static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
  T* dst = static_cast<T*>(p.q_out) + b * p.q_out_batch_stride + i * p.q_out_row_stride +
           h * p.q_out_head_stride;
  rotate_unit<T, V>(src, dst, u, pos, p, plan);
}

// Blocks [0, kv_blocks) run the append, the rest q's rotation.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    kv_append_kernel(const KvAppendParams p, const Plan plan) {
  const bool kv = blockIdx.x < static_cast<unsigned>(plan.kv_blocks);
  const int64_t block = kv ? blockIdx.x : blockIdx.x - plan.kv_blocks;
  const int64_t idx = block * kThreads + threadIdx.x;
  if (idx >= (kv ? plan.kv_units : plan.q_units)) return;
  if (kv) {
    append_unit<T, V>(p, plan, static_cast<int>(idx));
  } else {
    q_unit<T, V>(p, plan, static_cast<int>(idx));
  }
}

bool aligned(const void* ptr, int bytes) {
  return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

bool fits(const KvAppendParams& p, int v) {
  const bool append = p.k_new != nullptr, rotary = p.rotary_cos != nullptr;
  if (p.head_dim % v != 0) return false;
  if (rotary && (p.rotary_interleaved ? p.rotary_dim : p.rotary_dim / 2) % v != 0) return false;
  const int bytes = v * 2;  // fp16 / bf16
  if (rotary && !(aligned(p.q, bytes) && aligned(p.q_out, bytes) && aligned(p.rotary_cos, bytes) &&
                  aligned(p.rotary_sin, bytes))) {
    return false;
  }
  if (append && (p.head_dim_v % v != 0 || !aligned(p.k_new, bytes) || !aligned(p.v_new, bytes) ||
                 !aligned(p.k_cache, bytes) || !aligned(p.v_cache, bytes))) {
    return false;
  }
  const int64_t q_strides[] = {p.q_batch_stride,     p.q_row_stride,     p.q_head_stride,
                               p.q_out_batch_stride, p.q_out_row_stride, p.q_out_head_stride};
  const int64_t kv_strides[] = {
      p.k_new_batch_stride,  p.k_new_row_stride,     p.k_new_head_stride,    p.v_new_batch_stride,
      p.v_new_row_stride,    p.v_new_head_stride,    p.k_cache_batch_stride, p.k_cache_row_stride,
      p.k_cache_head_stride, p.v_cache_batch_stride, p.v_cache_row_stride,   p.v_cache_head_stride};
  if (rotary) {
    for (int64_t s : q_strides) {
      if (s % v != 0) return false;
    }
  }
  if (append) {
    for (int64_t s : kv_strides) {
      if (s % v != 0) return false;
    }
  }
  return true;
}

template <class T, int V>
cudaError_t launch(const KvAppendParams& p, const Plan& plan, cudaStream_t stream) {
  kv_append_kernel<T, V><<<plan.kv_blocks + plan.q_blocks, kThreads, 0, stream>>>(p, plan);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_width(const KvAppendParams& p, const Plan& plan, int v, cudaStream_t stream) {
  switch (v) {
    case 8:
      return launch<T, 8>(p, plan, stream);
    case 4:
      return launch<T, 4>(p, plan, stream);
    default:
      return launch<T, 2>(p, plan, stream);
  }
}

}  // namespace

int kv_append_vector_width(const KvAppendParams& p) {
  for (int v : {8, 4, 2}) {
    if (fits(p, v)) return v;
  }
  return 1;
}

cudaError_t run_kv_append(const KvAppendParams& p, cudaStream_t stream) {
  const int v = kv_append_vector_width(p);
  const bool append = p.k_new != nullptr, rotary = p.rotary_cos != nullptr;
  if (v < 2 || p.head_dim <= 0 || (append && p.head_dim_v <= 0) ||
      (rotary && (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim)) ||
      (p.page_table != nullptr && p.cache_rows <= 0)) {
    return cudaErrorInvalidValue;
  }
  Plan plan{};
  const int r = rotary ? p.rotary_dim : 0;
  plan.rot_units = rotary && !p.rotary_interleaved ? r / 2 / v : 0;
  plan.row_units =
      rotary && !p.rotary_interleaved ? plan.rot_units + (p.head_dim - r) / v : p.head_dim / v;
  plan.v_units = append ? p.head_dim_v / v : 0;
  plan.kv_row_units = plan.row_units + plan.v_units;
  // Every index of a unit is an int: the totals stay under 2^31 (one launch moves up to 32 GiB).
  const int64_t kv_rows = append ? int64_t(p.batch) * p.seqlen_new * p.heads_kv : 0;
  const int64_t q_rows = rotary ? int64_t(p.batch) * p.seqlen_q * p.heads_q : 0;
  const int64_t kv_units = kv_rows * plan.kv_row_units, q_units = q_rows * plan.row_units;
  if (kv_units > INT_MAX || q_units > INT_MAX || (q_units > 0 && p.q_out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  plan.kv_units = static_cast<int>(kv_units);
  plan.q_units = static_cast<int>(q_units);
  plan.kv_blocks = static_cast<int>((kv_units + kThreads - 1) / kThreads);
  plan.q_blocks = static_cast<int>((q_units + kThreads - 1) / kThreads);
  if (plan.kv_blocks + plan.q_blocks == 0) return cudaSuccess;
  return p.bf16 ? launch_width<__nv_bfloat16>(p, plan, v, stream)
                : launch_width<__half>(p, plan, v, stream);
}

}  // namespace fa4
