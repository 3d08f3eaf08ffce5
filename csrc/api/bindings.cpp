// PyTorch binding: the ops fa4::_fwd_kernel and fa4::_bwd_kernel, called by fa4/_ops.py once
// Python has validated the inputs and chosen a compiled kernel. Glue only: tensors become
// FwdParams / BwdParams, the C++ API runs them, a non-OK status becomes a Python error. No
// environment variable is read here: Python passes their values as the ops' last arguments.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "api/fa4.h"

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// An absent optional, or one holding an undefined tensor (what autograd can hand over for the
// gradient of an output the loss did not use), is a null pointer.
template <class T>
const T* opt_ptr(const OptTensor& t) {
  return t.has_value() && t->defined() ? t->data_ptr<T>() : nullptr;
}

// Strides of a (b, s, h, d) tensor, or (total, h, d) for varlen (no batch stride).
struct Strides {
  int64_t batch, row, head;
};
Strides strides_of(const Tensor& t, bool varlen) {
  return varlen ? Strides{0, t.stride(0), t.stride(1)}
                : Strides{t.stride(0), t.stride(1), t.stride(2)};
}

fa4::FwdParams fwd_params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const OptTensor& cu_q, const OptTensor& cu_k,
                          const OptTensor& seqused_k, int64_t max_q, int64_t max_k, bool causal,
                          double scale, int64_t wl, int64_t wr, double softcap, bool det) {
  const bool varlen = cu_q.has_value();
  fa4::FwdParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  auto [qb, qr, qh] = strides_of(q, varlen);
  auto [kb, kr, kh] = strides_of(k, varlen);
  auto [vb, vr, vh] = strides_of(v, varlen);
  auto [ob, orow, oh] = strides_of(out, varlen);
  p.q_batch_stride = qb, p.q_row_stride = qr, p.q_head_stride = qh;
  p.k_batch_stride = kb, p.k_row_stride = kr, p.k_head_stride = kh;
  p.v_batch_stride = vb, p.v_row_stride = vr, p.v_head_stride = vh;
  p.out_batch_stride = ob, p.out_row_stride = orow, p.out_head_stride = oh;
  // LSE is (b, h, s_q) dense and (h, total_q) varlen, contiguous (allocated here).
  p.lse_batch_stride = varlen ? 0 : lse.stride(0);
  p.lse_head_stride = lse.stride(varlen ? 0 : 1);
  p.heads_q = static_cast<int>(q.size(-2));
  p.heads_kv = static_cast<int>(k.size(-2));
  p.head_dim = static_cast<int>(q.size(-1));
  p.head_dim_v = static_cast<int>(v.size(-1));
  if (varlen) {
    p.batch = static_cast<int>(cu_q->size(0) - 1);
    p.seqlen_q = static_cast<int>(max_q);
    p.seqlen_k = static_cast<int>(max_k);
    p.cu_seqlens_q = cu_q->data_ptr<int>();
    p.cu_seqlens_k = opt_ptr<int>(cu_k);
    p.total_q = static_cast<int>(q.size(0));
    p.total_k = static_cast<int>(k.size(0));
  } else {
    p.batch = static_cast<int>(q.size(0));
    p.seqlen_q = static_cast<int>(q.size(1));
    p.seqlen_k = static_cast<int>(k.size(1));
  }
  p.seqused_k = opt_ptr<int>(seqused_k);  // varlen, paged, or a dense KV cache's key counts
  p.softmax_scale = static_cast<float>(scale);
  p.softcap = static_cast<float>(softcap);
  p.window_left = static_cast<int>(wl);
  p.window_right = static_cast<int>(wr);
  p.causal = causal;
  p.dtype = q.scalar_type() == at::kHalf            ? fa4::DType::kFloat16
            : q.scalar_type() == at::kFloat8_e4m3fn ? fa4::DType::kE4M3
                                                    : fa4::DType::kBFloat16;
  p.deterministic = det;
  return p;
}

// The ops' last three arguments, fa4/dispatch.py runtime_knobs's reading of the environment at
// each call: num_sms (FA4_NUM_SMS) caps the persistent grids (FwdParams::num_sms: the tests run
// the multi-tile walk with a few CTAs, and a count past the tiles gives one CTA per tile);
// tile_schedule picks the tile counter (Note [stream tile counter]); tile_order is FA4_TILE_ORDER's
// text, or FA4_BWD_TILE_ORDER's for the backward, passed as fa4::RunOptions ("" when unset: the
// built-in order; None: the library's process default, api/fa4.h).
enum TileSchedule : int64_t {
  kStreamCounter = 0,  // the stream's counter (Note [stream tile counter])
  kStatic = 1,         // FA4_STATIC_SCHEDULE=1: null, the static assignment (A/B, its tests)
  kFreshCounter = 2,   // FA4_FRESH_TILE_COUNTER=1: a fresh zeroed counter per call
};

