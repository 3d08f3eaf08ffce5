// Checks csrc/common/bwd_workspace.h (compiled by g++) over a grid of problems: every float the
// kernels address for a row of a sequence (dq's d floats, lse2, dpsum, and with deterministic the
// turn counter of its 64-row block) lies inside bytes(), the regions of different heads and
// buffers never overlap, and the turn counters exist only in the deterministic size; with GQA
// outside deterministic mode, likewise every float of the dK / dV accumulators of a key row of
// each kv head (Note [GQA head slices]), which the other sizes do not have. Prints
// "ok N" (N problems) or the first failure; tests/api/test_bwd_workspace.py runs it.
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "common/bwd_workspace.h"

namespace {

// Keys: lens_k[b] = lens[b] + 3 (another length than the queries').
int check(bool varlen, const std::vector<int>& lens, int heads, int heads_kv, int d, bool det) {
  const int batch = int(lens.size());
  int64_t total = 0, total_k = 0;
  int max_len = 0;
  for (int l : lens) total += l, total_k += l + 3, max_len = l > max_len ? l : max_len;
  const int kv_dim = d + 8;
  const int64_t bytes = fa4::BwdWorkspace::bytes(varlen, batch, max_len, total, heads, d, det,
                                                 max_len + 3, total_k, heads_kv, kv_dim);
  const int64_t floats = bytes / 4;
  // One owner tag per 4-byte word: a second owner is an overlap.
  std::vector<int64_t> owner(size_t(floats), -1);
  std::vector<float> buffer(size_t(floats) + 1);  // + 1: a one-past-the-end pointer stays valid
  float* base = buffer.data();
  const fa4::BwdWorkspace ws = fa4::BwdWorkspace::make(
      varlen, batch, max_len, total, heads, d, det, max_len + 3, total_k, heads_kv, kv_dim, base);
  const bool kv = heads > heads_kv && !det;
  if (kv != (ws.kv_base != nullptr)) return std::printf("kv accumulators %d\n", int(kv));
  // The per-query-head part: the turn counters' place when deterministic, the kv accumulators'
  // otherwise.
  const int64_t q_floats = ws.kv_base != nullptr ? ws.kv_base - base : floats;
  auto claim = [&](const void* p, int64_t tag) {
    const int64_t i = static_cast<const float*>(p) - base;
    if (i < 0 || i >= floats) return false;
    if (owner[size_t(i)] != -1 && owner[size_t(i)] != tag) return false;
    owner[size_t(i)] = tag;
    return true;
  };
  int64_t offset = 0;
  for (int b = 0; b < batch; ++b) {
    const int len = varlen ? lens[size_t(b)] : max_len;
    // Padded extent: whole 128-row blocks of the sequence (the kernels touch all of them).
    const int padded = (len + 127) / 128 * 128;
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < padded; ++i) {
        const int64_t row = ws.row_offset(b, int(offset), i);
        const int64_t tag = ((int64_t(b) * heads + h) << 20) + i;
        for (int c = 0; c < d; ++c) {
          if (!claim(ws.dq(h) + row * d + c, tag * 4))
            return std::printf("dq b%d h%d i%d\n", b, h, i);
        }
        if (!claim(ws.lse2(h) + row, tag * 4 + 1))
          return std::printf("lse2 b%d h%d i%d\n", b, h, i);
        if (!claim(ws.dpsum(h) + row, tag * 4 + 2)) return std::printf("dpsum b%d h%d\n", b, h);
        if (det) {
          const int64_t block_tag = (((int64_t(b) * heads + h) << 20) + i / 64) * 4 + 3;
          if (!claim(ws.sem(h, row), block_tag)) return std::printf("sem b%d h%d i%d\n", b, h, i);
        } else if (reinterpret_cast<const float*>(ws.sem(h, row)) - base < q_floats) {
          return std::printf("sem inside the non-deterministic size b%d h%d\n", b, h);
        }
      }
    }
    offset += len;
  }
  int64_t offset_k = 0;
  for (int b = 0; kv && b < batch; ++b) {
    const int len = (varlen ? lens[size_t(b)] : max_len) + 3;
    const int padded = (len + 127) / 128 * 128;
    for (int h = 0; h < heads_kv; ++h) {
      for (int i = 0; i < padded; ++i) {
        const int64_t row = ws.row_offset_k(b, int(offset_k), i);
        const int64_t tag = ((int64_t(1) << 40) + ((int64_t(b) * heads_kv + h) << 20) + i) * 4;
        for (int c = 0; c < kv_dim; ++c) {
          if (!claim(ws.dk(h) + row * kv_dim + c, tag)) return std::printf("dk b%d h%d\n", b, h);
          if (!claim(ws.dv(h) + row * kv_dim + c, tag + 1))
            return std::printf("dv b%d h%d\n", b, h);
        }
      }
    }
    offset_k += len;
  }
  if (kv && ws.kv_bytes() != bytes - (ws.kv_base - base) * 4) {
    return std::printf("kv_bytes %lld\n", static_cast<long long>(ws.kv_bytes()));
  }
  return 0;
}

}  // namespace

int main() {
  int n = 0;
  const std::vector<std::vector<int>> dense = {{1}, {128}, {200, 200}, {129, 129, 129}};
  const std::vector<std::vector<int>> varlen = {{0, 5, 130, 1, 256}, {300}, {64, 0, 65, 128}};
  for (bool det : {false, true}) {
    for (auto [heads, heads_kv] : {std::pair{1, 1}, {3, 3}, {3, 1}, {4, 2}}) {
      for (int d : {64, 192}) {
        for (const auto& l : dense) {
          if (check(false, l, heads, heads_kv, d, det)) return 1;
          ++n;
        }
        for (const auto& l : varlen) {
          if (check(true, l, heads, heads_kv, d, det)) return 1;
          ++n;
        }
      }
    }
  }
  std::printf("ok %d\n", n);
  return 0;
}
