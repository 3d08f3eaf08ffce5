// fa4: FlashAttention-4 forward and backward, plain C++ API.
//
// Installed as <fa4/fa4.h>. No torch and no exceptions cross this API: every entry point is
// noexcept and reports through fa4::Status, with a human-readable reason in fa4::last_error().
//
// Usage:
//   fa4::FwdParams p;            // fill pointers, strides, sizes, flags (see below)
//   if (fa4::run_fwd(p, stream) != fa4::Status::kOk) std::puts(fa4::last_error());
//   Optional per-call choices that are not the problem (tile orders): fa4::RunOptions (below),
//   passed as run_fwd(p, stream, options).
//
// Conventions shared by every tensor below:
// - Pointers are device pointers. Strides are in elements (not bytes), int64 because
//   batch * seqlen * heads * head_dim passes 2^31 for ordinary long-context problems.
// - The last (head_dim) dimension is contiguous by contract: there is no stride field for it.
// - q, k, v, out and the gradients share `dtype` (fp16 or bf16); lse is always fp32.
// - Every 16-bit tensor's base pointer must be 16-byte aligned, and each of its strides must be
//   a multiple of 8 elements (16 bytes) for every dimension whose extent is > 1: the kernels
//   move these tensors with TMA, whose global addresses and strides are 16-byte granular.
//   Strides of extent-1 dimensions are never multiplied by a nonzero index, so only >= 0 is
//   required of them.
// - Outputs must not overlap each other or the inputs. This is not checked.
//
// Dense layout (cu_seqlens_q == cu_seqlens_k == nullptr):
//   q   (batch, seqlen_q, heads_q,  head_dim):   q[b][i][h][x]   at q + b*q_batch_stride
//                                                 + i*q_row_stride + h*q_head_stride + x
//   k   (batch, seqlen_k, heads_kv, head_dim)     (same scheme with the k_* strides)
//   v   (batch, seqlen_k, heads_kv, head_dim_v)   (v_* strides)
//   out (batch, seqlen_q, heads_q,  head_dim_v)   (out_* strides)
//   lse (batch, heads_q, seqlen_q) fp32:          lse[b][h][i] at lse + b*lse_batch_stride
//                                                 + h*lse_head_stride + i   (rows contiguous)
//
// Varlen layout (cu_seqlens_q and cu_seqlens_k both set; the sequences are packed):
//   batch       number of sequences.
//   cu_seqlens_q, cu_seqlens_k  int32 device arrays of batch + 1 prefix offsets, starting at 0
//               and non-decreasing; sequence b owns query rows [cu_seqlens_q[b],
//               cu_seqlens_q[b+1]) and key rows [cu_seqlens_k[b], cu_seqlens_k[b+1]).
//               Never read on the host, so validate() cannot check them: the caller must (the
//               Python layer does).
//   seqused_k   optional int32 device array of batch entries: sequence b attends only to its
//               first seqused_k[b] keys (<= its cu_seqlens_k length); the rest are ignored, as
//               if that sequence had seqlen_k = seqused_k[b] (this also moves the causal
//               diagonal, see below). Only allowed with varlen.
//   total_q, total_k   host copies of cu_seqlens_q[batch] and cu_seqlens_k[batch] (the number
//               of packed rows). They size the backward workspace and say whether there is
//               anything to compute; the kernels themselves read the device arrays.
//   seqlen_q, seqlen_k  the maximum query / key count of any one sequence (as used, i.e. after
//               seqused_k). total_q <= batch * seqlen_q is checked.
//   q   (total_q, heads_q, head_dim):   row t at q + t*q_row_stride + h*q_head_stride + x;
//       likewise k, v, out with total_k / total_q rows. The *_batch_stride fields are ignored.
//   lse (heads_q, total_q) fp32:        lse[h][t] at lse + h*lse_head_stride + t, for the
//       packed row t = cu_seqlens_q[b] + i. lse_batch_stride is ignored.
//
// Inference layouts (the decode kernel; forward only: run_bwd rejects them):
//   Paged K/V (page_table set): k (num_pages, page_size, heads_kv, head_dim) with k_batch_stride
//               the stride between pages (likewise v); key j of sequence b is row j % page_size of
//               page page_table[r * page_table_batch_stride + j / page_size], r = b, or
//               kv_batch_idx[b] when set (FA3's rule: a table row per cache entry). Dense q needs
//               seqused_k (the key count per sequence, <= max_pages * page_size); varlen q needs
//               seqused_k and cu_seqlens_k = null. Page entries are not checked on the device:
//               the caller keeps them in [0, num_pages).
//   seqused_k with dense q: the key counts of a KV cache (k is (b_k, seqlen_k, heads_kv, d)).
//   kv_batch_idx (dense q): sequence b reads k/v batch entry (paged: page table row)
//               kv_batch_idx[b] instead of b.
//   leftpad_k: sequence b's keys are rows [leftpad_k[b], seqused_k[b]) (or to seqlen_k), so it
//               has seqused_k[b] - leftpad_k[b] keys, and the mask aligns on that count.
//   seqused_q (varlen): rows past seqused_q[b] are not computed: out = 0 and lse = -inf; the mask
//               aligns on seqused_q[b] rows.
//   learnable_sink: lse = log(sum_j exp(s_j) + exp(sink[h])) and out = sum_j exp(s_j - lse) v_j;
//               a row that sees no key gets out = 0 and lse = sink[h].
//   kv_fp8:     k and v hold float8_e4m3fn elements (q, out stay fp16 / bf16); the true value
//               of key element x of sequence b, kv head h is x * k_descale[b *
//               descale_batch_stride + h * descale_head_stride] (1 when k_descale is null;
//               likewise v with v_descale; positive and finite, as for the FP8 forward below).
//               head_dim, head_dim_v and the k / v row, head, batch strides are multiples of
//               16 elements. The decode kernel computes it in fp16: q values beyond +-65504
//               saturate there.
//
// FP8 forward (dtype = DType::kE4M3; SM90): q, k and v hold float8_e4m3fn elements and out is
// bf16; the true value of an element of sequence b, kv head h is x * descale[b *
// descale_batch_stride + h * descale_head_stride] with q_descale, k_descale, v_descale (each 1
// when null; a q head uses its kv head's entry). Descales must be positive and finite (their
// values are not read on the host: a negative q or k descale flips the softmax's max, which the
// kernels track on the scaled scores). Dense or varlen q, k, v only (no kv_fp8 flag, no
// paged or serving layouts, no sink); head dims multiples of 16; forward only. The kernel reads V
// transposed: run_fwd writes Vᵀ into `workspace` (fwd_workspace_size(p) bytes) first
// (sm90/fwd/fp8_vt.cuh, Note [fp8 P layout]).
//
// Masking (causal, window), bottom-right aligned as in flash-attn: with offset = seqlen_k -
// seqlen_q of the sequence (per sequence for varlen, after seqused_k), query row i sees key j iff
//   (window_left  == -1 || j >= i + offset - window_left) &&
//   (window_right == -1 || j <= i + offset + window_right).
// -1 is the one unbounded value: other negative entries shift that edge past the diagonal
// (flash-attn-4's shifted windows), and a band with window_left + window_right < 0 sees no key.
// causal = true sets window_right = 0 whatever it holds (flash-attn's rule); window_left with
// causal gives causal sliding-window attention.
//
// Scores: s = softmax_scale * (q . k); with softcap > 0, s = softcap * tanh(s / softcap).
// lse = log(sum_j exp(s_j)) over the visible keys (natural log, fp32).
//
// Empty work: seqlen_q == 0 / seqlen_k == 0 (varlen: total_q == 0 / total_k == 0) are valid.
// - Pointers to tensors with no element may be null (torch hands out null for empty tensors).
// - A query row that sees no key (seqlen_k == 0, a zero-length key sequence, or a mask that
//   hides every key) is defined as out = 0 and lse = -inf (the log of an empty sum).
// - run_fwd with no query rows writes nothing and returns kOk without touching the device;
//   run_bwd likewise when there are neither query nor key rows. (With key rows but no query
//   rows the backward still has dk = dv = 0 to write, so it needs a kernel.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

