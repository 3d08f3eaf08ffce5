// Which compiled instance serves a problem's head dims (host and device, no CUDA headers).
//
// Note [padded head dims]: any head dims d, d_v that are multiples of 8 up to 256 run on a
// compiled instance (D, D_v) with D >= d and D_v >= d_v. The kernels describe q, k, v and dO to
// TMA with their true column counts and load D-column boxes: TMA fills the columns past d with
// zeros, so S = Q·Kᵀ and P·V are unchanged, and the stores (TMA boxes clipped at the true width,
// or register stores guarded per 16-byte chunk, which d % 8 == 0 keeps whole) never write past
// d_v. Multiples of 8 because TMA needs 16-byte row strides. Among the instances that cover
// (d, d_v), the one with the least D + D_v (the columns its two GEMMs compute) wins, then the
// least D: (128, 64) takes (128, 128), (80, 80) takes (96, 96) where it is compiled.
#pragma once

namespace fa4 {

struct HeadDims {
  int d = 0, dv = 0;
  constexpr bool covers(int want_d, int want_dv) const { return d >= want_d && dv >= want_dv; }
  constexpr bool found() const { return d > 0; }
};

// The instance among list[0..n) that serves (d, dv) by Note [padded head dims]; {0, 0} when none
// does.
constexpr HeadDims cover(const HeadDims* list, int n, int d, int dv) {
  HeadDims best;
  for (int i = 0; i < n; ++i) {
    const HeadDims k = list[i];
    if (!k.covers(d, dv)) continue;
    const bool better = !best.found() || k.d + k.dv < best.d + best.dv ||
                        (k.d + k.dv == best.d + best.dv && k.d < best.d);
    if (better) best = k;
  }
  return best;
}
template <int N>
constexpr HeadDims cover(const HeadDims (&list)[N], int d, int dv) {
  return cover(list, N, d, dv);
}

// The forwards' lists, whose dtypes have different head dims (the FP8 forward's e4m3 instances):
// an entry with its dtype (a DType enumerator as an int), and the cover among one dtype's.
struct TypedHeadDims {
  int d = 0, dv = 0, dtype = 0;
};
template <int N>
constexpr HeadDims cover_of_dtype(const TypedHeadDims (&list)[N], int dtype, int d, int dv) {
  HeadDims mine[N] = {};
  int n = 0;
  for (const TypedHeadDims& e : list) {
    if (e.dtype == dtype) mine[n++] = HeadDims{e.d, e.dv};
  }
  return cover(mine, n, d, dv);
}
// {FA4_INSTANCES_SM90_FWD(FA4_TYPED_HEAD_DIMS_ENTRY)}: needs api/fa4.h's DType.
#define FA4_TYPED_HEAD_DIMS_ENTRY(D, DV, E) ::fa4::TypedHeadDims{D, DV, int(::fa4::DType::E)},

// One entry of an FA4_INSTANCES_* X-macro list (fa4_instances.h) as a HeadDims, for the lists
// cover() picks from: {FA4_INSTANCES_SM90_FWD(FA4_HEAD_DIMS_ENTRY)}.
#define FA4_HEAD_DIMS_ENTRY(D, DV, E) ::fa4::HeadDims{D, DV},

// The head dims the API admits: multiples of 8 from 8 to 256 (Note [padded head dims]).
constexpr bool admissible_head_dim(int d) {
  return d >= 8 && d <= 256 && d % 8 == 0;
}

}  // namespace fa4
