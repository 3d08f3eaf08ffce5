"""A model of the causal backward's DRAM traffic: which Q, dO and dQ-accumulator blocks (and K/V
tiles) the running CTAs touch, through an LRU L2, for fa4's walk and flash-attn-4's, so that a
walk can be predicted before it is built (docs/perf.md, "Backward against flash-attn-4 under
ncu": fa4 moved 1.0x flash-attn-4's DRAM bytes at MHA and 2.7-5.8x at the GQA points).

  python3 tools/bwd_l2_model.py --seqlen 8192 --heads 28:4            # Qwen-like, hd128
  python3 tools/bwd_l2_model.py --seqlen 8192 --heads 64:8 --hdim 64  # gpt-oss-like
  python3 tools/bwd_l2_model.py --seqlen 8192 --heads 28:4 --walks fa4,fa4-heads1,fa4-heads2

Walks (one batch entry, causal, seqlen_q = seqlen_k, 128-row kv tiles, Q blocks of 64 rows at
d > 64 and 128 at d <= 64, as BwdTraits):
- fa4: persistent CTAs (132) claim kv tiles in BwdGrid's causal walk (sections of "first,wave":
  ctas // n_tiles pairs, at least one; n ascending, pair fastest); a CTA walks its tile's q
  heads one after another (sm90/bwd/kernel.cuh) and, per head, the Q blocks that see the tile:
  the whole group, as in deterministic mode.
- fa4-headsK: the same with each tile's group dealt over items K heads at a time (Note [GQA
  head slices]: K = 2 outside deterministic mode), their dK / dV reduce-added.
- flash-attn-4: a CTA per (q head, kv tile), launched head by head (tiles fastest), one per SM
  at a time, each walking its head's Q blocks.
Time advances in steps of one Q block per running CTA; at each step every running CTA reads its
Q and dO blocks and reduce-adds its dQ block (read on a miss, written back when evicted dirty or
at the end); a tile's K and V are read once as it starts. What misses the LRU of --l2-mb is
DRAM traffic. The model ignores LSE / dPsum rows, dK / dV writes and the preprocess, and treats
the L2 as one fully associative cache with random eviction (--policy lru: a working set a little
past the capacity then misses every access, which the H100 does not show; its L2 is two 25 MB
partitions).

Against the H100's ncu (2026-12-07, docs/perf.md; read + write, defaults): flash-attn-4 0.53 /
0.65 / 0.48 / 0.66 GB measured at Qwen 28:4, Llama 32:8, gpt-oss 64:8 hd64 (8k) and MHA 16k,
0.72 / 0.91 / 0.61 / 0.65 modelled with its dK / dV accumulators (0.50 / 0.60 / 0.48 without);
fa4's whole-group walk 3.06 / 1.79 / 2.43 / 0.66 measured, 4.50 / 1.40 / 1.33 / 0.65 modelled: the
MHA equality and the GQA excess hold, the GQA values within 2x only. Note [GQA head slices] (two
q heads per item, fa4-heads2): 0.65 / 0.78 / 0.59 modelled, not yet measured.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tile_order_model import sections  # noqa: E402  (BwdGrid's section sizes)


class Cache:
    """Bytes through a cache of `capacity` bytes: reads on a miss, dirty write-backs. Eviction
    "lru" (least recently used) or "random" (a seeded uniform pick: a cyclic working set a little
    past the capacity then still hits in proportion, where LRU misses every access)."""

    def __init__(self, capacity: float, policy: str = "random", seed: int = 0):
        if policy not in ("lru", "random"):
            raise ValueError(f"policy {policy!r}: lru or random")
        self.capacity, self.used, self.policy = capacity, 0.0, policy
        self.lines: OrderedDict = OrderedDict()  # key -> [bytes, dirty]
        self.keys: list = []  # random: the resident keys, for O(1) picks
        self.slot: dict = {}
        self.rng = random.Random(seed)
        self.read = self.written = 0.0

    def _evict(self) -> None:
        if self.policy == "lru":
            _, (old, dirty) = self.lines.popitem(last=False)
        else:
            i = self.rng.randrange(len(self.keys))
            key = self.keys[i]
            last = self.keys.pop()
            if i < len(self.keys):
                self.keys[i], self.slot[last] = last, i
            del self.slot[key]
            old, dirty = self.lines.pop(key)
        self.used -= old
        self.written += old if dirty else 0.0

    def touch(self, key, size: float, dirty: bool = False) -> None:
        line = self.lines.get(key)
        if line is None:
            self.read += size
            while self.used + size > self.capacity and self.lines:
                self._evict()
            line = self.lines[key] = [size, False]
            self.used += size
            if self.policy == "random":
                self.slot[key] = len(self.keys)
                self.keys.append(key)
        elif self.policy == "lru":
            self.lines.move_to_end(key)
        line[1] = line[1] or dirty

    def flush(self) -> None:
        self.written += sum(size for size, dirty in self.lines.values() if dirty)


def q_blocks(n: int, n_tiles: int, block_m: int) -> range:
    """The Q blocks that see causal kv tile n (128 rows): from the tile's first row on."""
    per = 128 // block_m
    return range(n * per, n_tiles * per)