namespace fa4 {

enum class Status {
  kOk,           // the work was done (or there was none)
  kUnsupported,  // valid request, but this build / this GPU has no kernel for it
  kInvalid,      // the parameters break a rule documented here; nothing was launched
  kCudaError,    // a CUDA runtime call failed; last_error() has the CUDA message
};

// "ok", "unsupported", "invalid", "cuda_error" ("unknown" for anything else).
const char* status_name(Status s) noexcept;

// Describes the most recent non-kOk result on the calling thread: which field, which rule,
// e.g. "head_dim=80 not supported: 64, 96, 128, 192, 256, or (192, d_v=128)". Successful calls
// leave it unchanged (like errno), so read it right after the failing call. Empty string
// before any failure. The buffer is per thread and lives as long as the thread; the next failing
// call on the same thread overwrites it.
const char* last_error() noexcept;

// The library version, e.g. "0.1.0" (fa4/VERSION when it was built).
const char* version() noexcept;

enum class DType { kFloat16, kBFloat16, kE4M3 };  // kE4M3: the FP8 forward (see above)

struct FwdParams {
  // Tensors: see the layout notes at the top of this file.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // optional: null when the caller does not want the LSE

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  int batch = 0;       // >= 1 (varlen: number of sequences)
  int seqlen_q = 0;    // >= 0 (varlen: max over sequences)
  int seqlen_k = 0;    // >= 0 (varlen: max over sequences)
  int heads_q = 0;     // >= 1, a multiple of heads_kv (GQA / MQA)
  int heads_kv = 0;    // >= 1
  int head_dim = 0;    // 64, 96, 128, 192 or 256
  int head_dim_v = 0;  // == head_dim, except head_dim = 192 with head_dim_v = 128

