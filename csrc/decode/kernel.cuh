// The decode kernel: attention of a few query rows per KV head against a long (paged) KV cache,
// at memory speed. SM90 and SM100 (one source; SM100: compiled, not executed).
//
// Grid (m_blocks * num_splits, heads_kv, batch); 5 warps. Warp 4 streams key blocks of 64 rows
// into a ring of shared-memory stages (the producer variants: Note [row gather], [tma blocks]);
// warps 0-3 compute.
// The consumer warps are warps_m x warps_n (decode/plan.h): warp (wm, wn) owns packed rows
// [16 wm, 16 wm + 16) of the tile (Note [packed GQA]) and keys [wn * 64 / warps_n, ...) of
// every block. They run S = Q Kᵀ and O += P V with mma.sync m16n8k16 (decode reads each K/V
// element once for up to 64 rows: ~8 flops per byte, far below what mma.sync sustains), the
// shared online softmax (common/softmax.cuh, QuadFrag: an m16n8 accumulator is a wgmma
// accumulator's warp slice) and the shared masks (common/mask.cuh). The epilogue merges the
// warps_n partial results of each row through shared memory and writes either out and lse
// (one split; the learnable sink joins here) or the split's fp32 partials (decode/combine.cuh).
//
// Note [row gather]: K and V are gathered row by row, so paging (any page size), leftpad,
// kv_batch_idx and varlen keys are all one address computation per row. The producer warp
// resolves a block's 64 row offsets (two per lane, the page table read there), then copies the
// rows in 16-byte cp.async chunks (LDGSTS, 1024 per hd128 block) and signals the stage's full
// barrier with cp.async.mbarrier.arrive (32 arrivals). Rows past the sequence's end are
// zero-filled by the copy itself (source size 0), and the mask sets their scores to -inf, so
// P = 0 meets zeros, never stale shared memory. Two producers (kTma), both in every instance:
// the gather (kTma false; "variant 2" in the A/B of docs/decisions.md; copy_block) gives lane l
// chunks c = l + 32 i of the block (a warp instruction: two hd128 rows) with the offsets of 8
// copies loaded before any of them is issued; the TMA producer (kTma true, "variant 3", Note
// [tma blocks]) loads whole blocks by TMA tiles and gathers the rest the same way; it is
// dispatched wherever the cache admits its descriptors. On an H200 (docs/perf.md, Decode) it
// read 3.8-4.5 TB/s and the gather 3.3-3.8, where the first gather (each copy's row offset
// loaded from shared memory after the previous copy was issued) stopped at 1.9: a per-CTA issue
// limit (docs/decisions.md).
//
// Note [fp8 cache]: with an e4m3 cache (FwdParams::kv_fp8) the ring holds the cache's bytes (half
// the traffic and half the stage: 4 stages of 18 KB at hd128), and each consumer warp converts
// the K and V fragments it loads from them to fp16 in registers (cvt.rn.f16x2.e4m3x2: exact;
// Note [fp8 fragments] in decode/copy.cuh), so the MMAs run in fp16: Q is converted to fp16
// when the tile is loaded (bf16 values beyond +-65504 saturate) and so is P. The descales cost
// nothing per element: k_descale multiplies the score scale and v_descale the row
// normalization 1 / l.
//
// Note [stream first]: a decode CTA's first key block is on the critical path of the whole call
// (one CTA per SM streams for 50-100 us at batch 16), so nothing waits in front of it: the
// producer lane prefetches the TMA descriptors as the CTA starts, the barriers are initialized
// before anything is read, and the consumers load the query tile while the producer already
// streams (a named barrier among the 128 consumer threads publishes it). H100, graph replays
// with the read flush, against loading Q with all threads before the producer starts
// (2026-12-07): b16 kv8k hd64 gqa8 +0.9 % at the heuristic's 2 splits and +4.9 % unsplit,
// +0.2-1.0 % at the other points.
#pragma once

#include <cuda_runtime.h>

#include <cutlass/arch/barrier.h>

#include "common/mask.cuh"
#include "common/params.h"
#include "common/softmax.cuh"
#include "decode/copy.cuh"
#include "decode/plan.h"

