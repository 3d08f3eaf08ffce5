// Persistent static tile scheduling for the forward kernels of every architecture: a grid of
// min(num_sms, tiles) CTAs, CTA c taking work items c, c + grid, c + 2 grid, ...; each item is
// one (batch, head, m_block) Q tile. Host-callable, so tests/api/test_shared_headers.py checks that
// every tile is visited exactly once and that the causal order is longest first. The
// backward's grid of kv tiles (BwdGrid) is at the end.
//
//   const TileScheduler sched = TileScheduler::make(...);
//   for (int64_t w = blockIdx.x; w < sched.total(); w += gridDim.x) {
//     const TileCoord t = sched.at(w);
//     ...
//   }
//
// Orders (TileOrder):
// - kMBlockFastest (non-causal): w -> (batch, head, m_block) with m_block fastest, then head,
//   then batch. The CTAs running at one time take consecutive items, i.e. the Q tiles of one or
//   a few heads, and every Q tile of a head reads all of the head's K and V; q heads of one GQA
//   group are adjacent (head = kv_head * group + g), so the group's tiles are consecutive too.
//   132 CTAs at s = 16k (128 Q tiles per head) span 2-3 heads: K and V of d = 128 are 8 MB per
//   head, which the 50 MB L2 of an H100/H200 holds, and HBM reads each K/V block about once
//   instead of once per Q tile.
// - kLongestFirst (causal, Note [LPT order]): Q tile m_block of a causal mask visits m_block + 1
//   (+ the diagonal offset) KV blocks, so costs range over 1..n_m blocks. Static striding in
//   increasing order would give the last CTAs the most expensive tiles at the end; descending
//   order (longest-processing-time first) leaves the cheap tiles for the tail, where they even
//   out. To keep K/V reuse, the (batch, head) pairs are cut into sections of section_heads
//   consecutive pairs (sized by lpt_section_heads so that the section's K and V fit in half the
//   L2): sections in order; within one, m_block descending and the pair fastest. Pure LPT over
//   all heads would run the same m_block of 132 different heads at once: each tile's K/V
//   from HBM, 128 FLOP/byte at d = 128, which caps 4.3 TB/s at ~550 TFLOP/s.
//
// Note [tile order options]: RunOptions::tile_order (TileOrderOptions) changes two things of the
// causal order. "first" puts the partial section (pairs % section) first instead of last: left
// last, its longest tiles are claimed when the other CTAs are finishing the previous section's
// shortest ones, the tail LPT is meant to avoid (at 2k rows, d = 128, b·h = 128: sections of 25
// leave 3 pairs, whose 16-block tiles start at item 2000 of 2048). "wave" caps a section at the
// pairs whose tiles fill the grid once (ctas / m_blocks pairs, at least one GQA group): with 100
// pairs of 4 tiles (512 rows), the CTAs running at one time all hold the section's first tiles,
// which load every K/V block of the section from HBM at once, and later its last tiles, which load
// none. A number caps it at that many pairs; "plain" is the order above with neither. Tokens are
// comma-separated ("first,wave"); any other makes validate() return kInvalid before a launch.
// Empty: Note [default tile order]. Null: the process default, FA4_TILE_ORDER as the process's
// first run_fwd read it (a function-local static in api/dispatch.cu): no later run_fwd reads the
// environment. The torch ops read the variable in Python at every call instead and pass its text
// ("" when unset), so a test may change it between calls of one process (fa4/dispatch.py
// runtime_knobs: its four os.environ lookups cost ~4.5 us of host time a call on a 2-core CI
// machine, most of it the KeyError of each unset variable).
//
// Note [default tile order]: the forward's default is "first,wave,16". On an H100, "first,wave"
// gave the causal forward +10-12 % at 512 rows (d = 64 and 128) against "plain", and the cap of
// 16 pairs on top d = 256 +8 % there (docs/decisions.md, 2026-12-05). It changes only masked
// problems' order; the SM100 forward takes it too (compiled, not executed; a B200's SMs and L2
// differ).
// The backward's default is "first,wave" for every causal problem; unmasked ones keep the plain
// walk (sections cost them up to 15 % at 512 rows). Before it, "l2,first" for d >= 128 (+5 % at
// causal 512, d = 128) cut a GQA pair's sections to one pair wherever the group's Q, dO and dQ
// pass 25 MB (Llama 32:8 or Qwen 28:4 at 8k), which is the plain walk and its tail: the last
// pairs' longest tiles claimed near the end (the tile-order model: makespan 1.50x the even
// spread at Qwen 8k, 1.01x with "wave"). H100, bwd alone (2026-12-07, docs/perf.md): "first,wave"
// against "l2,first" +18 % at Qwen 28:4 8k, +11 % Llama 32:8 8k, +5-6 % at 4 x 4k, +8 % gpt-oss
// 64:8 hd64 8k, +1 % MHA hd128 16k. The deterministic backward keeps the plain walk: under
// "l2,first" it costs 12-13 % at causal 512 (docs/decisions.md, 2026-12-06).
//
// Note [scheduler int64]: the item index is int64. Dense problems cannot reach 2^31 items
// (b·h·s_q <= 2^30 for a bf16 q of d >= 64 in 141 GB, so items <= b·h·(s_q/128 + 1) < 2^31), but
// varlen tiles are counted over max_seqlen_q for every sequence: 10^6 sequences, one of them
// 10^5 tokens long, and 64 heads give 10^6 · 64 · 782 = 5·10^10 items. The int64 divisions cost
// ~100 instructions once per tile, next to ~10^3 clk of MMA for each KV block the tile visits.
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fragment.cuh"
#include "common/mask.cuh"

