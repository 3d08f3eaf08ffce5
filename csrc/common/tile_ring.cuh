// Run-time tile claiming for the persistent forward kernels of both architectures (the SM90
// kernel runs it on the H200; the SM100 kernel, compiled, not executed, uses the same code) and
// for the SM90 backward at d <= 128 (Note [persistent bwd], sm90/bwd/common.cuh).
//
// Note [dynamic tiles]: with a static stride (CTA c takes items c, c + grid, ...), the causal
// LPT order hands CTA 0 the most expensive tile of every round: CTAs' shares differ by up to
// 1.8x at hd256 16k (one head per section, 128 tiles per round of 132 CTAs) and 1.2x at hd128
// (simulated with per-tile costs m_block + 2.5 blocks; docs/decisions.md, 2026-11-29). With
// FwdParams::tile_counter set, the producer (the thread that issues the TMA loads) claims each
// next item with one atomicAdd when it has issued the current tile's loads (the consumers still
// have the pipeline's blocks of that tile to compute, which hides the atomic's latency), so
// tiles go to whichever CTA frees up first, in the TileScheduler's order (same L2 reuse). Not
// earlier: claimed when the current tile starts, the SM90 forward lost 14 % at hd256 causal 16k
// (a CTA holding a long tile in reserve; docs/decisions.md, 2026-12-01). It
// hands the items to the other roles through a ring of kTileSlots slots in shared memory: they
// need the item before Q is loaded, and a tile with no KV block loads nothing.
//   full[i]   producer -> every reader, protects items[i] (1 arrival)
//   empty[i]  every reader -> producer, the same slot for its next use (one arrival per
//             reading thread)
// The producer publishes an end marker after its last item. Without a counter the items are the
// static stride, through the same ring. What a slot carries is the kernel's choice: the forward
// kernels of both architectures pass the decoded tile (TileCoord), so that only the load thread
// runs the scheduler's int64 divisions; the SM90 backward passes the item index, which each
// reader decodes (BwdTile::of).
#pragma once

#include <stdint.h>

#include <cutlass/arch/barrier.h>

namespace fa4 {

constexpr int kTileSlots = 2;

// Producer (one thread): this CTA's n-th item (n = 0, 1, ...) into slot n % kTileSlots, once the
// readers released the slot's previous item. full, empty, items: kTileSlots each; Item is
// trivially copyable.
template <class Item>
__device__ __forceinline__ void publish_item(uint64_t* full, uint64_t* empty, Item* items, int n,
                                             const Item& w) {
  const int slot = n % kTileSlots, use = n / kTileSlots;
  // Use u > 0 waits for the readers' u-th release (parity (u - 1) & 1); a slot's first use has
  // nothing to wait for.
  if (use > 0) cutlass::arch::ClusterBarrier::wait(&empty[slot], uint32_t((use - 1) & 1));
  items[slot] = w;
  cutlass::arch::ClusterBarrier::arrive(&full[slot]);
}

// Reader thread: this CTA's n-th item; the slot is released as soon as it is read.
template <class Item>
__device__ __forceinline__ Item take_item(uint64_t* full, uint64_t* empty, const Item* items,
                                          int n) {
  const int slot = n % kTileSlots, use = n / kTileSlots;
  cutlass::arch::ClusterBarrier::wait(&full[slot], uint32_t(use & 1));
  const Item w = items[slot];
  cutlass::arch::ClusterBarrier::arrive(&empty[slot]);
  return w;
}

// The item after w: claimed from the counter (counter[0]), or the static stride.
__device__ __forceinline__ int64_t next_item(int64_t* counter, int64_t w) {
  if (counter == nullptr) return w + gridDim.x;
  return int64_t(atomicAdd(reinterpret_cast<unsigned long long*>(counter), 1ull)) + gridDim.x;
}

// Note [self-resetting tile counter]: the counter is two int64, zero when the kernel starts:
// counter[0] hands out the items, counter[1] counts the CTAs that made their last claim. The last
// CTA to arrive sets both back to zero, so the next kernel on the stream finds them zeroed without
// a memset launched ahead of every call: one stream operation and one allocation fewer per call
// (removing the memset measured no change in GPU time on the H200, docs/decisions.md,
// 2026-12-03). The claiming thread calls this once, after its last next_item. The fences order
// each CTA's claims before its arrival, and all arrivals (hence all claims) before the reset.
__device__ __forceinline__ void finish_claims(int64_t* counter) {
  if (counter == nullptr) return;
  auto* c = reinterpret_cast<unsigned long long*>(counter);
  __threadfence();
  const unsigned long long ctas =
      static_cast<unsigned long long>(gridDim.x) * gridDim.y * gridDim.z;
  if (atomicAdd(c + 1, 1ull) + 1 == ctas) {
    __threadfence();
    atomicExch(c, 0ull);
    atomicExch(c + 1, 0ull);
  }
}

}  // namespace fa4
