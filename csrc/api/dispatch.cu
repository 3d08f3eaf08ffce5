// Validation and arch dispatch for the C++ API in api/fa4.h. Built by CMake (the fa4::fa4 library)
// and by setup.py (the PyTorch extension), so it depends on nothing but the CUDA runtime.
#include "common/bwd_workspace.h"
#include "api/fa4.h"
#include "common/head_dims.h"
#include "common/params.h"
#include "decode/plan.h"
#include "fa4_instances.h"
#include "sm90/fwd/fp8_vt.cuh"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// Both build systems pass -DFA4_VERSION="x.y.z" from fa4/VERSION; the fallback keeps a build that
// sets nothing honest about what it is. tests/api/test_cpp_api.py checks that it matches
// fa4/VERSION.
#ifndef FA4_VERSION
#define FA4_VERSION "0.1.0"
#endif

// Lets the compiler check every message's format string against its arguments.
#if defined(__GNUC__)
#define FA4_PRINTF_LIKE(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define FA4_PRINTF_LIKE(fmt_index, first_arg)
#endif

namespace fa4 {

// The per-arch entry points exist when the build compiled instances of them: fa4_instances.h,
// generated from fa4/kernels.json for the build's archs and head dims, defines
// FA4_INSTANCES_<FAMILY>_<DIR> for each family with instances, so the table below is the one
// place that knows which kernels exist.
#if defined(FA4_INSTANCES_SM90_FWD)
constexpr FwdLaunch kSm90Fwd = &run_fwd_sm90;
#else
constexpr FwdLaunch kSm90Fwd = nullptr;
#endif
#if defined(FA4_INSTANCES_SM90_BWD)
constexpr BwdLaunch kSm90Bwd = &run_bwd_sm90;
#else
constexpr BwdLaunch kSm90Bwd = nullptr;
#endif
#if defined(FA4_INSTANCES_SM100_FWD)
constexpr FwdLaunch kSm100Fwd = &run_fwd_sm100;
#else
constexpr FwdLaunch kSm100Fwd = nullptr;
#endif
#if defined(FA4_INSTANCES_SM100_BWD)
constexpr BwdLaunch kSm100Bwd = &run_bwd_sm100;
#else
constexpr BwdLaunch kSm100Bwd = nullptr;
#endif
#if defined(FA4_INSTANCES_DECODE_FWD)
constexpr FwdLaunch kDecodeFwd = &run_fwd_decode;
#else
constexpr FwdLaunch kDecodeFwd = nullptr;
#endif

namespace {

struct ArchKernels {
  // The exact compute capability the cubin runs on: sm_90a / sm_100a code uses arch-specific
  // instructions (wgmma, tcgen05) and does not run on any other CC, not even a later minor.
  int cc_major;
  int cc_minor;
  const char* name;
  FwdLaunch fwd;  // null: not compiled into this build
  BwdLaunch bwd;
  const char* arch_flag;  // the FA4_CUDA_ARCHS entry that builds it, quoted in the error message
};

constexpr ArchKernels kArchs[] = {
    {9, 0, "SM90", kSm90Fwd, kSm90Bwd, "90a"},
    {10, 0, "SM100", kSm100Fwd, kSm100Bwd, "100a"},
};

// Fixed-size so that recording an error can never throw or allocate.
thread_local char t_last_error[1024] = "";

FA4_PRINTF_LIKE(2, 3) Status fail(Status s, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(t_last_error, sizeof(t_last_error), fmt, args);
  va_end(args);
  return s;
}

Status cuda_fail(const char* what, cudaError_t e) {
  return fail(Status::kCudaError, "fa4 %s: %s failed: %s (%s)", FA4_VERSION, what,
              cudaGetErrorName(e), cudaGetErrorString(e));
}

bool is_varlen(const FwdParams& p) {
  return p.cu_seqlens_q != nullptr;
}
int64_t q_rows(const FwdParams& p) {
  return is_varlen(p) ? p.total_q : int64_t{p.batch} * p.seqlen_q;
}
bool is_paged(const FwdParams& p) {
  return p.page_table != nullptr;
}
int64_t k_rows(const FwdParams& p) {
  if (is_paged(p)) return int64_t{p.num_pages} * p.page_size;
  return is_varlen(p) ? p.total_k : int64_t{p.batch} * p.seqlen_k;
}

// What a tile order text may hold (TileOrderOptions::parse), for the kInvalid messages.
constexpr const char* kOrderRule =
    "its tokens are first, wave, l2, plain or a positive number, comma-separated";

// Collects the first broken rule. `prefix` is "fwd." when checking BwdParams::fwd so that the
// message names the field exactly as the caller spells it.
class Checker {
 public:
  explicit Checker(const char* prefix) : prefix_(prefix) {}
  bool ok() const { return ok_; }
  Status status() const { return ok_ ? Status::kOk : Status::kInvalid; }