namespace fa4::decode {

// Everything the kernel reads besides FwdParams.
struct Args {
  FwdParams p;
  int group;  // heads_q / heads_kv
  int num_splits;
  int64_t partial_rows;
  float* o_partial;    // [split][row][head][d_v], num_splits > 1 only
  float* lse_partial;  // [split][row][head]
  ScoreScale score;
};

template <int D, int DV, class Element, int kWarpsN, bool kKvFp8 = false>
struct Traits {
  static constexpr int kKvBytes = kKvFp8 ? 1 : 2;  // bytes per K / V element in the ring
  static constexpr int kWarpsM = 4 / kWarpsN;
  static constexpr int kBlockM = 16 * kWarpsM;
  static constexpr int kWarpN = kBlockN / kWarpsN;  // keys of a block per consumer warp
  static constexpr int kThreads = 5 * 32;
  static constexpr int kConsumers = 4 * 32;
  static constexpr int kPitchK = row_pitch(D * kKvBytes);  // ring rows
  static constexpr int kPitchV = row_pitch(DV * kKvBytes);
  static constexpr int kPitchQ = row_pitch(2 * D);
  static constexpr int kStages = num_stages(D, DV, kWarpsN, kKvBytes);
  static constexpr int kStageBytes = stage_bytes(D, DV, kKvBytes);
  static constexpr int kRingBytes = ring_bytes(D, DV, kWarpsN, kKvBytes);
  static constexpr int kQOffset = kRingBytes;
  static constexpr int kBarOffset = kQOffset + q_bytes(D, kWarpsN);
  static constexpr int kRowOffOffset = kBarOffset + bar_bytes();  // the producer's row offsets
  static constexpr int kSmemBytes = smem_bytes(D, DV, kWarpsN, kKvBytes);
  static constexpr int kMinBlocks = ctas_per_sm(D, DV, kWarpsN, kKvBytes);
  // The MMAs' 16-bit type: the cache's with a 16-bit cache; fp16 with an FP8 one, into which
  // e4m3 converts exactly (Note [fp8 cache]).
  using MmaElement = std::conditional_t<kKvFp8, cutlass::half_t, Element>;
  static constexpr int kEpiPitch = epi_pitch(DV);
  static constexpr float kTau = 8.0f;  // Note [conditional rescale]
  using SFrag = QuadFrag<kWarpN>;
  using OFrag = QuadFrag<DV>;
  static_assert(kWarpN % 16 == 0 && D % 16 == 0 && DV % 16 == 0, "mma.sync k16 / n16 steps");
  static_assert(!kKvFp8 || (D % 32 == 0 && DV % 32 == 0), "Note [fp8 fragments]: 32-byte steps");
  static_assert(kBarOffset % 16 == 0 && kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(epi_bytes(DV) <= kRingBytes, "the epilogue reuses the ring");
  // Variant 3 (Note [tma blocks]): a stage holds K's and V's blocks as TMA writes them, each
  // in GMMA's K-major swizzled layout (16-byte chunks of a row permuted by the row's index, so
  // that ldmatrix's 8 rows of a matrix meet 8 different bank groups without padding), V at byte
  // kTmaVOffset of the stage; both fit the padded stage, whose base is 1024-byte aligned.
  // The cache's element: Element, or e4m3 with an FP8 cache (Note [fp8 fragments]).
  using KvElement = std::conditional_t<kKvFp8, cutlass::float_e4m3_t, Element>;
  using SmemLayoutK =
      decltype(tile_to_shape(smem_atom_k<KvElement, D>(), Shape<Int<kBlockN>, Int<D>>{}));
  using SmemLayoutV =
      decltype(tile_to_shape(smem_atom_k<KvElement, DV>(), Shape<Int<kBlockN>, Int<DV>>{}));
  static constexpr int kAtomColsK = size<1>(decltype(smem_atom_k<KvElement, D>()){});
  static constexpr int kAtomColsV = size<1>(decltype(smem_atom_k<KvElement, DV>()){});
  using TmaK = TmaTile<KvElement, SmemLayoutK, kBlockN, D>;
  using TmaV = TmaTile<KvElement, SmemLayoutV, kBlockN, DV>;
  // Note [tma boxes] (decode/plan.h): kBoxRows x one swizzle atom's columns, a contiguous
  // 1024-byte-aligned piece of the tiles above (their atoms run down the rows first).
  using SmemLayoutKBox =
      decltype(tile_to_shape(smem_atom_k<KvElement, D>(), Shape<Int<kBoxRows>, Int<kAtomColsK>>{}));
  using SmemLayoutVBox = decltype(tile_to_shape(smem_atom_k<KvElement, DV>(),
                                                Shape<Int<kBoxRows>, Int<kAtomColsV>>{}));
  using TmaKBox = TmaCols<KvElement, SmemLayoutKBox, kBoxRows, kAtomColsK, D>;
  using TmaVBox = TmaCols<KvElement, SmemLayoutVBox, kBoxRows, kAtomColsV, DV>;
  static_assert(kBoxRows % 8 == 0 && kBlockN % kBoxRows == 0 && D % kAtomColsK == 0 &&
                    DV % kAtomColsV == 0,
                "boxes of whole swizzle atoms");
  static constexpr int kTmaVOffset = kBlockN * D * kKvBytes;
  static constexpr int kTmaBytes = kBlockN * (D + DV) * kKvBytes;
  static_assert(kTmaVOffset % 1024 == 0 && kStageBytes % 1024 == 0 && kTmaBytes <= kStageBytes,
                "swizzled tiles start 1024-byte aligned");
};

// The kernel's parameters with TMA loads (variant 3): the descriptors of K and V over the cache
// as decode_kv_view describes it, and their shapes.
template <class T>
struct TmaArgs : Args {
  typename T::TmaK tma_k;
  typename T::TmaV tma_v;
  typename T::TmaKBox tma_k_box;  // Note [tma boxes]
  typename T::TmaVBox tma_v_box;
  decltype(GmemView{}.shape()) shape_k, shape_v;
};

template <int D, int DV, class Element, int kWarpsN, bool kKvFp8, bool kTma>
using KernelArgs = std::conditional_t<kTma, TmaArgs<Traits<D, DV, Element, kWarpsN, kKvFp8>>, Args>;

// The K or V cache as the TMA variant's descriptors see it (GmemView: rows, d, heads, batch):
// a page pool (page_size rows, num_pages entries), the packed varlen keys (one entry), or the
// dense cache (seqlen_k rows per batch entry).
inline GmemView decode_kv_view(const FwdParams& p, const void* ptr, int cols, int64_t row_stride,
                               int64_t head_stride, int64_t batch_stride) {
  if (p.page_table != nullptr) {
    return {ptr, p.page_size, cols, p.heads_kv, p.num_pages, row_stride, head_stride, batch_stride};
  }
  if (p.cu_seqlens_k != nullptr) {
    return {ptr, p.total_k > 0 ? p.total_k : 1, cols, p.heads_kv, 1, row_stride, head_stride, 0};
  }
  return {ptr,         p.seqlen_k > 0 ? p.seqlen_k : 1,
          cols,        p.heads_kv,
          p.batch,     row_stride,
          head_stride, batch_stride};
}

namespace detail {

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a b, m16n8k16, fp32 accumulators; a: 4 registers, b: 2.
template <class Element>
__device__ __forceinline__ void mma_16816(float* c, const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

__device__ __forceinline__ void wait_barrier(uint64_t* bar, int phase) {
  cutlass::arch::ClusterBarrier::wait(bar, static_cast<uint32_t>(phase));
}

}  // namespace detail

// One sequence's rows and keys, after seqused_q / seqused_k / leftpad_k (api/fa4.h).
struct SeqRows {
  int offset_q = 0;  // packed row of the sequence's first query (varlen), else 0
  int len_q = 0;     // query rows of the sequence (its share of the out / lse tensors)
  int used_q = 0;    // rows computed (seqused_q), <= len_q
  int offset_k = 0;  // varlen: first key row; dense / paged: leftpad
  int len_k = 0;     // keys attended
  int kv_batch = 0;  // dense k/v batch entry (kv_batch_idx)