  // Varlen (all null for dense): see the layout notes at the top of this file.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_k = nullptr;
  int total_q = 0;  // varlen only: == cu_seqlens_q[batch]
  int total_k = 0;  // varlen only: == cu_seqlens_k[batch]

  float softmax_scale = 0.0f;  // finite and > 0; usually 1 / sqrt(head_dim). No default on
                               // purpose: 0 is rejected so a forgotten field cannot pass.
  float softcap = 0.0f;        // >= 0 and finite; 0 = off
  int window_left = -1;        // -1 = unbounded; other values literal (see Masking above)
  int window_right = -1;       // -1 = unbounded; other values literal; causal makes it 0
  bool causal = false;         // bottom-right aligned when seqlen_q != seqlen_k
  DType dtype = DType::kBFloat16;
  bool deterministic = false;  // backward: reproducible dq accumulation order (slower)
  int num_sms = 0;             // >= 0; SMs the persistent kernels may use, 0 = the device's count
  // Optional: two int64 of device memory (8-byte aligned), zero when the run starts, that the
  // forward uses to hand out tiles to its persistent CTAs at run time, which balances causal and
  // local masks (whose tiles differ in cost); null = a static assignment. Every run leaves both
  // at zero again (its last CTA resets them), so one allocation, zeroed once (cudaMemset), serves
  // every run on one stream; runs that may overlap (other streams, graph replays) need one each.
  // Both forward kernels use it (SM100: compiled, not executed), and so does the SM90 backward.
  int64_t* tile_counter = nullptr;

  // Inference (serving): see "Inference layouts" at the top of this file. All optional; any of
  // them but the sink (which the SM90 forward has) sends the forward to the split-KV decode
  // kernel (csrc/decode).
  const int* seqused_q = nullptr;         // int32 (batch,): sequence b uses its first seqused_q[b]
                                          // query rows (varlen only)
  const int* page_table = nullptr;        // int32 (batch, max_pages): paged K/V
  int64_t page_table_batch_stride = 0;    // elements between two sequences' page lists
  int page_size = 0;                      // >= 1 with page_table: keys per page
  int num_pages = 0;                      // >= 1 with page_table: pages in the k/v pools
  const int* kv_batch_idx = nullptr;      // int32 (batch,): k/v batch entry (or page table row)
                                          // of sequence b
  const int* leftpad_k = nullptr;         // int32 (batch,): sequence b's keys start at this row
  const float* learnable_sink = nullptr;  // fp32 (heads_q,): a logit per head in every row's
                                          // softmax denominator (no value)
  bool kv_fp8 = false;                    // k, v are float8_e4m3fn (see Inference layouts)
  const float* k_descale = nullptr;       // fp32 (batch, heads_kv), optional with kv_fp8 or
                                          // kE4M3
  const float* v_descale = nullptr;       // likewise for v
  const float* q_descale = nullptr;       // likewise for q, with kE4M3
  int64_t descale_batch_stride = 0, descale_head_stride = 0;
  int num_splits = 0;  // >= 0: key splits of the decode kernel; 0 = heuristic, 1 = none
  // Device memory for the split-KV partial results: at least fwd_workspace_size(p) bytes,
  // 16-byte aligned, untouched by others until the stream has run this call. Null when that
  // size is 0.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct BwdParams {
  // The same problem as the forward. fwd.out and fwd.lse, as run_fwd wrote them, are inputs
  // here: both must be set whenever there are query rows (lse is not optional in the backward).
  FwdParams fwd;