namespace fa4 {

struct TileCoord {
  int batch, head, m_block;
};

enum class TileOrder : int { kMBlockFastest, kLongestFirst };

// (batch, head) pairs per LPT section: as many GQA groups as fit their K and V (seqlen_k rows of
// d + d_v elements) into half of the L2, the other half left to Q, O and the rest; at least one
// group. E.g. 50 MB L2, s_k = 8k, d = d_v = 128, bf16: 4 MB per kv head, 6 groups.
__host__ __device__ inline int lpt_section_heads(int64_t l2_bytes, int seqlen_k, int head_dim,
                                                 int head_dim_v, int elem_bytes, int group) {
  const int64_t kv_bytes = int64_t(seqlen_k) * (head_dim + head_dim_v) * elem_bytes;
  int64_t groups = kv_bytes > 0 ? (l2_bytes / 2) / kv_bytes : 1;
  groups = groups < 1 ? 1 : (groups > (1 << 20) ? (1 << 20) : groups);
  return static_cast<int>(groups) * group;
}

// Note [tile order options]; the defaults are the order of Note [LPT order].
struct TileOrderOptions {
  bool partial_first = false;  // "first": the section of pairs % section pairs goes first
  bool wave = false;           // "wave": at most ctas / m_blocks pairs (whole groups) a section
  int max_pairs = 0;           // "<n>": at most n pairs a section (rounded up to whole groups)
  bool l2 = false;             // "l2": sections by the L2 (the forward's always are; BwdGrid)
  int slice_heads = 0;         // "heads<n>": n q heads per SM90 backward item at GQA, else 0
  bool given = false;          // the text named walk options ("plain": none): no defaults added
  bool ok = true;              // false: the text had a token other than these

