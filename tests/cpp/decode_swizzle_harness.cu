// Host harness (nvcc, no GPU) of the decode TMA producer's shared-memory addressing
// (csrc/decode/kernel.cuh, Note [tma blocks]; tests/sass/test_decode_swizzle.py): for each cache
// element size and head dim, swizzled<SmemLayout, bytes>(row, col), the byte offset the consumers
// and the row gather use, must be (1) the address TMA's 128-byte swizzle writes element (row, col)
// to (64-element... column blocks of 128-byte rows, 16-byte chunk index XOR row % 8), where the
// tile takes the 128-byte swizzle; (2) a bijection of the tile's 16-byte chunks onto its bytes;
// (3) free of bank conflicts for ldmatrix (8 consecutive rows at one column: 8 distinct 16-byte
// bank groups); (4) reached by the consumers' steps (swizzled_step, Note [swizzle steps]) from
// each lane's own ldmatrix row and column (e4m3 tiles too: Note [fp8 fragments]). Prints "ok
// <case>" per case, or the first mismatch, and exits non-zero on any.
#include <cstdio>
#include <set>

#include "decode/kernel.cuh"

namespace {

int g_failed = 0;

template <class Element, int D>
void check(const char* name) {
  using T = fa4::decode::Traits<D, D, cutlass::bfloat16_t, 4, sizeof(Element) == 1>;
  using Layout = typename T::SmemLayoutK;
  constexpr int kBytes = sizeof(Element);
  constexpr int kChunkElems = 16 / kBytes;
  constexpr bool kSw128 = (D * kBytes) % 128 == 0;
  std::set<int> seen;
  for (int r = 0; r < fa4::decode::kBlockN; ++r) {
    for (int c = 0; c < D; c += kChunkElems) {
      const int got = fa4::decode::swizzled<Layout, kBytes>(r, c);
      if (kSw128) {
        const int per_row = 128 / kBytes;  // elements of a 128-byte swizzle row
        const int want = (c / per_row) * fa4::decode::kBlockN * 128 + r * 128 +
                         ((((c % per_row) * kBytes) / 16) ^ (r % 8)) * 16;
        if (got != want) {
          std::printf("FAIL %s: (%d, %d) -> %d, TMA writes %d\n", name, r, c, got, want);
          ++g_failed;
          return;
        }
      }
      if (got % 16 != 0 || got < 0 || got >= fa4::decode::kBlockN * D * kBytes ||
          !seen.insert(got).second) {
        std::printf("FAIL %s: (%d, %d) -> %d is not a fresh chunk of the tile\n", name, r, c, got);
        ++g_failed;
        return;
      }
    }
  }
  for (int r0 = 0; r0 < fa4::decode::kBlockN; r0 += 8) {
    for (int c = 0; c < D; c += kChunkElems) {
      std::set<int> groups;
      for (int r = r0; r < r0 + 8; ++r) {
        groups.insert((fa4::decode::swizzled<Layout, kBytes>(r, c) / 16) % 8);
      }
      if (groups.size() != 8) {
        std::printf("FAIL %s: rows %d-%d at column %d meet %zu bank groups\n", name, r0, r0 + 7, c,
                    groups.size());
        ++g_failed;
        return;
      }
    }
  }
  // Note [swizzle steps]: every consumer ldmatrix address as a step from the lane's own (row,
  // col), as the MMAs read the tiles: rows step by 16 within the block; columns by 16 elements
  // (16-bit tiles) or 32 (e4m3 tiles, Note [fp8 fragments]), the lane's own column 16 bytes in.
  constexpr int kStep = kBytes == 2 ? 16 : 32;
  for (int lane = 0; lane < 32; ++lane) {
    for (int w = 0; w < fa4::decode::kBlockN; w += 16) {
      const int own_r[2] = {w + (lane % 8) + (lane / 16) * 8,
                            w + (lane % 8) + ((lane / 8) % 2) * 8};
      const int own_c[2] = {((lane / 8) % 2) * kChunkElems, (lane / 16) * kChunkElems};
      for (int k = 0; k < 2; ++k) {
        const int own = fa4::decode::swizzled<Layout, kBytes>(own_r[k], own_c[k]);
        for (int dr = 0; own_r[k] + dr < fa4::decode::kBlockN; dr += 16) {
          for (int dc = 0; dc < D; dc += kStep) {
            const int got = fa4::decode::swizzled_step<Layout, kBytes, T::kAtomColsK>(own, dr, dc);
            const int want = fa4::decode::swizzled<Layout, kBytes>(own_r[k] + dr, own_c[k] + dc);
            if (got != want) {
              std::printf("FAIL %s: step (%d, %d) from (%d, %d) -> %d, layout %d\n", name, dr, dc,
                          own_r[k], own_c[k], got, want);
              ++g_failed;
              return;
            }
          }
        }
      }
    }
  }
  std::printf("ok %s\n", name);
}

}  // namespace

int main() {
  check<cutlass::bfloat16_t, 64>("bf16 d64");
  check<cutlass::bfloat16_t, 96>("bf16 d96");
  check<cutlass::bfloat16_t, 128>("bf16 d128");
  check<cutlass::bfloat16_t, 192>("bf16 d192");
  check<cutlass::bfloat16_t, 256>("bf16 d256");
  check<cutlass::float_e4m3_t, 64>("e4m3 d64");
  check<cutlass::float_e4m3_t, 96>("e4m3 d96");
  check<cutlass::float_e4m3_t, 128>("e4m3 d128");
  check<cutlass::float_e4m3_t, 192>("e4m3 d192");
  check<cutlass::float_e4m3_t, 256>("e4m3 d256");
  return g_failed == 0 ? 0 : 1;
}
