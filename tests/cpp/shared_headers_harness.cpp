// Host harness for the kernels' shared headers (csrc/common/mask.cuh, common/softmax.cuh,
// common/tile_scheduler.cuh, exp2_poly.cuh), driven by tests/api/test_shared_headers.py. Built
// with g++ -std=c++17.
//
//   harness mask IN OUT    IN: lines "s_q s_k window_left window_right causal". For each case,
//                          OUT gets (uint8) the s_q x s_k visibility by Mask::is_visible, (int32)
//                          how many elements outside the sequence it calls visible, then per
//                          block shape (MASK_SHAPES) the visibility a kernel would produce:
//                          only the KV blocks of block_range, a mask only where needs_mask
//                          (apply_mask_right from left_end on, apply_mask before it, as the
//                          SM90 forward does; RowMajorFrag rows; for 128 x 128 also QuadFrag
//                          quads), then (int32) n_begin n_end full_begin full_end left_end of
//                          every Q tile.
//   harness sched IN OUT   IN: lines "batch heads s_q s_k causal order section num_sms first"
//                          (first: 0/1, the partial section first). OUT (text): per CTA, its
//                          items in order: "cta batch head m_block cost", cost = KV blocks of the
//                          tile (block_range, 128 x 128).
//   harness order IN OUT   IN: lines "batch heads_q heads_kv s_q s_k ctas FA4_TILE_ORDER" (the
//                          value "-" for unset). OUT (text): per case "ok section rotation"
//                          of TileScheduler::for_forward (128-row tiles, d = d_v = 128, bf16).
//   harness bwdgrid IN OUT IN: lines "n_tiles heads_kv batch descending ctas pair_bytes
//                          FA4_BWD_TILE_ORDER" ("-" for unset). OUT (text): per case "case ok
//                          section rotation", then each item's "n head_kv b" in item order.
//   harness bwdopts IN OUT IN: lines "causal deterministic FA4_BWD_TILE_ORDER" ("-" for
//                          unset). OUT (text): per case "ok first wave l2 max_pairs
//                          slice_heads" of the options the SM90 backward passes BwdGrid::make.
//   harness slices IN OUT  IN: lines "seqlen_q group d dv given". OUT (text): per case the q
//                          heads per item BwdGrid::slice_heads picks (Note [GQA head slices]).
//   harness cover IN OUT   IN: lines "n D1 DV1 ... Dn DVn d dv". OUT (text): per line the
//                          compiled pair cover (common/head_dims.h) picks ("0 0": none) and
//                          admissible_head_dim(d).
//   harness keys IN OUT    IN: lines "s_q s_k window_left window_right causal". OUT (text): per
//                          case, keys_computed of 128-row tiles with 80- and with 64-key blocks.
//   harness attn IN OUT    a whole attention problem (layout in run_attention) through the
//                          headers as a kernel would run it; OUT: out then lse (float32); the
//                          decision counts of Note [conditional rescale] on stdout.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <string>
#include <vector>

#include "exp2_poly.cuh"
#include "common/head_dims.h"
#include "common/mask.cuh"
#include "common/softmax.cuh"
#include "common/tile_scheduler.cuh"

namespace {

FILE* open_or_die(const char* path, const char* mode) {
  FILE* f = std::fopen(path, mode);
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s: %s\n", path, std::strerror(errno));
    std::exit(1);
  }
  return f;
}

template <class T>
void put(FILE* f, const std::vector<T>& v) {
  if (std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) std::exit(1);
}

// ---- mask --------------------------------------------------------------------------------

