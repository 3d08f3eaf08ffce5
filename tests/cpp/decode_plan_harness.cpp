// Host harness of csrc/decode/plan.h (tests/api/test_decode_plan.py): reads problems from stdin,
// one per line, and prints the plan of each:
//   in:  batch seqlen_q seqlen_k heads_q heads_kv d d_v varlen total_q num_splits num_sms cc
//        flags   (flags: a string of letters, '-' for none: q seqused_q, p page_table,
//                 i kv_batch_idx, l leftpad_k, s learnable_sink, k seqused_k, c cu_seqlens_k,
//                 8 an e4m3 cache, x pages of 8 rows, y of 16 (else 64))
//   out: takes_decode warps_n block_m m_blocks n_blocks num_splits workspace_bytes ctas_per_sm
#include <cstdio>
#include <cstring>

#include "decode/plan.h"

namespace {

// The fields of fa4::FwdParams that plan.h reads (a stand-in: no CUDA headers on the host).
struct Params {
  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0,
      head_dim_v = 0, total_q = 0, num_splits = 0;
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_q = nullptr;
  const int* seqused_k = nullptr;
  const int* page_table = nullptr;
  const int* kv_batch_idx = nullptr;
  const int* leftpad_k = nullptr;
  const float* learnable_sink = nullptr;
  int page_size = 64;
  bool kv_fp8 = false;
};

}  // namespace

int main() {
  static const int kSome = 0;
  static const float kSomeF = 0.0f;
  Params p;
  int varlen = 0, num_sms = 0, cc = 0;
  char flags[16];
  while (std::scanf("%d %d %d %d %d %d %d %d %d %d %d %d %15s", &p.batch, &p.seqlen_q, &p.seqlen_k,
                    &p.heads_q, &p.heads_kv, &p.head_dim, &p.head_dim_v, &varlen, &p.total_q,
                    &p.num_splits, &num_sms, &cc, flags) == 13) {
    auto has = [&](char f) { return std::strchr(flags, f) != nullptr; };
    p.cu_seqlens_q = varlen ? &kSome : nullptr;
    p.cu_seqlens_k = has('c') ? &kSome : nullptr;
    p.seqused_q = has('q') ? &kSome : nullptr;
    p.page_table = has('p') ? &kSome : nullptr;
    p.kv_batch_idx = has('i') ? &kSome : nullptr;
    p.leftpad_k = has('l') ? &kSome : nullptr;
    p.learnable_sink = has('s') ? &kSomeF : nullptr;
    p.seqused_k = has('k') ? &kSome : nullptr;
    p.kv_fp8 = has('8');
    p.page_size = has('x') ? 8 : has('y') ? 16 : 64;
    const fa4::decode::Plan pl = fa4::decode::make_plan(p, num_sms);
    std::printf("%d %d %d %d %d %d %zu %d\n", fa4::decode::takes_decode(p, cc) ? 1 : 0, pl.warps_n,
                pl.block_m, pl.m_blocks, pl.n_blocks, pl.num_splits, pl.workspace_bytes(),
                fa4::decode::ctas_per_sm(p.head_dim, p.head_dim_v, pl.warps_n, p.kv_fp8 ? 1 : 2));
  }
  return 0;
}
