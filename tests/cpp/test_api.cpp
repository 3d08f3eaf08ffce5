// Tests of the fa4 C++ API as installed (<fa4/fa4.h>, fa4::fa4): validation rules, status codes,
// last_error() messages, the empty-problem rules and bwd_workspace_size's formula.
// No framework: CHECK counts failures and the exit code is their number.
//
// The pointers below are placeholder addresses that are never dereferenced: validation only looks
// at their values, and this build has no kernel, so run_fwd / run_bwd stop at kUnsupported
// before any device access. When kernels land, the kUnsupported checks become "kOk on a GPU
// with real buffers" and move to a GPU test.
#include <fa4/fa4.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#ifndef FA4_EXPECTED_VERSION
#error "tests/cpp/CMakeLists.txt passes the installed package's version as FA4_EXPECTED_VERSION"
#endif

namespace {

int g_checks = 0;
int g_failures = 0;

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    ++g_checks;                                                                                 \
    if (!(cond)) {                                                                              \
      ++g_failures;                                                                             \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed; last_error: \"%s\"\n", __FILE__, __LINE__, \
                   #cond, fa4::last_error());                                                   \
    }                                                                                           \
  } while (0)

bool error_has(const char* text) {
  return std::strstr(fa4::last_error(), text) != nullptr;
}
// bindings.cpp's check_ok renames a leading "tile_order=" / "bwd_tile_order=" after the variable.
bool error_starts(const char* text) {
  return std::strncmp(fa4::last_error(), text, std::strlen(text)) == 0;
}

// Distinct, 16-byte aligned, never dereferenced (see the top of the file).
template <class T>
T* fake(int slot) {
  return reinterpret_cast<T*>(uintptr_t{0x100000000} + uintptr_t(slot) * 0x10000000);
}

// A contiguous dense problem: (b, s, h, d) tensors, (b, h, s_q) LSE.
fa4::FwdParams dense(int b, int sq, int sk, int hq, int hkv, int d, int dv) {
  fa4::FwdParams p;
  p.q = fake<const void>(1);
  p.k = fake<const void>(2);
  p.v = fake<const void>(3);
  p.out = fake<void>(4);
  p.lse = fake<float>(5);
  p.q_batch_stride = int64_t{sq} * hq * d;
  p.q_row_stride = int64_t{hq} * d;
  p.q_head_stride = d;
  p.k_batch_stride = int64_t{sk} * hkv * d;
  p.k_row_stride = int64_t{hkv} * d;
  p.k_head_stride = d;
  p.v_batch_stride = int64_t{sk} * hkv * dv;
  p.v_row_stride = int64_t{hkv} * dv;
  p.v_head_stride = dv;
  p.out_batch_stride = int64_t{sq} * hq * dv;
  p.out_row_stride = int64_t{hq} * dv;
  p.out_head_stride = dv;
  p.lse_batch_stride = int64_t{hq} * sq;
  p.lse_head_stride = sq;
  p.batch = b;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = d;
  p.head_dim_v = dv;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.dtype = fa4::DType::kBFloat16;
  return p;
}

// One sequence of 64 queries and keys, 2 q heads on 1 kv head of head dim d, whose rows sit
// `pitch` elements apart (so that the strides stay 16-byte aligned for any d).
fa4::FwdParams dense_pitch(int d, int pitch) {
  fa4::FwdParams p = dense(1, 64, 64, 2, 1, d, d);
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.out_head_stride = pitch;
  p.q_row_stride = p.out_row_stride = 2 * pitch;
  p.k_row_stride = p.v_row_stride = pitch;
  p.q_batch_stride = p.out_batch_stride = 64 * 2 * pitch;
  p.k_batch_stride = p.v_batch_stride = 64 * pitch;
  return p;
}

fa4::FwdParams base() {
  return dense(2, 200, 300, 8, 2, 128, 128);
}
fa4::FwdParams causal() {
  fa4::FwdParams p = base();
  p.causal = true;
  return p;
}
// batch 1, one query row, one KV head: extent-1 dimensions.
fa4::FwdParams one_query() {
  return dense(1, 1, 64, 2, 1, 128, 128);
}

// Packed varlen: 3 sequences, 300 query rows, 500 key rows, (heads, total_q) LSE.
fa4::FwdParams varlen() {
  fa4::FwdParams p = dense(3, 150, 250, 8, 2, 128, 128);
  p.cu_seqlens_q = fake<const int>(6);
  p.cu_seqlens_k = fake<const int>(7);
  p.total_q = 300;
  p.total_k = 500;
  // Batch strides are ignored for varlen: even nonsense must pass.
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.out_batch_stride = -3;
  p.lse_batch_stride = -3;
  p.lse_head_stride = p.total_q;
  return p;
}