// Visibility as the kernel produces it with block shape (kBM, kBN): 1 where the element survives.
template <int kBM, int kBN>
void mask_shape(const fa4::Mask& mask, FILE* out) {
  using Frag = fa4::RowMajorFrag<1, kBN>;
  const int s_q = mask.seqlen_q, s_k = mask.seqlen_k;
  const int n_m = (s_q + kBM - 1) / kBM;
  std::vector<uint8_t> vis(size_t(s_q) * s_k, 0);
  std::vector<int32_t> table;
  for (int m = 0; m < n_m; ++m) {
    const fa4::BlockRange br = fa4::block_range<kBM, kBN>(mask, m);
    table.insert(table.end(), {br.n_begin, br.n_end, br.full_begin, br.full_end, br.left_end});
    for (int n = br.n_begin; n < br.n_end; ++n) {
      for (int row = m * kBM; row < (m + 1) * kBM && row < s_q; ++row) {
        float s[Frag::kSize];
        for (float& x : s) x = 0.0f;
        if (br.needs_mask(n) && n >= br.left_end) {
          fa4::apply_mask_right<Frag>(
              s, [&](int) { return mask.row_bounds(row).hi - n * kBN; }, [](int e) { return e; });
        } else if (br.needs_mask(n)) {
          fa4::apply_mask<Frag>(
              s, mask, [&](int) { return row; }, [&](int e) { return n * kBN + e; });
        }
        for (int e = 0; e < kBN && n * kBN + e < s_k; ++e) {
          vis[size_t(row) * s_k + n * kBN + e] = s[e] == 0.0f;
        }
      }
    }
  }
  put(out, vis);
  put(out, table);
}

// The same for 128 x 128 with SM90 accumulator fragments: per 64-row half, warp w, lane t of
// a warpgroup, the rows and columns that common/fragment.cuh's QuadFrag says the lane holds.
void mask_quad(const fa4::Mask& mask, FILE* out) {
  constexpr int kBM = 128, kBN = 128;
  using Frag = fa4::QuadFrag<kBN>;
  const int s_q = mask.seqlen_q, s_k = mask.seqlen_k;
  std::vector<uint8_t> vis(size_t(s_q) * s_k, 0);
  for (int m = 0; m * kBM < s_q; ++m) {
    const fa4::BlockRange br = fa4::block_range<kBM, kBN>(mask, m);
    for (int n = br.n_begin; n < br.n_end; ++n) {
      for (int lane = 0; lane < 128 * kBM / 64; ++lane) {  // 2 halves x 128 threads
        const int half = lane / 128, w = lane % 128 / 32, t = lane % 32;
        auto row_of = [&](int r) { return m * kBM + 64 * half + 16 * w + t / 4 + 8 * r; };
        auto col_of = [&](int e) { return n * kBN + 8 * (e / 2) + 2 * (t % 4) + e % 2; };
        float s[Frag::kSize];
        for (float& x : s) x = 0.0f;
        const int base = n * kBN + 2 * (t % 4);  // col_of(e) - base: a constant per element
        if (br.needs_mask(n) && n >= br.left_end) {
          fa4::apply_mask_right<Frag>(
              s, [&](int r) { return mask.row_bounds(row_of(r)).hi - base; },
              [](int e) { return 8 * (e / 2) + e % 2; });
        } else if (br.needs_mask(n)) {
          fa4::apply_mask<Frag>(s, mask, row_of, col_of);
        }
        for (int r = 0; r < Frag::kRows; ++r) {
          for (int e = 0; e < Frag::kCols; ++e) {
            const int row = row_of(r), col = col_of(e);
            if (row < s_q && col < s_k) vis[size_t(row) * s_k + col] = s[Frag::idx(r, e)] == 0.0f;
          }
        }
      }
    }
  }
  put(out, vis);
}

// q_blocks_seeing against a scan of every Q block's block_range, for every KV block (and one
// past the last), and the contiguity it relies on: mismatches.
template <int kBM, int kBN>
int q_range_mismatches(const fa4::Mask& mask) {
  const int m_blocks = (mask.seqlen_q + kBM - 1) / kBM;
  const int n_blocks = (mask.seqlen_k + kBN - 1) / kBN;
  int bad = 0;
  for (int n = 0; n <= n_blocks; ++n) {
    auto sees = [&](int m) {
      const fa4::BlockRange br = fa4::block_range<kBM, kBN>(mask, m);
      return br.n_begin <= n && n < br.n_end;
    };
    int begin = m_blocks, end = 0;
    for (int m = 0; m < m_blocks; ++m) {
      if (sees(m)) {
        begin = m < begin ? m : begin;
        end = m + 1;
      }
    }
    for (int m = begin; m < end; ++m) bad += !sees(m);
    int got_begin, got_end;
    fa4::q_blocks_seeing<kBM, kBN>(mask, n, got_begin, got_end);
    bad += got_begin != begin || got_end != end;
  }
  return bad;
}

