"""Timeline of the SM90 backward's main loop from a trace build (Note [bwd trace]):

    FA4_NVCC_EXTRA=-DFA4_TRACE pip install ... -e .    # dV (and O) are wrong in this build
    python3 tools/trace_bwd.py [--seqlen 16384] [--batch 1] [--causal]

Runs one backward (hd128, bf16, heads 16), reads the SM clock marks every CTA wrote over the
first rows of its dV tile, and prints, per mark, the median over CTAs and traced iterations of
its time after the iteration's first mark of warpgroup 0 (so warpgroup 1 and the reducer are
placed on warpgroup 0's timeline), and the median iteration period.
"""

from __future__ import annotations

import argparse

import torch

import fa4

FIRST, ITERS, POINTS, ROWS = 8, 4, 10, 3  # csrc/sm90/bwd/trace.cuh
LOOP_WORDS = ROWS * ITERS * POINTS
CTA_MARKS, CTA_WORD0 = 10, 128
WORDS = CTA_WORD0 + 2 * CTA_MARKS + 1
CTA_PHASES = [  # (name, from mark, to mark) of Note [bwd trace]'s CTA-level marks
    ("barrier init", 0, 1),
    ("K, V landed", 1, 2),
    ("first Q, dO ready", 2, 3),
    ("loop (warpgroup 0)", 3, 4),
    ("dK, dV stores issued", 4, 5),
    ("last reduce-add done", 4, 6),
    ("producer: K/V buffer wait", 8, 9),
    ("K/V issued to landed", 9, 2),
]
MARKS = [
    "loop top",
    "Q ready",  # and dO where it is not waited for a block early (Note [early dPᵀ], hd64)
    "S, dP done",
    "P, dS done",
    "dV issued, dS stored",
    "dS barrier passed",
    "dV, dQ done",
    "dQ buffer free",
    "dQ stored",
    "next dP issued, dK done",
]


def words_from_dv(g, n_tile=128):
    """Each tile's dump (Note [bwd trace]: word j at row j // 64, 32-bit column j % 64 of its dV
    tile) from dV (b, s, h, d), as int64 rows (tiles, WORDS); tiles in (b, tile, h) order."""
    b, s, h, d = g.shape
    tiles = s // n_tile
    rows = (WORDS + 63) // 64
    x = g[:, : tiles * n_tile].reshape(b, tiles, n_tile, h, d)[:, :, :rows]
    w = x.permute(0, 1, 3, 2, 4).contiguous().view(torch.int32)  # (b, tiles, h, rows, 64)
    return w.reshape(-1, rows * 64)[:, :WORDS].to(torch.int64) & 0xFFFFFFFF


def split_words(words):
    """(loop marks (tiles, ROWS, ITERS, POINTS), CTA-level marks in ns (tiles, CTA_MARKS), SM
    id per tile)."""
    w = words[:, :LOOP_WORDS].reshape(-1, ROWS, ITERS, POINTS)
    cta = words[:, CTA_WORD0 : CTA_WORD0 + 2 * CTA_MARKS].reshape(-1, CTA_MARKS, 2)
    cta = cta[:, :, 0] + (cta[:, :, 1] << 32)  # ns
    return w, cta, words[:, CTA_WORD0 + 2 * CTA_MARKS]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    h, d, n_tile = 16, 128, 128
    q, k, v = (
        torch.randn(a.batch, a.seqlen, h, d, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
        for _ in range(3)
    )  # fmt: skip
    dout = torch.randn_like(q)
    for _ in range(2):
        v.grad = None
        fa4.attention(q, k, v, causal=a.causal).backward(dout)
    torch.cuda.synchronize()
    words = words_from_dv(v.grad.detach(), n_tile)
    w, cta, sm = split_words(words)
    base = w[:, 0:1, :, 0:1]
    rel = (w - base) % (1 << 32)  # clock wraps at 2^32
    rel = torch.where(rel > (1 << 31), rel - (1 << 32), rel).to(torch.float64)
    period = ((w[:, 0, 1:, 0] - w[:, 0, :-1, 0]) % (1 << 32)).to(torch.float64)
    print(
        f"hd128 s={a.seqlen} b={a.batch} h={h} causal={a.causal}: {w.shape[0]} CTAs, "
        f"iterations {FIRST}..{FIRST + ITERS - 1}; clocks after warpgroup 0's loop top"
    )
    print(
        f"iteration period (wg0 loop top to loop top): median {period.median().item():.0f}, "
        f"p10 {period.quantile(0.1).item():.0f}, p90 {period.quantile(0.9).item():.0f}"
    )
    print(f"{'mark':28s} {'wg0':>7s} {'wg1':>7s}")
    for p, name in enumerate(MARKS):
        m0 = rel[:, 0, :, p].median().item()
        m1 = rel[:, 1, :, p].median().item()
        print(f"{name:28s} {m0:7.0f} {m1:7.0f}")
    print(f"{'reducer: both dQ halves in':28s} {rel[:, 2, :, 0].median().item():7.0f}")
    print(f"{'reducer: smem read':28s} {rel[:, 2, :, 1].median().item():7.0f}")
    cta_report(cta, sm)


def same_sm_pairs(start, sm):
    """(earlier, later): index pairs of consecutive dumps (CTAs, or a CTA's tiles) on one SM,
    ordered by their start marks."""
    earlier, later = [], []
    for s_id in sm.unique().tolist():
        idx = (sm == s_id).nonzero().flatten()
        order = idx[torch.argsort(start[idx])]
        earlier.append(order[:-1])
        later.append(order[1:])
    return torch.cat(earlier), torch.cat(later)


def cta_report(cta, sm):
    """Per-CTA phases (ns, median over CTAs) and the gap between CTAs on one SM."""
    cta = cta.to(torch.float64)
    print("CTA phases, ns (median, p90):")
    for name, a, b in CTA_PHASES:
        d = cta[:, b] - cta[:, a]
        print(f"  {name:26s} {d.median().item():8.0f} {d.quantile(0.9).item():8.0f}")
    end = torch.maximum(cta[:, 5], cta[:, 6])
    life = end - cta[:, 0]
    print(
        f"  {'entry to last mark':26s} {life.median().item():8.0f} {life.quantile(0.9).item():8.0f}"
    )
    earlier, later = same_sm_pairs(cta[:, 0], sm)
    g = cta[later, 0] - end[earlier]
    med, p90 = g.median().item(), g.quantile(0.9).item()
    print(
        f"  {'previous CTA end to entry':26s} {med:8.0f} {p90:8.0f}  (same SM, {g.numel()} pairs)"
    )
    # Persistent grid (Note [persistent bwd]): when the producer issued a tile's K/V, after the
    # previous tile's loops on that SM were done (both warpgroups: marks 4 and 7).
    g = cta[later, 9] - torch.maximum(cta[earlier, 4], cta[earlier, 7])
    med, p90 = g.median().item(), g.quantile(0.9).item()
    print(f"  {'previous loop done to K/V issue':26s} {med:8.0f} {p90:8.0f}  (same SM)")
    span = (end.max() - cta[:, 0].min()).item()
    print(f"  kernel span from the marks: {span / 1e3:.1f} us")


if __name__ == "__main__":
    main()
