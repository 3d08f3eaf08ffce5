// Note [fwd trace]: a measurement build of the SM90 forward (nvcc -DFA4_TRACE, e.g. through
// FA4_NVCC_EXTRA) records the SM clock at fixed places of each CTA's first kFwdTraceTiles tiles
// (per consumer warpgroup and for the producer thread) and of iterations [kFwdTraceFirst,
// kFwdTraceFirst + kFwdTraceIters) of its tile kFwdTraceTile, and writes the words over the first
// rows of O of the CTA's last tile once its stores have completed, where tools/trace_fwd.py reads
// them back: where a block's and a tile boundary's cycles go, which the profiler's per-kernel
// counters cannot give (the backward records Note [bwd trace] in the same build). Such a build's O
// is wrong by design and only dense problems are traced (with the register-store epilogue of d_v =
// 256 the staging marks coincide); without the macro every call here compiles to nothing.
#pragma once

#include <stdint.h>

#include <cutlass/arch/barrier.h>

namespace fa4::sm90 {

constexpr int kFwdTraceTiles = 6;  // tile-level marks of the CTA's first tiles
constexpr int kFwdTraceTile = 2;   // the tile whose iterations are traced
constexpr int kFwdTraceFirst = 1;  // first traced iteration (0 is the tile's first block)
constexpr int kFwdTraceIters = 6;
// Loop marks: top, turn held, K ready, S issued, V ready, S and P·V issued (turn ended), S done,
// softmax done, P·V done, end.
constexpr int kFwdLoopPoints = 10;
// Tile marks: taken, decoded, Q ready, first S done, last P·V done, O scaled, staging buffer free,
// O staged, TMA store issued, stored (LSE written).
constexpr int kFwdTilePoints = 10;
constexpr int kFwdProdPoints = 3;  // Q load begins (before its slot wait), Q issued, last V issued
constexpr int kFwdTraceWGs = 3;    // consumer warpgroups (three at hd 64)
constexpr uint32_t kFwdTraceMagic = 0xFA4C10C0u;
// Word layout of the dump: magic, SM id (bits 0-23) with the number of consumer warpgroups (bits
// 24-31: hd64 runs three or, in the three-CTA kernel, one: Note [short causal hd64]), clock and
// %globaltimer (low, high) at the consumers' start and end (the clock rate), then loop, tile and
// producer marks in struct order.
constexpr int kFwdHeaderWords = 8;
constexpr int kFwdLoopWords = kFwdTraceWGs * kFwdTraceIters * kFwdLoopPoints;
constexpr int kFwdTileWords = kFwdTraceWGs * kFwdTraceTiles * kFwdTilePoints;
constexpr int kFwdProdWords = kFwdTraceTiles * kFwdProdPoints;
constexpr int kFwdTraceWords = kFwdHeaderWords + kFwdLoopWords + kFwdTileWords + kFwdProdWords;

// %clock as each warpgroup's leader reads it. Compare marks within a warpgroup: across warpgroups
// they disagree by more than 100 cycles (a trace had warpgroup 1 past its turn barrier before
// warpgroup 0, by its own clock, had arrived there).
__device__ __forceinline__ uint32_t trace_clock() {
  uint32_t c;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
  return c;
}

__device__ __forceinline__ uint64_t trace_globaltimer() {
  uint64_t c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c));
  return c;
}

struct FwdTrace {
#ifdef FA4_TRACE
  uint32_t header[kFwdHeaderWords];
  uint32_t loop[kFwdTraceWGs][kFwdTraceIters][kFwdLoopPoints];
  uint32_t tile[kFwdTraceWGs][kFwdTraceTiles][kFwdTilePoints];
  uint32_t prod[kFwdTraceTiles][kFwdProdPoints];
  void* last_o;  // the CTA's last stored tile (set_last_tile), where dump writes
  int last_rows;
#endif
  __device__ __forceinline__ void loop_mark(bool leader, int wg, int tile, int i, int p) {
#ifdef FA4_TRACE
    const uint32_t c = trace_clock();
    if (leader && tile == kFwdTraceTile && i >= kFwdTraceFirst &&
        i < kFwdTraceFirst + kFwdTraceIters)
      loop[wg][i - kFwdTraceFirst][p] = c;
#endif
  }
  __device__ __forceinline__ void tile_mark(bool leader, int wg, int tile, int p) {
#ifdef FA4_TRACE
    const uint32_t c = trace_clock();
    if (leader && tile < kFwdTraceTiles) this->tile[wg][tile][p] = c;
#endif
  }
  __device__ __forceinline__ void prod_mark(int tile, int p) {
#ifdef FA4_TRACE
    const uint32_t c = trace_clock();
    if (tile < kFwdTraceTiles) prod[tile][p] = c;
#endif
  }
  // Consumer thread 0 at the consumers' start (k = 0) and end (k = 1).
  __device__ __forceinline__ void clock_mark(bool who, int k) {
#ifdef FA4_TRACE
    const uint32_t c = trace_clock();
    const uint64_t g = trace_globaltimer();
    if (!who) return;
    header[2 + 3 * k] = c;
    header[3 + 3 * k] = uint32_t(g);
    header[4 + 3 * k] = uint32_t(g >> 32);
#endif
  }
  // Before the kernel's first __syncthreads, by one thread.
  __device__ __forceinline__ void init() {
#ifdef FA4_TRACE
    last_o = nullptr;
#endif
  }
  // Consumer thread 0 after each dense tile it stored.
  __device__ __forceinline__ void set_last_tile(bool who, void* o_tile, int rows_valid) {
#ifdef FA4_TRACE
    if (who) {
      last_o = o_tile;
      last_rows = rows_valid;
    }
#endif
  }
  // By every consumer thread after its last tile: the TMA stores must have completed (not only
  // read shared memory) before thread 0 overwrites the tile's first rows (row_stride in bytes,
  // words_per_row = d_v / 2: 16-bit elements).
  __device__ __forceinline__ void dump(int64_t row_stride, int words_per_row, int tid,
                                       int consumer_threads, uint32_t barrier) {
#ifdef FA4_TRACE
    static_assert(sizeof(uint32_t) * kFwdTraceWords ==
                      sizeof(header) + sizeof(loop) + sizeof(tile) + sizeof(prod),
                  "the dump reads the mark arrays as one");
    if (tid % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    cutlass::arch::NamedBarrier::sync(consumer_threads, barrier);
    if (tid != 0 || last_o == nullptr || last_rows * words_per_row < kFwdTraceWords) return;
    char* o_tile = static_cast<char*>(last_o);
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    header[0] = kFwdTraceMagic;
    header[1] = sm | uint32_t(consumer_threads / 128) << 24;
    const uint32_t* src = header;
    for (int j = 0; j < kFwdTraceWords; ++j)
      reinterpret_cast<uint32_t*>(o_tile + (j / words_per_row) * row_stride)[j % words_per_row] =
          src[j];
    last_o = nullptr;
#endif
  }
};

}  // namespace fa4::sm90