  // Records `field`'s rule violation (printf-style) unless an earlier one was recorded.
  FA4_PRINTF_LIKE(3, 4) void fail(const char* field, const char* fmt, ...) {
    if (!ok_) return;
    ok_ = false;
    int n = std::snprintf(t_last_error, sizeof(t_last_error), "%s%s", prefix_, field);
    if (n < 0 || n >= static_cast<int>(sizeof(t_last_error))) return;
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(t_last_error + n, sizeof(t_last_error) - n, fmt, args);
    va_end(args);
  }

  void require_ptr(const char* field, const void* ptr, bool needed, const char* why) {
    if (needed && ptr == nullptr) fail(field, " is null: required %s", why);
  }

  // A 16-bit tensor moved by TMA: 16-byte aligned base (see api/fa4.h).
  void require_aligned(const char* field, const void* ptr) {
    auto addr = reinterpret_cast<uintptr_t>(ptr);
    if (addr % 16 != 0) {
      fail(field, "=%p not 16-byte aligned (TMA needs 16-byte global addresses)", ptr);
    }
  }

  // One stride of a tensor of elem_bytes-byte elements, for a dimension of `extent` elements.
  void require_stride(const char* field, int64_t stride, int64_t extent, int elem_bytes = 2) {
    if (stride < 0) {
      fail(field, "=%lld is negative: strides must be >= 0", static_cast<long long>(stride));
    } else if (extent > 1 && stride % (16 / elem_bytes) != 0) {
      fail(field, "=%lld not a multiple of %d elements (the copies need 16-byte strides)",
           static_cast<long long>(stride), 16 / elem_bytes);
    }
  }