  __device__ static SeqRows get(const FwdParams& p, int b) {
    SeqRows s;
    if (p.cu_seqlens_q != nullptr) {
      s.offset_q = p.cu_seqlens_q[b];
      s.len_q = p.cu_seqlens_q[b + 1] - s.offset_q;
    } else {
      s.len_q = p.seqlen_q;
    }
    s.used_q = p.seqused_q != nullptr ? min(p.seqused_q[b], s.len_q) : s.len_q;
    const int leftpad = p.leftpad_k != nullptr ? p.leftpad_k[b] : 0;
    if (p.cu_seqlens_k != nullptr) {
      s.offset_k = p.cu_seqlens_k[b] + leftpad;
      s.len_k = p.seqused_k != nullptr ? p.seqused_k[b] : p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    } else {
      s.offset_k = leftpad;
      s.len_k = p.seqused_k != nullptr ? p.seqused_k[b] : p.seqlen_k;
    }
    s.len_k = max(s.len_k - leftpad, 0);
    s.kv_batch = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;
    return s;
  }

  // Query token tk of sequence b in the packed row numbering of the split partials (dense:
  // b * seqlen_q + tk), in out (element offset of head h) and in lse.
  __device__ int64_t q_row(const FwdParams& p, int b, int tk) const {
    return p.cu_seqlens_q != nullptr ? int64_t{offset_q} + tk : int64_t{b} * p.seqlen_q + tk;
  }
  __device__ int64_t out_offset(const FwdParams& p, int b, int tk, int h) const {
    return (p.cu_seqlens_q != nullptr
                ? int64_t{offset_q + tk} * p.out_row_stride
                : int64_t{b} * p.out_batch_stride + int64_t{tk} * p.out_row_stride) +
           int64_t{h} * p.out_head_stride;
  }
  __device__ int64_t lse_offset(const FwdParams& p, int b, int tk, int h) const {
    return p.cu_seqlens_q != nullptr
               ? int64_t{h} * p.lse_head_stride + offset_q + tk
               : int64_t{b} * p.lse_batch_stride + int64_t{h} * p.lse_head_stride + tk;
  }
};

// Byte offset of key row j (0-based within the sequence's attended keys) from the base of K (or
// V, with its strides); kBytes per element.
template <int kBytes>
__device__ __forceinline__ int64_t key_offset(const FwdParams& p, const SeqRows& s, int kv_head,
                                              int j, int64_t batch_stride, int64_t row_stride,
                                              int64_t head_stride) {
  const int row = s.offset_k + j;
  int64_t off;
  if (p.page_table != nullptr) {
    // FA3's rule: with kv_batch_idx, sequence b reads page table row kv_batch_idx[b].
    const int page = p.page_table[s.kv_batch * p.page_table_batch_stride + row / p.page_size];
    off = int64_t{page} * batch_stride + int64_t{row % p.page_size} * row_stride;
  } else if (p.cu_seqlens_k != nullptr) {
    off = int64_t{row} * row_stride;
  } else {
    off = int64_t{s.kv_batch} * batch_stride + int64_t{row} * row_stride;
  }
  return (off + int64_t{kv_head} * head_stride) * kBytes;
}

template <int D, int DV, class Element, int kWarpsN, bool kKvFp8, bool kTma>
__global__ void __launch_bounds__(160, Traits<D, DV, Element, kWarpsN, kKvFp8>::kMinBlocks)
    decode_kernel(const __grid_constant__ KernelArgs<D, DV, Element, kWarpsN, kKvFp8, kTma> args) {
  using T = Traits<D, DV, Element, kWarpsN, kKvFp8>;
  using KvElement = typename T::KvElement;
  // Byte offsets of (row, col) in the swizzled K and V tiles of a stage (col: an element).
  const auto swz_k = [](int row, int col) {
    return swizzled<typename T::SmemLayoutK, T::kKvBytes>(row, col);
  };
  const auto swz_v = [](int row, int col) {
    return swizzled<typename T::SmemLayoutV, T::kKvBytes>(row, col);
  };
  extern __shared__ __align__(1024) char smem[];
  pdl_launch_dependents();  // Note [pdl combine] (decode/combine.cuh)
  if constexpr (kTma) {
    if (threadIdx.x == 4 * 32) {  // Note [stream first]
      cute::prefetch_tma_descriptor(args.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(args.tma_v.get_tma_descriptor());
    }
  }
  const FwdParams& p = args.p;
  const int b = blockIdx.z;
  const int kv_head = blockIdx.y;
  const int split = blockIdx.x % args.num_splits;
  const int m_block = blockIdx.x / args.num_splits;
  const int group = args.group;
  const SeqRows seq = SeqRows::get(p, b);
  const int rows_len = seq.len_q * group;  // packed rows with an output
  const int row0 = m_block * T::kBlockM;
  if (row0 >= rows_len) return;
  const int rows_used = seq.used_q * group;

  // The keys this tile's computed rows see (Note [mask alignment], on the used lengths), as
  // whole blocks, and this split's share of them.
  const Mask mask = Mask::from_params(p, seq.used_q, seq.len_k);
  int n_begin = 0, n_end = 0;
  if (row0 < rows_used) {
    const int i_lo = row0 / group;
    const int i_hi = (min(row0 + T::kBlockM, rows_used) - 1) / group;
    const int lo = max(0, i_lo + mask.diag_lo);
    const int hi = min(seq.len_k, i_hi + mask.diag_hi);
    if (hi > lo) {
      n_begin = lo / kBlockN;
      n_end = (hi + kBlockN - 1) / kBlockN;
    }
  }
  {
    const int per = (n_end - n_begin + args.num_splits - 1) / args.num_splits;
    const int first = n_begin + split * per;
    n_end = min(n_end, first + per);
    n_begin = min(first, n_end);
  }
  const int n_blocks = n_end - n_begin;

  uint64_t* full = reinterpret_cast<uint64_t*>(smem + T::kBarOffset);
  uint64_t* empty = full + T::kStages;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 32);  // the producer lanes' cp.async arrivals
      cutlass::arch::ClusterBarrier::init(&empty[s], T::kConsumers);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp == 4) {
    // Producer: Note [row gather]. Per block, each lane first resolves the byte offsets of rows
    // lane and lane + 32 (K and V; -1 past the sequence) into row_off, then the warp copies the
    // block in 16-byte chunks, chunk c of K being chunk c % kChunksK of row c / kChunksK.
    int64_t* row_off = reinterpret_cast<int64_t*>(smem + T::kRowOffOffset);
    constexpr int kChunksK = D * T::kKvBytes / 16, kChunksV = DV * T::kKvBytes / 16;
    for (int it = 0; it < n_blocks; ++it) {
      const int stage = it % T::kStages;
      const int n = n_begin + it;
      // Note [tma blocks] (decode/plan.h): whole blocks of one page by TMA (variant 3), or of
      // several pages by boxes (Note [tma boxes]).
      bool by_tma = false;
      TmaBlock tb;
      if constexpr (kTma) {
        tb = tma_block(n, seq.offset_k, seq.len_k, p.page_table ? p.page_size : 0);
        by_tma = tb.ok;
      }
      if (!by_tma) {
        FA4_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int r = lane + 32 * h, j = n * kBlockN + r;
          const bool ok = j < seq.len_k;
          row_off[2 * r] = ok ? key_offset<T::kKvBytes>(p, seq, kv_head, j, p.k_batch_stride,
                                                        p.k_row_stride, p.k_head_stride)
                              : -1;
          row_off[2 * r + 1] = ok ? key_offset<T::kKvBytes>(p, seq, kv_head, j, p.v_batch_stride,
                                                            p.v_row_stride, p.v_head_stride)
                                  : -1;
        }
        __syncwarp();
      }
      // The offsets (a page-table read when paged) are resolved before the stage is free.
      if (it >= T::kStages) detail::wait_barrier(&empty[stage], (it / T::kStages - 1) & 1);
      if constexpr (kTma) {
        if (by_tma) {
          const int batch =
              p.page_table != nullptr
                  ? p.page_table[seq.kv_batch * p.page_table_batch_stride + tb.page_slot]
              : p.cu_seqlens_k != nullptr ? 0
                                          : seq.kv_batch;
          if (lane == 0) {
            // The stage's last fill may have been a gather (generic-proxy writes), this one is
            // the async proxy's: the fence orders them (~tens of cycles per 32 KB block).
            cutlass::arch::fence_view_async_shared();
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[stage],
                                                                           T::kTmaBytes);
            KvElement* k_tile = reinterpret_cast<KvElement*>(smem + stage * T::kStageBytes);
            KvElement* v_tile =
                reinterpret_cast<KvElement*>(smem + stage * T::kStageBytes + T::kTmaVOffset);
            if (tb.boxes) {
              // Note [tma boxes]: slice i of the block from its own page, each atom column of
              // it one box, into the tile's rows kBoxRows i.. (the swizzle is the identity at
              // an atom's corner, so the layout gives the box's plain offset).
              const int first = tb.page_slot * p.page_size + tb.row;
              FA4_UNROLL
              for (int i = 0; i < kBlockN / kBoxRows; ++i) {
                const int row = first + kBoxRows * i;
                const int page =
                    p.page_table[seq.kv_batch * p.page_table_batch_stride + row / p.page_size];
                FA4_UNROLL
                for (int c = 0; c < D / T::kAtomColsK; ++c) {
                  detail::tma_load_box<kBoxRows, T::kAtomColsK>(
                      args.tma_k_box, args.shape_k, row % p.page_size, c * T::kAtomColsK, page,
                      kv_head, full[stage],
                      k_tile + typename T::SmemLayoutK{}(kBoxRows * i, c * T::kAtomColsK),
                      typename T::SmemLayoutKBox{});
                }
                FA4_UNROLL
                for (int c = 0; c < DV / T::kAtomColsV; ++c) {
                  detail::tma_load_box<kBoxRows, T::kAtomColsV>(
                      args.tma_v_box, args.shape_v, row % p.page_size, c * T::kAtomColsV, page,
                      kv_head, full[stage],
                      v_tile + typename T::SmemLayoutV{}(kBoxRows * i, c * T::kAtomColsV),
                      typename T::SmemLayoutVBox{});
                }
              }
            } else {
              detail::tma_load_block<kBlockN, D>(args.tma_k, args.shape_k, tb.row, batch, kv_head,
                                                 full[stage], k_tile, typename T::SmemLayoutK{});
              detail::tma_load_block<kBlockN, DV>(args.tma_v, args.shape_v, tb.row, batch, kv_head,
                                                  full[stage], v_tile, typename T::SmemLayoutV{});
            }
          } else {
            cutlass::arch::ClusterBarrier::arrive(&full[stage]);
          }
          continue;
        }
      }
      const uint32_t k_smem = detail::smem_addr(smem + stage * T::kStageBytes);
      const uint32_t v_smem = k_smem + kBlockN * T::kPitchK;
      if constexpr (kTma) {
        const uint32_t v_tile = k_smem + T::kTmaVOffset;
        detail::copy_block<kChunksK>(
            [&](int r, int x) { return k_smem + swz_k(r, 16 * x / T::kKvBytes); }, p.k, row_off, 0,
            lane, p.head_dim * T::kKvBytes);
        detail::copy_block<kChunksV>(
            [&](int r, int x) { return v_tile + swz_v(r, 16 * x / T::kKvBytes); }, p.v, row_off, 1,
            lane, p.head_dim_v * T::kKvBytes);
      } else {
        detail::copy_block<kChunksK>([&](int r, int x) { return k_smem + r * T::kPitchK + x * 16; },
                                     p.k, row_off, 0, lane, p.head_dim * T::kKvBytes);
        detail::copy_block<kChunksV>([&](int r, int x) { return v_smem + r * T::kPitchV + x * 16; },
                                     p.v, row_off, 1, lane, p.head_dim_v * T::kKvBytes);
      }
      // The stage is full when every lane's copies have landed: 32 arrivals per phase.
      detail::cp_async_arrive(&full[stage]);
      __syncwarp();  // row_off is rewritten by the next block
    }
    return;
  }

