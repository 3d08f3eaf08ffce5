// SM90 (Hopper) backward: the main kernel (dK, dV per KV tile, dQ by fp32 reduce-adds into the
// workspace), its postprocess and the launch of all three. This header describes the d <= 128
// variant (sm90/bwd/consumer.cuh); sm90/bwd/consumer_split.cuh describes how d > 128 differs.
//
// Work items: (kv tile of kBlockN rows, kv head, batch); one CTA per SM walks them (Note
// [persistent bwd], sm90/bwd/common.cuh), in both variants. K and V
// stay in shared memory for the item; the CTA loops over the item's query heads (the GQA group,
// or a slice of it: Note [GQA head slices]) and every Q block of kBlockM rows that sees the tile,
// so dK and dV are summed over them in registers and written once (with slices, added to fp32
// accumulators that a postprocess casts). Per Q block, each consumer
// warpgroup (64 of the kv rows) computes, with the scores transposed so that kv rows are the wgmma
// M dimension:
//   Sᵀ  = K·Qᵀ                 (SS)      Pᵀ = exp2(Sᵀ·c − lse₂)           (common/softmax.cuh exp2)
//   dPᵀ = V·dOᵀ                (SS)      dSᵀ = Pᵀ ∘ (dPᵀ − D) [∘ (1 − x²) with softcap]
//   dV += Pᵀ·dO                (RS: Pᵀ from registers)
//   dK += dSᵀ·Q                (RS: dSᵀ from registers)
//   dQ  = dS·K                 (SS: dS through shared memory, each warpgroup half of d)
// The consumers put dQ (fp32) in shared memory and a reducer warp of the producer warpgroup adds
// it to the workspace's accumulator with one bulk reduce-add (Note [dQ reduce]).
// Overlap inside a warpgroup (Note [bwd issue order]): the next block's dPᵀ runs behind dK
// (Note [early dPᵀ], d 96 and 128); the two warpgroups interleave naturally.
// lse₂ = lse·log2(e) (+inf for rows that saw no key, so P = 0) and D = rowsum(dO∘O) − dlse come
// from the preprocess kernel (common/bwd_prepost.cuh) and travel with Q and dO through the
// pipelines.
//
// Pipelines and barriers (from X to Y, protects Z):
//   tile ring   producer -> consumers and reducer, the next item (common/tile_ring.cuh)
//   kv_full     producer -> consumers, K and V (once per item)
//   kv_empty    consumers -> producer, the K/V buffer after the item's last GEMM
//   pipe_q      producer -> consumers, kStages buffers of Q and its lse₂ rows
//   pipe_do     producer -> consumers, kStages buffers of dO and its D rows
//   kDsWritten  consumers -> consumers (named), dS of this block in smem before the dQ GEMM
//               (two dS buffers: a warpgroup reaching block m+2's dS store has passed block
//               m+1's kDsWritten, which the other warpgroup reaches only after its dQ GEMM of
//               block m completed, so no buffer is overwritten while read)
//   kDqFull     consumers -> reducer (named), dQ of this block in smem
//   kDqEmpty    reducer -> consumers (named), the bulk copy has read dQ's smem (after every
//               block: with the register epilogue a warpgroup waits for it before its next dQ
//               store and after its last tile, Note [dK/dV from registers]; with the staged one
//               before a tile's 2nd.. block and its epilogue)
// (The split variant reuses kDqFull / kDqEmpty as consumer-only barriers of deterministic mode.)
//
// Head dims: d <= 128 here (kBlockN 128, kBlockM 64). Registers per consumer thread at d = 128:
// dK 64 + dV 64 + Sᵀ/P 32 + dPᵀ 32 + Pᵀ/dSᵀ as 16-bit 16 + dQ 32 (not all live at once) of 232;
// d or d_v > 128 runs the split variant (BwdTraitsSplit: dK/dV/dQ split across warpgroups).
#pragma once

#include "sm90/bwd/consumer.cuh"
#include "sm90/bwd/consumer_split.cuh"