 private:
  const char* prefix_;
  bool ok_ = true;
};

// The 16-bit tensor `name` with its three strides; rows = its row count, heads = its head count.
void check_tensor(Checker& c, const char* name, const void* ptr, bool varlen, int batch,
                  int64_t rows_per_batch, int heads, int64_t batch_stride, int64_t row_stride,
                  int64_t head_stride, int elem_bytes = 2) {
  char field[64];
  c.require_aligned(name, ptr);
  if (!varlen) {
    std::snprintf(field, sizeof(field), "%s_batch_stride", name);
    c.require_stride(field, batch_stride, batch, elem_bytes);
  }
  std::snprintf(field, sizeof(field), "%s_row_stride", name);
  c.require_stride(field, row_stride, rows_per_batch, elem_bytes);
  std::snprintf(field, sizeof(field), "%s_head_stride", name);
  c.require_stride(field, head_stride, heads, elem_bytes);
}

// Everything bwd_workspace_size depends on, plus the other size rules.
void check_sizes(Checker& c, const FwdParams& p) {
  if (p.batch < 1) c.fail("batch", "=%d must be >= 1", p.batch);
  if (p.seqlen_q < 0) c.fail("seqlen_q", "=%d must be >= 0", p.seqlen_q);
  if (p.seqlen_k < 0) c.fail("seqlen_k", "=%d must be >= 0", p.seqlen_k);
  if (p.heads_q < 1) c.fail("heads_q", "=%d must be >= 1", p.heads_q);
  if (p.heads_kv < 1) c.fail("heads_kv", "=%d must be >= 1", p.heads_kv);
  if (c.ok() && p.heads_q % p.heads_kv != 0) {
    c.fail("heads_q", "=%d not a multiple of heads_kv=%d (GQA/MQA groups whole heads)", p.heads_q,
           p.heads_kv);
  }
  // Note [padded head dims] (common/head_dims.h): any multiple of 8 up to 256 runs on the
  // compiled instance that covers it; run_fwd_* / run_bwd_* name a build that has none.
  if (!admissible_head_dim(p.head_dim)) {
    c.fail("head_dim", "=%d not supported: a multiple of 8 from 8 to 256", p.head_dim);
  }
  if (!admissible_head_dim(p.head_dim_v)) {
    c.fail("head_dim_v", "=%d not supported: a multiple of 8 from 8 to 256", p.head_dim_v);
  }
  const bool varlen_q = p.cu_seqlens_q != nullptr;
  const bool varlen_k = p.cu_seqlens_k != nullptr;
  const bool paged = p.page_table != nullptr;
  if (paged) {
    if (p.page_size < 1) c.fail("page_size", "=%d must be >= 1 with page_table", p.page_size);
    if (p.num_pages < 1) c.fail("num_pages", "=%d must be >= 1 with page_table", p.num_pages);
    if (p.page_table_batch_stride < 0) {
      c.fail("page_table_batch_stride", "=%lld must be >= 0",
             static_cast<long long>(p.page_table_batch_stride));
    }
    if (varlen_k) c.fail("cu_seqlens_k", " is set with page_table: paged keys take seqused_k");
    if (p.seqused_k == nullptr) {
      c.fail("seqused_k", " is null: required with page_table (the key count of each sequence)");
    }
  } else if (varlen_q != varlen_k) {
    c.fail(varlen_q ? "cu_seqlens_k" : "cu_seqlens_q",
           " is null while %s is set: both set (varlen) or both null (dense)",
           varlen_q ? "cu_seqlens_q" : "cu_seqlens_k");
  }
  if (p.kv_batch_idx != nullptr && varlen_q) {
    c.fail("kv_batch_idx", " is set with varlen: only allowed with dense q and k/v");
  }
  if (p.leftpad_k != nullptr && varlen_k) {
    c.fail("leftpad_k", " is set with cu_seqlens_k: only allowed with dense or paged k/v");
  }
  if (p.seqused_q != nullptr && !varlen_q) {
    c.fail("seqused_q", " is set without cu_seqlens_q: only allowed with varlen");
  }
  if (p.num_splits < 0) c.fail("num_splits", "=%d must be >= 0 (0 = heuristic)", p.num_splits);
  if (varlen_q && c.ok()) {
    if (p.total_q < 0) c.fail("total_q", "=%d must be >= 0", p.total_q);
    if (p.total_k < 0) c.fail("total_k", "=%d must be >= 0", p.total_k);
    if (int64_t{p.total_q} > int64_t{p.batch} * p.seqlen_q) {
      c.fail("total_q", "=%d exceeds batch * seqlen_q = %d * %d (seqlen_q is the max length)",
             p.total_q, p.batch, p.seqlen_q);
    }
    // With seqused_k the packed key rows may exceed what is used, so only bound without it.
    if (p.seqused_k == nullptr && !paged && int64_t{p.total_k} > int64_t{p.batch} * p.seqlen_k) {
      c.fail("total_k", "=%d exceeds batch * seqlen_k = %d * %d (seqlen_k is the max length)",
             p.total_k, p.batch, p.seqlen_k);
    }
  }
}

void check_fwd(Checker& c, const FwdParams& p, bool lse_required) {
  check_sizes(c, p);
  if (!c.ok()) return;  // the rules below index with the sizes

  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16 && p.dtype != DType::kE4M3) {
    c.fail("dtype", "=%d unknown: DType::kFloat16, kBFloat16 or kE4M3", static_cast<int>(p.dtype));
  }
  const bool e4m3 = p.dtype == DType::kE4M3;
  if (e4m3) {
    // The FP8 forward (api/fa4.h): dense or varlen q, k, v, none of the serving layouts.
    if (p.kv_fp8 || p.page_table != nullptr || p.kv_batch_idx != nullptr ||
        p.leftpad_k != nullptr || p.seqused_q != nullptr || p.learnable_sink != nullptr ||
        p.num_splits > 1 || (p.seqused_k != nullptr && p.cu_seqlens_k == nullptr)) {
      c.fail("dtype",
             "=kE4M3: the FP8 forward takes dense or varlen q, k, v (no kv_fp8, "
             "page_table, kv_batch_idx, leftpad_k, seqused_q, dense seqused_k, "
             "learnable_sink or splits)");
    }
    if (p.head_dim % 16 != 0 || p.head_dim_v % 16 != 0) {
      c.fail("head_dim", "=%d / head_dim_v=%d: the FP8 forward needs multiples of 16", p.head_dim,
             p.head_dim_v);
    }
  }
  if (!(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.0f)) {
    c.fail("softmax_scale", "=%g must be finite and > 0 (usually 1/sqrt(head_dim))",
           static_cast<double>(p.softmax_scale));
  }
  if (!(std::isfinite(p.softcap) && p.softcap >= 0.0f)) {
    c.fail("softcap", "=%g must be finite and >= 0 (0 = off)", static_cast<double>(p.softcap));
  }
  if (p.num_sms < 0) c.fail("num_sms", "=%d must be >= 0 (0 = the device's count)", p.num_sms);
  if (reinterpret_cast<uintptr_t>(p.tile_counter) % 8 != 0) {
    c.fail("tile_counter", "=%p not 8-byte aligned", static_cast<void*>(p.tile_counter));
  }

