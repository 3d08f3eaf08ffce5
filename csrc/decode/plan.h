// The decode kernel's launch plan, computed on the host from FwdParams alone (no device memory
// is read): which problems take the kernel, its tile shape, the number of key splits and the
// workspace of the split results. Plain C++ templated on the params struct (FwdParams, or the
// host harness tests/cpp/decode_plan_harness.cpp's stand-in), shared by api/dispatch.cu
// (fwd_workspace_size, the routing) and decode/kernel.cuh (the launch).
//
// Note [packed GQA]: the heads_q / heads_kv query heads that share a KV head are one tile's rows:
// packed row r of a sequence is query token r / group of q head kv_head * group + r % group. One
// CTA then reads each K/V byte once for the whole group, where a CTA per q head would read it
// group times (from L2 at best). Decode (1 token, GQA 4:1) fills 4 of a tile's 16 rows.
//
// Note [split-KV]: a decode problem has batch * heads_kv tiles, fewer than the SMs can run at once
// (batch 4, 8 KV heads: 32 CTAs on 132 SMs), and each streams a long KV sequence. The keys of a
// tile are cut into num_splits ranges of whole blocks, one CTA each; each writes its rows'
// fp32 output, normalized over its range, and that range's LSE to the workspace, and the combine
// kernel (decode/combine.cuh) weighs them by exp(lse_s - lse) into out and lse.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/host_device.cuh"