fa4::BwdParams bwd_of(const fa4::FwdParams& f) {
  fa4::BwdParams p;
  p.fwd = f;
  p.dout = fake<const void>(8);
  p.dq = fake<void>(9);
  p.dk = fake<void>(10);
  p.dv = fake<void>(11);
  p.dout_batch_stride = f.out_batch_stride;
  p.dout_row_stride = f.out_row_stride;
  p.dout_head_stride = f.out_head_stride;
  p.dq_batch_stride = f.q_batch_stride;
  p.dq_row_stride = f.q_row_stride;
  p.dq_head_stride = f.q_head_stride;
  p.dk_batch_stride = f.k_batch_stride;
  p.dk_row_stride = f.k_row_stride;
  p.dk_head_stride = f.k_head_stride;
  p.dv_batch_stride = f.v_batch_stride;
  p.dv_row_stride = f.v_row_stride;
  p.dv_head_stride = f.v_head_stride;
  return p;
}

using Mutate = void (*)(fa4::FwdParams&);

struct FwdCase {
  const char* expect;  // invalid cases: must appear in last_error() (field and value);
                       // valid cases: a name for the failure report
  fa4::FwdParams (*start)();
  Mutate mutate;
};

using P = fa4::FwdParams;

// One broken rule each, applied to a valid problem so only the named rule can fire.
const FwdCase kInvalidFwd[] = {
    {"q is null", base, [](P& p) { p.q = nullptr; }},
    {"k is null", base, [](P& p) { p.k = nullptr; }},
    {"v is null", base, [](P& p) { p.v = nullptr; }},
    {"out is null", base, [](P& p) { p.out = nullptr; }},
    {"batch=0", base, [](P& p) { p.batch = 0; }},
    {"seqlen_q=-1", base, [](P& p) { p.seqlen_q = -1; }},
    {"seqlen_k=-1", base, [](P& p) { p.seqlen_k = -1; }},
    {"heads_q=0", base, [](P& p) { p.heads_q = 0; }},
    {"heads_kv=0", base, [](P& p) { p.heads_kv = 0; }},
    {"heads_q=8 not a multiple of heads_kv=3", base, [](P& p) { p.heads_kv = 3; }},
    {"head_dim=84 not supported: a multiple of 8 from 8 to 256", base,
     [](P& p) { p = dense(2, 200, 300, 8, 2, 84, 84); }},
    {"head_dim=4", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 4, 4); }},
    {"head_dim=512", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 512, 512); }},
    {"head_dim=264", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 264, 128); }},
    {"head_dim_v=60", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 128, 60); }},
    {"head_dim_v=0", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 192, 0); }},
    {"dtype=7", base, [](P& p) { p.dtype = static_cast<fa4::DType>(7); }},
    {"softmax_scale=0", base, [](P& p) { p.softmax_scale = 0.0f; }},
    {"softmax_scale=-1", base, [](P& p) { p.softmax_scale = -1.0f; }},
    {"softmax_scale=nan", base, [](P& p) { p.softmax_scale = std::nanf(""); }},
    {"softmax_scale=inf", base, [](P& p) { p.softmax_scale = HUGE_VALF; }},
    {"softcap=-1", base, [](P& p) { p.softcap = -1.0f; }},
    {"softcap=inf", base, [](P& p) { p.softcap = HUGE_VALF; }},
    {"softcap=nan", base, [](P& p) { p.softcap = std::nanf(""); }},
    {"num_sms=-1", base, [](P& p) { p.num_sms = -1; }},
    {"tile_counter=0x", base,
     [](P& p) { p.tile_counter = reinterpret_cast<int64_t*>(fake<char>(8) + 4); }},
    {"q=0x", base, [](P& p) { p.q = fake<const char>(1) + 8; }},
    {"out=0x", base, [](P& p) { p.out = fake<char>(4) + 2; }},
    {"q_batch_stride=-8", base, [](P& p) { p.q_batch_stride = -8; }},
    {"q_row_stride=1028 not a multiple of 8", base, [](P& p) { p.q_row_stride = 1028; }},
    {"q_head_stride=-128", base, [](P& p) { p.q_head_stride = -128; }},
    {"k_row_stride=4", base, [](P& p) { p.k_row_stride = 4; }},
    {"k_head_stride=-1", base, [](P& p) { p.k_head_stride = -1; }},
    {"v_batch_stride=12", base, [](P& p) { p.v_batch_stride = 12; }},
    {"out_head_stride=130", base, [](P& p) { p.out_head_stride = 130; }},
    {"lse_batch_stride=-1", base, [](P& p) { p.lse_batch_stride = -1; }},
    {"lse_head_stride=-1", base, [](P& p) { p.lse_head_stride = -1; }},
    {"cu_seqlens_k is null", varlen, [](P& p) { p.cu_seqlens_k = nullptr; }},
    {"cu_seqlens_q is null", varlen, [](P& p) { p.cu_seqlens_q = nullptr; }},
    {"seqused_q is set without cu_seqlens_q", base, [](P& p) { p.seqused_q = fake<int>(12); }},
    {"page_size=0 must be >= 1", base,
     [](P& p) {
       p.page_table = fake<int>(12);
       p.seqused_k = fake<int>(12);
       p.num_pages = 4;
     }},
    {"seqused_k is null: required with page_table", base,
     [](P& p) {
       p.page_table = fake<int>(12);
       p.page_size = 16;
       p.num_pages = 4;
     }},
    {"cu_seqlens_k is set with page_table", varlen,
     [](P& p) {
       p.page_table = fake<int>(12);
       p.page_size = 16;
       p.num_pages = 4;
       p.seqused_k = fake<int>(12);
     }},
    {"kv_batch_idx is set with varlen", varlen, [](P& p) { p.kv_batch_idx = fake<int>(12); }},
    {"leftpad_k is set with cu_seqlens_k", varlen, [](P& p) { p.leftpad_k = fake<int>(12); }},
    {"num_splits=-1", base, [](P& p) { p.num_splits = -1; }},
    {"total_q=-1", varlen, [](P& p) { p.total_q = -1; }},
    {"total_k=-1", varlen, [](P& p) { p.total_k = -1; }},
    {"total_q=451 exceeds", varlen, [](P& p) { p.total_q = 451; }},
    {"total_k=751 exceeds", varlen, [](P& p) { p.total_k = 751; }},
    {"q_row_stride=12", varlen, [](P& p) { p.q_row_stride = 12; }},
    // FP8 (api/fa4.h): the e4m3 forward (dtype kE4M3), the e4m3 KV cache (kv_fp8), descales.
    {"dtype=kE4M3: the FP8 forward takes dense or varlen q, k, v", base,
     [](P& p) {
       p.dtype = fa4::DType::kE4M3;
       p.kv_fp8 = true;
     }},
    {"dtype=kE4M3: the FP8 forward takes dense or varlen q, k, v", base,
     [](P& p) {
       p.dtype = fa4::DType::kE4M3;
       p.learnable_sink = fake<float>(12);
     }},
    {"head_dim=72 / head_dim_v=72: the FP8 forward needs multiples of 16", base,
     [](P& p) {
       p = dense_pitch(72, 80);
       p.dtype = fa4::DType::kE4M3;
     }},
    {"head_dim=72 / head_dim_v=72: kv_fp8 needs multiples of 16", base,
     [](P& p) {
       p = dense_pitch(72, 80);
       p.kv_fp8 = true;
     }},
    {"q_descale is set without dtype kE4M3", base, [](P& p) { p.q_descale = fake<float>(14); }},
    {"q_descale is set without dtype kE4M3", base,
     [](P& p) {
       p.kv_fp8 = true;
       p.q_descale = fake<float>(14);
     }},
    {"k_descale / v_descale are set without kv_fp8 or kE4M3", base,
     [](P& p) { p.v_descale = fake<float>(14); }},
    {"descale_batch_stride=-1", base,
     [](P& p) {
       p.kv_fp8 = true;
       p.descale_batch_stride = -1;
     }},
};

