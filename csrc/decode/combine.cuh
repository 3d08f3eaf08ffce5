// The split-KV combine (Note [split-KV] in decode/plan.h): one warp per (query row, q head)
// merges the num_splits partial rows of the workspace: lse = log(sum_s exp(lse_s) + exp(sink)),
// out = sum_s exp(lse_s - lse) o_s. Bandwidth-bound: it reads num_splits * (d_v + 1) floats per
// row and writes d_v 16-bit values (batch 4, 32 heads, 8 splits, hd128: 0.5 MB).
//
// Note [pdl combine]: the combine is a programmatic dependent launch (launch_dependent in
// common/params.h). Every decode CTA executes griddepcontrol.launch_dependents as it starts, so
// once the last one is resident the combine's CTAs are launched into the SMs' free slots and
// wait in griddepcontrol.wait for the decode grid to finish and its writes to be visible: the
// combine's launch latency overlaps the decode kernel instead of following it. H100, graph
// replays with the read flush, against a plain launch (2026-12-07): +0.8-2.1 % where b16 kv8k
// splits (2-4 splits of 55-95 us calls), +0.2-0.6 % at b4 kv128k; ncu timed the combine itself
// at 5.0-5.3 us against a 51 us decode kernel (b16 kv8k hd64 gqa8, 2 splits).
#pragma once

#include <cuda_runtime.h>

#include "common/softmax.cuh"
#include "decode/kernel.cuh"

namespace fa4::decode {

constexpr int kCombineWarps = 4;

// Grid (ceil(seqlen_q * heads_q / kCombineWarps), batch), kCombineWarps warps.
template <class Element>
__global__ void __launch_bounds__(kCombineWarps * 32)
    combine_kernel(const __grid_constant__ Args args) {
  const FwdParams& p = args.p;
  const int b = blockIdx.y;
  const int idx = blockIdx.x * kCombineWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int tk = idx / p.heads_q, h = idx % p.heads_q;
  const SeqRows seq = SeqRows::get(p, b);
  if (tk >= seq.len_q) return;
  const int64_t q_row = seq.q_row(p, b, tk);
  const int dv = p.head_dim_v;
  const int splits = args.num_splits;
  const bool used = tk < seq.used_q;
  pdl_wait();  // Note [pdl combine]: the partials are the decode kernel's

  // The merged LSE in log2 units: max, then the sum of the weights over the lanes.
  float m = -INFINITY;
  for (int s = lane; s < splits && used; s += 32) {
    m = fmaxf(m, args.lse_partial[(int64_t{s} * args.partial_rows + q_row) * p.heads_q + h]);
  }
  FA4_UNROLL
  for (int o = 16; o >= 1; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  m *= kLog2e;
  const float sink = used && p.learnable_sink != nullptr ? p.learnable_sink[h] * kLog2e : -INFINITY;
  const float mt = fmaxf(m, sink);
  float sum = 0.0f;
  for (int s = lane; s < splits && used && mt != -INFINITY; s += 32) {
    sum += exp2_hw(
        args.lse_partial[(int64_t{s} * args.partial_rows + q_row) * p.heads_q + h] * kLog2e - mt);
  }
  FA4_UNROLL
  for (int o = 16; o >= 1; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (mt != -INFINITY) sum += exp2_hw(sink - mt);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;

  Element* out = static_cast<Element*>(p.out) + seq.out_offset(p, b, tk, h);
  for (int c = lane; c < dv / 4; c += 32) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits && sum > 0.0f; ++s) {
      const int64_t slot = (int64_t{s} * args.partial_rows + q_row) * p.heads_q + h;
      const float w = exp2_hw(args.lse_partial[slot] * kLog2e - mt) * inv;
      if (w == 0.0f) continue;
      const float4 v = *reinterpret_cast<const float4*>(args.o_partial + slot * dv + 4 * c);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    uint2 packed;
    packed.x = detail::pack2<Element>(acc.x, acc.y);
    packed.y = detail::pack2<Element>(acc.z, acc.w);
    *reinterpret_cast<uint2*>(out + 4 * c) = packed;
  }
  if (lane == 0 && p.lse != nullptr) {
    p.lse[seq.lse_offset(p, b, tk, h)] = sum > 0.0f ? (mt + log2f(sum)) * kLn2 : -INFINITY;
  }
}

}  // namespace fa4::decode
