"""The decode kernel's host plan (csrc/decode/plan.h) through tests/cpp/decode_plan_harness.cpp:
which problems take the decode kernel (and fa4/_ops.py takes_decode's mirror of that rule), the
tile shape of packed GQA, the split heuristic on the decode bench's shapes (one wave of CTA
slots, Note [split heuristic]), forced splits capped at the key blocks, and the workspace size
of the split partials."""

import math
import subprocess
from pathlib import Path

import pytest
from helpers import build_gxx

from fa4 import _ops

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    exe = build_gxx(
        ROOT / "tests/cpp/decode_plan_harness.cpp", tmp_path_factory.mktemp("plan") / "plan"
    )

    def run(rows):
        text = "\n".join(" ".join(str(x) for x in r) for r in rows) + "\n"
        res = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True)
        return [tuple(int(x) for x in line.split()) for line in res.stdout.splitlines()]

    return run


def _row(b, s_q, s_k, h, h_kv, d=128, splits=0, sms=132, cc=9, flags="k", varlen=0, total_q=0):
    return (b, s_q, s_k, h, h_kv, d, d, varlen, total_q, splits, sms, cc, flags)


def test_routing_and_its_python_mirror(plan):
    cases = [("-", 9, 0), ("k", 9, 1), ("kc", 9, 0), ("p", 9, 1), ("q", 9, 1), ("i", 9, 1),
             ("l", 9, 1), ("s", 9, 0), ("s", 10, 1), ("-", 10, 0)]  # fmt: skip
    got = plan([_row(2, 1, 512, 8, 2, flags=f, cc=cc) for f, cc, _ in cases])
    for (flags, cc, want), out in zip(cases, got, strict=True):
        assert out[0] == want, (flags, cc)
        sv = _ops.Serving(
            seqused_q=1 if "q" in flags else None,
            page_table=1 if "p" in flags else None,
            cache_batch_idx=1 if "i" in flags else None,
            leftpad_k=1 if "l" in flags else None,
            learnable_sink=1 if "s" in flags else None,
        )
        mirror = _ops.takes_decode(
            1 if "c" in flags else None, 1 if "k" in flags else None, sv,
            "sm90" if cc == 9 else "sm100",
        )  # fmt: skip
        assert mirror == bool(want), (flags, cc)
    assert plan([_row(2, 1, 512, 8, 2, flags="-", splits=3)])[0][0] == 1  # num_splits > 1