// The message is formatted here and raised as one string, as check_ok raises: on the H100 device
// (torch 2.11), TORCH_CHECK with int64_t message arguments crashed (SIGSEGV) at this point, while
// its const char* form raised.
void check_knobs(int64_t num_sms, int64_t tile_schedule) {
  char msg[160] = "";
  if (num_sms < 0 || num_sms > std::numeric_limits<int>::max()) {
    std::snprintf(msg, sizeof(msg), "fa4: num_sms=%lld must be >= 0 and fit an int (0 = every SM)",
                  static_cast<long long>(num_sms));
  } else if (tile_schedule < kStreamCounter || tile_schedule > kFreshCounter) {
    std::snprintf(msg, sizeof(msg),
                  "fa4: tile_schedule=%lld must be 0 (the stream's counter), 1 (static) or 2 (a "
                  "fresh counter per call)",
                  static_cast<long long>(tile_schedule));
  }
  TORCH_CHECK(msg[0] == '\0', static_cast<const char*>(msg));
}

// A non-OK status as a Python error. The ops' tile order argument is `env`'s text, so a kInvalid
// about it (last_error() "<field>=<text>: ...", api/dispatch.cu) names the variable the user set:
// tests/gpu/test_fwd_sm90.py and tests/gpu/test_bwd_sm90.py match "FA4_TILE_ORDER=first,last".
void check_ok(fa4::Status s, const char* field, const char* env) {
  if (s == fa4::Status::kOk) return;
  const char* msg = fa4::last_error();
  const size_t n = std::strlen(field);
  const bool order = std::strncmp(msg, field, n) == 0 && msg[n] == '=';
  TORCH_CHECK(false, "fa4 (", fa4::status_name(s), "): ", order ? env : "", order ? msg + n : msg);
}

// Note [stream tile counter]: the kernels leave FwdParams::tile_counter at zero (Note
// [self-resetting tile counter], common/tile_ring.cuh), so each (device, stream) keeps one, zeroed
// once on its stream when first used: the calls on one stream run in order and never share it at
// the same time. The map is never freed: its tensors live as long as the process, and a static
// destructor would free CUDA memory after the driver may have shut down. Which counter a call
// takes is the ops' tile_schedule argument (TileSchedule), not an environment variable read here:
// fa4/dispatch.py runtime_knobs reads FA4_STATIC_SCHEDULE and FA4_FRESH_TILE_COUNTER at each call
// (~1 us an os.environ lookup on a 2-core CI machine), so that a test may switch them between
// calls of one process.
const Tensor& stream_counter(const c10::cuda::CUDAStream& stream, const Tensor& like) {
  static std::mutex mu;
  static auto* counters = new std::map<std::pair<int, int64_t>, Tensor>();
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(int(stream.device_index()), int64_t(stream.id()));
  auto it = counters->find(key);
  if (it == counters->end()) {
    it = counters->emplace(key, at::zeros({2}, like.options().dtype(at::kLong))).first;
  }
  return it->second;
}

// The tile counter of a call on the current stream (null for kStatic). While the stream is
// captured into a CUDA graph, a fresh zeroed one instead, held by `fresh` (the fill is captured
// with the kernel): replays of a graph may run on any stream, beside this stream's eager calls
// and beside each other. kFreshCounter takes that path in eager calls too: the A/B of the fill
// launched per call, and the capture path's test outside a capture.
int64_t* tile_counter_for(const Tensor& like, int64_t tile_schedule, Tensor& fresh) {
  if (tile_schedule == kStatic) return nullptr;
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
  if (tile_schedule == kFreshCounter || status != cudaStreamCaptureStatusNone) {
    fresh = at::zeros({2}, like.options().dtype(at::kLong));
    return fresh.data_ptr<int64_t>();
  }
  return stream_counter(stream, like).data_ptr<int64_t>();
}