  // The query tile, loaded by the consumers once the producer runs (Note [stream first]): packed
  // row r is token (row0 + r) / group of head kv_head * group + (row0 + r) % group; rows past the
  // computed ones are zeros. With an FP8 cache each thread takes two chunks (16 d's), converted to
  // fp16 and put in the MMAs' k order (Note [fp8 fragments]).
  constexpr int kQChunks = D / 8;  // 16-byte chunks per row
  constexpr int kPer = kKvFp8 ? 2 : 1;
  const auto q_chunk = [&](int r, int c) {
    const int pr = row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (pr < rows_used && c * 8 < p.head_dim) {  // zeros past d: Note [padded head dims]
      const int tok = pr / group, h = kv_head * group + pr % group;
      const int64_t off = (p.cu_seqlens_q != nullptr
                               ? int64_t{seq.offset_q + tok} * p.q_row_stride
                               : int64_t{b} * p.q_batch_stride + int64_t{tok} * p.q_row_stride) +
                          int64_t{h} * p.q_head_stride + c * 8;
      v = *reinterpret_cast<const uint4*>(static_cast<const Element*>(p.q) + off);
      if constexpr (kKvFp8) v = detail::to_f16x8<Element>(v);
    }
    return v;
  };
  for (int i = threadIdx.x; i < T::kBlockM * kQChunks / kPer; i += T::kConsumers) {
    const int r = i / (kQChunks / kPer), c = i % (kQChunks / kPer) * kPer;
    uint4* dst = reinterpret_cast<uint4*>(smem + T::kQOffset + r * T::kPitchQ + c * 16);
    if constexpr (kKvFp8) {
      uint4 lo = q_chunk(r, c), hi = q_chunk(r, c + 1);
      detail::fp8_q_order(lo, hi);
      dst[0] = lo;
      dst[1] = hi;
    } else {
      dst[0] = q_chunk(r, c);
    }
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(T::kConsumers));