// Valid corners that a too-strict validator would reject.
const FwdCase kValidFwd[] = {
    {"base", base, [](P&) {}},
    {"varlen", varlen, [](P&) {}},
    {"varlen + seqused_k, more packed keys than batch * seqlen_k", varlen,
     [](P& p) {
       p.seqused_k = fake<int>(12);
       p.total_k = 9000;
     }},
    {"d=64", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 64, 64); }},
    {"d=96", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 96, 96); }},
    {"d=192", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 192, 192); }},
    {"d=256", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 256, 256); }},
    // Note [padded head dims]: any multiple of 8 up to 256, d and d_v independently.
    {"d=80", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 80, 80); }},
    {"d=8", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 8, 8); }},
    {"d=128 d_v=64", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 128, 64); }},
    {"d=40 d_v=256", base, [](P& p) { p = dense(1, 64, 64, 1, 1, 40, 256); }},
    {"MQA, d=192 d_v=128", base, [](P& p) { p = dense(1, 64, 64, 6, 1, 192, 128); }},
    {"no LSE: its strides are unused", base,
     [](P& p) {
       p.lse = nullptr;
       p.lse_head_stride = -1;
     }},
    {"causal, window_right=-1", causal, [](P&) {}},
    {"causal sliding window", causal,
     [](P& p) {
       p.window_right = 0;
       p.window_left = 64;
     }},
    {"window (0, 0)", base, [](P& p) { p.window_left = p.window_right = 0; }},
    {"shifted window (-98, -1)", base, [](P& p) { p.window_left = -98; }},
    {"empty band (-5, 3)", base,
     [](P& p) {
       p.window_left = -5;
       p.window_right = 3;
     }},
    {"causal clips window_right=5", causal, [](P& p) { p.window_right = 5; }},
    {"softcap, deterministic, num_sms", base,
     [](P& p) {
       p.softcap = 30.0f;
       p.deterministic = true;
       p.num_sms = 7;
     }},
    {"tile_counter", base,
     [](P& p) { p.tile_counter = reinterpret_cast<int64_t*>(fake<char>(8)); }},
    {"fp16", base, [](P& p) { p.dtype = fa4::DType::kFloat16; }},
    // Strides of extent-1 dimensions are never used, so any value >= 0 goes.
    {"extent-1 strides", one_query, [](P& p) { p.q_row_stride = p.k_head_stride = 5; }},
    {"K/V broadcast over the batch", base, [](P& p) { p.k_batch_stride = p.v_batch_stride = 0; }},
    {"dense KV cache: seqused_k, kv_batch_idx, leftpad_k, sink, splits", base,
     [](P& p) {
       p.seqused_k = fake<int>(12);
       p.kv_batch_idx = fake<int>(12);
       p.leftpad_k = fake<int>(12);
       p.learnable_sink = fake<float>(12);
       p.num_splits = 8;
     }},
    {"paged K/V, dense q", base,
     [](P& p) {
       p.page_table = fake<int>(12);
       p.page_size = 16;
       p.num_pages = 8;
       p.seqused_k = fake<int>(12);
     }},
    {"FP8 forward with q, k, v descales", base,
     [](P& p) {
       p.dtype = fa4::DType::kE4M3;
       p.q_descale = p.k_descale = p.v_descale = fake<float>(14);
       p.descale_batch_stride = 2;
       p.descale_head_stride = 1;
     }},
    {"FP8 forward, varlen, no descales (1)", varlen, [](P& p) { p.dtype = fa4::DType::kE4M3; }},
    {"FP8 KV cache with descales, paged", base,
     [](P& p) {
       p.kv_fp8 = true;
       p.page_table = fake<int>(12);
       p.page_size = 64;
       p.num_pages = 16;
       p.seqused_k = fake<int>(12);
       p.k_descale = p.v_descale = fake<float>(14);
       p.descale_batch_stride = 2;
       p.descale_head_stride = 1;
     }},
    {"paged K/V, varlen q with seqused_q", varlen,
     [](P& p) {
       p.cu_seqlens_k = nullptr;
       p.page_table = fake<int>(12);
       p.page_size = 1;
       p.num_pages = 9000;
       p.k_batch_stride = p.k_row_stride;  // page stride
       p.v_batch_stride = p.v_row_stride;
       p.seqused_k = fake<int>(12);
       p.seqused_q = fake<int>(12);
     }},
};

