"""CPU tests of tools/trace_fwd.py, the reader of the SM90 forward's trace build (Note [fwd trace]):
synthetic dumps written into O the way the kernel writes them, read back, and the printed medians
checked against the marks that were written. The word layout constants are read from
csrc/sm90/fwd/trace.cuh, so a kernel-side change that the reader misses fails here.
"""

import re
from pathlib import Path

import pytest
import torch
from helpers import header_constant, load_script

ROOT = Path(__file__).resolve().parents[2]
tf = load_script(ROOT / "tools" / "trace_fwd.py", "trace_fwd")


def _header_constant(name: str) -> int:
    return header_constant(ROOT / "csrc" / "sm90/fwd/trace.cuh", name)


def test_layout_matches_the_kernel_header():
    assert tf.MAGIC == _header_constant("kFwdTraceMagic")
    assert tf.TILES == _header_constant("kFwdTraceTiles")
    assert tf.TRACE_TILE == _header_constant("kFwdTraceTile")
    assert tf.FIRST == _header_constant("kFwdTraceFirst")
    assert tf.ITERS == _header_constant("kFwdTraceIters")
    assert tf.LOOP_POINTS == _header_constant("kFwdLoopPoints") == len(tf.LOOP_MARKS)
    assert tf.TILE_POINTS == _header_constant("kFwdTilePoints")
    assert tf.PROD_POINTS == _header_constant("kFwdProdPoints")
    assert tf.WGS == _header_constant("kFwdTraceWGs")
    assert tf.HEADER == _header_constant("kFwdHeaderWords")


# Per loop point, cycles after the iteration's top (warpgroup 0); warpgroup g is shifted by 700 g.
LOOP_OFFSETS = [0, 50, 150, 330, 440, 790, 850, 2550, 2580, 2700]
PERIOD = 2800
TILE_OFFSETS = [0, 200, 560, 690, 1420, 20000, 20400, 20600, 20900, 21250]
TILE_PERIOD = 25000


def _words(
    n_cta: int,
    base: int,
    garbage_loop_cta: int | None = None,
    wgs: int = 0,
    tile_offsets: list[int] = TILE_OFFSETS,
) -> torch.Tensor:
    """Dumps of n_cta CTAs; wgs > 0 writes it to the SM id word's top byte (as the kernel does)
    and leaves the marks of the warpgroups past it unset (garbage)."""
    w = torch.zeros(n_cta, tf.WORDS, dtype=torch.int64)
    for c in range(n_cta):
        t0 = base + 1000 * c
        w[c, 0] = tf.MAGIC
        w[c, 1] = c | wgs << 24
        # clock and globaltimer at start and end: 1.75 GHz over 1 ms
        g0 = 5_000_000 + c
        w[c, 2], w[c, 3], w[c, 4] = t0 % 2**32, g0 % 2**32, g0 >> 32
        w[c, 5], w[c, 6], w[c, 7] = (t0 + 1_750_000) % 2**32, (g0 + 10**6) % 2**32, g0 >> 32
        loop = w[c, tf.LOOP0 : tf.TILE0].view(tf.WGS, tf.ITERS, tf.LOOP_POINTS)
        for g in range(tf.WGS):
            for i in range(tf.ITERS):
                for p, off in enumerate(LOOP_OFFSETS):
                    loop[g, i, p] = (t0 + 700 * g + PERIOD * i + off) % 2**32
        if wgs:
            loop[wgs:] = (t0 + 2**30) % 2**32
        if c == garbage_loop_cta:
            loop[1, 3, 4] = (t0 + 2**30) % 2**32  # an unset mark: shared-memory garbage
        tile = w[c, tf.TILE0 : tf.PROD0].view(tf.WGS, tf.TILES, tf.TILE_POINTS)
        for g in range(tf.WGS):
            for k in range(tf.TILES):
                for p, off in enumerate(tile_offsets):
                    tile[g, k, p] = (t0 + 300 * g + TILE_PERIOD * k + off) % 2**32
        if wgs:
            tile[wgs:] = (t0 + 2**30) % 2**32
        prod = w[c, tf.PROD0 : tf.WORDS].view(tf.TILES, tf.PROD_POINTS)
        for k in range(tf.TILES):
            prod[k] = torch.tensor([TILE_PERIOD * k + x for x in (-3000, -2900, 15000)]) + t0
        prod %= 2**32
    return w


