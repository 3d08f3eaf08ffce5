// Note [bwd trace]: in a measurement build (nvcc -DFA4_TRACE, e.g. through FA4_NVCC_EXTRA; the
// forward records its own marks in the same build, Note [fwd trace]) the SM90 backward records
// the SM clock at kTracePoints places of iterations [kTraceFirst, kTraceFirst + kTraceIters) of
// the d <= 128 main loop, for each consumer warpgroup (its first thread) and the dQ reducer, and
// writes the words over the first rows of the CTA's dV tile after the epilogue, where
// tools/trace_bwd.py reads them back: a timeline of where a block's cycles go, which the
// profiler's per-kernel counters cannot give. Such a build's dV is wrong by design; without the
// macro every call here compiles to nothing.
#pragma once

#include <stdint.h>

#include <cutlass/arch/barrier.h>

namespace fa4::sm90 {

constexpr int kTraceFirst = 8;  // skip the pipeline fill
constexpr int kTraceIters = 4;
constexpr int kTracePoints = 10;  // consumer marks per iteration; the reducer uses the first 2
constexpr int kTraceRows = 3;     // warpgroup 0, warpgroup 1, the reducer
constexpr int kLoopWords = kTraceRows * kTraceIters * kTracePoints;
// CTA-level marks, %globaltimer (ns, one clock for every SM) at: 0 entry, 1 barriers initialised,
// 2 K and V landed, 3 first Q and dO ready, 4 warpgroup 0's loop done, 5 its dK/dV stores issued,
// 6 the reducer's last reduce-add read, 7 warpgroup 1's loop done, 8 the producer starts waiting
// for the K/V buffer (kv_empty), 9 it has issued K and V; then the SM id. Per item of the
// persistent grid (Note [persistent bwd]): each item's words go over its own dV tile, and for a
// CTA's later items 0 and 1 are both the item's start (consumer thread 0 took it). Marks 8 and 9
// are kept per item parity: the producer reaches the next item's before this one's dump.
constexpr int kCtaMarks = 10;
constexpr int kConsumerMarks = 8;  // 0..7 in cta[]; 8, 9 in producer[item & 1]
constexpr int kCtaWord0 = 128;     // 64-bit aligned, after the loop marks
constexpr int kTraceWords = kCtaWord0 + 2 * kCtaMarks + 1;
constexpr int kTraceThreads = 256 + 32;  // the consumers and the reducer warp meet before the dump

struct BwdTrace {
#ifdef FA4_TRACE
  uint32_t t[kTraceRows][kTraceIters][kTracePoints];
  uint64_t cta[kConsumerMarks];
  uint64_t producer[2][kCtaMarks - kConsumerMarks];
#endif
  __device__ __forceinline__ void mark(bool leader, int row, int i, int p) {
#ifdef FA4_TRACE
    uint32_t c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    if (leader && i >= kTraceFirst && i < kTraceFirst + kTraceIters) t[row][i - kTraceFirst][p] = c;
#endif
  }
  __device__ __forceinline__ void cta_mark(bool who, int k) {
#ifdef FA4_TRACE
    uint64_t c;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c));
    if (who) cta[k] = c;
#endif
  }
  // The producer thread's mark k (8 or 9) for its item `item` (counted per CTA).
  __device__ __forceinline__ void producer_mark(int item, int k) {
#ifdef FA4_TRACE
    uint64_t c;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c));
    producer[item & 1][k - kConsumerMarks] = c;
#endif
  }
  // The reducer warp's side of dump's barrier, after its last mark.
  __device__ __forceinline__ void reducer_done(uint32_t barrier) {
#ifdef FA4_TRACE
    cutlass::arch::NamedBarrier::sync(kTraceThreads, barrier);
#endif
  }
  // After the epilogue, by consumer thread 0 once every consumer and the reducer passed
  // `barrier` (so that no dV store of the epilogue lands after these and every mark is in):
  // word j at row j / 64, 32-bit column j % 64 of the tile (dV rows are >= 128 bytes: d_v >= 64
  // elements of 2 bytes).
  template <class Element>
  __device__ __forceinline__ void dump(Element* dv_tile, int64_t row_stride, int rows_valid,
                                       int tid, uint32_t barrier, int item) {
#ifdef FA4_TRACE
    cutlass::arch::NamedBarrier::sync(kTraceThreads, barrier);
    if (tid != 0 || rows_valid * 64 < kTraceWords) return;
    auto word = [&](int j) -> uint32_t& {
      return reinterpret_cast<uint32_t*>(dv_tile + (j / 64) * row_stride)[j % 64];
    };
    for (int j = 0; j < kLoopWords; ++j) word(j) = (&t[0][0][0])[j];
    for (int k = 0; k < kCtaMarks; ++k) {
      const uint64_t c = k < kConsumerMarks ? cta[k] : producer[item & 1][k - kConsumerMarks];
      word(kCtaWord0 + 2 * k) = uint32_t(c);
      word(kCtaWord0 + 2 * k + 1) = uint32_t(c >> 32);
    }
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    word(kCtaWord0 + 2 * kCtaMarks) = sm;
#endif
  }
};

}  // namespace fa4::sm90