  // Host only: parses a tile order text, RunOptions::tile_order / RunOptions::bwd_tile_order or
  // their variables' (nullptr or "": the defaults; an empty token, as in "wave,", is unknown).
  static TileOrderOptions parse(const char* text) {
    TileOrderOptions o;
    if (text == nullptr || *text == '\0') return o;
    for (const char* t = text;;) {
      const char* end = t;
      while (*end != '\0' && *end != ',') ++end;
      const int n = int(end - t);
      const bool heads = n > 5 && strncmp(t, "heads", 5) == 0;
      const char* number = heads ? t + 5 : t;
      int value = 0;
      bool digits = end > number && end - number < 8;
      for (const char* c = number; c < end && digits; ++c) {
        digits = *c >= '0' && *c <= '9';
        value = value * 10 + (*c - '0');
      }
      o.given = o.given || !heads;
      if (n == 5 && strncmp(t, "first", 5) == 0) {
        o.partial_first = true;
      } else if (n == 4 && strncmp(t, "wave", 4) == 0) {
        o.wave = true;
      } else if (n == 2 && strncmp(t, "l2", 2) == 0) {
        o.l2 = true;
      } else if (n == 5 && strncmp(t, "plain", 5) == 0) {
        // no option: the walk of Note [LPT order] / pair by pair, to measure the defaults against
      } else if (digits && value > 0) {
        (heads ? o.slice_heads : o.max_pairs) = value;
      } else {
        o.ok = false;
      }
      if (*end == '\0') break;
      t = end + 1;  // an empty token after a comma is unknown
    }
    return o;
  }
  // Note [default tile order]: the options when the text names none.
  TileOrderOptions forward_or_default() const {
    TileOrderOptions o = *this;
    if (!given) {
      o.partial_first = o.wave = true;
      o.max_pairs = 16;
    }
    return o;
  }
  TileOrderOptions backward_or_default(bool causal, bool deterministic) const {
    TileOrderOptions o = *this;
    if (!given && causal && !deterministic) o.partial_first = o.wave = true;
    return o;
  }
};

struct TileScheduler {
  int num_batch = 0, num_heads = 0, num_m_blocks = 0;
  TileOrder order = TileOrder::kMBlockFastest;
  int section_heads = 1;  // kLongestFirst: (batch, head) pairs per section, >= 1
  int64_t rotation = 0;   // kLongestFirst: the items of the sections before a partial last one
  int64_t items = 0;      // num_batch · num_heads · num_m_blocks, kept for at()'s rotation

  // num_m_blocks: ceil(seqlen_q / kBlockM), of max_seqlen_q for varlen (the tiles past a
  // sequence's end get an empty BlockRange with no rows, and the CTA moves on). partial_first:
  // Note [tile order options]'s "first", as a rotation of the items: the last section's items
  // first, then the others' from item 0. One add and one compare against the kept item count in
  // at(): the producer decodes there with 32 registers in the three-CTA kernel, and a first
  // section of its own size (a branch, two more live values) or the count recomputed raised its
  // spills from 72 to 76 and 88 bytes (ptxas; tests/sass/test_sass_sm90.py bounds them).
  __host__ __device__ static TileScheduler make(int num_batch, int num_heads, int num_m_blocks,
                                                TileOrder order, int section_heads = 1,
                                                bool partial_first = false) {
    TileScheduler s;
    s.num_batch = num_batch;
    s.num_heads = num_heads;
    s.num_m_blocks = num_m_blocks;
    s.order = order;
    s.section_heads = section_heads < 1 ? 1 : section_heads;
    const int64_t pairs = int64_t(num_batch) * num_heads;
    const int64_t rest = pairs % s.section_heads;
    s.items = pairs * num_m_blocks;
    if (partial_first && order == TileOrder::kLongestFirst && rest != 0) {
      s.rotation = (pairs - rest) * num_m_blocks;
    }
    return s;
  }

  // The forward's scheduler for FwdParams (a template, so this header needs no api/fa4.h): tiles of
  // `tile_rows` query rows (max_seqlen_q for varlen), longest-first for any mask. 50 MB is the
  // H100/H200 L2; B200's is larger, left at 50 MB until a B200 can measure it.
  // ctas: the CTAs the launch may run at once (SMs × CTAs per SM), for opt.wave.
  template <class Params>
  static TileScheduler for_forward(const Params& p, int tile_rows, int elem_bytes, int ctas = 0,
                                   const TileOrderOptions& requested = {}) {
    const TileOrderOptions opt = requested.forward_or_default();
    const int m_blocks = (p.seqlen_q + tile_rows - 1) / tile_rows;
    const bool masked = is_banded(p);
    const int group = p.heads_q / p.heads_kv;
    int section = lpt_section_heads(int64_t(50) << 20, p.seqlen_k, p.head_dim, p.head_dim_v,
                                    elem_bytes, group);
    auto cap = [&](int64_t pairs) {  // whole groups, at least one
      const int64_t g = (pairs + group - 1) / group;
      if (g * group < section) section = static_cast<int>((g < 1 ? 1 : g) * group);
    };
    if (opt.wave && m_blocks > 0 && ctas > 0) cap(ctas / m_blocks / group * group);
    if (opt.max_pairs > 0) cap(opt.max_pairs);
    return make(p.batch, p.heads_q, m_blocks,
                masked ? TileOrder::kLongestFirst : TileOrder::kMBlockFastest, section,
                opt.partial_first);
  }