def _o_with(
    words: torch.Tensor, b: int, s: int, h: int, d: int, block_m: int | None = None
) -> torch.Tensor:
    """O (b, s, h, d) bf16 holding one CTA's dump at the first rows of each of the first tiles."""
    wpr = d // 2
    o32 = torch.zeros(b, s, h, wpr, dtype=torch.int32)
    block_m = block_m or (192 if d <= 64 else 128)
    slots = [(bi, hi, m0) for bi in range(b) for hi in range(h) for m0 in range(0, s, block_m)]
    for c, (bi, hi, m0) in enumerate(slots[: words.shape[0]]):
        for j in range(tf.WORDS):
            v = int(words[c, j])
            o32[bi, m0 + j // wpr, hi, j % wpr] = v - 2**32 if v >= 2**31 else v
    return o32.view(torch.bfloat16)


def _median_of(out: str, label: str) -> float:
    m = re.search(rf"{re.escape(label)}\s+(-?\d+)", out)
    assert m, (label, out)
    return float(m.group(1))


@pytest.mark.parametrize("base", [1000, 2**32 - 40_000])  # the second wraps the 32-bit clock
def test_report_gives_the_marks_back(capsys, base):
    d, s, b, h = 128, 1024, 2, 3
    words = _words(5, base, garbage_loop_cta=2)
    found = tf.cta_words(_o_with(words, b, s, h, d), d)
    assert found.shape == (5, tf.WORDS)
    assert torch.equal(found[found[:, 1].argsort()], words)
    tf.report(found, d, "synthetic")
    out = capsys.readouterr().out
    assert "SM clock 1.75 GHz" in out
    assert "4 CTAs with every traced iteration, 5 with 6 tiles" in out
    L = LOOP_OFFSETS
    assert _median_of(out, "period (wg0 top to top)") == PERIOD
    assert _median_of(out, "wg0 softmax") == L[7] - L[6]
    assert _median_of(out, "wg1 S issue") == L[3] - L[2]
    assert _median_of(out, "wg1 P·V issue") == L[5] - L[4]
    assert _median_of(out, "wg0 convert") == L[9] - L[8]
    assert _median_of(out, "wg1 top") == 700
    T = TILE_OFFSETS
    assert _median_of(out, "wg0 stmatrix O") == T[7] - T[6]
    assert _median_of(out, "wg1 take") == TILE_PERIOD - T[9]
    assert _median_of(out, "wg0 tile (stored to stored)") == TILE_PERIOD
    assert _median_of(out, "Q(k) issued -> wg0 Q ready(k)") == T[2] + 2900


def test_no_dump_is_an_error():
    o = torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(SystemExit, match="no trace found"):
        tf.report(tf.cta_words(o, 128), 128, "empty")


def test_two_warpgroup_hd64_dump(capsys):
    """Note [short causal hd64]: short causal hd64 runs 128-row tiles on two consumer
    warpgroups; the dump says so, the reader finds the dumps at 128-row tile starts and ignores
    the third warpgroup's unset marks."""
    d, s, b, h = 64, 1024, 1, 2
    words = _words(5, 1000, wgs=2)
    found = tf.cta_words(_o_with(words, b, s, h, d, block_m=128), d)
    assert found.shape == (5, tf.WORDS)
    tf.report(found, d, "synthetic")
    out = capsys.readouterr().out
    assert "2 consumer warpgroups" in out
    assert "5 CTAs with every traced iteration, 5 with 6 tiles" in out
    assert "wg2" not in out
    assert _median_of(out, "wg1 take") == TILE_PERIOD - TILE_OFFSETS[9]
    assert _median_of(out, "period (wg0 top to top)") == PERIOD


def test_old_dumps_fall_back_to_the_head_dim(capsys):
    """A dump without the warpgroup count (top byte 0) is read as three at hd64."""
    words = _words(3, 1000)
    tf.report(tf.cta_words(_o_with(words, 1, 768, 2, 64), 64), 64, "synthetic")
    assert "3 consumer warpgroups" in capsys.readouterr().out


def test_pipelined_tile_order(capsys):
    """Note [next tile's first S] (c314a0e): tile k is taken, decoded and its first S issued
    (marks 0-2) before tile k-1's last P·V is done and its epilogue runs (marks 4-9 of k-1); the
    reader switches to the phases of that order."""
    offsets = [-1500, -1300, -1200, 600, 24000, 24200, 24400, 24500, 24550, 24580]
    words = _words(5, 1000, wgs=2, tile_offsets=offsets)
    tf.report(words, 64, "synthetic")
    out = capsys.readouterr().out
    assert "wg0 take" not in out
    assert _median_of(out, "wg0 decode (tile_work)") == 200
    assert _median_of(out, "wg1 Q wait") == 100
    assert _median_of(out, "wg0 S issue, k-1's last P·V wait") == 24000 - TILE_PERIOD + 1200
    assert _median_of(out, "wg1 k-1: stmatrix O") == 100
    assert _median_of(out, "wg0 k-1 stored -> first S done") == 600 - (24580 - TILE_PERIOD)
    assert _median_of(out, "wg0 blocks (+ k+1's take, S issue)") == 24000 - 600
    assert _median_of(out, "wg1 tile (stored to stored)") == TILE_PERIOD
