// Host harness of the TMA producer's decisions in csrc/decode/plan.h (Note [tma blocks];
// tests/api/test_decode_plan.py). Reads lines from stdin:
//   b n offset_k len_k page_size       -> "ok row page_slot boxes" of tma_block
//   e flags page_size align            -> 1 / 0 of tma_eligible; flags: letters or '-' (p paged,
//                                         i kv_batch_idx, c cu_seqlens_k, 8 fp8 cache); align:
//                                         the byte alignment of the base pointers; every
//                                         stride is align / 2 elements
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "decode/plan.h"

namespace {

// The fields of fa4::FwdParams that tma_eligible reads.
struct Params {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  const int* page_table = nullptr;
  const int* kv_batch_idx = nullptr;
  const int* cu_seqlens_k = nullptr;
  int page_size = 0;
  bool kv_fp8 = false;
};

alignas(256) char g_pool[1024];

}  // namespace

int main() {
  static const int kSome = 0;
  char kind[4];
  while (std::scanf("%3s", kind) == 1) {
    if (kind[0] == 'b') {
      int n = 0, offset_k = 0, len_k = 0, page_size = 0;
      if (std::scanf("%d %d %d %d", &n, &offset_k, &len_k, &page_size) != 4) return 1;
      const fa4::decode::TmaBlock t = fa4::decode::tma_block(n, offset_k, len_k, page_size);
      std::printf("%d %d %d %d\n", t.ok ? 1 : 0, t.row, t.page_slot, t.boxes ? 1 : 0);
    } else {
      char flags[16];
      int page_size = 0, align = 0;
      if (std::scanf("%15s %d %d", flags, &page_size, &align) != 3) return 1;
      auto has = [&](char f) { return std::strchr(flags, f) != nullptr; };
      Params p;
      p.k = g_pool + align;  // g_pool is 256-byte aligned: base alignment = align for align < 256
      p.v = g_pool + 2 * align;
      p.k_batch_stride = p.k_row_stride = p.k_head_stride = align / 2;
      p.v_batch_stride = p.v_row_stride = p.v_head_stride = align / 2;
      p.page_table = has('p') ? &kSome : nullptr;
      p.kv_batch_idx = has('i') ? &kSome : nullptr;
      p.cu_seqlens_k = has('c') ? &kSome : nullptr;
      p.kv_fp8 = has('8');
      p.page_size = page_size;
      std::printf("%d\n", fa4::decode::tma_eligible(p) ? 1 : 0);
    }
  }
  return 0;
}