  const bool varlen = is_varlen(p);
  const int64_t sq = varlen ? p.total_q : p.seqlen_q;  // row extent per batch entry
  const int64_t sk = varlen ? p.total_k : p.seqlen_k;
  const bool has_q = q_rows(p) > 0;
  const bool has_k = k_rows(p) > 0;
  c.require_ptr("q", p.q, has_q, "when there are query rows");
  c.require_ptr("out", p.out, has_q, "when there are query rows");
  c.require_ptr("k", p.k, has_k, "when there are key rows");
  c.require_ptr("v", p.v, has_k, "when there are key rows");
  c.require_ptr("lse", p.lse, lse_required && has_q, "by the backward (it is an input there)");
  check_tensor(c, "q", p.q, varlen, p.batch, sq, p.heads_q, p.q_batch_stride, p.q_row_stride,
               p.q_head_stride, e4m3 ? 1 : 2);
  // Paged: (num_pages, page_size, heads, d); kv_batch_idx: more batch entries than q has.
  const bool k_dense = !varlen || is_paged(p);
  const int k_batch = is_paged(p) ? p.num_pages : p.kv_batch_idx != nullptr ? 2 : p.batch;
  const int64_t k_len = is_paged(p) ? p.page_size : sk;
  const int kv_bytes = p.kv_fp8 || e4m3 ? 1 : 2;
  check_tensor(c, "k", p.k, !k_dense, k_batch, k_len, p.heads_kv, p.k_batch_stride, p.k_row_stride,
               p.k_head_stride, kv_bytes);
  check_tensor(c, "v", p.v, !k_dense, k_batch, k_len, p.heads_kv, p.v_batch_stride, p.v_row_stride,
               p.v_head_stride, kv_bytes);
  if (p.kv_fp8 || e4m3) {
    // Note [fp8 cache] (decode/kernel.cuh): 16-byte copies of whole rows.
    if (p.head_dim % 16 != 0 || p.head_dim_v % 16 != 0) {
      c.fail("head_dim", "=%d / head_dim_v=%d: kv_fp8 needs multiples of 16", p.head_dim,
             p.head_dim_v);
    }
    if (p.descale_batch_stride < 0 || p.descale_head_stride < 0) {
      c.fail("descale_batch_stride", "=%lld / descale_head_stride=%lld must be >= 0",
             static_cast<long long>(p.descale_batch_stride),
             static_cast<long long>(p.descale_head_stride));
    }
  } else if (p.k_descale != nullptr || p.v_descale != nullptr) {
    c.fail("k_descale", " / v_descale are set without kv_fp8 or kE4M3: descales are for FP8");
  }
  if (p.q_descale != nullptr && !e4m3) {
    c.fail("q_descale", " is set without dtype kE4M3: it is the FP8 forward's");
  }
  check_tensor(c, "out", p.out, varlen, p.batch, sq, p.heads_q, p.out_batch_stride,
               p.out_row_stride, p.out_head_stride);
  if (p.lse != nullptr) {
    // fp32 and written row by row, so no TMA alignment rule; only the sign.
    if (!varlen && p.lse_batch_stride < 0) {
      c.fail("lse_batch_stride", "=%lld is negative: strides must be >= 0",
             static_cast<long long>(p.lse_batch_stride));
    }
    if (p.lse_head_stride < 0) {
      c.fail("lse_head_stride", "=%lld is negative: strides must be >= 0",
             static_cast<long long>(p.lse_head_stride));
    }
  }
}

const ArchKernels* find_arch(int cc_major, int cc_minor) {
  for (const ArchKernels& a : kArchs) {
    if (a.cc_major == cc_major && a.cc_minor == cc_minor) return &a;
  }
  return nullptr;
}

// "SM90 forward: not built (FA4_CUDA_ARCHS without 90a), ..." for the kernels this build lacks.
void describe_missing(char* buf, size_t n, bool fwd) {
  buf[0] = '\0';
  size_t used = 0;
  for (const ArchKernels& a : kArchs) {
    if ((fwd ? a.fwd != nullptr : a.bwd != nullptr) || used >= n) continue;
    int w = std::snprintf(buf + used, n - used, "%s%s %s: not built (FA4_CUDA_ARCHS without %s)",
                          used ? ", " : "", a.name, fwd ? "forward" : "backward", a.arch_flag);
    if (w > 0) used += static_cast<size_t>(w);
  }
}

// "SM90, SM100" for the kernels this build has.
void describe_compiled(char* buf, size_t n, bool fwd) {
  buf[0] = '\0';
  size_t used = 0;
  for (const ArchKernels& a : kArchs) {
    if ((fwd ? a.fwd == nullptr : a.bwd == nullptr) || used >= n) continue;
    int w = std::snprintf(buf + used, n - used, "%s%s", used ? ", " : "", a.name);
    if (w > 0) used += static_cast<size_t>(w);
  }
}

bool any_compiled(bool fwd) {
  for (const ArchKernels& a : kArchs) {
    if (fwd ? a.fwd != nullptr : a.bwd != nullptr) return true;
  }
  return false;
}

// Picks the kernel for the current device. The device is queried only when some kernel for this
// direction is compiled in, so a kernel-less build never touches it (and answers the same on a
// machine without one).
Status select_arch(bool fwd, int num_sms, const ArchKernels** arch, DeviceInfo* info) {
  const char* dir = fwd ? "forward" : "backward";
  if (!any_compiled(fwd)) {
    char missing[256];
    describe_missing(missing, sizeof(missing), fwd);
    return fail(Status::kUnsupported, "fa4 %s: no %s kernel is compiled into this build (%s)",
                FA4_VERSION, dir, missing);
  }
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_fail("cudaGetDevice", e);
  e = cudaDeviceGetAttribute(&info->cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&info->cc_minor, cudaDevAttrComputeCapabilityMinor, dev);
  }
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&info->num_sms, cudaDevAttrMultiProcessorCount, dev);
  }
  if (e != cudaSuccess) return cuda_fail("cudaDeviceGetAttribute", e);
  if (num_sms > 0) info->num_sms = num_sms;

  *arch = find_arch(info->cc_major, info->cc_minor);
  if (*arch == nullptr || (fwd ? (*arch)->fwd == nullptr : (*arch)->bwd == nullptr)) {
    char compiled[128];
    describe_compiled(compiled, sizeof(compiled), fwd);
    return fail(Status::kUnsupported,
                "fa4 %s: no %s kernel for this GPU (compute capability %d.%d); this build has: %s",
                FA4_VERSION, dir, info->cc_major, info->cc_minor, compiled);
  }
  return Status::kOk;
}