void test_status_names() {
  CHECK(std::strcmp(fa4::status_name(fa4::Status::kOk), "ok") == 0);
  CHECK(std::strcmp(fa4::status_name(fa4::Status::kUnsupported), "unsupported") == 0);
  CHECK(std::strcmp(fa4::status_name(fa4::Status::kInvalid), "invalid") == 0);
  CHECK(std::strcmp(fa4::status_name(fa4::Status::kCudaError), "cuda_error") == 0);
  CHECK(std::strcmp(fa4::status_name(static_cast<fa4::Status>(42)), "unknown") == 0);
  CHECK(std::strcmp(fa4::version(), FA4_EXPECTED_VERSION) == 0);
}

void test_invalid_fwd() {
  for (const FwdCase& c : kInvalidFwd) {
    fa4::FwdParams p = c.start();
    c.mutate(p);
    CHECK(fa4::validate(p) == fa4::Status::kInvalid);
    if (!error_has(c.expect)) {
      std::fprintf(stderr, "  expected \"%s\" in last_error \"%s\"\n", c.expect, fa4::last_error());
      CHECK(error_has(c.expect));
    }
    // run_fwd validates first, with the same message.
    CHECK(fa4::run_fwd(p, nullptr) == fa4::Status::kInvalid);
    CHECK(error_has(c.expect));
  }
}