  __host__ __device__ int64_t total() const { return items; }
  // CTAs to launch: one per SM, fewer when there are fewer tiles (0: nothing to launch).
  __host__ __device__ int grid(int num_sms) const {
    const int64_t t = total();
    return t < num_sms ? static_cast<int>(t) : num_sms;
  }

  // Work item w in [0, total()) -> its tile.
  __host__ __device__ TileCoord at(int64_t w) const {
    int64_t pair;  // batch * num_heads + head
    int m_block;
    if (order == TileOrder::kMBlockFastest) {
      m_block = static_cast<int>(w % num_m_blocks);
      pair = w / num_m_blocks;
    } else {
      // Note [LPT order]: section k holds pairs [k S, k S + S_k), S_k = S except for the last;
      // its items run m_block from num_m_blocks - 1 down, each over the section's pairs. A
      // rotation starts the walk at the last section (Note [tile order options]).
      w += rotation;
      if (w >= items) w -= items;
      const int64_t pairs = int64_t(num_batch) * num_heads;
      const int64_t per_section = int64_t(section_heads) * num_m_blocks;
      const int64_t k = w / per_section;
      const int64_t r = w - k * per_section;
      const int64_t first = k * section_heads;
      const int64_t left = pairs - first;
      const int64_t size = left < section_heads ? left : section_heads;
      m_block = num_m_blocks - 1 - static_cast<int>(r / size);
      pair = first + r % size;
    }
    TileCoord t;
    t.batch = static_cast<int>(pair / num_heads);
    t.head = static_cast<int>(pair - int64_t(t.batch) * num_heads);
    t.m_block = m_block;
    return t;
  }
};

// The backward's grid: (kv tile, kv head, batch) flattened into x with the kv tile fastest, and
// no grid dimension limiting heads or batch. The hardware dispatches blocks in increasing index
// order (SM100), and the SM90 persistent walk claims items so: by default tile 0 first, the
// longest one under a causal mask (it sees every Q block); in deterministic mode the last tile
// first, because each tile waits only on higher tiles (Note [deterministic dQ],
// common/bwd_blocks.cuh).
//
// Note [bwd tile order options]: RunOptions::bwd_tile_order (the SM90 and SM100 backwards take it;
// SM100 launches one CTA or cluster per item, which the hardware starts in item order) walks the
// (batch, kv head) pairs in sections instead of one by one: within a section the kv tile runs
// slowest and the pair fastest, so a section's longest tiles go first, as the forward's Note [LPT
// order]. Pair by pair, the last pair's longest tile is claimed when ~1/pairs of the work is left
// (at 2k rows, d = 128: 16 tiles of 32..2 Q blocks, the first claimed at item 2032 of 2048).
// Sections hold the pairs of a number token, or of "wave" (the pairs whose tiles fill the grid
// once), or of "l2" (the pairs whose Q, dO, fp32 dQ and row statistics fit half the L2: every tile
// of a pair reads its Q / dO rows and adds to its dQ), the smallest of those given; "first" puts
// the partial section first (a rotation, as the forward's); "plain" is one pair per section, the
// walk above. "heads<n>" (SM90 backward, GQA, outside deterministic mode) deals each kv head's
// q heads n per item instead of by BwdGrid::slice_heads (Note [GQA head slices]); it alone
// leaves the other defaults in place. Deterministic mode keeps its guarantee under any of them:
// a tile waits only on higher tiles of its own pair, which come earlier in its section. Empty:
// Note [default tile order]. Null: FA4_BWD_TILE_ORDER as the process's first run_bwd read it; the
// torch ops pass the variable's text at every call instead, as for the forward's Note [tile order
// options].
struct BwdGrid {
  int n_tiles, heads_kv;
  bool descending = false;  // deterministic mode
  int section = 1;          // (batch, kv head) pairs per section, >= 1
  int pairs = 0;            // batch · heads_kv (section > 1 only)
  int rotation = 0;         // items before a partial last section walked first, or 0
  int items = 0;            // n_tiles · pairs (section > 1 only)
  // Note [GQA head slices] (sm90/bwd/kernel.cuh): each kv head's q heads dealt over this many
  // items per kv tile; a "pair" is then a (batch, kv head, slice), slices of a kv head adjacent.
  int slices = 1;