// Note [tile order options]: the process default of a null RunOptions::tile_order
// (RunOptions::bwd_tile_order), the environment variable `name` as it was when first asked.
struct EnvTileOrder {
  const char* name;
  TileOrderOptions options;
  char text[128];  // the variable's text for the kInvalid message (cut at 127 characters)

  static EnvTileOrder read(const char* name) {
    const char* text = std::getenv(name);
    EnvTileOrder e{name, TileOrderOptions::parse(text), ""};
    std::snprintf(e.text, sizeof(e.text), "%s", text == nullptr ? "" : text);
    return e;
  }
};

// Function-local statics: initialized once (thread-safe), by the process's first run_fwd /
// run_bwd.
const EnvTileOrder& fwd_env_tile_order() {
  static const EnvTileOrder e = EnvTileOrder::read("FA4_TILE_ORDER");
  return e;
}
const EnvTileOrder& bwd_env_tile_order() {
  static const EnvTileOrder e = EnvTileOrder::read("FA4_BWD_TILE_ORDER");
  return e;
}

// RunOptions' tile order `text` as `options`: kInvalid naming `field` when it has a token they
// do not know (bindings.cpp renames the "<field>=" prefix after the environment variable). Null
// leaves `options` for tile_order_default.
Status tile_order_option(const char* field, const char* text, TileOrderOptions* options) {
  if (text == nullptr) return Status::kOk;
  *options = TileOrderOptions::parse(text);
  if (options->ok) return Status::kOk;
  return fail(Status::kInvalid, "%s=%s: %s", field, text, kOrderRule);
}