namespace fa4::decode {

constexpr int kBlockN = 64;      // keys per pipeline stage
constexpr int kMaxRows = 64;     // packed rows of one tile (4 consumer warps x 16)
constexpr int kMaxSplits = 256;  // num_splits cap (a 128k-key sequence has 2048 blocks)

// The tile shape: rows per CTA = 16 * (4 / warps_n). A tile of 16 rows gives each of the 4
// consumer warps a quarter of every key block (warps_n = 4); 64 rows give each warp its own 16
// rows of the whole block (warps_n = 1).
inline int warps_n_for(int packed_rows) {
  return packed_rows <= 16 ? 4 : packed_rows <= 32 ? 2 : 1;
}

// Shared memory of one CTA (decode/kernel.cuh): a ring of key blocks, each K and V row padded
// by 16 bytes so that ldmatrix's 8 rows of a matrix start in 8 different bank groups; the query
// tile (same padding); the pipeline barriers. The epilogue's fp32 rows reuse the ring.
// Stages: as many as keep the CTA within half an SM's 228 KB (two CTAs per SM overlap one's
// prologue and epilogue with the other's stream), between 2 and kMaxStages. hd128: 3 stages of
// 34,816 bytes (bf16), 4 of 18,432 (fp8). kv_bytes: bytes per K / V element, 2 or 1 (e4m3).
constexpr int kMaxStages = 4;
// The pipeline barriers (full and empty per stage) and the producer's row offsets (two per key).
constexpr int bar_bytes() {
  return 2 * kMaxStages * 8;
}
constexpr int row_off_bytes() {
  return kBlockN * 2 * 8;
}
constexpr int row_pitch(int bytes) {
  return bytes + 16;
}
constexpr int stage_bytes(int d, int dv, int kv_bytes = 2) {
  return kBlockN * (row_pitch(d * kv_bytes) + row_pitch(dv * kv_bytes));
}
constexpr int q_bytes(int d, int warps_n) {
  return 16 * (4 / warps_n) * row_pitch(2 * d);
}
constexpr int epi_pitch(int dv) {
  return dv + 4;
}  // floats
constexpr int epi_bytes(int dv) {
  return 64 * epi_pitch(dv) * 4 + 64 * 4;
}
constexpr int num_stages(int d, int dv, int warps_n, int kv_bytes = 2) {
  const int s = (113 * 1024 - q_bytes(d, warps_n) - bar_bytes()) / stage_bytes(d, dv, kv_bytes);
  return s < 2 ? 2 : s > kMaxStages ? kMaxStages : s;
}
constexpr int ring_bytes(int d, int dv, int warps_n, int kv_bytes = 2) {
  const int ring = num_stages(d, dv, warps_n, kv_bytes) * stage_bytes(d, dv, kv_bytes);
  return ring > epi_bytes(dv) ? ring : epi_bytes(dv);
}
constexpr int smem_bytes(int d, int dv, int warps_n, int kv_bytes = 2) {
  return ring_bytes(d, dv, warps_n, kv_bytes) + q_bytes(d, warps_n) + bar_bytes() + row_off_bytes();
}
// CTAs per SM by shared memory, capped by registers. The launch bounds leave a thread 128
// registers at 3 CTAs (a sub-partition's 16384 over 4 of the 15 warps), 168 at 2 and 255 at 1;
// a consumer thread holds O (d_v / 2 registers) and S (kBlockN / warps_n / 2) plus ~64 of
// fragments, addresses and row state. FP8 caches, whose stages are half as large, reach the cap:
// one CTA more than it spilled 60-428 bytes of their loops (hd64 at 4 CTAs, hd96 at 3, hd192 and
// hd256 at 2, on sm_90a). 16-bit caches stay below it.
constexpr int ctas_per_sm(int d, int dv, int warps_n, int kv_bytes = 2) {
  const int n = (228 * 1024) / (smem_bytes(d, dv, warps_n, kv_bytes) + 1024);
  const int regs = dv / 2 + kBlockN / warps_n / 2 + 64;
  const int cap = regs <= 128 ? 3 : regs <= 168 ? 2 : 1;
  return n < 1 ? 1 : n > cap ? cap : n;
}

template <class Params>
bool uses_inference_features(const Params& p) {
  return p.seqused_q != nullptr || p.page_table != nullptr || p.kv_batch_idx != nullptr ||
         p.leftpad_k != nullptr || (p.seqused_k != nullptr && p.cu_seqlens_k == nullptr) ||
         p.num_splits > 1 || p.kv_fp8;
}

// Whether the forward takes the decode kernel: every inference feature is its alone. The learnable
// sink is also the SM90 forward's (Note [learnable sink] in common/softmax.cuh), not yet the
// SM100 forward's (cc_major 10), whose sink problems go here. Plain dense problems with a small
// query block stay on the prefill kernels: the decode kernel ran correctly on an H100 (tree of
// 7136377) but no run has yet timed both kernels on those shapes to choose the boundary; packed,
// they would fit one tile when seqlen_q * heads_q / heads_kv <= kMaxRows.
template <class Params>
bool takes_decode(const Params& p, int cc_major) {
  return uses_inference_features(p) || (p.learnable_sink != nullptr && cc_major != 9);
}

// Note [tma blocks]: the TMA producer (decode/kernel.cuh, variant 3) loads key block n with one
// TMA tile per K and V (two boxes each at hd128: the 128-byte swizzle's box is 64 columns wide)
// when all of its kBlockN rows are keys of the sequence and lie in one page; otherwise (the
// sequence's last, partial block; a block across a page boundary, as leftpad can make) the
// producer gathers it row by row into the same swizzled layout, zero-filling past the
// sequence: TMA would read rows past the sequence's end as they are, and a NaN there times
// P = 0 is NaN. offset_k: the sequence's first key row (varlen offset plus leftpad, or leftpad);
// len_k: its keys. row: the tile's first row in decode_kv_view's tensor (in its page when
// paged); page_slot: which entry of the sequence's page-table row holds that page.
// Note [tma boxes]: a whole block across pages goes by TMA too when the pages are multiples of
// kBoxRows rows and the block starts on a kBoxRows boundary (pages of 16 or 32 rows, as serving
// engines use, and leftpad multiples of 16 at larger pages): then every kBoxRows-row slice lies
// in one page, and the producer loads kBlockN / kBoxRows boxes per tile (boxes), each from its
// own page. Gathered, page 16 ran at 0.85-0.87 of the unpaged cache on an H100 (docs/perf.md).
constexpr int kBoxRows = 16;
struct TmaBlock {
  bool ok = false;
  bool boxes = false;  // ok by kBoxRows-row boxes (Note [tma boxes])
  int row = 0, page_slot = 0;
};
__host__ __device__ inline TmaBlock tma_block(int n, int offset_k, int len_k, int page_size) {
  TmaBlock t;
  const int j0 = n * kBlockN;
  if (j0 + kBlockN > len_k) return t;
  const int row = offset_k + j0;
  if (page_size > 0) {
    t.row = row % page_size;
    t.page_slot = row / page_size;
    if (t.row + kBlockN > page_size) {
      if (page_size % kBoxRows != 0 || row % kBoxRows != 0) return t;
      t.boxes = true;
    }
  } else {
    t.row = row;
  }
  t.ok = true;
  return t;
}

// The size part of tma_eligible: pages of whole boxes, and no kv_batch_idx on a dense cache
// (whose batch count FwdParams does not carry, so no descriptor could bound it).
template <class Params>
bool tma_sizes_fit(const Params& p) {
  return p.page_table != nullptr ? p.page_size % kBoxRows == 0 : p.kv_batch_idx == nullptr;
}

// Whether TMA descriptors can describe the cache (Note [tma blocks], [tma boxes]): tma_sizes_fit
// and 16-byte aligned base and strides (TMA's rule; varlen keys have no batch stride).
template <class Params>
bool tma_eligible(const Params& p) {
  if (!tma_sizes_fit(p)) return false;
  const bool varlen = p.cu_seqlens_k != nullptr && p.page_table == nullptr;
  const int64_t bytes = p.kv_fp8 ? 1 : 2;
  const auto aligned = [varlen, bytes](const void* ptr, int64_t row, int64_t head, int64_t batch) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (row * bytes) % 16 == 0 &&
           (head * bytes) % 16 == 0 && (varlen || (batch * bytes) % 16 == 0);
  };
  return aligned(p.k, p.k_row_stride, p.k_head_stride, p.k_batch_stride) &&
         aligned(p.v, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
}

struct Plan {
  int group = 1;             // heads_q / heads_kv
  int warps_n = 4;           // 4, 2 or 1 (warps_n_for)
  int block_m = 16;          // packed rows per tile
  int m_blocks = 0;          // tiles per (sequence, KV head), for the longest sequence
  int n_blocks = 0;          // key blocks of the longest sequence
  int num_splits = 1;        // key ranges per tile
  int64_t partial_rows = 0;  // query rows with a partial result per split (dense b*s_q, varlen
                             // total_q)
  size_t workspace_bytes() const {
    if (num_splits <= 1) return 0;
    // [split][row][head] fp32 LSEs, padded to 16 bytes, then [split][row][head][d_v] fp32
    // outputs (decode/instance.cuh).
    const size_t slots = size_t(num_splits) * size_t(partial_rows) * size_t(heads_q_);
    return ((slots + 3) / 4 * 4 + slots * size_t(dv_)) * 4;
  }
  int heads_q_ = 0, dv_ = 0;
};

// Note [split heuristic]: the CTAs of one wave are num_sms * ctas_per_sm; base = batch * heads_kv
// * m_blocks tiles. A problem with at least 80 % of a wave already runs unsplit. Otherwise the
// split count is the smallest s (of at most n_blocks / 4 blocks' worth: a split of fewer than 4
// blocks spends more on its prologue and the combine than it gains) whose waves are at least
// 85 % full: base * s / (ceil(base * s / slots) * slots) >= 0.85, preferring one full wave.
// Note [tma split heuristic]: a cache the TMA producer streams (tma_by_sizes) needs no
// wave of CTA slots: one CTA on each of fewer than half the SMs already streams at the HBM rate,
// and every split adds its prologue, more partials and the combine. So such a problem splits
// only while its tiles fill less than 45 % of the SMs, into the fewest splits that reach it.
// Forced splits on an H100 (2026-12-07, graph replays, hd128 32 q heads; docs/perf.md): 128
// tiles 175.9 us unsplit against 180.3 with the wave rule's 2 splits; 64 tiles 93.2 against
// 98.5 (b16 kv8k, 4 kv heads) and 92.6 against 97.7 (b8, 8 kv heads); 32 tiles (b4 kv32k) 261.7
// unsplit, 179.3 at 2 splits, 179.6 at 4, 182.2 with the wave rule. At d = 64 the share is
// 90 % of the SMs (the integer 128 / d times 45 %): a CTA there keeps fewer bytes in flight (its
// ring, 4 stages of 64 rows, is 72 KB against d = 128's 102 KB), so the HBM rate takes more
// CTAs. H100 forced splits at d = 64 (2026-12-07, ebc66af, GB/s): 32 tiles 2577 at 2 splits,
// 2982 at 3 and 4; 16 tiles 2450 at 4, 2767 at 6 (8, which the rule picks, not measured); 64
// tiles 1940 unsplit, 2044 at 2; 128 tiles best unsplit. An e4m3 cache (Note [fp8 fragments])
// takes the 90 % share at every head dim: its hd128 ring holds 72 KB too. H100 forced splits
// (2026-12-07, graph replays, GB/s of its bytes; docs/perf.md): hd128 128 tiles 2462 unsplit
// against 2264 with the wave rule's 2, 64 tiles 1936 at 2 against 1876 at 4, 32 tiles 2888 at 4
// against 2727; hd64 128 tiles 1884 unsplit against 1689 at 3, 256 tiles 2704 unsplit against
// 2159 at 3, 32 tiles 2385 at 4 against 1939. Measured on SM90 only; the sm_100a build takes
// the same rule unmeasured.
// tma_scale: 0 for the wave rule, else the share's multiple of 45 % (tma_split_scale).
inline int heuristic_splits(int64_t base, int n_blocks, int num_sms, int ctas_per_sm,
                            int tma_scale = 0) {
  const int64_t slots = int64_t{num_sms} * ctas_per_sm;
  int max_s = n_blocks / 4;
  if (max_s > kMaxSplits) max_s = kMaxSplits;
  if (tma_scale > 0 && base > 0 && num_sms > 0) {
    // ceil(0.45 tma_scale num_sms)
    const int64_t want = (int64_t{num_sms} * 9 * tma_scale + 19) / 20;
    if (base >= want || max_s <= 1) return 1;
    const int64_t s = (want + base - 1) / base;
    return static_cast<int>(s < max_s ? s : max_s);
  }
  if (base <= 0 || slots <= 0 || base * 5 >= slots * 4) return 1;
  if (max_s <= 1) return 1;
  int best = 1;
  double best_eff = 0.0;
  for (int s = 1; s <= max_s; ++s) {
    const int64_t ctas = base * s;
    const int64_t waves = (ctas + slots - 1) / slots;
    const double eff = double(ctas) / double(waves * slots);
    if (waves == 1 && eff >= 0.85) return s;
    if (eff > best_eff + 1e-9) {
      best_eff = eff;
      best = s;
    }
    if (waves > 1 && best_eff >= 0.85) break;
  }
  return best;
}

// Whether the TMA producer streams this cache, judged from the sizes alone (tma_eligible
// without the pointers' alignment, which fwd_workspace_size may not know): Note [tma split
// heuristic]'s rule applies.
// An e4m3 cache in pages that hold no whole block (boxes, Note [tma boxes]) keeps the wave rule:
// page 16 at b16 kv8k hd128 read 2289 GB/s in its 2 splits, 1765 unsplit (H100, 2026-12-07).
template <class Params>
bool tma_by_sizes(const Params& p) {
  return tma_sizes_fit(p) && !(p.kv_fp8 && p.page_table != nullptr && p.page_size % kBlockN != 0);
}

// Note [tma split heuristic]'s share of the SMs as a multiple of 45 %: 0 where the wave rule
// applies (!tma_by_sizes), 1 at d >= 128, the integer 128 / d below it, at least 2 for e4m3.
template <class Params>
int tma_split_scale(const Params& p) {
  if (!tma_by_sizes(p)) return 0;
  const int scale = p.head_dim > 0 && p.head_dim < 128 ? 128 / p.head_dim : 1;
  return p.kv_fp8 && scale < 2 ? 2 : scale;
}

template <class Params>
Plan make_plan(const Params& p, int num_sms) {
  Plan pl;
  pl.group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  const int64_t rows = int64_t{p.seqlen_q} * pl.group;
  pl.warps_n = warps_n_for(static_cast<int>(rows < kMaxRows ? rows : kMaxRows));
  pl.block_m = 16 * (4 / pl.warps_n);
  pl.m_blocks = static_cast<int>((rows + pl.block_m - 1) / pl.block_m);
  pl.n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  pl.heads_q_ = p.heads_q;
  pl.dv_ = p.head_dim_v;
  pl.partial_rows = p.cu_seqlens_q != nullptr ? int64_t{p.total_q} : int64_t{p.batch} * p.seqlen_q;
  const int64_t base = int64_t{p.batch} * p.heads_kv * pl.m_blocks;
  const int per_sm = ctas_per_sm(p.head_dim, p.head_dim_v, pl.warps_n, p.kv_fp8 ? 1 : 2);
  int s = p.num_splits == 0
              ? heuristic_splits(base, pl.n_blocks, num_sms, per_sm, tma_split_scale(p))
              : p.num_splits;
  if (s > pl.n_blocks) s = pl.n_blocks;
  if (s > kMaxSplits) s = kMaxSplits;
  pl.num_splits = s < 1 ? 1 : s;
  return pl;
}

}  // namespace fa4::decode