@pytest.mark.parametrize(
    "s_q,h,h_kv,warps_n,block_m",
    [(1, 32, 8, 4, 16), (4, 32, 8, 4, 16), (8, 32, 8, 2, 32), (8, 32, 4, 1, 64),
     (16, 32, 4, 1, 64)],
)  # fmt: skip
def test_packed_tile_shape(plan, s_q, h, h_kv, warps_n, block_m):
    out = plan([_row(4, s_q, 4096, h, h_kv)])[0]
    assert out[1:3] == (warps_n, block_m)
    assert out[3] == math.ceil(s_q * h // h_kv / block_m)


def test_split_heuristic_fills_one_wave(plan):
    # Note [split heuristic], the caches the TMA producer cannot stream by their sizes (pages of
    # 8 rows, 16-bit or e4m3): (batch, s_k, h_kv) of the decode bench, tiles = batch * h_kv
    shapes = [(16, 8192, 8), (64, 32768, 8), (4, 131072, 8), (16, 8192, 4), (1, 65536, 8)]
    for flags in ("kpx8", "kpx"):
        out = plan([_row(b, 1, s_k, 32, h_kv, flags=flags) for b, s_k, h_kv in shapes])
        for (b, s_k, h_kv), o in zip(shapes, out, strict=True):
            tiles, splits, slots = b * h_kv, o[5], 132 * o[7]
            if tiles * 5 >= slots * 4:
                assert splits == 1, (b, s_k, h_kv, flags)
                continue
            ctas = tiles * splits
            assert ctas <= slots and ctas / slots >= 0.85, (b, s_k, h_kv, splits, flags)
            assert splits <= o[4] // 4  # at least 4 key blocks per split


def test_split_heuristic_of_tma_caches(plan):
    # Note [tma split heuristic]: a 16-bit dense cache or pages of whole 16-row boxes split only
    # while the tiles fill less than 45 % of the SMs (60 of 132), into the fewest splits that
    # reach it: the split counts measured best on an H100 (1 at 64 and 128 tiles, 2 at 32)
    cases = {  # (batch, s_k, h_kv, flags): splits
        (16, 8192, 8, "k"): 1,  # 128 tiles (the wave rule split them in 2)
        (16, 8192, 4, "k"): 1,  # 64 tiles
        (8, 8192, 8, "kp"): 1,  # 64 tiles, paged 64
        (4, 32768, 8, "k"): 2,  # 32 tiles
        (4, 131072, 4, "k"): 4,  # 16 tiles
        (1, 65536, 8, "k"): 8,  # 8 tiles
        (1, 1024, 1, "k"): 4,  # 1 tile, 16 key blocks: at least 4 blocks a split
        (64, 32768, 8, "k"): 1,
    }
    out = plan([_row(b, 1, s_k, 32, h_kv, flags=f) for b, s_k, h_kv, f in cases])
    for (key, want), o in zip(cases.items(), out, strict=True):
        assert o[5] == want, (key, o[5])


def test_split_heuristic_of_tma_caches_at_hd64(plan):
    # Note [tma split heuristic] at d = 64: split while the tiles fill less than 90 % of the SMs
    # (119 of 132), the counts measured best on an H100 (2 at 64 tiles, 3-4 at 32, 1 at 128)
    cases = {  # (batch, s_k, h_kv, d): splits
        (16, 8192, 8, 64): 1,  # 128 tiles
        (16, 8192, 4, 64): 2,  # 64 tiles (unsplit at d = 128)
        (4, 131072, 8, 64): 4,  # 32 tiles (2 at d = 128)
        (4, 131072, 4, 64): 8,  # 16 tiles
        (16, 8192, 4, 96): 1,  # d = 96 keeps d = 128's share: 128 // 96 = 1
        (16, 8192, 4, 256): 1,
    }
    out = plan([_row(b, 1, s_k, 32, h_kv, d=d) for b, s_k, h_kv, d in cases])
    for (key, want), o in zip(cases.items(), out, strict=True):
        assert o[5] == want, (key, o[5])


def test_split_heuristic_of_tma_fp8_caches(plan):
    # Note [tma split heuristic] with an e4m3 cache: the 90 % share (119 of 132 SMs) at d = 128
    # and 64, the counts measured best on an H100 (1 at 128 and 256 tiles, 2 at 64, 4 at 32)
    cases = {  # (batch, s_k, h_kv, d): splits
        (16, 8192, 8, 128): 1,  # 128 tiles (the wave rule split them in 2)
        (16, 8192, 4, 128): 2,  # 64 tiles (the wave rule: 4)
        (4, 131072, 8, 128): 4,  # 32 tiles (the wave rule: 8)
        (16, 8192, 8, 64): 1,  # 128 tiles (the wave rule: 3)
        (32, 32768, 8, 64): 1,  # 256 tiles
        (4, 131072, 8, 64): 4,  # 32 tiles
        (64, 32768, 8, 128): 1,
    }
    out = plan([_row(b, 1, s_k, 32, h_kv, d=d, flags="k8") for b, s_k, h_kv, d in cases])
    for (key, want), o in zip(cases.items(), out, strict=True):
        assert o[5] == want, (key, o[5])
    # pages of 64 rows hold whole blocks and take the rule; pages of 16 (boxes) and 8 keep the
    # wave rule's 2 splits at 128 tiles, where a 16-bit cache in pages of 16 takes the rule
    paged = plan([_row(16, 1, 8192, 32, 8, flags=f) for f in ("k8p", "k8py", "k8px", "kpy")])
    assert [o[5] for o in paged] == [1, 2, 2, 1]


def test_forced_splits_and_workspace(plan):
    out = plan([_row(3, 2, 1000, 8, 2, splits=16), _row(3, 2, 100, 8, 2, splits=16),
                _row(3, 2, 1000, 8, 2, splits=1), _row(3, 5, 1000, 8, 2, splits=4, varlen=1,
                total_q=9, flags="p")])  # fmt: skip
    assert out[0][5] == 16 and out[1][5] == 2  # capped at the 2 key blocks of 100 keys
    assert out[2][5] == 1 and out[2][6] == 0  # no split: no workspace

    def ws(splits, rows, h=8, dv=128):
        slots = splits * rows * h
        return (math.ceil(slots / 4) * 4 + slots * dv) * 4

    assert out[0][6] == ws(16, 3 * 2)
    assert out[3][6] == ws(4, 9)  # varlen: total_q rows


@pytest.fixture(scope="module")
def tma(tmp_path_factory):
    exe = build_gxx(ROOT / "tests/cpp/decode_tma_harness.cpp", tmp_path_factory.mktemp("tma") / "t")

    def run(lines):
        text = "\n".join(lines) + "\n"
        res = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True)
        return [tuple(int(x) for x in line.split()) for line in res.stdout.splitlines()]

    return run