void test_valid_fwd() {
  for (const FwdCase& c : kValidFwd) {
    fa4::FwdParams p = c.start();
    c.mutate(p);
    const fa4::Status s = fa4::validate(p);
    CHECK(s == fa4::Status::kOk);
    if (s != fa4::Status::kOk)
      std::fprintf(stderr, "  %s rejected: %s\n", c.expect, fa4::last_error());
  }
}

void test_last_error_is_sticky() {
  CHECK(fa4::validate(dense(1, 64, 64, 1, 1, 84, 84)) == fa4::Status::kInvalid);
  CHECK(fa4::validate(base()) == fa4::Status::kOk);
  CHECK(error_has("head_dim=84"));  // a kOk call leaves the last failure's message in place
}

void test_no_kernel_built() {
  CHECK(fa4::run_fwd(base(), nullptr) == fa4::Status::kUnsupported);
  CHECK(error_has("no forward kernel is compiled into this build"));
  CHECK(error_has("SM90 forward: not built (FA4_CUDA_ARCHS without 90a)"));
  CHECK(error_has("SM100 forward: not built (FA4_CUDA_ARCHS without 100a)"));
  CHECK(error_has(FA4_EXPECTED_VERSION));
  CHECK(fa4::run_fwd(varlen(), nullptr) == fa4::Status::kUnsupported);

  const fa4::BwdParams b = bwd_of(base());
  const size_t ws = fa4::bwd_workspace_size(b);
  CHECK(ws > 0);
  CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr) == fa4::Status::kUnsupported);
  CHECK(error_has("no backward kernel is compiled into this build"));
}

// Note [tile order options] / [bwd tile order options]: RunOptions::tile_order and
// RunOptions::bwd_tile_order, which FwdParams / BwdParams do not hold (their layout is the
// kernels'). Text they do not know is kInvalid from run_fwd / run_bwd, naming the field, before
// the params are validated or a kernel is looked for; known text goes on to the kernel lookup.
// Each direction reads only its own field.
void test_tile_order_options() {
  const fa4::FwdParams p = base();
  fa4::RunOptions o;
  for (const char* order : {"first,wave,16", "", "plain", "3,first", "wave", "plain,l2"}) {
    o.tile_order = order;
    CHECK(fa4::run_fwd(p, nullptr, o) == fa4::Status::kUnsupported);
    CHECK(error_has("no forward kernel is compiled into this build"));
  }
  struct Bad {
    const char* text;
    const char* expect;  // the start of last_error()
  };
  const Bad bad[] = {
      {"first,bogus",
       "tile_order=first,bogus: its tokens are first, wave, l2, plain or a positive number, "
       "comma-separated"},
      {"wave,", "tile_order=wave,: its tokens are"},
      {"0", "tile_order=0: its tokens are"},
  };
  for (const Bad& c : bad) {
    o.tile_order = c.text;
    CHECK(fa4::run_fwd(p, nullptr, o) == fa4::Status::kInvalid);
    CHECK(error_starts(c.expect));
  }
  // Judged before the params: the message names the option, not the broken field.
  fa4::FwdParams broken = base();
  broken.head_dim = 84;
  o.tile_order = "bogus";
  CHECK(fa4::run_fwd(broken, nullptr, o) == fa4::Status::kInvalid);
  CHECK(error_starts("tile_order=bogus: "));
  // A problem with nothing to write still has its options judged.
  fa4::FwdParams none = dense(2, 0, 300, 8, 2, 128, 128);
  none.q = none.out = nullptr;
  CHECK(fa4::run_fwd(none, nullptr, o) == fa4::Status::kInvalid);
  o.tile_order = nullptr;
  CHECK(fa4::run_fwd(none, nullptr, o) == fa4::Status::kOk);
  // run_fwd reads tile_order alone.
  o.bwd_tile_order = "bogus";
  CHECK(fa4::run_fwd(p, nullptr, o) == fa4::Status::kUnsupported);

  const fa4::BwdParams b = bwd_of(base());
  const size_t ws = fa4::bwd_workspace_size(b);
  fa4::RunOptions ob;
  ob.bwd_tile_order = "l2,";
  CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr, ob) == fa4::Status::kInvalid);
  CHECK(error_starts("bwd_tile_order=l2,: its tokens are first, wave, l2, plain or a positive"));
  // Judged before the params and the workspace rules.
  ob.bwd_tile_order = "wave,bogus";
  fa4::BwdParams broken_b = b;
  broken_b.dq = nullptr;
  CHECK(fa4::run_bwd(broken_b, nullptr, 0, nullptr, ob) == fa4::Status::kInvalid);
  CHECK(error_starts("bwd_tile_order=wave,bogus: "));
  for (const char* order : {"l2,wave,first", "", "plain", "4"}) {
    ob.bwd_tile_order = order;
    CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr, ob) == fa4::Status::kUnsupported);
    CHECK(error_has("no backward kernel is compiled into this build"));
  }
  // run_bwd reads bwd_tile_order alone.
  ob.tile_order = "bogus";
  CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr, ob) == fa4::Status::kUnsupported);
}