namespace fa4::sm90 {

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdKernelParams<T> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem);
  if constexpr (!T::kSplitD) ss.trace.cta_mark(threadIdx.x == 0, 0);  // Note [bwd trace]
  const auto role = static_cast<WarpGroupRole>(threadIdx.x / 128);
  if (threadIdx.x == 0) {
    ss.kv_full.init(1);
    ss.kv_empty.init(T::kConsumerThreads);
    // The tile ring's readers: the consumers, and at d <= 128 the dQ reducer warp.
    constexpr int kReaders = T::kConsumerThreads + (T::kSplitD ? 0 : kReducerThreads);
    for (int i = 0; i < kTileSlots; ++i) {
      cutlass::arch::ClusterBarrier::init(&ss.tile_full[i], 1);
      cutlass::arch::ClusterBarrier::init(&ss.tile_empty[i], kReaders);
    }
  }
  using Pipe = typename T::Pipeline;
  typename Pipe::Params pq;
  pq.role = role == WarpGroupRole::kProducer ? Pipe::ThreadCategory::Producer
                                             : Pipe::ThreadCategory::Consumer;
  pq.is_leader = threadIdx.x == 0;
  pq.num_consumers = T::kConsumerThreads;
  typename Pipe::Params pd = pq;
  pq.transaction_bytes = T::kQBytes;
  pd.transaction_bytes = T::kDOBytes;
  Pipe pipe_q(ss.pipe_q, pq, Shape<_1, _1, _1>{});
  Pipe pipe_do(ss.pipe_do, pd, Shape<_1, _1, _1>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();
  if constexpr (!T::kSplitD) ss.trace.cta_mark(threadIdx.x == 0, 1);
  // Note [persistent bwd], both variants.
  if (role == WarpGroupRole::kProducer) {
    cutlass::arch::warpgroup_reg_dealloc<kBwdProducerRegs>();
    if (threadIdx.x == 0) bwd_producer(kp, ss, pipe_q, pipe_do);
    if constexpr (!T::kSplitD) {
      if (threadIdx.x / 32 == 1) bwd_dq_reducer(kp, ss);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kBwdConsumerRegs>();
    if constexpr (T::kSplitD) {
      bwd_consumer_split(kp, ss, pipe_q, pipe_do, threadIdx.x - 128);
    } else {
      bwd_consumer(kp, ss, pipe_q, pipe_do, threadIdx.x - 128);
    }
  }
#endif
}

// Row pitch, in floats, of the postprocess's shared-memory copy of a dQ block.
template <class T>
constexpr int kPostPitch = T::kHeadDim + 8;

// Note [postprocess from registers]: each thread holds, in fragment order, one warpgroup
// accumulator of MmaDQ (QuadFrag<N>, N = kDqFloats / 128 columns per warpgroup), so it can convert
// its float pairs and write whole 16-byte row chunks after quad_transpose (write_quad_rows, as
// Note [split epilogue]) with no shared-memory copy, no barrier and no dynamic shared memory.
// N must be whole groups of four 8-column chunks (d = 96, N = 48, cannot), so it runs at hd 64
// and 128 (the traits' kPostRegs). Against the copy at hd128: the backward +1-2.6 % at 512 / 1k
// and causal 512 / 1k, level from 2k.
template <class T>
constexpr bool kPostFromRegisters = T::kPostRegs && (T::kDqFloats / 128) % 32 == 0;

// dQ accumulator (fragment order, Note [dQ reduce]) · softmax_scale -> the dtype, rows <
// seqlen_q. One CTA of kConsumerThreads per kBlockM-row block; thread t reads its own float4s
// (coalesced) and writes them from registers (Note [postprocess from registers]) or puts each
// pair of adjacent columns in its row of a shared-memory copy of the block (kDqBytes of dynamic
// shared memory), from which the CTA writes 16-byte row chunks.
// Grid: (kBlockM-row blocks of the longest sequence, heads_q, batch) flattened, block fastest.
template <class T>
__global__ void __launch_bounds__(T::kConsumerThreads)
    bwd_postprocess_sm90(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename T::Element;
  const FwdParams& f = p.fwd;
  const int m_blocks = (f.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  const int m = int(blockIdx.x % m_blocks);
  const int head = int(blockIdx.x / m_blocks % f.heads_q);
  const int b = int(blockIdx.x / m_blocks / f.heads_q);
  const SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  if (m * T::kBlockM >= seq.seqlen_q) return;
  const int tid = threadIdx.x;
  const float4* acc = reinterpret_cast<const float4*>(
      ws.dq(head) + ws.row_offset(b, seq.offset_q, m * T::kBlockM) * T::kHeadDim);
  typename T::MmaDQ mma_dq;
  const auto coords = fragment_coords(mma_dq, tid, Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{});
  const bool varlen = f.cu_seqlens_q != nullptr;
  Element* dq = static_cast<Element*>(p.dq) + (varlen ? 0 : int64_t(b) * p.dq_batch_stride) +
                (int64_t(seq.offset_q) + int64_t(m) * T::kBlockM) * p.dq_row_stride +
                int64_t(head) * p.dq_head_stride;
  const int rows_valid = seq.seqlen_q - m * T::kBlockM;
  if constexpr (kPostFromRegisters<T>) {
    Tensor frag = partition_fragment_C(mma_dq, Shape<Int<T::kBlockM>, Int<T::kHeadDim>>{});
    static_assert(decltype(size(frag))::value * T::kConsumerThreads == T::kDqFloats,
                  "the workspace block is the consumers' fragments");
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < T::kDqFloats / (4 * T::kConsumerThreads); ++j) {
      const float4 v = acc[j * T::kConsumerThreads + tid];
      frag(4 * j) = v.x;
      frag(4 * j + 1) = v.y;
      frag(4 * j + 2) = v.z;
      frag(4 * j + 3) = v.w;
    }
    write_quad_rows<T, T::kDqFloats / 128>(dq, p.dq_row_stride, rows_valid, f.head_dim,
                                           f.softmax_scale, frag, coords, tid % 4);
    return;
  }
  // The block in fragment order -> shared memory in rows (coalesced 16-byte loads, then each
  // pair to its place) -> rows of 16-byte stores: direct 4-byte stores from the fragment order
  // wrote half-used sectors and took 3.4x flash-attn-4's postprocess time at 1k.
  // Rows kPostPitch floats apart: a warp's pairs cover 8 rows × 8 floats, which at a pitch of d
  // (512 bytes at d = 128) all fell in the same 8 banks; 8 more floats spread them over all 32.
  extern __shared__ float4 rows[];  // T::kBlockM × kPostPitch<T> floats
  constexpr int kDqPitch = kPostPitch<T>;
  float* rows_f = reinterpret_cast<float*>(rows);
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < T::kDqFloats / (4 * T::kConsumerThreads); ++j) {
    const float4 v = acc[j * T::kConsumerThreads + tid];
    const float pair[2][2] = {{v.x, v.y}, {v.z, v.w}};
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int at = get<0>(coords(4 * j + 2 * h)) * kDqPitch + get<1>(coords(4 * j + 2 * h));
      *reinterpret_cast<float2*>(rows_f + at) = make_float2(pair[h][0], pair[h][1]);
    }
  }
  __syncthreads();
  constexpr int kChunks = T::kHeadDim / 8;  // 8 elements = 16 bytes of dq per store
  for (int c = tid; c < T::kBlockM * kChunks; c += T::kConsumerThreads) {
    const int row = c / kChunks, col = c % kChunks * 8;
    if (row >= rows_valid) break;
    if (col >= f.head_dim) continue;  // Note [padded head dims]
    const float4 lo = rows[(row * kDqPitch + col) / 4];
    const float4 hi = rows[(row * kDqPitch + col) / 4 + 1];
    const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    cutlass::Array<Element, 8> out;
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < 8; ++e) out[e] = Element(x[e] * f.softmax_scale);
    *reinterpret_cast<cutlass::Array<Element, 8>*>(dq + int64_t(row) * p.dq_row_stride + col) = out;
  }
