// What the FP8 (e4m3) forwards of both architectures share (Note [fp8 forward],
// sm90/fwd/traits.cuh and sm100/fwd/kernel.cuh): P's scaling and its packing into e4m3.
#pragma once

#include <stdint.h>

#include "api/fa4.h"

namespace fa4 {

// Note [fp8 forward]: P = exp2(s - m) with the row's exact max (kTau 0) is at most 1; scaled by
// 2^8 its largest entry is exactly 256 <= 448 (e4m3's largest), and entries down to 2^-14 stay
// normal.
// Note [fp8 P scale] (docs/numerics.md): the 2^8 is added to the exponent's offset
// (OnlineSoftmax's kPLog2), P' = 2^(x · c - m + 8), instead of a multiply per element before
// the e4m3 packing (16384 FMULs per 128 x 128 block; 128 fewer FMULs per thread in the SM90
// hd128 kernel's SASS). l sums the same P', so O / l needs no 2^-8, and finalize takes the 8
// out of the LSE.
constexpr int kFp8PLog2 = 8;

// Four floats as e4m3 (round to nearest, saturating at +-448) in one register, a in byte 0.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  uint32_t r;
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(r)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}

// The descales of sequence b, kv head h (api/fa4.h, "FP8 forward"): q's and k's multiply the
// score scale (before the softcap), v's multiplies 1/l.
struct Fp8Scales {
  float qk = 1.0f;
  float out = 1.0f;
};
__device__ __forceinline__ Fp8Scales fp8_scales(const FwdParams& p, int b, int kv_head) {
  const int64_t at = int64_t(b) * p.descale_batch_stride + int64_t(kv_head) * p.descale_head_stride;
  Fp8Scales f;
  f.qk = (p.q_descale != nullptr ? p.q_descale[at] : 1.0f) *
         (p.k_descale != nullptr ? p.k_descale[at] : 1.0f);
  f.out = p.v_descale != nullptr ? p.v_descale[at] : 1.0f;
  return f;
}

}  // namespace fa4