// block_needs_mask against block_range's needs_mask over every Q block and KV blocks 0 to two
// past the last (seen or not): mismatches (Note [block needs mask]).
template <int kBM, int kBN>
int needs_mask_mismatches(const fa4::Mask& mask) {
  int bad = 0;
  const int n_blocks = (mask.seqlen_k + kBN - 1) / kBN;
  for (int m = 0; m * kBM < mask.seqlen_q; ++m) {
    const fa4::BlockRange br = fa4::block_range<kBM, kBN>(mask, m);
    for (int n = 0; n <= n_blocks + 1; ++n) {
      bad += fa4::block_needs_mask<kBM, kBN>(mask, m, n) != br.needs_mask(n);
    }
  }
  return bad;
}

// slice_block_end against a scan of is_visible, for every 64-row slice of every Q block of
// kBM rows (Note [slice block end]): mismatches.
template <int kBM, int kBN>
int slice_end_mismatches(const fa4::Mask& mask) {
  int bad = 0;
  for (int m = 0; m * kBM < mask.seqlen_q; ++m) {
    const fa4::BlockRange br = fa4::block_range<kBM, kBN>(mask, m);
    if (br.empty()) continue;
    for (int r0 = m * kBM; r0 < (m + 1) * kBM && r0 < mask.seqlen_q; r0 += 64) {
      const int r1 = std::min(r0 + 64, mask.seqlen_q) - 1;
      int want = br.n_begin + 1;  // the last block any row of the slice sees, plus one
      for (int i = r0; i <= r1; ++i) {
        for (int j = 0; j < mask.seqlen_k; ++j) {
          if (mask.is_visible(i, j)) want = std::max(want, j / kBN + 1);
        }
      }
      bad += fa4::slice_block_end<kBN>(br, mask, r0, r1) != want;
    }
  }
  return bad;
}