// `test_api env-defaults`, run by tests/api/test_cpp_api.py in a process of its own with
// FA4_TILE_ORDER=first,bogus and FA4_BWD_TILE_ORDER=l2, in its environment: a null RunOptions
// tile order is the variable's, as the process's first run_fwd / run_bwd read it; validate()
// reads none.
void test_env_defaults() {
  const char* fwd_env = std::getenv("FA4_TILE_ORDER");
  const char* bwd_env = std::getenv("FA4_BWD_TILE_ORDER");
  CHECK(fwd_env != nullptr && std::strcmp(fwd_env, "first,bogus") == 0);
  CHECK(bwd_env != nullptr && std::strcmp(bwd_env, "l2,") == 0);
  const fa4::BwdParams b = bwd_of(base());
  const size_t ws = fa4::bwd_workspace_size(b);
  CHECK(fa4::validate(base()) == fa4::Status::kOk);
  CHECK(fa4::validate(b) == fa4::Status::kOk);
  CHECK(fa4::run_fwd(base(), nullptr) == fa4::Status::kInvalid);
  CHECK(error_has("FA4_TILE_ORDER=first,bogus: its tokens are"));
  CHECK(error_has("(or unset it)"));
  CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr) == fa4::Status::kInvalid);
  CHECK(error_has("FA4_BWD_TILE_ORDER=l2,: its tokens are"));
  // Default options are the two-argument calls' (null: the variables).
  CHECK(fa4::run_fwd(base(), nullptr, fa4::RunOptions{}) == fa4::Status::kInvalid);
  CHECK(error_has("FA4_TILE_ORDER=first,bogus"));
  CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr, fa4::RunOptions{}) == fa4::Status::kInvalid);
  CHECK(error_has("FA4_BWD_TILE_ORDER=l2,"));
  // An option, even empty, overrides the variable.
  fa4::RunOptions o;
  o.tile_order = "";
  CHECK(fa4::run_fwd(base(), nullptr, o) == fa4::Status::kUnsupported);
  o.bwd_tile_order = "wave";
  CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr, o) == fa4::Status::kUnsupported);
  // Read once: changing the variables later changes nothing.
  setenv("FA4_TILE_ORDER", "first", 1);
  unsetenv("FA4_BWD_TILE_ORDER");
  CHECK(fa4::run_fwd(base(), nullptr) == fa4::Status::kInvalid);
  CHECK(error_has("FA4_TILE_ORDER=first,bogus"));
  CHECK(fa4::run_bwd(b, fake<void>(13), ws, nullptr) == fa4::Status::kInvalid);
  CHECK(error_has("FA4_BWD_TILE_ORDER=l2,"));
}

