"""A model of the causal forward's tile order (Note [LPT order], Note [tile order options] in
csrc/common/tile_scheduler.cuh), for predicting FA4_TILE_ORDER's variants before measuring them.

  python3 tools/tile_order_model.py --seqlen 512            # hd128 causal 512 on an H100
  python3 tools/tile_order_model.py --seqlen 2048 --bw-tbs 4.5
  python3 tools/tile_order_model.py --dir bwd --seqlen 2048 --variants "plain;wave;l2;l2,first"
  python3 tools/tile_order_model.py --dir bwd --seqlen 8192 --heads 28:4 --group-splits 1,7
  python3 tools/tile_order_model.py --dir bwd --seqlen 8192 --heads 28:4 --sections 1,wave

What it models: persistent CTAs claiming items in the scheduler's order (each CTA claims its
next item as it finishes the current one: the producers claim once they have issued the
current tile's last loads, a pipeline's depth before its end, or near its start for tiles no
longer than the K/V stages, which the model does not separate); an item's time is its blocks
(the diagonal block costs mask_factor more) plus a per-tile overhead; its HBM bytes are Q and O
and every K/V block not in an LRU L2 of l2_mb. HBM is shared fluidly: while the running tiles
together ask for more than bw_tbs, all slow down in proportion. Calibrated on the H100 run of
2026-12-05 (docs/decisions.md): 1.67 us per 128 x 128 block at hd128 (663 TFLOP/s non-causal 16k),
1.9 us per tile (516 TFLOP/s non-causal 512), mask factor 1.45 (the SASS count of the masked
block, docs/decisions.md). Its absolute times are rough (it puts the default order at 16k
causal 8 % over the measurement); the differences between orders are the prediction.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict


def sections(pairs: int, section: int, first: int) -> list[int]:
    """Section sizes as TileScheduler::at cuts them: `first` pairs, then `section` each."""
    sizes, done = [], 0
    size = first
    while done < pairs:
        sizes.append(min(size, pairs - done))
        done += sizes[-1]
        size = section
    return sizes


def order(pairs: int, m_blocks: int, section: int, first: int) -> list[tuple[int, int]]:
    """Items (pair, m_block): per section, m_block descending, pair fastest."""
    items, base = [], 0
    for size in sections(pairs, section, first):
        items += [(base + r % size, m_blocks - 1 - r // size) for r in range(size * m_blocks)]
        base += size
    return items


def choose(pairs, m_blocks, l2_section, ctas, opts: str) -> tuple[int, int]:
    """(section, first) for FA4_TILE_ORDER text `opts` (GQA group 1), as for_forward does."""
    section = l2_section
    toks = [t for t in opts.split(",") if t] if opts not in ("", "-", "default") else []
    for t in toks:
        cap = ctas // m_blocks if t == "wave" else (int(t) if t.isdigit() else None)
        if cap is not None:
            section = min(section, max(1, cap))
    rest = pairs % section
    return section, rest if "first" in toks and rest else section


def simulate(items, *, ctas=132, block_us=1.67, tile_us=1.9, mask_factor=1.45, bw_tbs=3.0,
             l2_mb=40.0, rows=128, hdim=128) -> float:  # fmt: skip
    """Makespan (us) of the items, causal with kBlockM = kBlockN = rows (tile m: m + 1 blocks)."""
    kv_bytes = rows * hdim * 2 * 2  # one K and one V block, 16-bit
    qo_bytes = rows * hdim * 2 * 2
    bw = bw_tbs * 1e6  # bytes per us
    lru: OrderedDict = OrderedDict()
    held = [0]
    nxt = [0]

    def fetch(key) -> int:
        if key in lru:
            lru.move_to_end(key)
            return 0
        while held[0] + kv_bytes > l2_mb * 1e6 and lru:
            lru.popitem(last=False)
            held[0] -= kv_bytes
        lru[key] = True
        held[0] += kv_bytes
        return kv_bytes

    def claim():
        if nxt[0] >= len(items):
            return None
        nxt[0] += 1
        return items[nxt[0] - 1]

    running: dict[int, list[float]] = {}  # cta -> [compute us left, bytes left]

    def start(c):
        it = claim()
        if it is None:
            return
        pair, m = it
        work = m * block_us + mask_factor * block_us + tile_us
        moved = qo_bytes + sum(fetch((pair, n)) for n in range(m + 1))
        running[c] = [work, float(moved)]

    for c in range(ctas):
        start(c)
    t = 0.0
    while running:
        demand = sum(b / w for w, b in running.values())
        rate = min(1.0, bw / demand) if demand > 0 else 1.0
        dt = min(w for w, _ in running.values()) / rate
        for v in running.values():
            v[1] -= v[1] / v[0] * rate * dt if v[0] > 0 else 0.0
            v[0] -= rate * dt
        t += dt
        for c in [c for c, v in running.items() if v[0] <= 1e-9]:
            del running[c]
            start(c)
    return t


def bwd_order(pairs: int, n_tiles: int, section: int, first: int) -> list[int]:
    """The backward's kv tiles n in BwdGrid's walk (Note [bwd tile order options]): per section,
    n ascending with the pair fastest; the pairs themselves do not matter to the model."""
    items = []
    for size in sections(pairs, section, first):
        items += [n for n in range(n_tiles) for _ in range(size)]
    return items


def simulate_bwd(tiles: list[int], *, ctas=132, qblock_us=2.35, tile_us=10.7) -> float:
    """Makespan (us) of the causal backward's kv tiles (s_q = s_k, 64-row Q blocks, 128-row kv
    tiles: tile n of n_tiles sees 2 (n_tiles - n) Q blocks), claimed as in simulate() but
    without HBM: the pair's Q / dO stay in L2 when sections are sized by it. Constants from
    the same H100 run: 589 TFLOP/s non-causal 16k, 319 at 512 less ~80 us of pre/postprocess."""
    n_tiles = max(tiles) + 1 if tiles else 0
    items = [2 * (n_tiles - n) * qblock_us + tile_us for n in tiles]
    return simulate_costs(items, ctas)


def simulate_bwd_gqa(
    batch: int,
    heads_q: int,
    heads_kv: int,
    seqlen: int,
    split: int = 1,
    *,
    section: int = 1,
    ctas=132,
    qblock_us=2.35,
    tile_us=10.7,
) -> tuple[float, float]:
    """The causal GQA backward (makespan, ideal) in us: one CTA per (batch, kv head, kv tile)
    loops over every q head of its group (sm90/bwd/kernel.cuh), in BwdGrid's walk of `section`
    pairs (1: pair by pair, each pair's longest tile first); split > 1 models the group's q
    heads dealt over `split` CTAs per tile (each a tile's overhead, the dK / dV reduction not
    counted). ideal: the same work spread evenly over the CTAs."""
    group = heads_q // heads_kv
    n_tiles = seqlen // 128
    pairs = batch * heads_kv * split
    section = max(1, min(section, pairs))
    rest = pairs % section
    tiles = bwd_order(pairs, n_tiles, section, rest if rest else section)
    costs = [2 * (n_tiles - n) * qblock_us * group / split + tile_us for n in tiles]
    return simulate_costs(costs, ctas), sum(costs) / ctas


def simulate_costs(costs: list[float], ctas: int) -> float:
    """Makespan of items of fixed cost, claimed in order, each CTA claiming its next item as it
    finishes the current one."""
    import heapq

    events = [(costs[c], c) for c in range(min(ctas, len(costs)))]
    heapq.heapify(events)
    nxt, end = len(events), 0.0
    while events:
        t, c = heapq.heappop(events)
        end = max(end, t)
        if nxt < len(costs):
            heapq.heappush(events, (t + costs[nxt], c))
            nxt += 1
    return end


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--bw-tbs", type=float, default=3.0, help="HBM TB/s (H100 ~3.0, H200 ~4.5)")
    ap.add_argument("--variants", default="default;first;wave;first,wave;16;first,16")
    ap.add_argument("--dir", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument(
        "--heads", default="", help="bwd, GQA: q:kv heads (one sequence unless --batch)"
    )
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--sections",
        default="1",
        help="bwd, GQA: comma list of pairs per section (a number, or wave: ctas / kv tiles)",
    )
    ap.add_argument("--group-splits", default="1", help="bwd, GQA: CTAs per kv tile to model")
    args = ap.parse_args(argv)
    if args.dir == "bwd" and args.heads:
        hq, hkv = (int(x) for x in args.heads.split(":"))
        print(f"bwd GQA {hq}:{hkv} b={args.batch} s={args.seqlen}")
        for text in args.sections.split(","):
            section = 132 // (args.seqlen // 128) if text == "wave" else int(text)
            for split in (int(x) for x in args.group_splits.split(",")):
                mk, ideal = simulate_bwd_gqa(
                    args.batch, hq, hkv, args.seqlen, split, section=section
                )
                print(
                    f"  section {text} ({section}), group split {split}: makespan {mk:8.1f} us, "
                    f"ideal {ideal:8.1f} us, ratio {mk / ideal:.3f}"
                )
        return
    pairs = 16384 // args.seqlen * (2048 // args.hdim)  # the sweep's b x h (DESIGN.md §6)
    m_blocks = args.seqlen // 128
    if args.dir == "bwd":  # BwdGrid: one pair a section unless given; l2 as BwdGrid::make
        pair_bytes = args.seqlen * (args.hdim * 8 + 8)
        print(f"bwd s={args.seqlen} hd={args.hdim} pairs={pairs}")
        for v in args.variants.split(";"):
            toks = [t for t in v.split(",") if t] if v not in ("", "-", "default") else []
            caps = [132 // m_blocks] if "wave" in toks else []
            caps += [(25 << 20) // pair_bytes] if "l2" in toks else []
            caps += [int(t) for t in toks if t.isdigit()]
            section = min(pairs, max(1, min(caps))) if caps else 1
            rest = pairs % section
            first = rest if "first" in toks and rest else section
            us = simulate_bwd(bwd_order(pairs, m_blocks, section, first))
            print(f"  {v:<14} section {section:>3} first {first:>3}: {us:8.1f} us")
        return
    l2_section = max(1, (25 << 20) // (args.seqlen * 2 * args.hdim * 2))
    print(f"s={args.seqlen} hd={args.hdim} pairs={pairs} L2 section={l2_section}")
    for v in args.variants.split(";"):
        section, first = choose(pairs, m_blocks, l2_section, 132, v)
        us = simulate(order(pairs, m_blocks, section, first), bw_tbs=args.bw_tbs, hdim=args.hdim)
        print(f"  {v:<12} section {section:>3} first {first:>3}: {us:8.1f} us")


if __name__ == "__main__":
    main()
