// Host check of Note [fp8 P layout] (csrc/sm90/fwd/fp8_vt.cuh) against CuTe's own layouts: for
// every thread of a consumer warpgroup and every element a of the FP8 P·V wgmma's A fragment
// (keys of a kBlockN block), the S accumulator element the consumer copies there
// (fp8_a_source) is in the same row, and its key is the key that column of Vᵀ holds
// (fp8_key_of). Prints one line per checked configuration; exits 1 on the first mismatch.
// Built with nvcc as a host program by tests/sass/test_fp8_layout.py; runs on a CPU.
#include <cstdio>

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "sm90/fwd/fp8_vt.cuh"

using namespace cute;

template <int kBlockN, int kHeadDimV>
int check() {
  using E = cutlass::float_e4m3_t;
  auto mma_s = make_tiled_mma(GMMA::ss_op_selector<E, E, float, Shape<_64, Int<kBlockN>, _128>>());
  auto mma_o =
      make_tiled_mma(GMMA::rs_op_selector<E, E, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>,
                                          GMMA::Major::K, GMMA::Major::K>());
  auto id = make_identity_tensor(Shape<_64, Int<kBlockN>>{});
  int checked = 0;
  for (int t = 0; t < 128; ++t) {
    auto c = mma_s.get_slice(t).partition_C(id);
    auto a = mma_o.get_slice(t).partition_A(id);
    if (size(c) != size(a) || size(a) % 16 != 0) {
      std::printf("fragment sizes C %d A %d\n", int(size(c)), int(size(a)));
      return 1;
    }
    for (int i = 0; i < int(size(a)); ++i) {
      const int j = 16 * (i / 16) + fa4::sm90::fp8_a_source(i % 16);
      const int ka = get<1>(a(i)), kc = get<1>(c(j));
      const int want = 32 * (ka / 32) + fa4::sm90::fp8_key_of(ka % 32);
      if (get<0>(a(i)) != get<0>(c(j)) || kc != want) {
        std::printf(
            "mismatch N=%d t=%d a=%d: A (%d, %d) takes C (%d, %d), Vt column holds key %d\n",
            kBlockN, t, i, int(get<0>(a(i))), ka, int(get<0>(c(j))), kc, want);
        return 1;
      }
      ++checked;
    }
  }
  std::printf("ok kBlockN=%d d_v=%d elements=%d\n", kBlockN, kHeadDimV, checked);
  return 0;
}

// VtLayout's varlen columns: each sequence starts 32-aligned (the transpose's 16-byte stores),
// and its round_up(length, 32) columns end before the next sequence's start and within cols.
int check_varlen_layout() {
  unsigned seed = 12345u;
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + trial % 7;
    int cu[8] = {0};
    for (int b = 0; b < batch; ++b) {
      seed = seed * 1103515245u + 12345u;
      cu[b + 1] = cu[b] + int((seed >> 8) % 300u);  // lengths 0..299, empty ones included
    }
    fa4::FwdParams p;
    p.batch = batch;
    p.total_k = cu[batch];
    p.cu_seqlens_k = cu;
    const fa4::sm90::VtLayout l = fa4::sm90::VtLayout::of(p);
    for (int b = 0; b < batch; ++b) {
      const int64_t start = l.start(cu, b);
      const int64_t end = start + (cu[b + 1] - cu[b] + 31) / 32 * 32;
      const int64_t next = b + 1 < batch ? l.start(cu, b + 1) : l.cols;
      if (start % 32 != 0 || end > next || l.cols % 32 != 0) {
        std::printf("varlen layout: b=%d start %lld end %lld next %lld cols %lld\n", b,
                    (long long)start, (long long)end, (long long)next, (long long)l.cols);
        return 1;
      }
    }
  }
  std::printf("ok varlen Vt layout\n");
  return 0;
}

int main() {
  return check<128, 128>() | check<192, 128>() | check<128, 64>() | check<96, 256>() |
         check<64, 256>() | check_varlen_layout();
}