void test_empty_problems() {
  // No query rows: nothing to write, kOk with no kernel and null q/out.
  fa4::FwdParams p = dense(2, 0, 300, 8, 2, 128, 128);
  p.q = nullptr;
  p.out = nullptr;
  p.lse = nullptr;
  CHECK(fa4::run_fwd(p, nullptr) == fa4::Status::kOk);
  // Query rows but no keys: out = 0 and lse = -inf must still be written, which takes a kernel.
  fa4::FwdParams nk = dense(2, 200, 0, 8, 2, 128, 128);
  nk.k = nk.v = nullptr;
  CHECK(fa4::validate(nk) == fa4::Status::kOk);
  CHECK(fa4::run_fwd(nk, nullptr) == fa4::Status::kUnsupported);
  // Varlen with total_q = 0 is the same no-op.
  fa4::FwdParams vq = varlen();
  vq.total_q = 0;
  vq.q = vq.out = nullptr;
  CHECK(fa4::run_fwd(vq, nullptr) == fa4::Status::kOk);

  // Backward: a no-op only when there are neither query nor key rows.
  fa4::FwdParams none = dense(1, 0, 0, 8, 2, 128, 128);
  none.q = none.k = none.v = none.out = nullptr;
  none.lse = nullptr;
  fa4::BwdParams b = bwd_of(none);
  b.dout = b.dq = b.dk = b.dv = nullptr;
  CHECK(fa4::bwd_workspace_size(b) == 0);
  CHECK(fa4::run_bwd(b, nullptr, 0, nullptr) == fa4::Status::kOk);
  // Keys but no queries: dk = dv = 0 still have to be written.
  fa4::FwdParams keys_only = dense(1, 0, 64, 8, 2, 128, 128);
  keys_only.q = keys_only.out = nullptr;
  keys_only.lse = nullptr;
  fa4::BwdParams bk = bwd_of(keys_only);
  bk.dout = bk.dq = nullptr;
  CHECK(fa4::bwd_workspace_size(bk) == 0);
  CHECK(fa4::run_bwd(bk, nullptr, 0, nullptr) == fa4::Status::kUnsupported);
}

void test_invalid_bwd() {
  struct BwdCase {
    const char* expect;
    void (*mutate)(fa4::BwdParams&);
  };
  const BwdCase cases[] = {
      {"fwd.lse is null", [](fa4::BwdParams& b) { b.fwd.lse = nullptr; }},
      {"fwd.out is null", [](fa4::BwdParams& b) { b.fwd.out = nullptr; }},
      {"fwd.head_dim=84", [](fa4::BwdParams& b) { b.fwd.head_dim = b.fwd.head_dim_v = 84; }},
      {"fwd.softmax_scale=0", [](fa4::BwdParams& b) { b.fwd.softmax_scale = 0.0f; }},
      {"dout is null", [](fa4::BwdParams& b) { b.dout = nullptr; }},
      {"dq is null", [](fa4::BwdParams& b) { b.dq = nullptr; }},
      {"dk is null", [](fa4::BwdParams& b) { b.dk = nullptr; }},
      {"dv is null", [](fa4::BwdParams& b) { b.dv = nullptr; }},
      {"dq=0x", [](fa4::BwdParams& b) { b.dq = fake<char>(9) + 4; }},
      {"dout_row_stride=-1", [](fa4::BwdParams& b) { b.dout_row_stride = -1; }},
      {"dq_row_stride=12", [](fa4::BwdParams& b) { b.dq_row_stride = 12; }},
      {"dk_head_stride=100", [](fa4::BwdParams& b) { b.dk_head_stride = 100; }},
      {"dv_batch_stride=-8", [](fa4::BwdParams& b) { b.dv_batch_stride = -8; }},
      {"are forward only", [](fa4::BwdParams& b) { b.fwd.learnable_sink = fake<float>(12); }},
      {"are forward only", [](fa4::BwdParams& b) { b.fwd.seqused_k = fake<int>(12); }},
  };
  for (const BwdCase& c : cases) {
    fa4::BwdParams b = bwd_of(base());
    c.mutate(b);
    CHECK(fa4::validate(b) == fa4::Status::kInvalid);
    if (!error_has(c.expect)) {
      std::fprintf(stderr, "  expected \"%s\" in last_error \"%s\"\n", c.expect, fa4::last_error());
      CHECK(error_has(c.expect));
    }
    CHECK(fa4::run_bwd(b, fake<void>(13), size_t{1} << 30, nullptr) == fa4::Status::kInvalid);
  }
  fa4::BwdParams ok = bwd_of(base());
  ok.dlse = fake<const float>(14);
  CHECK(fa4::validate(ok) == fa4::Status::kOk);
  CHECK(fa4::validate(bwd_of(varlen())) == fa4::Status::kOk);

  const size_t ws = fa4::bwd_workspace_size(ok);
  CHECK(fa4::run_bwd(ok, fake<void>(13), ws - 1, nullptr) == fa4::Status::kInvalid);
  CHECK(error_has("workspace_bytes="));
  CHECK(fa4::run_bwd(ok, nullptr, ws, nullptr) == fa4::Status::kInvalid);
  CHECK(error_has("workspace is null"));
  CHECK(fa4::run_bwd(ok, fake<char>(13) + 4, ws, nullptr) == fa4::Status::kInvalid);
  CHECK(error_has("workspace=0x"));
}