// The inference arguments (api/fa4.h, "Inference layouts"): paged k/v are (num_pages,
// page_size, h_kv, d) with page_table (b, max_pages), and max_k is then the longest key count.
void set_inference(fa4::FwdParams& p, const Tensor& k, const Tensor& v, const OptTensor& seqused_q,
                   const OptTensor& page_table, const OptTensor& kv_batch_idx,
                   const OptTensor& leftpad_k, const OptTensor& sink, int64_t max_k,
                   int64_t num_splits) {
  p.seqused_q = opt_ptr<int>(seqused_q);
  p.kv_batch_idx = opt_ptr<int>(kv_batch_idx);
  p.leftpad_k = opt_ptr<int>(leftpad_k);
  p.learnable_sink = opt_ptr<float>(sink);
  p.num_splits = static_cast<int>(num_splits);
  if (page_table.has_value() && page_table->defined()) {
    p.page_table = page_table->data_ptr<int>();
    p.page_table_batch_stride = page_table->stride(0);
    p.num_pages = static_cast<int>(k.size(0));
    p.page_size = static_cast<int>(k.size(1));
    p.k_batch_stride = k.stride(0);
    p.k_row_stride = k.stride(1);
    p.k_head_stride = k.stride(2);
    p.v_batch_stride = v.stride(0);
    p.v_row_stride = v.stride(1);
    p.v_head_stride = v.stride(2);
    p.seqlen_k = static_cast<int>(max_k);
  }
}

std::tuple<Tensor, Tensor> fwd_kernel(
    const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& cu_q, const OptTensor& cu_k,
    const OptTensor& seqused_k, const OptTensor& seqused_q, const OptTensor& page_table,
    const OptTensor& kv_batch_idx, const OptTensor& leftpad_k, const OptTensor& sink, int64_t max_q,
    int64_t max_k, bool causal, double scale, int64_t wl, int64_t wr, double softcap, bool det,
    int64_t num_splits, int64_t num_sms, int64_t tile_schedule,
    const std::optional<std::string>& tile_order, const OptTensor& k_descale,
    const OptTensor& v_descale, const OptTensor& q_descale) {
  check_knobs(num_sms, tile_schedule);
  c10::cuda::CUDAGuard guard(q.device());
  auto out_shape = q.sizes().vec();
  out_shape.back() = v.size(-1);
  // The FP8 forward (e4m3 q, k, v: api/fa4.h) writes bf16.
  const bool fp8_fwd = q.scalar_type() == at::kFloat8_e4m3fn;
  Tensor out = at::empty(out_shape, fp8_fwd ? q.options().dtype(at::kBFloat16) : q.options());
  Tensor lse = cu_q.has_value()
                   ? at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat))
                   : at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  if (q.numel() == 0) return {out, lse};
  auto p = fwd_params(q, k, v, out, lse, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, wl, wr,
                      softcap, det);
  set_inference(p, k, v, seqused_q, page_table, kv_batch_idx, leftpad_k, sink, max_k, num_splits);
  // An e4m3 cache with 16-bit q (api/fa4.h, "Inference layouts"), or the FP8 forward; descales
  // are fp32 (batch, heads_kv) with one layout.
  p.kv_fp8 = !fp8_fwd && k.scalar_type() == at::kFloat8_e4m3fn;
  p.k_descale = opt_ptr<float>(k_descale);
  p.v_descale = opt_ptr<float>(v_descale);
  p.q_descale = opt_ptr<float>(q_descale);
  bool descale_strides_set = false;
  for (const OptTensor* d : {&k_descale, &v_descale, &q_descale}) {
    if (!d->has_value() || !(*d)->defined() || (*d)->dim() != 2) continue;
    const bool same = !descale_strides_set || (p.descale_batch_stride == (*d)->stride(0) &&
                                               p.descale_head_stride == (*d)->stride(1));
    TORCH_CHECK(same, "fa4: q_descale, k_descale and v_descale must have the same strides");
    p.descale_batch_stride = (*d)->stride(0);
    p.descale_head_stride = (*d)->stride(1);
    descale_strides_set = true;
  }
  p.num_sms = static_cast<int>(num_sms);
  // Split-KV partials (Note [split-KV]) or the FP8 forward's Vᵀ: sized from the sizes alone, so
  // a CUDA graph captures a fixed allocation.
  const size_t ws_bytes = fa4::fwd_workspace_size(p);
  Tensor workspace;
  if (ws_bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(ws_bytes)}, q.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = ws_bytes;
  }
  fa4::RunOptions options;
  options.tile_order = tile_order ? tile_order->c_str() : nullptr;
  Tensor fresh_counter;  // Note [stream tile counter]
  p.tile_counter = tile_counter_for(q, tile_schedule, fresh_counter);
  check_ok(fa4::run_fwd(p, c10::cuda::getCurrentCUDAStream(), options), "tile_order",
           "FA4_TILE_ORDER");
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> bwd_kernel(const Tensor& dout, const Tensor& q, const Tensor& k,
                                              const Tensor& v, const Tensor& out, const Tensor& lse,
                                              const OptTensor& dlse, const OptTensor& cu_q,
                                              const OptTensor& cu_k, const OptTensor& seqused_k,
                                              int64_t max_q, int64_t max_k, bool causal,
                                              double scale, int64_t wl, int64_t wr, double softcap,
                                              bool det, int64_t num_sms, int64_t tile_schedule,
                                              const std::optional<std::string>& bwd_tile_order) {
  check_knobs(num_sms, tile_schedule);
  c10::cuda::CUDAGuard guard(q.device());
  const bool varlen = cu_q.has_value();
  Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  fa4::BwdParams p;
  p.fwd = fwd_params(q, k, v, out, lse, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, wl, wr,
                     softcap, det);
  p.dout = dout.data_ptr();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  auto [db, dr, dh] = strides_of(dout, varlen);
  auto [qb, qr, qh] = strides_of(dq, varlen);
  auto [kb, kr, kh] = strides_of(dk, varlen);
  auto [vb, vr, vh] = strides_of(dv, varlen);
  p.dout_batch_stride = db, p.dout_row_stride = dr, p.dout_head_stride = dh;
  p.dq_batch_stride = qb, p.dq_row_stride = qr, p.dq_head_stride = qh;
  p.dk_batch_stride = kb, p.dk_row_stride = kr, p.dk_head_stride = kh;
  p.dv_batch_stride = vb, p.dv_row_stride = vr, p.dv_head_stride = vh;
  p.dlse = opt_ptr<float>(dlse);
  p.fwd.num_sms = static_cast<int>(num_sms);
  fa4::RunOptions options;
  options.bwd_tile_order = bwd_tile_order ? bwd_tile_order->c_str() : nullptr;
  // Note [persistent bwd]: the tile counter, as the forward's (Note [stream tile counter]).
  Tensor fresh_counter;
  p.fwd.tile_counter = tile_counter_for(q, tile_schedule, fresh_counter);
  const size_t bytes = fa4::bwd_workspace_size(p);
  Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  check_ok(fa4::run_bwd(p, workspace.data_ptr(), bytes, c10::cuda::getCurrentCUDAStream(), options),
           "bwd_tile_order", "FA4_BWD_TILE_ORDER");
  return {dq, dk, dv};
}