// The process default `e` as `options`, for a null RunOptions tile order: kInvalid naming e's
// variable when that has a token they do not know.
Status tile_order_default(const EnvTileOrder& e, TileOrderOptions* options) {
  *options = e.options;
  if (e.options.ok) return Status::kOk;
  return fail(Status::kInvalid, "%s=%s: %s (or unset it)", e.name, e.text, kOrderRule);
}

}  // namespace

Status kernel_fail(Status s, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(t_last_error, sizeof(t_last_error), fmt, args);
  va_end(args);
  return s;
}

const char* status_name(Status s) noexcept {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kUnsupported:
      return "unsupported";
    case Status::kInvalid:
      return "invalid";
    case Status::kCudaError:
      return "cuda_error";
  }
  return "unknown";
}

const char* last_error() noexcept {
  return t_last_error;
}

const char* version() noexcept {
  return FA4_VERSION;
}

Status validate(const FwdParams& p) noexcept {
  Checker c("");
  check_fwd(c, p, /*lse_required=*/false);
  return c.status();
}

Status validate(const BwdParams& p) noexcept {
  Checker f("fwd.");
  check_fwd(f, p.fwd, /*lse_required=*/true);
  if (!f.ok()) return f.status();

  const FwdParams& fp = p.fwd;
  Checker c("");
  // The backward kernels have none of the inference layouts; fa4/_ops.py computes the sink's
  // gradient and runs seqused_q through lse = +inf rows.
  if (fp.seqused_q != nullptr || fp.page_table != nullptr || fp.kv_batch_idx != nullptr ||
      fp.leftpad_k != nullptr || fp.learnable_sink != nullptr || fp.kv_fp8 ||
      fp.dtype == DType::kE4M3 || (fp.seqused_k != nullptr && fp.cu_seqlens_k == nullptr)) {
    c.fail("fwd",
           ": seqused_q, page_table, kv_batch_idx, leftpad_k, learnable_sink, kv_fp8, dtype kE4M3 "
           "and dense seqused_k are forward only (api/fa4.h)");
    return c.status();
  }
  const bool varlen = is_varlen(fp);
  const int64_t sq = varlen ? fp.total_q : fp.seqlen_q;
  const int64_t sk = varlen ? fp.total_k : fp.seqlen_k;
  const bool has_q = q_rows(fp) > 0;
  const bool has_k = k_rows(fp) > 0;
  c.require_ptr("dout", p.dout, has_q, "when there are query rows");
  c.require_ptr("dq", p.dq, has_q, "when there are query rows");
  c.require_ptr("dk", p.dk, has_k, "when there are key rows");
  c.require_ptr("dv", p.dv, has_k, "when there are key rows");
  check_tensor(c, "dout", p.dout, varlen, fp.batch, sq, fp.heads_q, p.dout_batch_stride,
               p.dout_row_stride, p.dout_head_stride);
  check_tensor(c, "dq", p.dq, varlen, fp.batch, sq, fp.heads_q, p.dq_batch_stride, p.dq_row_stride,
               p.dq_head_stride);
  check_tensor(c, "dk", p.dk, varlen, fp.batch, sk, fp.heads_kv, p.dk_batch_stride, p.dk_row_stride,
               p.dk_head_stride);
  check_tensor(c, "dv", p.dv, varlen, fp.batch, sk, fp.heads_kv, p.dv_batch_stride, p.dv_row_stride,
               p.dv_head_stride);
  return c.status();
}