#endif
}

// Note [GQA head slices]: dK and dV of one kv tile from the workspace's accumulators (fragment
// order, red_dk_dv) to the dtype, through the consumers' register epilogue (store_dk_dv_regs:
// dK scaled, rows past seqlen_k skipped). One CTA of kConsumerThreads per (kv tile, kv head,
// batch), flattened, tile fastest.
template <class T>
__global__ void __launch_bounds__(T::kConsumerThreads)
    bwd_postprocess_kv_sm90(const __grid_constant__ BwdKernelParams<T> kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kN = T::kBlockN;
  const FwdParams& f = kp.p.fwd;
  const int n_tiles = (f.seqlen_k + kN - 1) / kN;
  const int n = int(blockIdx.x % n_tiles);
  const int head_kv = int(blockIdx.x / n_tiles % f.heads_kv);
  const int b = int(blockIdx.x / n_tiles / f.heads_kv);
  const SeqInfo seq =
      SeqInfo::get(b, f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k);
  if (n * kN >= seq.seqlen_k) return;
  const int tid = threadIdx.x;
  typename T::MmaDK mma_dk;
  typename T::MmaDV mma_dv;
  Tensor acc_dk = partition_fragment_C(mma_dk, Shape<Int<kN>, Int<T::kHeadDim>>{});
  Tensor acc_dv = partition_fragment_C(mma_dv, Shape<Int<kN>, Int<T::kHeadDimV>>{});
  const int64_t at = kp.ws.row_offset_k(b, seq.offset_k, n * kN) * kp.ws.kv_dim + 4 * tid;
  load_fragment<T::kConsumerThreads>(kp.ws.dk(head_kv) + at, acc_dk);
  load_fragment<T::kConsumerThreads>(kp.ws.dv(head_kv) + at, acc_dv);
  store_dk_dv_regs(kp, seq, n, head_kv, b, tid, mma_dk, acc_dk, mma_dv, acc_dv);
#endif
}