// The counter itself (an alias, created if this stream has none yet): tests read it back.
Tensor stream_tile_counter(const Tensor& like) {
  c10::cuda::CUDAGuard guard(like.device());
  return stream_counter(c10::cuda::getCurrentCUDAStream(), like);
}

}  // namespace

TORCH_LIBRARY(fa4, m) {
  m.def(
      "_fwd_kernel(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "Tensor? seqused_k, Tensor? seqused_q, Tensor? page_table, Tensor? cache_batch_idx, "
      "Tensor? leftpad_k, Tensor? learnable_sink, int max_seqlen_q, int max_seqlen_k, "
      "bool causal, float softmax_scale, int window_left, int window_right, float softcap, "
      "bool deterministic, int num_splits, int num_sms, int tile_schedule, str? tile_order, "
      "Tensor? k_descale=None, Tensor? v_descale=None, Tensor? q_descale=None) -> (Tensor, "
      "Tensor)");
  m.def(
      "_bwd_kernel(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? "
      "dlse, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, int max_seqlen_q, "
      "int max_seqlen_k, bool causal, float softmax_scale, int window_left, int window_right, "
      "float softcap, bool deterministic, int num_sms, int tile_schedule, str? bwd_tile_order) "
      "-> (Tensor, Tensor, Tensor)");
  // The current stream's tile counter on like's device (Note [stream tile counter]), for tests.
  m.def("_stream_tile_counter(Tensor like) -> Tensor");
}

TORCH_LIBRARY_IMPL(fa4, CUDA, m) {
  m.impl("_fwd_kernel", &fwd_kernel);
  m.impl("_bwd_kernel", &bwd_kernel);
  m.impl("_stream_tile_counter", &stream_tile_counter);
}

// `import fa4._C` loads this library, which registers the ops above; the module itself is empty.
PyMODINIT_FUNC PyInit__C() {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&def);
}