// Note [bwd workspace] in common/bwd_workspace.h: per query head, fp32 dq (rows x head_dim), lse2
// and dpsum (rows each), and with deterministic int32 turn counters (rows / 64); rows padded to
// 128. GQA outside deterministic mode adds fp32 dK and dV accumulators per kv head over the
// padded key rows, max(d, d_v) wide (Note [GQA head slices]).
void test_workspace_formula() {
  // Dense b=2, s_q=200 -> 2 * 256 = 512 rows; 8 heads, d=128:
  //   8 * 512 * (128 + 1 + 1) * 4 = 2,129,920 bytes; s_k=300 -> 2 * 384 = 768 key rows, 2 kv
  //   heads: dK and dV 2 * 2 * 768 * 128 * 4 = 1,572,864 more.
  CHECK(fa4::bwd_workspace_size(bwd_of(base())) == size_t{2129920 + 1572864});
  // Deterministic: no dK / dV accumulators, 8 * 512 / 64 * 4 bytes of turn counters.
  fa4::BwdParams det = bwd_of(base());
  det.fwd.deterministic = true;
  CHECK(fa4::bwd_workspace_size(det) == size_t{2130176});
  // Varlen, 3 sequences, total_q=300 -> round_up(300 + 3*128, 128) = 768 rows; 8 heads, d=128:
  //   8 * 768 * 130 * 4 = 3,194,880 bytes; total_k=500 -> round_up(500 + 384, 128) = 896 key
  //   rows: 2 * 2 * 896 * 128 * 4 = 1,835,008 more.
  CHECK(fa4::bwd_workspace_size(bwd_of(varlen())) == size_t{3194880 + 1835008});
  // d=192 / d_v=128: the accumulator follows head_dim (dQ's width), not head_dim_v.
  // 6 heads * 128 rows * (192 + 2) * 4 = 595,968 bytes; 6:1 GQA: 2 * 128 * 192 * 4 = 196,608.
  CHECK(fa4::bwd_workspace_size(bwd_of(dense(1, 64, 64, 6, 1, 192, 128))) ==
        size_t{595968 + 196608});
  // Exactly 128 rows: no padding. 1 * 128 * (64 + 2) * 4 = 33,792.
  CHECK(fa4::bwd_workspace_size(bwd_of(dense(1, 128, 7, 1, 1, 64, 64))) == size_t{33792});
  // Only sizes matter: it works before the tensors exist.
  fa4::BwdParams sizes_only;
  sizes_only.fwd.batch = 2;
  sizes_only.fwd.seqlen_q = 200;
  sizes_only.fwd.heads_q = sizes_only.fwd.heads_kv = 8;
  sizes_only.fwd.head_dim = sizes_only.fwd.head_dim_v = 128;
  CHECK(fa4::bwd_workspace_size(sizes_only) == size_t{2129920});
  // Invalid sizes: 0 and a message.
  fa4::BwdParams bad = bwd_of(base());
  bad.fwd.heads_q = 0;
  CHECK(fa4::bwd_workspace_size(bad) == 0);
  CHECK(error_has("fwd.heads_q=0"));
  // The FP8 forward's workspace holds Vᵀ (sm90/fwd/fp8_vt.cuh): at least d_v bytes per key row
  // and head (b=2, s_k=300, 2 kv heads, d_v=128: 153,600); none for a 16-bit forward without a
  // device (no decode plan applies to base()).
  fa4::FwdParams fp8 = base();
  fp8.dtype = fa4::DType::kE4M3;
  CHECK(fa4::fwd_workspace_size(fp8) >= size_t{153600});
  CHECK(fa4::fwd_workspace_size(base()) == 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "env-defaults") == 0) {
    test_env_defaults();
  } else {
    test_status_names();
    test_invalid_fwd();
    test_valid_fwd();
    test_last_error_is_sticky();
    test_no_kernel_built();
    test_tile_order_options();
    test_empty_problems();
    test_invalid_bwd();
    test_workspace_formula();
  }
  std::printf("fa4 %s C++ API test: %d checks, %d failed\n", fa4::version(), g_checks, g_failures);
  return g_failures;
}
