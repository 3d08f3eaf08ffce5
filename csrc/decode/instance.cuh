// The decode kernel's entry point for one (head dims, dtype) instance (common/instance.cuh): the
// plan (decode/plan.h), the kernel for its tile shape, and the combine when it splits.
#pragma once

#include "common/instance.cuh"
#include "decode/combine.cuh"
#include "decode/kernel.cuh"

namespace fa4::decode {

// One tile shape's kernel for one cache type (Note [row gather], [tma blocks]): the TMA
// producer where the cache admits its descriptors (tma_eligible), else the gather it falls back
// to per block anyway.
template <int D, int DV, class Element, int kWarpsN, bool kKvFp8>
Status launch_cache(const Args& args, const Plan& pl, cudaStream_t stream) {
  using T = Traits<D, DV, Element, kWarpsN, kKvFp8>;
  const dim3 grid(pl.m_blocks * pl.num_splits, args.p.heads_kv, args.p.batch);
  if (!tma_eligible(args.p)) {
    return launch_kernel("decode_kernel", decode_kernel<D, DV, Element, kWarpsN, kKvFp8, false>,
                         grid, T::kThreads, T::kSmemBytes, stream, args);
  }
  static_assert(sizeof(TmaArgs<T>) <= 4096, "kernel parameters: 4 KB");
  const FwdParams& p = args.p;
  TmaArgs<T> a;
  static_cast<Args&>(a) = args;
  const GmemView k =
      decode_kv_view(p, p.k, p.head_dim, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  const GmemView v =
      decode_kv_view(p, p.v, p.head_dim_v, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
  using KvElement = typename T::KvElement;
  a.tma_k = make_tma_tile<KvElement, typename T::SmemLayoutK, kBlockN, D>(k);
  a.tma_v = make_tma_tile<KvElement, typename T::SmemLayoutV, kBlockN, DV>(v);
  a.tma_k_box = make_tma_cols<KvElement, typename T::SmemLayoutKBox, kBoxRows, T::kAtomColsK, D>(k);
  a.tma_v_box =
      make_tma_cols<KvElement, typename T::SmemLayoutVBox, kBoxRows, T::kAtomColsV, DV>(v);
  a.shape_k = k.shape();
  a.shape_v = v.shape();
  return launch_kernel("decode_kernel", decode_kernel<D, DV, Element, kWarpsN, kKvFp8, true>, grid,
                       T::kThreads, T::kSmemBytes, stream, a);
}

template <int D, int DV, class Element, int kWarpsN>
Status launch_tile(const Args& args, const Plan& pl, cudaStream_t stream) {
  if (args.p.kv_fp8) return launch_cache<D, DV, Element, kWarpsN, true>(args, pl, stream);
  return launch_cache<D, DV, Element, kWarpsN, false>(args, pl, stream);
}

template <int D, int DV, DType E>
Status fwd_instance(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using Element = ElementOf<E>;
  const Plan pl = make_plan(p, dev.num_sms);
  if (p.workspace_bytes < pl.workspace_bytes() || (pl.num_splits > 1 && p.workspace == nullptr)) {
    return kernel_fail(Status::kInvalid,
                       "workspace_bytes=%zu smaller than fwd_workspace_size()=%zu (%d splits)",
                       p.workspace_bytes, pl.workspace_bytes(), pl.num_splits);
  }
  Args args;
  args.p = p;
  args.group = pl.group;
  args.num_splits = pl.num_splits;
  args.partial_rows = pl.partial_rows;
  args.lse_partial = static_cast<float*>(p.workspace);
  args.o_partial = nullptr;
  if (pl.num_splits > 1) {
    // [split][row][head] LSEs first, then the [split][row][head][d_v] outputs (16-byte aligned:
    // the LSE part is padded to 4 floats).
    const int64_t slots = int64_t{pl.num_splits} * pl.partial_rows * p.heads_q;
    args.o_partial = args.lse_partial + ((slots + 3) / 4) * 4;
  }
  args.score = ScoreScale::make(p.softmax_scale, p.softcap);
  Status s = Status::kOk;
  switch (pl.warps_n) {
    case 4:
      s = launch_tile<D, DV, Element, 4>(args, pl, stream);
      break;
    case 2:
      s = launch_tile<D, DV, Element, 2>(args, pl, stream);
      break;
    default:
      s = launch_tile<D, DV, Element, 1>(args, pl, stream);
  }
  if (s != Status::kOk || pl.num_splits == 1) return s;
  const dim3 grid((p.seqlen_q * p.heads_q + kCombineWarps - 1) / kCombineWarps, p.batch);
  return launch_dependent("decode_combine", combine_kernel<Element>, grid, kCombineWarps * 32,
                          stream, args);
}

}  // namespace fa4::decode