// Note [GQA head slices]: a backward CTA walks, for its kv tile, the Q blocks of every q head of
// the item in turn, and the persistent CTAs drift apart along that walk (a causal tile n sees
// n_tiles - n blocks per head), so at GQA the running CTAs span every head of the group's Q, dO
// and dQ rows. ncu (docs/perf.md, "Backward against flash-attn-4 under ncu") had fa4 moving
// 2.7-5.8x flash-attn-4's DRAM bytes at 32:8 .. 28:4 with 68-86 % L2 hits against 95 %, and
// tools/bwd_l2_model.py reproduced it. So, outside deterministic mode, each kv head's group is
// dealt over `slices` items of bwd_slice_heads() q heads each (BwdGrid: slices of a kv head
// adjacent, so a section's running CTAs share one slice's rows); their partial dK and dV are
// added to fp32 accumulators (red_dk_dv, 16-byte reduce-adds in fragment order, zeroed by a
// memset) and bwd_postprocess_kv_sm90 casts them. BwdGrid::slice_heads picks the heads per
// item: ncu (H100, 2026-12-08) had the sliced walk at flash-attn-4's DRAM bytes, 0.55 GB
// against 2.83 whole at Qwen 28:4 8k (flash-attn-4: 0.53). Deterministic mode keeps whole
// groups: the reduce-adds' order would vary.
template <class T>
int bwd_slice_heads(const FwdParams& f, const BwdWorkspace& ws, const DeviceInfo& dev) {
  const int group = f.heads_q / f.heads_kv;
  if (ws.kv_base == nullptr) return group;
  return BwdGrid::slice_heads(f.seqlen_q, group, T::kHeadDim, T::kHeadDimV,
                              dev.tile_order.slice_heads);
}

