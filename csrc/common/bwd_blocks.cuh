// Arch-neutral pieces of the backward kernels (SM90: sm90/bwd/kernel.cuh, SM100:
// sm100/bwd/kernel.cuh): the Q blocks a kv tile visits and the turn counters of deterministic
// mode (the grid of kv tiles, BwdGrid, is in common/tile_scheduler.cuh). Plain CUDA (no wgmma, no
// tcgen05).
#pragma once

#include <stdint.h>

#include "common/mask.cuh"
#include "common/tile_scheduler.cuh"  // BwdGrid

namespace fa4 {

// The Q blocks (of kBlockM rows) that see kv block n (common/mask.cuh).
template <class T>
__device__ __forceinline__ void q_blocks_seeing(const Mask& mask, int n, int& m_begin, int& m_end) {
  fa4::q_blocks_seeing<T::kBlockM, T::kBlockN>(mask, n, m_begin, m_end);
}

// Note [deterministic dQ]: with FwdParams::deterministic, the kv tiles that see a query block
// (64 rows on SM90, 128 on SM100, which uses the counter of its first 64 rows) add their dQ to it
// in decreasing tile order. The reducer of tile n waits, before its reduce-add, until the block's
// turn counter (BwdWorkspace::sem) equals the number of tiles after it that see the block
// (dq_turn: the range (n, n_end), Note [mask alignment]), and increments it once the add has
// completed. The float adds to each address then happen in one fixed order, so dQ is bitwise
// reproducible. Decreasing order, because every tile walks its Q blocks upwards: under a causal
// mask tile n's first block is its diagonal block n, which no higher tile sees, and block n + j
// is its j-th, the (j-1)-th of tile n + 1; so each tile needs from the tile above it a block that
// tile reached one iteration earlier, and the tiles run skewed by one iteration instead of
// waiting (in increasing order tile n waited for tile n - 1's (j+1)-th iteration, and the waits
// added up along the tiles: 40-58 % of the causal backward's time; docs/decisions.md,
// 2026-11-29). A tile only waits on tiles of higher index, which come earlier in this mode's item
// order (BwdGrid::descending): the grid dispatches them earlier, or the SM90 persistent walk
// claims them earlier (a CTA works its items in claim order, so the earliest unfinished item
// never waits), and the waits cannot deadlock. Only the reducer waits; the consumers run on until
// they need the dQ buffer again.
__device__ __forceinline__ int dq_turn(const BlockRange& br, int n) {
  return br.n_end - 1 - n;
}

// Until the counter has reached `turn`. It then equals turn (no tile before it in the order has
// passed), except in the SM100 head-dim split, whose two CTAs of a tile pass in either order
// (Note [sm100 dQ]): waiting for "at least" serves both.
__device__ __forceinline__ void dq_turn_wait(const int* sem, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(sem) : "memory");
  } while (seen < turn);
}

__device__ __forceinline__ void dq_turn_pass(int* sem) {
  // The reduce-add has completed (wait_group without .read); order it before the release.
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  __threadfence();
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(sem) : "memory");
}

}  // namespace fa4