  const void* dout = nullptr;  // like out (head_dim_v)
  void* dq = nullptr;          // like q
  void* dk = nullptr;          // like k
  void* dv = nullptr;          // like v (head_dim_v)
  int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // Optional gradient flowing into the forward's LSE (when the caller used the LSE), fp32,
  // with exactly fwd.lse's layout and strides. Null = zero.
  const float* dlse = nullptr;
};

// Plain data: kernels take them by value as __global__ arguments, and bindings may memcpy them.
static_assert(std::is_trivially_copyable_v<FwdParams> && std::is_standard_layout_v<FwdParams>);
static_assert(std::is_trivially_copyable_v<BwdParams> && std::is_standard_layout_v<BwdParams>);
// The kernels' parameter structs hold FwdParams / BwdParams by value followed by their own
// members, so a member added here moves the constant-bank offset of every later kernel parameter
// and changes the machine code of every kernel. Per-call choices that no kernel reads go in
// RunOptions instead. With 8-byte pointers (every CUDA host): 384 and 520 bytes.
static_assert(sizeof(void*) != 8 || (sizeof(FwdParams) == 384 && sizeof(BwdParams) == 520),
              "FwdParams / BwdParams changed size: every kernel's SASS moves (see above)");

// Per-call options that do not describe the problem (kernels never see this struct).
struct RunOptions {
  // The order in which the forward's persistent CTAs walk the tiles of a causal or local mask,
  // as comma-separated tokens: "first" (the partial L2 section first), "wave" (sections of one
  // wave of CTAs), a positive number (at most that many (batch, head) pairs a section), "plain"
  // (none of these); "" = the built-in default ("first,wave,16"). Null = the process default:
  // the environment variable FA4_TILE_ORDER (same text), read once, at the process's first
  // run_fwd, so later changes to it are not seen; unset, the built-in default. Unknown text here
  // or in the variable is kInvalid from run_fwd. It changes which CTA computes a tile, never a
  // result bit (Note [tile order options] in common/tile_scheduler.cuh). run_bwd ignores it.
  const char* tile_order = nullptr;
  // The SM90 and SM100 backwards' walk over (batch, kv head) pairs, like tile_order: "wave", "l2"
  // (sections whose Q / dO / dQ rows fit half the L2), a positive number, "first", "plain" (one
  // pair after another); "" = the built-in default ("first,wave" for causal problems outside
  // deterministic mode, else "plain"). Null = the process default: the environment
  // variable FA4_BWD_TILE_ORDER, read once, at the process's first run_bwd. Unknown text is
  // kInvalid from run_bwd (Note [bwd tile order options]). run_fwd ignores it.
  const char* bwd_tile_order = nullptr;
};

// Checks every rule that can be checked without reading device memory (pointers, sizes, head
// dims, GQA ratio, window / causal / softcap / scale, strides, alignment). kOk or kInvalid; on
// kInvalid, last_error() names the field and the rule. run_fwd / run_bwd call these first, after
// checking RunOptions' text. They read no environment variable.
Status validate(const FwdParams& p) noexcept;
Status validate(const BwdParams& p) noexcept;

// Bytes of device workspace run_fwd needs for this problem (FwdParams::workspace): the split-KV
// partial outputs and LSEs of the decode kernel, 0 when the problem takes no split. Depends on
// the size fields, num_splits and the current device's SM count (the split heuristic), so it may
// be called before the tensors exist. 0 with last_error() set when a size field is invalid.
size_t fwd_workspace_size(const FwdParams& p) noexcept;

// Runs the forward on `stream` (asynchronously, like a kernel launch), on the calling thread's
// current device (cudaSetDevice), which must be the device of `stream` and of every pointer.
// Unknown text in options.tile_order is kInvalid, with last_error() "tile_order=<text>: <rule>",
// before anything else is looked at. The two-argument form is options = RunOptions{}.
Status run_fwd(const FwdParams& p, cudaStream_t stream, const RunOptions& options) noexcept;
Status run_fwd(const FwdParams& p, cudaStream_t stream) noexcept;

// Bytes of device workspace run_bwd needs for this problem. Depends only on the size fields
// (batch, seqlen_q, total_q, heads_q, head_dim, varlen or not; with GQA also seqlen_k, total_k,
// heads_kv and head_dim_v: the dK / dV accumulators) and on deterministic (its turn counters,
// and no dK / dV accumulators), so it may be called before the tensors exist. Returns 0 when there
// are no query rows, and 0 with last_error() set when a size field is invalid.
size_t bwd_workspace_size(const BwdParams& p) noexcept;

// Runs the backward on `stream`, on the current device like run_fwd. `workspace` must hold at least
// bwd_workspace_size(p) bytes, 16-byte aligned (cudaMalloc's 256 is plenty); its contents on entry
// do not matter, and it must stay untouched by others until the stream has finished this call's
// work. Unknown text in options.bwd_tile_order is kInvalid ("bwd_tile_order=<text>: <rule>"),
// checked first as in run_fwd. The four-argument form is options = RunOptions{}.
Status run_bwd(const BwdParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream,
               const RunOptions& options) noexcept;
Status run_bwd(const BwdParams& p, void* workspace, size_t workspace_bytes,
               cudaStream_t stream) noexcept;

}  // namespace fa4