int run_mask(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "wb");
  int s_q, s_k, wl, wr, causal;
  while (std::fscanf(in, "%d %d %d %d %d", &s_q, &s_k, &wl, &wr, &causal) == 5) {
    const fa4::Mask mask = fa4::Mask::make(s_q, s_k, wl, wr, causal != 0);
    std::vector<uint8_t> vis(size_t(s_q) * s_k);
    for (int i = 0; i < s_q; ++i) {
      for (int j = 0; j < s_k; ++j) vis[size_t(i) * s_k + j] = mask.is_visible(i, j);
    }
    put(out, vis);
    // Outside the sequence nothing is visible: rows -1 and [s_q, s_q + 200) (the padding rows of
    // a last Q tile), and columns -1 and s_k of every row; and col_bounds (and, for rows of the
    // sequence, the band test) agrees with is_visible everywhere in that range.
    std::vector<int32_t> outside(1, 0);
    for (int i = -1; i < s_q + 200; ++i) {
      for (int j = -1; j <= s_k; ++j) {
        const bool out_of_range = i < 0 || i >= s_q || j < 0 || j == s_k;
        outside[0] += out_of_range && mask.is_visible(i, j);
        outside[0] += mask.col_bounds(j).contains(i) != mask.is_visible(i, j);
        if (i >= 0 && i < s_q && j >= 0) {  // Note [band test]'s domain, keys past s_k included
          outside[0] +=
              fa4::Mask::in_band(j - i - mask.diag_lo, mask.key_width(j)) != mask.is_visible(i, j);
        }
      }
    }
    outside[0] += q_range_mismatches<128, 128>(mask) + q_range_mismatches<64, 128>(mask) +
                  q_range_mismatches<64, 64>(mask) + q_range_mismatches<128, 176>(mask) +
                  q_range_mismatches<176, 64>(mask);
    outside[0] += needs_mask_mismatches<64, 128>(mask) + needs_mask_mismatches<128, 128>(mask) +
                  needs_mask_mismatches<64, 64>(mask) + needs_mask_mismatches<128, 256>(mask);
    outside[0] += slice_end_mismatches<192, 128>(mask) + slice_end_mismatches<128, 80>(mask) +
                  slice_end_mismatches<128, 64>(mask);
    put(out, outside);
    mask_shape<128, 128>(mask, out);  // MASK_SHAPES in the test, in this order
    mask_shape<64, 128>(mask, out);
    mask_shape<128, 176>(mask, out);
    mask_shape<176, 64>(mask, out);
    mask_quad(mask, out);
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

// ---- scheduler ---------------------------------------------------------------------------

int run_sched(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "w");
  int batch, heads, s_q, s_k, causal, order, section, num_sms, first;
  while (std::fscanf(in, "%d %d %d %d %d %d %d %d %d", &batch, &heads, &s_q, &s_k, &causal, &order,
                     &section, &num_sms, &first) == 9) {
    const fa4::Mask mask = fa4::Mask::make(s_q, s_k, -1, -1, causal != 0);
    const fa4::TileScheduler sched = fa4::TileScheduler::make(
        batch, heads, (s_q + 127) / 128, static_cast<fa4::TileOrder>(order), section, first != 0);
    const int grid = sched.grid(num_sms);
    std::fprintf(out, "case %d %lld\n", grid, static_cast<long long>(sched.total()));
    for (int cta = 0; cta < grid; ++cta) {
      for (int64_t w = cta; w < sched.total(); w += grid) {
        const fa4::TileCoord t = sched.at(w);
        const int cost = fa4::block_range<128, 128>(mask, t.m_block).size();
        std::fprintf(out, "%d %d %d %d %d\n", cta, t.batch, t.head, t.m_block, cost);
      }
    }
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

// The forward's choice of sections under FA4_TILE_ORDER (Note [tile order options]).
struct OrderParams {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int head_dim = 128, head_dim_v = 128;
  int window_left = -1, window_right = -1;
  bool causal = true;
};

// A FA4_TILE_ORDER / FA4_BWD_TILE_ORDER value as the inputs write it ("-": unset).
fa4::TileOrderOptions options_of(const char* text) {
  return fa4::TileOrderOptions::parse(std::strcmp(text, "-") == 0 ? nullptr : text);
}

int run_order(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "w");
  OrderParams p;
  int ctas;
  char text[64];
  while (std::fscanf(in, "%d %d %d %d %d %d %63s", &p.batch, &p.heads_q, &p.heads_kv, &p.seqlen_q,
                     &p.seqlen_k, &ctas, text) == 7) {
    const fa4::TileOrderOptions opt = options_of(text);
    const fa4::TileScheduler s = fa4::TileScheduler::for_forward(p, 128, 2, ctas, opt);
    std::fprintf(out, "%d %d %lld\n", int(opt.ok), s.section_heads,
                 static_cast<long long>(s.rotation));
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

// The backward's walk of its kv tiles (Note [bwd tile order options]).
int run_bwdgrid(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "w");
  int n_tiles, heads_kv, batch, descending, ctas, slices;
  long long pair_bytes;
  char text[64];
  while (std::fscanf(in, "%d %d %d %d %d %lld %63s %d", &n_tiles, &heads_kv, &batch, &descending,
                     &ctas, &pair_bytes, text, &slices) == 8) {
    const fa4::TileOrderOptions opt = options_of(text);
    const fa4::BwdGrid g = fa4::BwdGrid::make(n_tiles, heads_kv, batch, descending != 0, ctas, opt,
                                              pair_bytes, slices);
    std::fprintf(out, "case %d %d %d\n", int(opt.ok), g.section, g.rotation);
    for (int bid = 0; bid < n_tiles * heads_kv * batch * slices; ++bid) {
      int n, h, b, slice;
      g.decode(bid, n, h, b, slice);
      std::fprintf(out, "%d %d %d %d\n", n, h, b, slice);
    }
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

// Note [default tile order]: the backward's options once the defaults are added.
int run_bwdopts(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "w");
  int causal, deterministic;
  char text[64];
  while (std::fscanf(in, "%d %d %63s", &causal, &deterministic, text) == 3) {
    const fa4::TileOrderOptions given = options_of(text);
    const fa4::TileOrderOptions o = given.backward_or_default(causal != 0, deterministic != 0);
    std::fprintf(out, "%d %d %d %d %d %d\n", int(o.ok), int(o.partial_first), int(o.wave),
                 int(o.l2), o.max_pairs, o.slice_heads);
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

int run_slices(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "w");
  int seqlen_q, group, d, dv, given;
  while (std::fscanf(in, "%d %d %d %d %d", &seqlen_q, &group, &d, &dv, &given) == 5) {
    std::fprintf(out, "%d\n", fa4::BwdGrid::slice_heads(seqlen_q, group, d, dv, given));
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

// ---- keys computed (Note [hd256 narrow blocks]) -------------------------------------------

int run_keys(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "w");
  int s_q, s_k, wl, wr, causal;
  while (std::fscanf(in, "%d %d %d %d %d", &s_q, &s_k, &wl, &wr, &causal) == 5) {
    const fa4::Mask mask = fa4::Mask::make(s_q, s_k, wl, wr, causal != 0);
    std::fprintf(out, "%lld %lld\n", static_cast<long long>(fa4::keys_computed<128, 80>(mask)),
                 static_cast<long long>(fa4::keys_computed<128, 64>(mask)));
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

// ---- attention ---------------------------------------------------------------------------

// IN, native byte order: int32 header kHeaderInts, then cu_seqlens_q[batch + 1],
// cu_seqlens_k[batch + 1], seqused_k[batch] (if has_seqused), float32 scale, softcap, tau, then
// float32 q (total_q, heads, d), k (total_k, heads_kv, d), v (total_k, heads_kv, d_v).
enum Header {
  kBatch,
  kHeads,
  kHeadsKv,
  kD,
  kDv,
  kCausal,
  kWinLeft,
  kWinRight,
  kEmu,
  kDegree,
  kFused,  // 1: scores folded as the kernels do (ScoreScale); 0: the model's three steps
  kFp16,   // P rounded to fp16 (else bf16) before P·V
  kHasSeqused,
  kShape,  // 0: 128 x 128, 1: 64 x 176
  kPLog2,  // OnlineSoftmax's kPLog2: P scaled by 2^kPLog2 in the exponent (0 or 8)
  kHeaderInts
};

struct Problem {
  std::vector<int> h, cu_q, cu_k, used;
  float scale, softcap, tau;
  std::vector<float> q, k, v;
};

struct Counts {
  long long rescaled = 0, skipped = 0, rows_first_block = 0;
  long long warp_groups_skipped = 0, warp_groups_total = 0, tiles = 0;
  // Note [stale-max vote]: rows whose keeps_max held, and those where it disagreed with
  // update_max's own decision (kept iff the row had seen a key and was not rescaled).
  long long kept = 0, keep_mismatch = 0;
};

float round_p(float p, bool fp16) {
  if (fp16) return static_cast<float>(static_cast<_Float16>(p));
  uint32_t u;
  std::memcpy(&u, &p, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;  // round to nearest even (P is finite)
  std::memcpy(&p, &u, 4);
  return p;
}

template <int kBM, int kBN, int kEmu, int kDegree, int kPLog2>
void attend(const Problem& pb, std::vector<float>& out, std::vector<float>& lse, Counts& c) {
  using Frag = fa4::RowMajorFrag<1, kBN>;
  const std::vector<int>& h = pb.h;
  const int heads = h[kHeads], group = h[kHeads] / h[kHeadsKv], d = h[kD], dv = h[kDv];
  const int total_q = pb.cu_q.back();
  const fa4::ScoreScale ss = fa4::ScoreScale::make(pb.scale, pb.softcap);
  const float c_log2 = h[kFused] ? ss.scale_log2 : 1.0f;
  for (int b = 0; b < h[kBatch]; ++b) {
    const fa4::SeqInfo si = fa4::SeqInfo::get(b, pb.cu_q.data(), pb.cu_k.data(),
                                              h[kHasSeqused] ? pb.used.data() : nullptr, 0, 0);
    const fa4::Mask mask =
        fa4::Mask::make(si.seqlen_q, si.seqlen_k, h[kWinLeft], h[kWinRight], h[kCausal] != 0);
    for (int head = 0; head < heads; ++head) {
      const int kvh = head / group;
      const float* kb = pb.k.data() + (size_t(si.offset_k) * h[kHeadsKv] + kvh) * d;
      const float* vb = pb.v.data() + (size_t(si.offset_k) * h[kHeadsKv] + kvh) * dv;
      for (int m = 0; m * kBM < si.seqlen_q; ++m) {
        const fa4::BlockRange br = fa4::block_range<kBM, kBN>(mask, m);
        c.tiles += br.size();
        const int rows = std::min(kBM, si.seqlen_q - m * kBM);
        std::vector<fa4::OnlineSoftmax<Frag, kPLog2>> st(rows);
        for (auto& x : st) x.init();
        std::vector<float> o(size_t(rows) * dv, 0.0f), pv(dv);
        for (int n = br.n_begin; n < br.n_end; ++n) {
          bool decides[kBM / 32] = {}, rescales[kBM / 32] = {};
          for (int i = 0; i < rows; ++i) {
            const int row = m * kBM + i;
            const float* qr = pb.q.data() + (size_t(si.offset_q + row) * heads + head) * d;
            float s[Frag::kSize];
            for (int e = 0; e < kBN; ++e) {
              const int col = n * kBN + e;
              float acc = 0.0f;  // padding columns: zero K, as the model pads
              for (int x = 0; col < si.seqlen_k && x < d; ++x) {
                acc += qr[x] * kb[size_t(col) * h[kHeadsKv] * d + x];
              }
              s[e] = acc;
            }
            if (h[kFused]) {
              if (ss.softcap) fa4::apply_softcap<Frag>(s, ss.pre);
            } else {  // fa4/reference.py _scores, then · 1/ln 2
              for (float& x : s) {
                x *= pb.scale;
                if (pb.softcap > 0.0f) x = std::tanh(x / pb.softcap) * pb.softcap;
                x *= fa4::kLog2e;
              }
            }
            if (br.needs_mask(n)) {
              fa4::apply_mask<Frag>(
                  s, mask, [&](int) { return row; }, [&](int e) { return n * kBN + e; });
            }
            float o_scale[1], m_loc[1];
            const bool seen = st[i].row_max[0] != -INFINITY;
            st[i].local_max(s, m_loc);
            const bool keep = st[i].keeps_max(m_loc, c_log2, pb.tau);
            const fa4::RowDecisions dec = st[i].update_max_local(m_loc, c_log2, pb.tau, o_scale);
            c.kept += keep;
            c.keep_mismatch += keep != (seen && !(dec.rescaled & 1));
            c.rows_first_block += dec.first & 1;
            c.rescaled += dec.rescaled & 1;
            c.skipped += dec.skipped & 1;
            decides[i / 32] |= ((dec.rescaled | dec.skipped) & 1) != 0;
            rescales[i / 32] |= dec.any_rescaled();
            st[i].template exp2_and_sum<kEmu, kDegree>(s, c_log2);
            std::fill(pv.begin(), pv.end(), 0.0f);
            for (int e = 0; e < kBN && n * kBN + e < si.seqlen_k; ++e) {
              const float p = round_p(s[e], h[kFp16] != 0);
              const float* vr = vb + size_t(n * kBN + e) * h[kHeadsKv] * dv;
              for (int x = 0; x < dv; ++x) pv[x] += p * vr[x];
            }
            for (int x = 0; x < dv; ++x)
              o[size_t(i) * dv + x] = o[size_t(i) * dv + x] * o_scale[0] + pv[x];
          }
          for (int w = 0; w < kBM / 32; ++w) {
            c.warp_groups_total += decides[w];
            c.warp_groups_skipped += decides[w] && !rescales[w];
          }
        }
        for (int i = 0; i < rows; ++i) {
          float inv_l[1], row_lse[1];
          st[i].finalize(inv_l, row_lse);
          const size_t t = size_t(si.offset_q + m * kBM + i);
          for (int x = 0; x < dv; ++x)
            out[(t * heads + head) * dv + x] = o[size_t(i) * dv + x] * inv_l[0];
          lse[size_t(head) * total_q + t] = row_lse[0];
        }
      }
    }
  }
}

template <int kBM, int kBN, int kEmu_, int kDegree_, int kPLog2_ = 0>
bool try_case(const Problem& pb, std::vector<float>& out, std::vector<float>& lse, Counts& c) {
  if (pb.h[kEmu] != kEmu_ || pb.h[kDegree] != kDegree_ || pb.h[kPLog2] != kPLog2_) return false;
  attend<kBM, kBN, kEmu_, kDegree_, kPLog2_>(pb, out, lse, c);
  return true;
}

// The (emulated sixteenths, polynomial degree, P's log2 scale) triples the tests use.
template <int kBM, int kBN>
bool dispatch_emu(const Problem& pb, std::vector<float>& out, std::vector<float>& lse, Counts& c) {
  const bool ok =
      try_case<kBM, kBN, 0, 3>(pb, out, lse, c) || try_case<kBM, kBN, 3, 3>(pb, out, lse, c) ||
      try_case<kBM, kBN, 4, 3>(pb, out, lse, c) || try_case<kBM, kBN, 16, 3>(pb, out, lse, c) ||
      try_case<kBM, kBN, 4, 2>(pb, out, lse, c) || try_case<kBM, kBN, 16, 5>(pb, out, lse, c) ||
      try_case<kBM, kBN, 0, 3, 8>(pb, out, lse, c) || try_case<kBM, kBN, 4, 3, 8>(pb, out, lse, c);
  if (!ok) {
    std::fprintf(stderr, "emu %d / degree %d / plog2 %d not instantiated\n", pb.h[kEmu],
                 pb.h[kDegree], pb.h[kPLog2]);
  }
  return ok;
}

int run_attention(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "rb");
  Problem pb;
  auto read = [&](auto& vec, size_t n) {
    vec.resize(n);
    if (std::fread(vec.data(), sizeof(vec[0]), n, in) != n) std::exit(1);
  };
  read(pb.h, kHeaderInts);
  const int batch = pb.h[kBatch];
  read(pb.cu_q, batch + 1);
  read(pb.cu_k, batch + 1);
  if (pb.h[kHasSeqused]) read(pb.used, batch);
  std::vector<float> f;
  read(f, 3);
  pb.scale = f[0], pb.softcap = f[1], pb.tau = f[2];
  const size_t tq = pb.cu_q.back(), tk = pb.cu_k.back();
  read(pb.q, tq * pb.h[kHeads] * pb.h[kD]);
  read(pb.k, tk * pb.h[kHeadsKv] * pb.h[kD]);
  read(pb.v, tk * pb.h[kHeadsKv] * pb.h[kDv]);
  std::fclose(in);

  std::vector<float> out(tq * pb.h[kHeads] * pb.h[kDv], NAN), lse(tq * pb.h[kHeads], NAN);
  Counts c;
  const bool ok = pb.h[kShape] == 0 ? dispatch_emu<128, 128>(pb, out, lse, c)
                                    : dispatch_emu<64, 176>(pb, out, lse, c);
  if (!ok) return 2;
  FILE* o = open_or_die(out_path, "wb");
  put(o, out);
  put(o, lse);
  if (std::fclose(o) != 0) return 1;
  std::printf("rescaled %lld\nskipped %lld\nrows_first_block %lld\n", c.rescaled, c.skipped,
              c.rows_first_block);
  std::printf("warp_groups_skipped %lld\nwarp_groups_total %lld\ntiles %lld\n",
              c.warp_groups_skipped, c.warp_groups_total, c.tiles);
  std::printf("kept %lld\nkeep_mismatch %lld\n", c.kept, c.keep_mismatch);
  return 0;
}

}  // namespace

// ---- padded head dims -------------------------------------------------------------------------

int run_cover(const char* in_path, const char* out_path) {
  FILE* in = open_or_die(in_path, "r");
  FILE* out = open_or_die(out_path, "w");
  int n;
  while (std::fscanf(in, "%d", &n) == 1) {
    std::vector<fa4::HeadDims> list(n);
    for (auto& k : list) {
      if (std::fscanf(in, "%d %d", &k.d, &k.dv) != 2) return 2;
    }
    int d, dv;
    if (std::fscanf(in, "%d %d", &d, &dv) != 2) return 2;
    const fa4::HeadDims k = fa4::cover(list.data(), n, d, dv);
    std::fprintf(out, "%d %d %d\n", k.d, k.dv, int(fa4::admissible_head_dim(d)));
  }
  std::fclose(in);
  return std::fclose(out) == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 4) {
    const std::string mode = argv[1];
    if (mode == "mask") return run_mask(argv[2], argv[3]);
    if (mode == "cover") return run_cover(argv[2], argv[3]);
    if (mode == "sched") return run_sched(argv[2], argv[3]);
    if (mode == "order") return run_order(argv[2], argv[3]);
    if (mode == "bwdgrid") return run_bwdgrid(argv[2], argv[3]);
    if (mode == "bwdopts") return run_bwdopts(argv[2], argv[3]);
    if (mode == "slices") return run_slices(argv[2], argv[3]);
    if (mode == "keys") return run_keys(argv[2], argv[3]);
    if (mode == "attn") return run_attention(argv[2], argv[3]);
  }
  std::fprintf(stderr, "usage: shared_headers_harness mask|sched|keys|attn IN OUT\n");
  return 2;
}