def test_tma_blocks_whole_blocks_of_one_page(tma):
    """Note [tma blocks]: a block goes by TMA only when its 64 rows are keys of the sequence; as
    one tile when they lie in one page (its tile row is the row in the page and its page slot
    the table entry), else by 16-row boxes (Note [tma boxes]) when the pages are multiples of
    16 rows and the block starts on a multiple of 16, else gathered."""
    cases = {  # (n, offset_k, len_k, page_size): (ok, row, page_slot, boxes)
        (0, 0, 64, 0): (1, 0, 0, 0),  # dense, one whole block
        (1, 0, 100, 0): (0, 0, 0, 0),  # the partial last block is gathered
        (1, 5, 128, 0): (1, 69, 0, 0),  # leftpad 5: dense rows need no alignment
        (3, 0, 1024, 256): (1, 192, 0, 0),  # paged: 4 blocks per page
        (4, 0, 1024, 256): (1, 0, 1, 0),  # the next page's first block
        (0, 32, 1024, 64): (1, 32, 0, 1),  # leftpad 32: every block across two pages, boxes
        (0, 8, 1024, 64): (0, 8, 0, 0),  # leftpad 8: a box would straddle pages: gathered
        (2, 0, 190, 64): (0, 0, 0, 0),  # keys end inside block 2
        (15, 0, 1024, 64): (1, 0, 15, 0),  # the last block, whole
        (3, 0, 1024, 16): (1, 0, 12, 1),  # page 16: four pages per block, boxes from slot 12
        (1, 16, 1024, 32): (1, 16, 2, 1),  # page 32, leftpad 16: rows 80.. start in slot 2
        (1, 0, 1024, 48): (1, 16, 1, 1),  # page 48: rows 64.. from row 16 of slot 1
        (0, 0, 1024, 8): (0, 0, 0, 0),  # page 8: smaller than a box
        (3, 0, 190, 16): (0, 0, 0, 0),  # partial: gathered whatever the page
    }
    got = tma([f"b {n} {o} {k} {p}" for n, o, k, p in cases])
    for (key, want), out in zip(cases.items(), got, strict=True):
        assert out[0] == want[0], key
        if want[0]:
            assert out[1:] == want[1:], key


def test_tma_eligible_caches(tma):
    """Descriptors only for caches with 16-byte aligned bases and strides (in bytes: an e4m3
    element is one), pages of whole 16-row boxes, and no kv_batch_idx on a dense cache (its
    batch count is unknown). The harness sets every stride to align / 2 elements."""
    cases = {
        ("-", 0, 16): 1,
        ("-", 0, 8): 0,  # 8-byte alignment: no descriptor
        ("8", 0, 16): 0,  # e4m3 cache with 8-byte strides (8 one-byte elements)
        ("8", 0, 32): 1,  # e4m3 cache, 16-byte strides
        ("i", 0, 16): 0,  # dense with kv_batch_idx
        ("pi", 64, 16): 1,  # paged: kv_batch_idx picks a table row, the pool is bounded
        ("p", 256, 16): 1,
        ("p", 16, 16): 1,  # pages of whole 16-row boxes (Note [tma boxes])
        ("p", 96, 16): 1,
        ("p", 8, 16): 0,  # smaller than a box
        ("p", 24, 16): 0,  # not a multiple of the box
        ("c", 0, 16): 1,  # varlen keys
    }
    got = tma([f"e {f} {p} {a}" for f, p, a in cases])
    for (key, want), out in zip(cases.items(), got, strict=True):
        assert out[0] == want, key