  // The bytes one (batch, kv head) pair's tiles share in L2: its group's Q, dO, dQ's fp32
  // accumulator and LSE and D rows.
  static int64_t pair_bytes(int seqlen_q, int group, int d, int dv) {
    return int64_t(seqlen_q) * group * (d * (2 + 4) + dv * 2 + 2 * int(sizeof(float)));
  }

  // Note [GQA head slices]: q heads per item when the dK/dV accumulators are there. given > 0:
  // TileOrderOptions::slice_heads. Whole groups while a group's pair_bytes fit half the L2;
  // past it, as many heads as fit 10 MiB (H100, fwd+bwd, 2026-12-08: one head at Qwen 28:4 8k
  // 1.06x whole groups and 4 % ahead of two; two at gpt-oss 64:8 hd64 8k; whole groups at 4 x 4k
  // and 8 x 1k, 17 and 4 MB, where one head cost 2 and 8 %).
  static int slice_heads(int seqlen_q, int group, int d, int dv, int given) {
    int h = given;
    if (h <= 0) {
      const int64_t l2 = int64_t(50) << 20;
      const int64_t head = pair_bytes(seqlen_q, 1, d, dv);
      if (head == 0 || pair_bytes(seqlen_q, group, d, dv) <= l2 / 2) return group;
      const int64_t fit = (int64_t(10) << 20) / head;
      h = fit < 1 ? 1 : fit < group ? int(fit) : group;
    }
    return h < group ? h : group;
  }

  // Sections for bwd_tile_order's options; ctas: the items running at once (CTAs, or clusters
  // of the SM100 2-CTA kernel); pair_bytes: pair_bytes() of the problem.
  static BwdGrid make(int n_tiles, int heads_kv, int batch, bool descending, int ctas,
                      const TileOrderOptions& opt, int64_t pair_bytes, int slices = 1) {
    BwdGrid g{n_tiles, heads_kv, descending};
    g.slices = slices;
    const int64_t pairs = int64_t(batch) * heads_kv * slices;
    int64_t s = 0;  // 0: no cap given
    auto cap = [&](int64_t c) { s = s == 0 || c < s ? (c < 1 ? 1 : c) : s; };
    if (opt.max_pairs > 0) cap(opt.max_pairs);
    if (opt.wave && n_tiles > 0) cap(ctas / n_tiles);
    if (opt.l2 && pair_bytes > 0) cap((int64_t(50) << 20) / 2 / pair_bytes);
    if (s <= 1 || pairs <= 1) return g;
    g.section = static_cast<int>(s < pairs ? s : pairs);
    g.pairs = static_cast<int>(pairs);
    g.items = static_cast<int>(pairs * n_tiles);
    const int rest = g.pairs % g.section;
    if (opt.partial_first && rest != 0) g.rotation = (g.pairs - rest) * n_tiles;
    return g;
  }

  // bid < 2^31: a block index (SM100) or an item below BwdKernelParams::tiles (SM90, an int).
  // 32-bit divisions: int64 ones tested the high word and carried a 64-bit slow path, per tile
  // in the SM90 consumers, which decode each tile twice.
  __host__ __device__ void decode(int bid, int& n, int& head_kv, int& b) const {
    int slice;
    decode(bid, n, head_kv, b, slice);
  }
  __host__ __device__ void decode(int bid, int& n, int& head_kv, int& b, int& slice) const {
    int pair;
    if (section <= 1) {
      n = bid % n_tiles;
      pair = bid / n_tiles;
    } else {
      bid = bid < items - rotation ? bid + rotation : bid - (items - rotation);  // no int overflow
      const int per_section = section * n_tiles;
      const int k = bid / per_section;
      const int r = bid - k * per_section;
      const int first = k * section;
      const int size = pairs - first < section ? pairs - first : section;
      n = r / size;
      pair = first + (r - n * size);
    }
    if (descending) n = n_tiles - 1 - n;
    slice = pair % slices;
    pair /= slices;
    head_kv = pair % heads_kv;
    b = pair / heads_kv;
  }
};

}  // namespace fa4