// Pre/main/postprocess on `stream`.
template <class T>
Status launch_bwd(const BwdParams& p, const DeviceInfo& dev, void* workspace, cudaStream_t stream) {
  using Element = typename T::Element;
  const FwdParams& f = p.fwd;
  BwdKernelParams<T> kp;
  kp.p = p;
  kp.ws = workspace_of(f, workspace, T::kHeadDim, std::max(T::kHeadDim, T::kHeadDimV));
  kp.score = ScoreScale::make(f.softmax_scale, f.softcap);
  kp.group = f.heads_q / f.heads_kv;
  kp.slice_heads = bwd_slice_heads<T>(f, kp.ws, dev);  // Note [GQA head slices]
  const int slices = (kp.group + kp.slice_heads - 1) / kp.slice_heads;
  const auto [q, dout, k, v] = bwd_views(p);
  kp.shape_q = q.shape();
  kp.shape_do = dout.shape();
  kp.shape_k = k.shape();
  kp.shape_v = v.shape();
  kp.tma_q = make_tma_tile<Element, typename T::SmemLayoutQ, T::kBlockM, T::kHeadDim>(q);
  kp.tma_do = make_tma_tile<Element, typename T::SmemLayoutDO, T::kBlockM, T::kHeadDimV>(dout);
  kp.tma_k = make_tma_tile<Element, typename T::SmemLayoutK, T::kBlockN, T::kHeadDim>(k);
  kp.tma_v = make_tma_tile<Element, typename T::SmemLayoutV, T::kBlockN, T::kHeadDimV>(v);
  if constexpr (T::kTmaStoreDkDv) {  // Note [TMA-store dK/dV]: dense problems, whole groups
    if (f.cu_seqlens_q == nullptr && slices == 1) {
      const GmemView dk = gmem_view(f, p.dk, true, f.head_dim, p.dk_row_stride, p.dk_head_stride,
                                    p.dk_batch_stride);
      const GmemView dv = gmem_view(f, p.dv, true, f.head_dim_v, p.dv_row_stride, p.dv_head_stride,
                                    p.dv_batch_stride);
      kp.out.shape_dk = dk.shape();
      kp.out.shape_dv = dv.shape();
      kp.out.tma_dk =
          make_tma_store_tile<Element, typename T::SmemLayoutDKst, T::kBlockN, T::kHeadDim>(dk);
      kp.out.tma_dv =
          make_tma_store_tile<Element, typename T::SmemLayoutDVst, T::kBlockN, T::kHeadDimV>(dv);
      kp.out.on = true;
    }
  }
  // Grids flattened into x (at most 2^31 - 1 blocks: a 2^31-row problem is far past memory).
  const RowBlockGrid row_grid = RowBlockGrid::of(f);
  const int64_t pp_blocks = row_grid.blocks(f);
  if (pp_blocks > 0) {
    bwd_preprocess<Element><<<unsigned(pp_blocks), 256, 0, stream>>>(p, kp.ws, row_grid);
  }
  // Note [bwd tile order options].
  kp.grid = BwdGrid::make(
      (f.seqlen_k + T::kBlockN - 1) / T::kBlockN, f.heads_kv, f.batch, f.deterministic, dev.num_sms,
      dev.tile_order.backward_or_default(f.causal, f.deterministic),
      BwdGrid::pair_bytes(f.seqlen_q, kp.slice_heads, T::kHeadDim, T::kHeadDimV), slices);
  const int64_t kv_tiles = int64_t(kp.grid.n_tiles) * f.heads_kv * f.batch;
  const int64_t tiles = kv_tiles * slices;
  if (slices > 1 && kv_tiles > 0) {
    const cudaError_t e = cudaMemsetAsync(kp.ws.kv_base, 0, size_t(kp.ws.kv_bytes()), stream);
    if (e != cudaSuccess) {
      return kernel_fail(Status::kCudaError, "bwd_sm90 dK/dV accumulators: cudaMemsetAsync: %s",
                         cudaGetErrorString(e));
    }
  }
  kp.tiles = int(tiles);  // < 2^31 as any grid above: 2^31 tiles of K are 2^38 rows
  // Note [persistent bwd]: at most one CTA per SM (one fits), each walking tiles; num_sms at
  // least the tile count gives one CTA per tile.
  const int64_t blocks = std::min<int64_t>(tiles, dev.num_sms);
  if (blocks > 0) {
    const Status s = launch_kernel("bwd_sm90", bwd_kernel<T>, dim3(unsigned(blocks)), T::kThreads,
                                   T::kSmemBytes, stream, kp);
    if (s != Status::kOk) return s;
  }
  if (slices > 1 && kv_tiles > 0) {
    const Status s = launch_kernel("bwd_sm90 postprocess kv", bwd_postprocess_kv_sm90<T>,
                                   dim3(unsigned(kv_tiles)), T::kConsumerThreads, 0, stream, kp);
    if (s != Status::kOk) return s;
  }
  // As bwd_postprocess_sm90 decodes it: kBlockM-row blocks of the longest sequence, heads, batch.
  const int64_t post_blocks =
      int64_t((f.seqlen_q + T::kBlockM - 1) / T::kBlockM) * f.heads_q * f.batch;
  if (post_blocks > 0) {
    return launch_kernel(
        "bwd_sm90 postprocess", bwd_postprocess_sm90<T>, dim3(unsigned(post_blocks)),
        T::kConsumerThreads,
        kPostFromRegisters<T> ? 0 : int(T::kBlockM * kPostPitch<T> * sizeof(float)), stream, p,
        kp.ws);
  }
  return Status::kOk;
}

// d, d_v <= 128: BwdTraits; larger: the split-d variant.
template <int D, int DV, class Element>
using BwdTraitsFor = std::conditional_t<(D <= 128 && DV <= 128), BwdTraits<D, DV, Element>,
                                        BwdTraitsSplit<D, DV, Element>>;

}  // namespace fa4::sm90