Status run_fwd(const FwdParams& p, cudaStream_t stream, const RunOptions& options) noexcept {
  const EnvTileOrder& env = fwd_env_tile_order();  // read at the process's first run_fwd
  DeviceInfo info;
  Status s = tile_order_option("tile_order", options.tile_order, &info.tile_order);
  if (s != Status::kOk) return s;
  s = validate(p);
  if (s != Status::kOk) return s;
  if (q_rows(p) == 0) return Status::kOk;  // no output element: nothing to write (see api/fa4.h)

  if (options.tile_order == nullptr) {
    s = tile_order_default(env, &info.tile_order);
    if (s != Status::kOk) return s;
  }
  const ArchKernels* arch = nullptr;
  s = select_arch(/*fwd=*/true, p.num_sms, &arch, &info);
  if (s != Status::kOk) return s;
  if (decode::takes_decode(p, info.cc_major)) {
    if (kDecodeFwd == nullptr) {
      return fail(Status::kUnsupported, "fa4 %s: the decode kernel is not compiled into this build",
                  FA4_VERSION);
    }
    const size_t needed = fwd_workspace_size(p);
    if (p.workspace_bytes < needed || (needed > 0 && p.workspace == nullptr)) {
      return fail(Status::kInvalid, "workspace_bytes=%zu smaller than fwd_workspace_size()=%zu",
                  p.workspace_bytes, needed);
    }
    if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0) {
      return fail(Status::kInvalid, "workspace=%p not 16-byte aligned", p.workspace);
    }
    return kDecodeFwd(p, info, stream);
  }
  if (p.dtype == DType::kE4M3) {  // Vᵀ goes to the workspace (sm90/fwd/fp8_vt.cuh)
    const size_t needed = fwd_workspace_size(p);
    if (p.workspace_bytes < needed || p.workspace == nullptr) {
      return fail(Status::kInvalid, "workspace_bytes=%zu smaller than fwd_workspace_size()=%zu",
                  p.workspace_bytes, needed);
    }
    if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0) {
      return fail(Status::kInvalid, "workspace=%p not 16-byte aligned", p.workspace);
    }
  }
  return arch->fwd(p, info, stream);
}

size_t fwd_workspace_size(const FwdParams& p) noexcept {
  Checker c("");
  check_sizes(c, p);
  if (!c.ok() || q_rows(p) == 0) return 0;
  int dev = 0, num_sms = 1, cc_major = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) {
    cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  }
  if (p.num_sms > 0) num_sms = p.num_sms;
  if (p.dtype == DType::kE4M3) return sm90::VtLayout::of(p).bytes(p);
  if (!decode::takes_decode(p, cc_major)) return 0;
  return decode::make_plan(p, num_sms).workspace_bytes();
}

