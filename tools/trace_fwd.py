"""Timeline of the SM90 forward from a trace build (Note [fwd trace]):

    FA4_NVCC_EXTRA=-DFA4_TRACE pip install ... -e .    # O (and dV) are wrong in this build
    python3 tools/trace_fwd.py [--seqlen 16384] [--causal] [--hdim 128]

Runs one forward (bf16, the bench's 16k-token shapes: batch 16k / seqlen, heads 2048 / hd),
reads the SM clock marks each CTA wrote over the first rows of O of its last tile, and prints
(medians over CTAs, with the 10th and 90th percentiles):
- per traced iteration, each consumer warpgroup's marks after warpgroup 0's loop top, and the
  iteration period;
- per tile of a CTA, the phases of each warpgroup (tile claim, Q wait, first block, the loop,
  epilogue; at d_v = 256, which stores O from registers, "barrier, TMA store" is those stores)
  and the producer's Q issue against the consumers' marks.
Differences within a warpgroup are exact; between warpgroups (and the producer) the clocks
disagree by more than 100 cycles (csrc/sm90/fwd/trace.cuh, trace_clock).
"""

from __future__ import annotations

import argparse

import torch

import fa4

MAGIC = 0xFA4C10C0  # csrc/sm90/fwd/trace.cuh
TILES, TRACE_TILE, FIRST, ITERS = 6, 2, 1, 6
LOOP_POINTS, TILE_POINTS, PROD_POINTS, WGS = 10, 10, 3, 3
HEADER = 8
LOOP0 = HEADER
TILE0 = LOOP0 + WGS * ITERS * LOOP_POINTS
PROD0 = TILE0 + WGS * TILES * TILE_POINTS
WORDS = PROD0 + TILES * PROD_POINTS
LOOP_MARKS = [
    "top",
    "turn held",
    "K ready",
    "S issued",
    "V ready",
    "S, P·V issued",
    "S done",
    "softmax done",
    "P·V done",
    "end",
]
# (name, from, to) of the tile marks (csrc/sm90/fwd/trace.cuh), each end a (tile, mark) pair:
# tile 0 is tile k, -1 the tile before it.
TILE_PHASES = [
    ("take", (-1, 9), (0, 0)),  # from the previous tile's "stored"
    ("decode (tile_work)", (0, 0), (0, 1)),
    ("Q wait", (0, 1), (0, 2)),
    ("first block's S", (0, 2), (0, 3)),
    ("blocks", (0, 3), (0, 4)),
    ("finalize, scale O", (0, 4), (0, 5)),
    ("staging buffer free", (0, 5), (0, 6)),
    ("stmatrix O", (0, 6), (0, 7)),
    ("barrier, TMA store", (0, 7), (0, 8)),
    ("LSE", (0, 8), (0, 9)),
]
# Note [next tile's first S] (commit c314a0e, withdrawn: docs/decisions.md, 2026-12-02; kept
# for tracing that order again): tile k is taken, decoded and its first S issued before
# tile k-1's last P·V is waited for and its epilogue runs, so "blocks" of tile k also holds tile
# k+1's take, decode, Q wait and S issue.
PIPELINED_TILE_PHASES = [
    ("decode (tile_work)", (0, 0), (0, 1)),
    ("Q wait", (0, 1), (0, 2)),
    ("S issue, k-1's last P·V wait", (0, 2), (-1, 4)),
    ("k-1: scale O", (-1, 4), (-1, 5)),
    ("k-1: staging buffer free", (-1, 5), (-1, 6)),
    ("k-1: stmatrix O", (-1, 6), (-1, 7)),
    ("k-1: barrier, TMA store", (-1, 7), (-1, 8)),
    ("k-1: LSE", (-1, 8), (-1, 9)),
    ("k-1 stored -> first S done", (-1, 9), (0, 3)),
    ("blocks (+ k+1's take, S issue)", (0, 3), (0, 4)),
]


