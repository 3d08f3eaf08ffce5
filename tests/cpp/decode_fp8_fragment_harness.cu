// Host harness (nvcc, no GPU) of Note [fp8 fragments] (csrc/decode/copy.cuh;
// tests/sass/test_decode_swizzle.py): the FP8 cache's MMA operands as ldmatrix and mma.sync
// m16n8k16 distribute them over a warp's lanes (PTX ISA: "Matrix fragments for mma.m16n8k16",
// "ldmatrix"), built from e4m3 bytes the way decode_kernel builds them, must give
// (1) S = Q Kᵀ when the query tile is stored in fp8_q_order's k order, and
// (2) O = P V with the accumulators' columns as fp8_o_column says (and as the epilogue's float4
// stores take them: even, odd, even, odd MMA register = d 4q .. 4q + 3).
// Values are small integers (exact in fp16 and double); bytes stand for e4m3 codes. Prints
// "ok <case>" per case, or the first mismatch, and exits non-zero on any.
#include <cstdint>
#include <cstdio>

#include "decode/copy.cuh"

namespace {

int g_failed = 0;

uint32_t byte_perm(uint32_t x, uint32_t sel) {  // __byte_perm(x, 0, sel)
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t b = (sel >> (4 * i)) & 7u;
    r |= (b < 4 ? (x >> (8 * b)) & 0xffu : 0u) << (8 * i);
  }
  return r;
}

// S of 16 rows x 8 keys over 32 d's: Q as fp8_q_order stores it, K bytes by ldmatrix (non-trans)
// of matrices (8 keys, d 16 j .. 16 j + 15); thread (g, q) = (l / 4, l % 4).
void check_s() {
  constexpr int kD = 32;
  int qv[16][kD], kv[8][kD];
  for (int r = 0; r < 16; ++r)
    for (int d = 0; d < kD; ++d) qv[r][d] = (r * 7 + d * 3) % 11 - 5;
  for (int n = 0; n < 8; ++n)
    for (int d = 0; d < kD; ++d) kv[n][d] = (n * 5 + d * 13) % 9 - 4;
  int qs[16][kD];  // the tile in shared memory: per 16 d's, two chunks in fp8_q_order
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < kD / 16; ++c) {
      uint32_t w[8];  // 16-bit slots as pairs: word x holds d 2x, 2x + 1 (x = 0..7)
      for (int x = 0; x < 8; ++x) w[x] = uint32_t(x);
      uint4 lo = make_uint4(w[0], w[1], w[2], w[3]), hi = make_uint4(w[4], w[5], w[6], w[7]);
      fa4::decode::detail::fp8_q_order(lo, hi);
      const uint32_t order[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      for (int k = 0; k < 16; ++k) qs[r][16 * c + k] = qv[r][16 * c + 2 * order[k / 2] + k % 2];
    }
  }
  double s[16][8] = {};
  for (int j = 0; j < kD / 16; ++j) {
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, q = l % 4;
      // B from the K word (bytes d 16 j + 4q .. + 3 of key g): b0 = bytes 0, 1; b1 = bytes 2, 3.
      const int b0[2] = {kv[g][16 * j + 4 * q], kv[g][16 * j + 4 * q + 1]};
      const int b1[2] = {kv[g][16 * j + 4 * q + 2], kv[g][16 * j + 4 * q + 3]};
      // B[k][n = g]: b0 = k 2q, 2q + 1; b1 = k 2q + 8, 2q + 9. A[m][k] from the stored tile.
      for (int m = 0; m < 16; ++m) {
        for (int h = 0; h < 2; ++h) {
          s[m][g] += double(qs[m][16 * j + 2 * q + h]) * b0[h];
          s[m][g] += double(qs[m][16 * j + 2 * q + 8 + h]) * b1[h];
        }
      }
    }
  }
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      double want = 0;
      for (int d = 0; d < kD; ++d) want += double(qv[m][d]) * kv[n][d];
      if (s[m][n] != want) {
        std::printf("FAIL S: (%d, %d) = %g, Q Kt %g\n", m, n, s[m][n], want);
        ++g_failed;
        return;
      }
    }
  }
  std::printf("ok S\n");
}

// O of 16 rows x 16 d's over 16 keys: V bytes by ldmatrix .trans of matrices (keys 0-7 and
// 8-15, 16 d's), each word permuted by kFp8TransPerm into the even-d and odd-d B fragments.
void check_o() {
  int pv[16][16], vv[16][16];
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) pv[m][k] = (m * 3 + k * 5) % 7 - 3;
  for (int k = 0; k < 16; ++k)
    for (int d = 0; d < 16; ++d) vv[k][d] = (k * 11 + d * 7) % 13 - 6;
  double c[2][16][8] = {};  // [even / odd MMA][row][n]
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    for (int half = 0; half < 2; ++half) {  // matrix of keys 8 half .. 8 half + 7
      // .trans: b16 elements [row 2q][col g] (low) and [row 2q + 1][col g]; a b16 is d 2g, 2g + 1.
      const int key = 8 * half + 2 * q;
      const uint32_t w =
          uint32_t(vv[key][2 * g] & 0xff) | uint32_t(vv[key][2 * g + 1] & 0xff) << 8 |
          uint32_t(vv[key + 1][2 * g] & 0xff) << 16 | uint32_t(vv[key + 1][2 * g + 1] & 0xff) << 24;
      const uint32_t p = byte_perm(w, fa4::decode::detail::kFp8TransPerm);
      for (int odd = 0; odd < 2; ++odd) {  // e4m3x4_to_f16x4: bytes 0, 1 even; 2, 3 odd
        const int e0 = int8_t((p >> (16 * odd)) & 0xff), e1 = int8_t((p >> (16 * odd + 8)) & 0xff);
        // B[k][n = g] for k = 2q + 8 half, + 1 (b0 for half 0, b1 for half 1).
        for (int m = 0; m < 16; ++m) {
          c[odd][m][g] += double(pv[m][8 * half + 2 * q]) * e0;
          c[odd][m][g] += double(pv[m][8 * half + 2 * q + 1]) * e1;
        }
      }
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    for (int odd = 0; odd < 2; ++odd) {
      for (int i = 0; i < 4; ++i) {  // C register i: row g + 8 (i / 2), n 2q + i % 2
        const int m = g + 8 * (i / 2), d = fa4::decode::detail::fp8_o_column(odd, i, q);
        double want = 0;
        for (int k = 0; k < 16; ++k) want += double(pv[m][k]) * vv[k][d];
        if (c[odd][m][2 * q + i % 2] != want) {
          std::printf("FAIL O: lane %d, %s register %d -> d %d: %g, P V %g\n", l,
                      odd ? "odd" : "even", i, d, c[odd][m][2 * q + i % 2], want);
          ++g_failed;
          return;
        }
      }
    }
    for (int r = 0; r < 2; ++r) {  // the epilogue's float4: even 2r, odd 2r, even 2r+1, odd 2r+1
      const int at[4][2] = {{0, 2 * r}, {1, 2 * r}, {0, 2 * r + 1}, {1, 2 * r + 1}};
      for (int x = 0; x < 4; ++x) {
        if (fa4::decode::detail::fp8_o_column(at[x][0], at[x][1], q) != 4 * q + x) {
          std::printf("FAIL O: the epilogue's element %d of lane %d is not d 4q + %d\n", x, l, x);
          ++g_failed;
          return;
        }
      }
    }
  }
  std::printf("ok O\n");
}

}  // namespace

int main() {
  check_s();
  check_o();
  return g_failed == 0 ? 0 : 1;
}
