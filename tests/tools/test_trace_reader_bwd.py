"""CPU tests of tools/trace_bwd.py, the reader of the SM90 backward's trace build (Note [bwd
trace]): its word layout against csrc/sm90/bwd/trace.cuh, a synthetic dump written into dV the
way the kernel writes it (word j at row j // 64, 32-bit column j % 64 of each tile) read back, and
the per-tile phases of the persistent grid (Note [persistent bwd]) printed from known marks.
"""

import re
from pathlib import Path

import torch
from helpers import header_constant, load_script

ROOT = Path(__file__).resolve().parents[2]
tb = load_script(ROOT / "tools" / "trace_bwd.py", "trace_bwd")


def _header_constant(name: str) -> int:
    return header_constant(ROOT / "csrc" / "sm90/bwd/trace.cuh", name)


def test_layout_matches_the_kernel_header():
    assert tb.FIRST == _header_constant("kTraceFirst")
    assert tb.ITERS == _header_constant("kTraceIters")
    assert tb.POINTS == _header_constant("kTracePoints") == len(tb.MARKS)
    assert tb.ROWS == _header_constant("kTraceRows")
    assert tb.CTA_MARKS == _header_constant("kCtaMarks")
    assert tb.CTA_WORD0 == _header_constant("kCtaWord0")
    assert tb.WORDS == tb.CTA_WORD0 + 2 * tb.CTA_MARKS + 1  # kTraceWords
    assert tb.LOOP_WORDS <= tb.CTA_WORD0


# One SM running three tiles back to back, ns: the CTA-level marks 0..9 of each tile (Note [bwd
# trace]); the producer's marks 8 and 9 (K/V buffer wait, K/V issued) precede the tile's start.
TILE = {0: 0, 1: 100, 2: 1600, 3: 1900, 4: 30000, 5: 33000, 6: 32000, 7: 30100, 8: -6000, 9: -1000}
STARTS = [10_000, 45_000, 80_000]


def _dv_with_dumps():
    """dV (b=1, s=3·128, h=1, d=128) holding one dump per tile, as bf16 bits."""
    words = torch.zeros(len(STARTS), tb.WORDS, dtype=torch.int64)
    for t, start in enumerate(STARTS):
        for k, off in TILE.items():
            ns = 2**40 + start + off  # past 2^32: both halves of each mark matter
            words[t, tb.CTA_WORD0 + 2 * k] = ns & 0xFFFFFFFF
            words[t, tb.CTA_WORD0 + 2 * k + 1] = ns >> 32
        words[t, tb.CTA_WORD0 + 2 * tb.CTA_MARKS] = 7  # SM id
        for j in range(tb.LOOP_WORDS):
            words[t, j] = 1000 * t + j
    rows = (tb.WORDS + 63) // 64
    dv = torch.zeros(1, len(STARTS) * 128, 1, 128, dtype=torch.bfloat16)
    raw = dv.view(torch.int16).view(1, len(STARTS), 128, 1, 64, 2)
    padded = torch.zeros(len(STARTS), rows * 64, dtype=torch.int64)
    padded[:, : tb.WORDS] = words
    w32 = padded.to(torch.int32).view(len(STARTS), rows, 64)  # low 32 bits of each word
    raw[0, :, :rows, 0] = w32.view(torch.int16).view(len(STARTS), rows, 64, 2)
    return dv, words


def test_words_round_trip_through_dv():
    dv, words = _dv_with_dumps()
    got = tb.words_from_dv(dv)
    assert torch.equal(got, words)
    loop, cta, sm = tb.split_words(got)
    assert loop.shape == (len(STARTS), tb.ROWS, tb.ITERS, tb.POINTS)
    assert int(loop[2, 0, 0, 1]) == 2001
    assert [int(c) for c in cta[1]] == [2**40 + STARTS[1] + TILE[k] for k in range(tb.CTA_MARKS)]
    assert sm.tolist() == [7, 7, 7]


def test_persistent_phases(capsys):
    _, cta, sm = tb.split_words(tb.words_from_dv(_dv_with_dumps()[0]))
    tb.cta_report(cta, sm)
    out = {}
    for line in capsys.readouterr().out.splitlines():
        m = re.match(r"\s+(.+?)\s{2,}(-?\d+)\s+(-?\d+)", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    assert out["K, V landed"] == TILE[2] - TILE[1]
    assert out["producer: K/V buffer wait"] == TILE[9] - TILE[8]
    assert out["K/V issued to landed"] == TILE[2] - TILE[9]
    # issue of tile t (start_t + TILE[9]) after the loops of tile t - 1 (start + max(TILE[4, 7]))
    lag = STARTS[1] + TILE[9] - (STARTS[0] + max(TILE[4], TILE[7]))
    assert out["previous loop done to K/V issue"] == lag
    gap = STARTS[1] - (STARTS[0] + max(TILE[5], TILE[6]))
    assert out["previous CTA end to entry"] == gap