def fa4_items(heads_q: int, heads_kv: int, n_tiles: int, ctas: int, heads_per: int) -> list:
    """(kv head, tile n, q heads) in BwdGrid's causal walk with "first,wave" sections; a pair is
    a (kv head, slice of heads_per q heads)."""
    group = heads_q // heads_kv
    slices = [list(range(s, min(s + heads_per, group))) for s in range(0, group, heads_per)]
    pairs = [(kv, sl) for kv in range(heads_kv) for sl in slices]
    section = max(1, min(len(pairs), ctas // n_tiles))
    items, base = [], 0
    for size in sections(len(pairs), section, len(pairs) % section or section):
        for n in range(n_tiles):
            for kv, sl in pairs[base : base + size]:
                items.append((kv, n, [kv * group + g for g in sl]))
        base += size
    return items


def flash_items(heads_q: int, heads_kv: int, n_tiles: int) -> list:
    """(kv head, tile n, [q head]) in the launch order: head by head, tiles fastest."""
    group = heads_q // heads_kv
    return [(h // group, n, [h]) for h in range(heads_q) for n in range(n_tiles)]


def simulate(
    items, *, n_tiles, hdim, block_m, ctas, l2_mb, policy, kv_acc=False
) -> tuple[float, float]:
    """(DRAM read GB, DRAM write GB) of the items run by `ctas` CTAs, each claiming the next item
    when its own ends, one Q block per CTA per step. kv_acc: fp32 dK / dV accumulators (Note [GQA
    head slices], flash-attn-4's dk_accum / dv_accum at GQA) reduce-added by each item as it
    ends; their zeroing and the postprocess that reads them are other kernels, outside the
    count, as in the ncu measurements of the main kernel."""
    cache = Cache(l2_mb * 1e6, policy)
    row = hdim * 2  # bytes of a bf16 row of Q or dO
    acc = 128 * hdim * 4  # one kv tile's fp32 dK (or dV) accumulator
    walks = [
        [(h, m) for h in heads for m in q_blocks(n, n_tiles, block_m)] for _, n, heads in items
    ]
    running: list = []  # [item index, position in its walk]
    nxt = 0
    while nxt < len(items) or running:
        while len(running) < ctas and nxt < len(items):
            kv, n, _ = items[nxt]
            cache.touch(("k", kv, n), 128 * row)
            cache.touch(("v", kv, n), 128 * row)
            running.append([nxt, 0])
            nxt += 1
        for slot in running:
            h, m = walks[slot[0]][slot[1]]
            cache.touch(("q", h, m), block_m * row)
            cache.touch(("do", h, m), block_m * row)
            cache.touch(("dq", h, m), block_m * hdim * 4, dirty=True)
            slot[1] += 1
        for slot in running if kv_acc else ():
            if slot[1] == len(walks[slot[0]]):
                kv, n, _ = items[slot[0]]
                cache.touch(("dkacc", kv, n), acc, dirty=True)
                cache.touch(("dvacc", kv, n), acc, dirty=True)
        running = [s for s in running if s[1] < len(walks[s[0]])]
    cache.flush()
    return cache.read / 1e9, cache.written / 1e9


def run(seqlen, heads_q, heads_kv, hdim, walk, *, ctas=132, l2_mb=50.0, policy="random"):
    n_tiles = seqlen // 128
    block_m = 128 if hdim <= 64 else 64
    if walk == "flash-attn-4":  # GQA: its dk_accum / dv_accum, reduce-added per q head
        items = flash_items(heads_q, heads_kv, n_tiles)
        kv_acc = heads_q > heads_kv
    elif walk == "fa4" or walk.startswith("fa4-heads"):
        group = heads_q // heads_kv
        per = group if walk == "fa4" else int(walk[len("fa4-heads") :])
        items = fa4_items(heads_q, heads_kv, n_tiles, ctas, per)
        kv_acc = per < group
    else:
        raise ValueError(f"walk {walk!r}: fa4, fa4-headsK or flash-attn-4")
    return simulate(
        items, n_tiles=n_tiles, hdim=hdim, block_m=block_m, ctas=ctas, l2_mb=l2_mb, policy=policy,
        kv_acc=kv_acc,
    )  # fmt: skip


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--heads", default="28:4", help="q heads:kv heads")
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--walks", default="fa4,flash-attn-4")
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--l2-mb", type=float, default=50.0)
    ap.add_argument("--policy", choices=("random", "lru"), default="random")
    args = ap.parse_args(argv)
    hq, hkv = map(int, args.heads.split(":"))
    print(
        f"causal {args.seqlen}, heads {hq}:{hkv}, hd{args.hdim}, L2 {args.l2_mb:g} MB {args.policy}"
    )
    for walk in args.walks.split(","):
        r, w = run(args.seqlen, hq, hkv, args.hdim, walk, ctas=args.ctas, l2_mb=args.l2_mb,
                   policy=args.policy)  # fmt: skip
        print(f"  {walk:>14}: DRAM read {r:.2f} GB, write {w:.2f} GB, total {r + w:.2f} GB")


if __name__ == "__main__":
    main()