Status run_fwd(const FwdParams& p, cudaStream_t stream) noexcept {
  return run_fwd(p, stream, RunOptions{});
}

// The dQ accumulator's row width: the head dim of the backward instance that runs the problem
// (Note [padded head dims]), the widest over the archs this build compiled, since the size is
// asked without a device. Its kernel lays the workspace out with its own width, which is <= it.
// With dv: the widest max(d, d_v), the dK / dV accumulators' width (Note [GQA head slices]).
namespace {
int workspace_head_dim(const FwdParams& f, bool dv = false) {
  int width = dv ? std::max(f.head_dim, f.head_dim_v) : f.head_dim;
  auto widen = [&](HeadDims h) { width = std::max(width, dv ? std::max(h.d, h.dv) : h.d); };
#if defined(FA4_INSTANCES_SM90_BWD)
  constexpr HeadDims kSm90[] = {FA4_INSTANCES_SM90_BWD(FA4_HEAD_DIMS_ENTRY)};
  widen(cover(kSm90, f.head_dim, f.head_dim_v));
#endif
#if defined(FA4_INSTANCES_SM100_BWD)
  constexpr HeadDims kSm100[] = {FA4_INSTANCES_SM100_BWD(FA4_HEAD_DIMS_ENTRY)};
  widen(cover(kSm100, f.head_dim, f.head_dim_v));
#endif
  (void)widen;
  return width;
}
}  // namespace

// Layout and size: common/bwd_workspace.h (Note [bwd workspace]).
size_t bwd_workspace_size(const BwdParams& p) noexcept {
  Checker c("fwd.");
  check_sizes(c, p.fwd);
  if (!c.ok()) return 0;
  const FwdParams& f = p.fwd;
  if (q_rows(f) == 0) return 0;
  return static_cast<size_t>(BwdWorkspace::bytes(
      is_varlen(f), f.batch, f.seqlen_q, f.total_q, f.heads_q, workspace_head_dim(f),
      f.deterministic, f.seqlen_k, f.total_k, f.heads_kv, workspace_head_dim(f, true)));
}

Status run_bwd(const BwdParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
               const RunOptions& options) noexcept {
  const EnvTileOrder& env = bwd_env_tile_order();  // read at the process's first run_bwd
  DeviceInfo info;
  Status s = tile_order_option("bwd_tile_order", options.bwd_tile_order, &info.tile_order);
  if (s != Status::kOk) return s;
  s = validate(p);
  if (s != Status::kOk) return s;
  const size_t needed = bwd_workspace_size(p);
  if (workspace_bytes < needed) {
    return fail(Status::kInvalid, "workspace_bytes=%zu smaller than bwd_workspace_size()=%zu",
                workspace_bytes, needed);
  }
  if (needed > 0 && workspace == nullptr) {
    return fail(Status::kInvalid, "workspace is null: required %zu bytes", needed);
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return fail(Status::kInvalid, "workspace=%p not 16-byte aligned", workspace);
  }
  // No gradient element at all: nothing to write (see api/fa4.h).
  if (q_rows(p.fwd) == 0 && k_rows(p.fwd) == 0) return Status::kOk;

  if (options.bwd_tile_order == nullptr) {
    s = tile_order_default(env, &info.tile_order);
    if (s != Status::kOk) return s;
  }
  const ArchKernels* arch = nullptr;
  s = select_arch(/*fwd=*/false, p.fwd.num_sms, &arch, &info);
  if (s != Status::kOk) return s;
  return arch->bwd(p, info, workspace, stream);
}

Status run_bwd(const BwdParams& p, void* workspace, size_t workspace_bytes,
               cudaStream_t stream) noexcept {
  return run_bwd(p, workspace, workspace_bytes, stream, RunOptions{});
}

}  // namespace fa4