def tile_phases(T: torch.Tensor) -> list:
    """The phase list for one warpgroup's tile marks T (CTAs, tiles, marks): pipelined when tile
    k is taken before tile k-1 is stored."""
    taken_after_stored = phase_cycles(T, (-1, 9), (0, 0)).double().median().item()
    return PIPELINED_TILE_PHASES if taken_after_stored < 0 else TILE_PHASES


def phase_cycles(T: torch.Tensor, start: tuple, end: tuple) -> torch.Tensor:
    """Cycles from mark start to mark end for tiles k = 1.. of T (CTAs, tiles, marks)."""
    n = T.shape[1]
    (t0, m0), (t1, m1) = start, end
    return rel(T[:, 1 + t1 : n + t1, m1], T[:, 1 + t0 : n + t0, m0])


def q(x: torch.Tensor) -> str:
    x = x.double().flatten()
    if x.numel() == 0:
        return "n/a"
    p = torch.quantile(x, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    return f"{p[1]:8.0f}  [{p[0]:.0f}, {p[2]:.0f}]"


def rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a - b for 32-bit clock words, wrap-safe."""
    d = (a - b) % (1 << 32)
    return torch.where(d > (1 << 31), d - (1 << 32), d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--save", help="also write the CTAs' words here (torch.save)")
    ap.add_argument("--load", help="report on words saved by --save instead of running")
    a = ap.parse_args()
    s, d = a.seqlen, a.hdim
    b, h = max(1, 16384 // s), 2048 // d
    title = f"hd{d} s={s} b={b} h={h} causal={a.causal}"
    if a.load:
        w = torch.load(a.load)
    else:
        x = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        for _ in range(2):
            o = fa4.attention(*x, causal=a.causal)
        torch.cuda.synchronize()
        w = cta_words(o.cpu(), d)
        if a.save:
            torch.save(w, a.save)
    report(w, d, title)


def cta_words(o: torch.Tensor, d: int) -> torch.Tensor:
    """The dumped words of each traced CTA, (CTAs, WORDS) int64, from O (b, s, h, d). Tiles are
    128 or 192 rows (hd64 runs both, Note [short causal hd64]): every 64th row is looked at."""
    b, s, h, _ = o.shape
    wpr = d // 2  # 32-bit words per row of O
    o32 = o.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # (b, s, h, d / 2)
    found = []
    for m0 in range(0, s, 64):
        rows = o32[:, m0 : m0 + (WORDS + wpr - 1) // wpr]  # (b, r, h, wpr)
        if rows.shape[1] * wpr < WORDS:
            continue
        w = rows.permute(0, 2, 1, 3).reshape(b * h, -1)[:, :WORDS]
        found.append(w[w[:, 0] == MAGIC])
    return torch.cat(found)


def consumer_wgs(w: torch.Tensor, d: int) -> int:
    """The consumer warpgroups of the traced kernel, from the SM id word's top byte (0 in dumps
    of builds before it was written there: three at hd64, else two)."""
    k = (w[:, 1] >> 24) & 0xFF
    if not bool((k == k[0]).all()):
        raise SystemExit(
            f"the CTAs disagree on their consumer warpgroups: {sorted(set(k.tolist()))}"
        )
    return int(k[0]) or (3 if d <= 64 else 2)


def report(w: torch.Tensor, d: int, title: str):
    n = w.shape[0]
    if n == 0:
        raise SystemExit("no trace found: is this a -DFA4_TRACE build?")
    c0, c1 = w[:, 2], w[:, 5]
    g0 = w[:, 3] + (w[:, 4] << 32)
    g1 = w[:, 6] + (w[:, 7] << 32)
    ghz = (rel(c1, c0).double() / (g1 - g0).double()).median().item()
    loop = w[:, LOOP0:TILE0].reshape(n, WGS, ITERS, LOOP_POINTS)
    tile = w[:, TILE0:PROD0].reshape(n, WGS, TILES, TILE_POINTS)
    prod = w[:, PROD0:WORDS].reshape(n, TILES, PROD_POINTS)
    wgs = consumer_wgs(w, d)
    print(
        f"{title}: {n} CTAs traced, {wgs} consumer warpgroups, SM clock {ghz:.2f} GHz; cycles, "
        "median [p10, p90]"
    )

    # A CTA whose traced tile had fewer blocks, or that ran fewer tiles, left those marks unset
    # (shared-memory garbage): keep the CTAs whose marks all lie within 2^24 cycles of their
    # first one, per section.
    def settled(x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        return (rel(x, first).abs() < (1 << 24)).flatten(1).all(1)

    ok_loop = settled(loop[:, :wgs], loop[:, :1, :1, :1])
    ok_tile = settled(tile[:, :wgs], tile[:, :1, :1, :1]) & settled(prod, tile[:, :1, :1, 0])
    print(
        f"  {int(ok_loop.sum())} CTAs with every traced iteration, {int(ok_tile.sum())} with "
        f"{TILES} tiles"
    )
    loop, tile, prod = loop[ok_loop], tile[ok_tile], prod[ok_tile]
    print(f"\niterations {FIRST}..{FIRST + ITERS - 1} of tile {TRACE_TILE}, after wg0's top:")
    if not bool(ok_loop.any()):
        print(f"  (no CTA's tile {TRACE_TILE} had {FIRST + ITERS} blocks: short tiles)")
    for g in range(wgs):
        for p, name in enumerate(LOOP_MARKS):
            print(f"  wg{g} {name:14s} {q(rel(loop[:, g, :, p], loop[:, 0, :, 0]))}")
    print(f"  period (wg0 top to top)   {q(rel(loop[:, 0, 1:, 0], loop[:, 0, :-1, 0]))}")
    print("  per warpgroup: S wait (turn ended -> S done), softmax, P·V wait, rescale+convert,")
    print("  turn wait (top -> turn held), then the turn: K wait, S issue, V wait, P·V issue")
    for g in range(wgs):
        L = loop[:, g]
        print(f"  wg{g} S wait      {q(rel(L[..., 6], L[..., 5]))}")
        print(f"  wg{g} softmax     {q(rel(L[..., 7], L[..., 6]))}")
        print(f"  wg{g} P·V wait    {q(rel(L[..., 8], L[..., 7]))}")
        print(f"  wg{g} convert     {q(rel(L[..., 9], L[..., 8]))}")
        print(f"  wg{g} turn wait   {q(rel(L[..., 1], L[..., 0]))}")
        print(f"  wg{g} K wait      {q(rel(L[..., 2], L[..., 1]))}")
        print(f"  wg{g} S issue     {q(rel(L[..., 3], L[..., 2]))}")
        print(f"  wg{g} V wait      {q(rel(L[..., 4], L[..., 3]))}")
        print(f"  wg{g} P·V issue   {q(rel(L[..., 5], L[..., 4]))}")
    print("\ntiles 1..5 of a CTA, per warpgroup:")
    for g in range(wgs):
        T = tile[:, g]
        for name, start, end in tile_phases(T):
            print(f"  wg{g} {name:28s} {q(phase_cycles(T, start, end))}")
        print(f"  wg{g} {'tile (stored to stored)':28s} {q(phase_cycles(T, (-1, 9), (0, 9)))}")
    last_pv = torch.maximum(tile[:, 0, :-1, 4], tile[:, wgs - 1, :-1, 4])
    P, T0 = prod[:, 1:], tile[:, 0]
    print("  producer, tile k >= 1:")
    print(f"    Q(k) load begins after wg0 took k-1    {q(rel(P[..., 0], T0[:, :-1, 0]))}")
    print(f"    Q(k) issued after wg0's first S(k-1)   {q(rel(P[..., 1], T0[:, :-1, 3]))}")
    print(f"    Q(k) issued before last P·V(k-1) done  {q(rel(last_pv, prod[:, 1:, 1]))}")
    print(f"    Q(k) issued -> wg0 Q ready(k)          {q(rel(T0[:, 1:, 2], P[..., 1]))}")
    print(f"    last V(k) issued before wg0 stored(k)  {q(rel(T0[:, 1:, 9], P[..., 2]))}")


if __name__ == "__main__":
    main()