  // Consumers.
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  float o[T::OFrag::kSize];
  FA4_UNROLL
  for (int i = 0; i < T::OFrag::kSize; ++i) o[i] = 0.0f;
  OnlineSoftmax<typename T::SFrag> softmax;
  softmax.init();
  // This thread's two rows of the warp's 16 (m16n8 accumulator: lane / 4 and lane / 4 + 8) as
  // query tokens; rows not computed get token -1 (row_bounds: nothing visible).
  int tok[2];
  FA4_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int pr = row0 + wm * 16 + lane / 4 + 8 * r;
    tok[r] = pr < rows_used ? pr / group : -1;
  }
  const uint32_t q_base = detail::smem_addr(smem + T::kQOffset);
  // ldmatrix lane addresses. A (Q, rows x d): matrix lane / 8 holds rows +8 for odd, cols +8 for
  // >= 2. B of S (K rows = n, d = k): matrices (n0, k0), (n0, k8), (n8, k0), (n8, k8). B of O
  // (V rows = k, d_v = n), transposed: (k0, n0), (k8, n0), (k0, n8), (k8, n8).
  const int a_row = wm * 16 + (lane % 8) + ((lane / 8) % 2) * 8, a_col = (lane / 16) * 8;
  // K and V: each matrix is 8 rows x 16 bytes (8 16-bit elements, or 16 e4m3 ones: Note [fp8
  // fragments]), the lane's own column in bytes.
  const int kb_row = wn * T::kWarpN + (lane % 8) + (lane / 16) * 8, kb_byte = ((lane / 8) % 2) * 16;
  const int vb_row = wn * T::kWarpN + (lane % 8) + ((lane / 8) % 2) * 8, vb_byte = (lane / 16) * 16;
  // Note [fp8 cache]: the descales fold into the score scale (k) and the row normalization (v).
  float v_scale = 1.0f;
  ScoreScale score = args.score;
  if constexpr (kKvFp8) {
    const int64_t at =
        int64_t{b} * p.descale_batch_stride + int64_t{kv_head} * p.descale_head_stride;
    const float k_scale = p.k_descale != nullptr ? p.k_descale[at] : 1.0f;
    if (p.v_descale != nullptr) v_scale = p.v_descale[at];
    score = ScoreScale::make(p.softmax_scale * k_scale, p.softcap);
  }
  using MmaElement = typename T::MmaElement;
  constexpr int kB = T::kKvBytes;
  // Byte offsets of (row, col: an element) in the stage's K and V blocks: the padded rows, or the
  // swizzled TMA tiles (Note [tma blocks]), which the MMAs read as they are. Both step from the
  // thread's own ldmatrix row and column (Note [swizzle steps]).
  const int k_own = kTma ? swz_k(kb_row, kb_byte / kB) : kb_row * T::kPitchK + kb_byte;
  const int v_own = kTma ? swz_v(vb_row, vb_byte / kB) : vb_row * T::kPitchV + vb_byte;
  const auto k_at = [&](int dr, int dc) {
    if constexpr (kTma)
      return swizzled_step<typename T::SmemLayoutK, kB, T::kAtomColsK>(k_own, dr, dc);
    else
      return k_own + dr * T::kPitchK + dc * kB;
  };
  const auto v_at = [&](int dr, int dc) {
    if constexpr (kTma)
      return swizzled_step<typename T::SmemLayoutV, kB, T::kAtomColsV>(v_own, dr, dc);
    else
      return v_own + dr * T::kPitchV + dc * kB;
  };

  for (int it = 0; it < n_blocks; ++it) {
    const int stage = it % T::kStages;
    detail::wait_barrier(&full[stage], (it / T::kStages) & 1);
    const uint32_t k_base = detail::smem_addr(smem + stage * T::kStageBytes);
    const uint32_t v_base = k_base + (kTma ? T::kTmaVOffset : kBlockN * T::kPitchK);

    float s[T::SFrag::kSize];
    FA4_UNROLL
    for (int i = 0; i < T::SFrag::kSize; ++i) s[i] = 0.0f;
    if constexpr (kKvFp8) {
      // Note [fp8 fragments]: per 32 d's, one ldmatrix of 16 keys feeds four MMAs: matrices (keys
      // 0-7, d 0-15), (0-7, 16-31), (8-15, 0-15), (8-15, 16-31).
      FA4_UNROLL
      for (int kk = 0; kk < D / 32; ++kk) {
        uint32_t a0[4], a1[4];
        detail::ldmatrix_x4(q_base + a_row * T::kPitchQ + (kk * 32 + a_col) * 2, a0);
        detail::ldmatrix_x4(q_base + a_row * T::kPitchQ + (kk * 32 + 16 + a_col) * 2, a1);
        FA4_UNROLL
        for (int np = 0; np < T::kWarpN / 16; ++np) {
          uint32_t k8[4], bk[8];
          detail::ldmatrix_x4(k_base + k_at(np * 16, kk * 32), k8);
          FA4_UNROLL
          for (int j = 0; j < 4; ++j) detail::e4m3x4_to_f16x4(k8[j], bk[2 * j], bk[2 * j + 1]);
          detail::mma_16816<MmaElement>(&s[(2 * np) * 4], a0, bk[0], bk[1]);
          detail::mma_16816<MmaElement>(&s[(2 * np) * 4], a1, bk[2], bk[3]);
          detail::mma_16816<MmaElement>(&s[(2 * np + 1) * 4], a0, bk[4], bk[5]);
          detail::mma_16816<MmaElement>(&s[(2 * np + 1) * 4], a1, bk[6], bk[7]);
        }
      }
    } else {
      FA4_UNROLL
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        detail::ldmatrix_x4(q_base + a_row * T::kPitchQ + (kk * 16 + a_col) * 2, a);
        FA4_UNROLL
        for (int np = 0; np < T::kWarpN / 16; ++np) {
          uint32_t bk[4];
          detail::ldmatrix_x4(k_base + k_at(np * 16, kk * 16), bk);
          detail::mma_16816<MmaElement>(&s[(2 * np) * 4], a, bk[0], bk[1]);
          detail::mma_16816<MmaElement>(&s[(2 * np + 1) * 4], a, bk[2], bk[3]);
        }
      }
    }
    if (score.softcap) apply_softcap<typename T::SFrag>(s, score.pre);
    const int n = n_begin + it;
    const int col0 = n * kBlockN + wn * T::kWarpN + 2 * (lane % 4);
    apply_mask<typename T::SFrag>(
        s, mask, [&](int r) { return tok[r]; }, [&](int e) { return col0 + 8 * (e / 2) + e % 2; });
    float o_scale[2];
    const RowDecisions d = softmax.update_max(s, score.scale_log2, T::kTau, o_scale);
    if (d.any_rescaled()) scale_rows<typename T::OFrag>(o, o_scale);
    softmax.template exp2_and_sum<0>(s, score.scale_log2);

    FA4_UNROLL
    for (int kc = 0; kc < T::kWarpN / 16; ++kc) {
      // P of keys [16 kc, 16 kc + 16): n-tiles 2 kc and 2 kc + 1 of S are the A fragment.
      uint32_t a[4];
      a[0] = detail::pack2<MmaElement>(s[8 * kc + 0], s[8 * kc + 1]);
      a[1] = detail::pack2<MmaElement>(s[8 * kc + 2], s[8 * kc + 3]);
      a[2] = detail::pack2<MmaElement>(s[8 * kc + 4], s[8 * kc + 5]);
      a[3] = detail::pack2<MmaElement>(s[8 * kc + 6], s[8 * kc + 7]);
      if constexpr (kKvFp8) {
        // Note [fp8 fragments]: per 32 d's, matrices (keys 0-7, d 0-15), (8-15, 0-15), (0-7,
        // 16-31), (8-15, 16-31); O's n-tiles 2c and 2c + 1 take the even and odd d's of 16 c.
        FA4_UNROLL
        for (int t = 0; t < DV / 32; ++t) {
          uint32_t v8[4];
          detail::ldmatrix_x4_trans(v_base + v_at(kc * 16, t * 32), v8);
          FA4_UNROLL
          for (int h = 0; h < 2; ++h) {
            const int c = 2 * t + h;
            uint32_t even[2], odd[2];
            detail::e4m3_trans_to_f16(v8[2 * h], even[0], odd[0]);
            detail::e4m3_trans_to_f16(v8[2 * h + 1], even[1], odd[1]);
            detail::mma_16816<MmaElement>(&o[(2 * c) * 4], a, even[0], even[1]);
            detail::mma_16816<MmaElement>(&o[(2 * c + 1) * 4], a, odd[0], odd[1]);
          }
        }
      } else {
        FA4_UNROLL
        for (int dp = 0; dp < DV / 16; ++dp) {
          uint32_t bv[4];
          detail::ldmatrix_x4_trans(v_base + v_at(kc * 16, dp * 16), bv);
          detail::mma_16816<MmaElement>(&o[(2 * dp) * 4], a, bv[0], bv[1]);
          detail::mma_16816<MmaElement>(&o[(2 * dp + 1) * 4], a, bv[2], bv[3]);
        }
      }
    }
    // Every consumer thread releases the stage after its own last ldmatrix of it (mbarrier
    // arrive has release semantics for the arriving thread's reads): one elected arrive per warp
    // after __syncwarp drew compute-sanitizer racecheck hazards against the next bulk copy.
    cutlass::arch::ClusterBarrier::arrive(&empty[stage]);
  }

  // Epilogue. Each warp's rows, normalized over its keys, with their LSE (log2 units), into the
  // ring (every copy has landed: the loop waited for all of them).
  float inv_l[2], lse[2];
  softmax.finalize(inv_l, lse);
  inv_l[0] *= v_scale;
  inv_l[1] *= v_scale;
  scale_rows<typename T::OFrag>(o, inv_l);
  asm volatile("bar.sync 1, %0;\n" ::"n"(T::kConsumers));
  float* epi = reinterpret_cast<float*>(smem);
  float* epi_lse = epi + 64 * T::kEpiPitch;
  FA4_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int slot = warp * 16 + lane / 4 + 8 * r;  // (wm, wn) row slot
    if constexpr (kKvFp8) {
      // Note [fp8 fragments]: n-tiles 2c (even d's) and 2c + 1 (odd) hold d 16 c + 4 q .. + 3.
      FA4_UNROLL
      for (int c = 0; c < DV / 16; ++c) {
        const float* e = o + 8 * c + 2 * r;
        *reinterpret_cast<float4*>(epi + slot * T::kEpiPitch + 16 * c + 4 * (lane % 4)) =
            make_float4(e[0], e[4], e[1], e[5]);
      }
    } else {
      FA4_UNROLL
      for (int g = 0; g < DV / 8; ++g) {
        *reinterpret_cast<float2*>(epi + slot * T::kEpiPitch + 8 * g + 2 * (lane % 4)) =
            make_float2(o[g * 4 + 2 * r], o[g * 4 + 2 * r + 1]);
      }
    }
    if (lane % 4 == 0) epi_lse[slot] = lse[r] * kLog2e;  // log2 units
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(T::kConsumers));

  // Merge the kWarpsN partials of each row: row r of the tile is slot (r / 16 * kWarpsN + wn) * 16
  // + r % 16 of warp (r / 16, wn). 4 floats per thread and step.
  const bool use_sink = p.learnable_sink != nullptr && args.num_splits == 1;
  constexpr int kChunks = DV / 4;
  for (int i = threadIdx.x; i < T::kBlockM * kChunks; i += T::kConsumers) {
    const int r = i / kChunks, c = i % kChunks;
    const int pr = row0 + r;
    if (pr >= rows_len || 4 * c >= p.head_dim_v) continue;  // Note [padded head dims]
    const int tk = pr / group, h = kv_head * group + pr % group;
    float part_lse[kWarpsN];
    float m = -INFINITY;
    FA4_UNROLL
    for (int w = 0; w < kWarpsN; ++w) {
      part_lse[w] = epi_lse[((r / 16) * kWarpsN + w) * 16 + r % 16];
      m = fmaxf(m, part_lse[w]);
    }
    float sink = -INFINITY;
    if (use_sink && pr < rows_used) sink = p.learnable_sink[h] * kLog2e;
    const float mt = fmaxf(m, sink);
    float wsum = 0.0f, weight[kWarpsN];
    FA4_UNROLL
    for (int w = 0; w < kWarpsN; ++w) {
      weight[w] = mt == -INFINITY ? 0.0f : exp2_hw(part_lse[w] - mt);
      wsum += weight[w];
    }
    const float sink_w = mt == -INFINITY ? 0.0f : exp2_hw(sink - mt);
    const float total = wsum + sink_w;
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    FA4_UNROLL
    for (int w = 0; w < kWarpsN; ++w) {
      const float4 v = *reinterpret_cast<const float4*>(
          epi + (((r / 16) * kWarpsN + w) * 16 + r % 16) * T::kEpiPitch + 4 * c);
      const float wt = weight[w] * inv;
      acc.x += wt * v.x;
      acc.y += wt * v.y;
      acc.z += wt * v.z;
      acc.w += wt * v.w;
    }
    // Natural-log LSE of the merged row (and the sink): -inf when it saw nothing.
    const float lse_row = total > 0.0f ? (mt + log2f(total)) * kLn2 : -INFINITY;
    if (args.num_splits == 1) {
      const int64_t off = seq.out_offset(p, b, tk, h) + 4 * c;
      uint2 packed;
      packed.x = detail::pack2<Element>(acc.x, acc.y);
      packed.y = detail::pack2<Element>(acc.z, acc.w);
      *reinterpret_cast<uint2*>(static_cast<Element*>(p.out) + off) = packed;
      if (c == 0 && p.lse != nullptr) {
        p.lse[seq.lse_offset(p, b, tk, h)] = lse_row;
      }
    } else {
      const int64_t slot =
          (int64_t{split} * args.partial_rows + seq.q_row(p, b, tk)) * p.heads_q + h;
      *reinterpret_cast<float4*>(args.o_partial + slot * p.head_dim_v + 4 * c) = acc;
      if (c == 0) args.lse_partial[slot] = lse_row;
    }
  }
}

}  // namespace fa4::decode
