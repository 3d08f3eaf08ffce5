"""The kernels' shared headers on the host: csrc/common/mask.cuh, common/softmax.cuh and
common/tile_scheduler.cuh, run by tests/cpp/shared_headers_harness.cpp (g++) exactly as the SM90
and SM100 kernels include them.

- masks: the element predicate and what a kernel would produce (block range, element mask only
  on the blocks needs_mask names, RowMajorFrag and QuadFrag fragments) equal
  fa4.reference.allowed_keys element for element; the block ranges are exactly the blocks with a
  visible element, the "full" ranges exactly the blocks with every element visible; the
  backward's Q-block range of each KV block (q_blocks_seeing) is the scan of those block ranges,
  and its per-block mask test (block_needs_mask) is block_range's needs_mask; the blocks a
  warpgroup's 64-row slice of a tile sees end where slice_block_end says.
- softmax: whole attention problems through common/mask.cuh + common/softmax.cuh + exp2_poly.cuh
  against fa4.reference.attention_fa4_model: decision counts identical, out and lse close.
- scheduler: every tile once, the documented orders.
- the same headers compile as device code for sm_90a and sm_100a, without local memory.
"""

from __future__ import annotations

import math
import re
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_tolerance, build_gxx, need_tool

from fa4 import dispatch, manifest, reference
from fa4.reference import allowed_keys, attention_fa4_model, attention_ref

pytestmark = pytest.mark.build

ROOT = Path(__file__).resolve().parents[2]
HARNESS_SRC = ROOT / "tests" / "cpp" / "shared_headers_harness.cpp"
DEVICE_SRC = ROOT / "tests" / "cpp" / "shared_headers_device.cu"
BF16, FP16 = torch.bfloat16, torch.float16
MASK_SHAPES = [(128, 128), (64, 128), (128, 176), (176, 64)]  # the harness's order
COUNT_KEYS = (
    "rescaled", "skipped", "rows_first_block", "warp_groups_skipped", "warp_groups_total", "tiles",
)  # fmt: skip


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return build_gxx(HARNESS_SRC, tmp_path_factory.mktemp("shared") / "shared_headers_harness")


def _run(exe: Path, mode: str, src: Path, dst: Path) -> str:
    res = subprocess.run([str(exe), mode, str(src), str(dst)], capture_output=True, text=True)
    assert res.returncode == 0, f"harness {mode} failed ({res.returncode}): {res.stderr}"
    return res.stdout


# --- masks ------------------------------------------------------------------------------------


def _mask_cases() -> list[tuple[int, int, int, int, int]]:
    """(s_q, s_k, window_left, window_right, causal): edges, then random sizes and windows."""
    big = 2**31 - 1  # Note [mask clamping]: must not overflow
    cases = [
        (0, 0, -1, -1, 0), (0, 5, -1, -1, 1), (5, 0, -1, -1, 1), (1, 1, -1, -1, 1),
        (1, 1, 0, 0, 0), (128, 128, -1, -1, 1), (129, 128, -1, -1, 1), (128, 129, -1, -1, 1),
        (257, 113, -1, -1, 1), (113, 257, -1, -1, 1), (300, 7, 3, -1, 1), (7, 300, 0, 0, 0),
        (200, 200, big, big, 0), (200, 200, big, -1, 1), (190, 260, 0, big, 0),
        (260, 190, 64, 64, 0), (176, 176, 0, -1, 1), (352, 64, 100, 5, 0),
        # Window edges exactly on a block edge of 64-row / 128-key blocks (the comparisons of
        # Note [block needs mask] at equality).
        (512, 512, 63, -1, 0), (512, 512, 191, 63, 0), (512, 512, -1, 63, 0),
        (512, 512, -1, 127, 0), (448, 512, 127, 0, 1),
        # Shifted windows (Note [window entries]): negative literal edges, empty bands, and
        # edges shifted past either end of the sequence.
        (200, 200, -30, -1, 0), (200, 200, -1, -30, 0), (200, 260, 50, -20, 0),
        (200, 200, -30, 10, 0), (200, 200, -5, 3, 0), (200, 200, -5, 4, 1), (64, 64, -64, 0, 0),
        (130, 300, -big, -1, 0), (130, 300, -1, -big, 0), (300, 130, -40, 50, 1),
    ]  # fmt: skip
    rng = np.random.default_rng(3)
    for _ in range(220):
        s_q, s_k = (int(x) for x in rng.choice([1, 2, 17, 63, 64, 65, 127, 128, 129, 400], 2))
        if rng.random() < 0.6:
            s_q, s_k = (int(x) for x in rng.integers(0, 420, 2))
        pick = [-1, 0, int(rng.integers(0, 40)), int(rng.integers(0, 450)), big,
                -int(rng.integers(2, 40)), -int(rng.integers(2, 450))]  # fmt: skip
        prob = [0.3, 0.1, 0.15, 0.15, 0.1, 0.1, 0.1]
        wl, wr = (pick[int(i)] for i in rng.choice(len(pick), 2, p=prob))
        causal = int(rng.random() < 0.4)
        cases.append((s_q, s_k, wl, -1 if causal and rng.random() < 0.5 else wr, causal))
    return cases


def _pad_view(a: torch.Tensor, bm: int, bn: int, row_fill: bool, col_fill: bool):
    """(s_q, s_k) -> (n_m, bm, n_n, bn), padding rows with row_fill and then columns with
    col_fill (a padding row of a tile is not a row of the sequence)."""
    s_q, s_k = a.shape
    n_m, n_n = -(-s_q // bm), -(-s_k // bn)
    out = torch.full((n_m * bm, n_n * bn), col_fill, dtype=torch.bool)
    out[s_q:] = row_fill
    out[:s_q, :s_k] = a
    return out.view(n_m, bm, n_n, bn)


def _check_block_table(case, allowed, table, bm, bn):
    s_q, s_k = allowed.shape
    n_m, n_n = -(-s_q // bm), -(-s_k // bn)
    any_vis = _pad_view(allowed, bm, bn, False, False).any(3).any(1)
    all_vis = _pad_view(allowed, bm, bn, True, False).all(3).all(1)
    blocks = torch.arange(n_n)
    no_left_edge = case[2] == -1  # window_left unbounded: only right edges cut a block
    for m in range(n_m):
        nb, ne, fb, fe, le = table[m].tolist()
        where = f"{case} shape {bm}x{bn} m_block {m}: {table[m].tolist()}"
        assert torch.equal((blocks >= nb) & (blocks < ne), any_vis[m]), where
        assert nb <= fb <= fe <= ne or (fb == fe == ne), where
        assert torch.equal((blocks >= fb) & (blocks < fe), all_vis[m]), where
        # Note [right-edge mask]: a left_end too low shows up in the visibility checks; one too
        # high would only send blocks to the two-edge mask, so causal tiles are pinned here.
        assert (le == nb) if no_left_edge or nb == ne else nb <= le, where


@pytest.fixture(scope="module")
def mask_results(harness, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mask")
    cases = _mask_cases()
    (tmp / "in.txt").write_text("".join(" ".join(map(str, c)) + "\n" for c in cases))
    _run(harness, "mask", tmp / "in.txt", tmp / "out.bin")
    return cases, (tmp / "out.bin").read_bytes()


def test_mask_matches_reference(mask_results):
    cases, raw = mask_results
    pos = 0

    def take(n: int, dtype) -> np.ndarray:
        nonlocal pos
        a = np.frombuffer(raw, dtype=dtype, count=n, offset=pos)
        pos += a.nbytes
        return a

    n_visited = n_full = 0  # (Q tile, KV block) pairs visited; of them, without element mask
    for case in cases:
        s_q, s_k, wl, wr, causal = case
        allowed = allowed_keys(torch.arange(s_q), s_q, s_k, bool(causal), (wl, wr))
        vis = torch.from_numpy(take(s_q * s_k, np.uint8).reshape(s_q, s_k).astype(bool))
        assert torch.equal(vis, allowed), f"is_visible differs from allowed_keys: {case}"
        bad = take(1, np.int32)[0]
        assert bad == 0, (
            f"visible elements outside the sequence, col_bounds or the band test wrong, "
            f"q_blocks_seeing not the scan of block_range, block_needs_mask not "
            f"block_range's needs_mask, or slice_block_end not the scan: {case}"
        )
        for bm, bn in MASK_SHAPES:
            got = torch.from_numpy(take(s_q * s_k, np.uint8).reshape(s_q, s_k).astype(bool))
            bad = (got != allowed).nonzero()
            assert bad.numel() == 0, f"{case} shape {bm}x{bn}: first wrong (row, col) {bad[0]}"
            table = torch.from_numpy(take(5 * -(-s_q // bm), np.int32).reshape(-1, 5).copy())
            _check_block_table(case, allowed, table, bm, bn)
            n_visited += int((table[:, 1] - table[:, 0]).sum())
            n_full += int((table[:, 3] - table[:, 2]).sum())
        quad = torch.from_numpy(take(s_q * s_k, np.uint8).reshape(s_q, s_k).astype(bool))
        assert torch.equal(quad, allowed), f"QuadFrag fragments differ: {case}"
    assert pos == len(raw)
    assert n_full > 500 and n_visited - n_full > 1500  # both kinds of block (1081, 2402)


# --- scheduler --------------------------------------------------------------------------------

M_FASTEST, LONGEST_FIRST = 0, 1


def _sched_cases() -> list[tuple[int, ...]]:
    """(batch, heads, s_q, s_k, causal, order, section, num_sms, first): first = 1 puts the
    partial section first (Note [tile order options])."""
    rng = np.random.default_rng(5)
    cases = [
        (1, 1, 1, 1, 0, M_FASTEST, 1, 132, 0),
        (2, 3, 1000, 1000, 1, LONGEST_FIRST, 6, 132, 0),
        (3, 4, 2048, 1024, 1, LONGEST_FIRST, 1000, 7, 0),
        (1, 2, 129, 700, 1, LONGEST_FIRST, 1, 1, 0),
        (4, 5, 600, 600, 0, M_FASTEST, 1, 100000, 0),
        (2, 2, 2000, 130, 1, LONGEST_FIRST, 3, 132, 0),
        (8, 16, 2048, 2048, 1, LONGEST_FIRST, 25, 132, 1),
        (5, 5, 700, 700, 1, LONGEST_FIRST, 4, 9, 1),
        (3, 3, 900, 900, 1, LONGEST_FIRST, 3, 5, 1),  # 9 pairs: no partial section
        (4, 5, 600, 600, 0, M_FASTEST, 1, 7, 1),  # no sections to rotate
    ]  # fmt: skip
    for _ in range(60):
        b, h = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        s_q, s_k = (int(x) for x in rng.integers(1, 2500, 2))
        causal = int(rng.random() < 0.6)
        order = LONGEST_FIRST if causal else M_FASTEST
        section = int(rng.integers(1, b * h + 3))
        num_sms = int(rng.choice([1, 2, 7, 132, 148, 100000]))
        first = int(rng.random() < 0.5)
        cases.append((b, h, s_q, s_k, causal, order, section, num_sms, first))
    return cases


def _section_of(pairs: np.ndarray, n_pairs: int, section: int, first: int) -> np.ndarray:
    """Each pair's section in walk order: runs of `section` pairs; with `first`, a partial last
    section is walked first (-1)."""
    sec = pairs // section
    if first and n_pairs % section:
        sec = np.where(sec == n_pairs // section, -1, sec)
    return sec


def _parse_sched(text: str):
    blocks = text.split("case ")[1:]
    for blk in blocks:
        lines = blk.strip().splitlines()
        grid, total = (int(x) for x in lines[0].split())
        rows = np.array([[int(x) for x in ln.split()] for ln in lines[1:]], dtype=np.int64)
        yield grid, total, rows.reshape(-1, 5)


@pytest.mark.parametrize(
    "case, keys",
    [
        # (s_q, s_k, window_left, window_right, causal): (80-key blocks, 64-key blocks)
        ((512, 512, -1, -1, 0), (4 * 560, 4 * 512)),  # 7 blocks of 80 per tile, 32 keys past
        ((512, 512, -1, -1, 1), (160 + 320 + 400 + 560, 128 + 256 + 384 + 512)),
        ((1024, 1024, -1, -1, 0), (8 * 1040, 8 * 1024)),
        ((2048, 2048, -1, -1, 1), (17920, 128 * 136)),  # 16 diagonal tiles, 1.029
        ((100, 100, -1, -1, 0), (160, 128)),  # one tile, rows past the sequence see nothing
        ((256, 256, 40, 0, 0), (160 + 240, 128 + 192)),  # a 41-key band: tile 1 sees keys 88-255
    ],
)
def test_keys_computed(case, keys, harness, tmp_path):
    """Note [hd256 narrow blocks]: the key columns the S GEMMs compute per sequence (whole blocks,
    the diagonal's and the tail's included), as the SM90 forward's dispatch compares them."""
    (tmp_path / "in.txt").write_text(" ".join(map(str, case)) + "\n")
    _run(harness, "keys", tmp_path / "in.txt", tmp_path / "out.txt")
    assert tuple(int(x) for x in (tmp_path / "out.txt").read_text().split()) == keys


def test_scheduler_visits_every_tile_once_in_order(harness, tmp_path):
    cases = _sched_cases()
    (tmp_path / "in.txt").write_text("".join(" ".join(map(str, c)) + "\n" for c in cases))
    _run(harness, "sched", tmp_path / "in.txt", tmp_path / "out.txt")
    parsed = list(_parse_sched((tmp_path / "out.txt").read_text()))
    assert len(parsed) == len(cases)
    for case, (grid, total, rows) in zip(cases, parsed, strict=True):
        b, h, s_q, s_k, causal, order, section, num_sms, first = case
        n_m = -(-s_q // 128)
        assert total == b * h * n_m and grid == min(num_sms, total), case
        cta, bi, hi, mi, cost = rows.T
        assert len(rows) == total, case
        # exactly once: the (batch, head, m_block) triples are a permutation of all of them
        key = (bi * h + hi) * n_m + mi
        assert np.array_equal(np.sort(key), np.arange(total)), case
        # CTA c's i-th item is work item w = c + i * grid (rows are grouped by CTA, in order)
        idx = np.concatenate([np.arange(np.count_nonzero(cta == c)) for c in range(grid)])
        w = cta + idx * grid
        by_w = np.argsort(w)
        assert np.array_equal(w[by_w], np.arange(total)), case
        if order == M_FASTEST:
            assert np.array_equal(key[by_w], np.arange(total)), case  # m_block fastest
            continue
        # LPT: per section of `section` (batch, head) pairs (the first of `first`), m_block
        # descending, pair fastest
        pair, m_w, cost_w = (bi * h + hi)[by_w], mi[by_w], cost[by_w]
        sec = _section_of(pair, b * h, section, first)
        assert np.all(np.diff(sec) >= 0), case
        for s in np.unique(sec):
            sel = sec == s
            assert np.all(np.diff(m_w[sel]) <= 0), case
            assert np.all(np.diff(pair[sel].reshape(-1, np.unique(pair[sel]).size)) > 0), case
            if causal:
                assert np.all(np.diff(cost_w[sel]) <= 0), f"{case}: cost rises in section {s}"
                assert cost_w[sel][0] == cost_w.max(), case
        first_pairs = np.unique(pair[sec == sec[0]]).size
        if causal and grid <= first_pairs * n_m:
            first = cost_w[:grid]  # every CTA's first tile: the most expensive ones, in order
            assert np.all(np.diff(first) <= 0) and first[0] == cost_w.max(), case


@pytest.mark.parametrize(
    "case, want",
    [
        # (batch, heads_q, heads_kv, s_q = s_k, ctas, FA4_TILE_ORDER): (ok, section, rotation);
        # d = d_v = 128 bf16, half of 50 MB: 100 pairs at 512 rows, 25 at 2k, 3 at 16k
        ((32, 16, 16, 512, 132, "-"), (1, 16, 0)),  # Note [default tile order]: first,wave,16
        ((32, 16, 16, 512, 132, "plain"), (1, 100, 0)),
        ((8, 16, 16, 2048, 132, "-"), (1, 8, 0)),  # 132 / 16 tiles: 8 pairs, 128 = 16 * 8
        ((4, 20, 20, 4096, 132, "-"), (1, 4, 0)),  # 132 / 32 tiles: 4 pairs
        ((5, 12, 4, 512, 132, "-"), (1, 18, 216)),  # groups of 3: 16 -> 18; 60 = 3 * 18 + 6
        ((8, 16, 16, 2048, 132, "plain,16"), (1, 16, 0)),
        ((32, 16, 16, 512, 132, "first"), (1, 100, 2000)),  # 512 = 5 * 100 + 12: 500 * 4 items
        ((32, 16, 16, 512, 132, "wave"), (1, 33, 0)),  # 132 CTAs / 4 tiles
        ((32, 16, 16, 512, 132, "first,wave"), (1, 33, 1980)),  # 512 = 15 * 33 + 17
        ((32, 16, 16, 512, 396, "wave,first"), (1, 99, 1980)),  # three CTAs per SM: 396 / 4
        ((8, 16, 16, 2048, 132, "first"), (1, 25, 2000)),  # 125 pairs * 16 tiles
        ((8, 16, 16, 2048, 132, "first,16"), (1, 16, 0)),  # 128 = 8 * 16: nothing partial
        ((1, 16, 16, 16384, 132, "wave"), (1, 1, 0)),  # 132 CTAs / 128 tiles: one pair
        ((32, 16, 16, 512, 132, "7"), (1, 7, 0)),
        ((32, 16, 16, 512, 132, "200"), (1, 100, 0)),  # a cap above the L2 rule's section
        ((4, 32, 4, 512, 132, "wave"), (1, 32, 0)),  # GQA groups of 8: 33 -> 4 groups
        ((4, 32, 4, 512, 132, "5,first"), (1, 8, 0)),  # a cap rounds up to whole groups
        ((4, 32, 4, 512, 132, "last"), (0, 0, 0)),  # unknown token: the launch refuses
        ((4, 32, 4, 512, 132, "0"), (0, 0, 0)),
        ((4, 32, 4, 512, 132, "wave,,first"), (0, 0, 0)),
        ((4, 32, 4, 512, 132, "wave,"), (0, 0, 0)),
        ((4, 32, 4, 512, 132, ",wave"), (0, 0, 0)),
        ((32, 16, 16, 512, 132, "l2"), (1, 100, 0)),  # the forward's sections always are
    ],
)
def test_tile_order_options(case, want, harness, tmp_path):
    """Note [tile order options]: FA4_TILE_ORDER's tokens, as TileScheduler::for_forward applies
    them (GQA-aligned sections; invalid text flagged for the launch to refuse)."""
    b, h, h_kv, s, ctas, text = case
    (tmp_path / "in.txt").write_text(f"{b} {h} {h_kv} {s} {s} {ctas} {text}\n")
    _run(harness, "order", tmp_path / "in.txt", tmp_path / "out.txt")
    got = tuple(int(x) for x in (tmp_path / "out.txt").read_text().split())
    if want[0] == 0:
        assert got[0] == 0, case  # the rest is whatever the valid tokens gave: unused
    else:
        assert got == want, case


@pytest.mark.parametrize(
    "case, want",
    [
        # (causal, deterministic, FA4_BWD_TILE_ORDER): (ok, first, wave, l2, max_pairs,
        # slice_heads)
        ((1, 0, "-"), (1, 1, 1, 0, 0, 0)),  # Note [default tile order]: first,wave
        ((1, 1, "-"), (1, 0, 0, 0, 0, 0)),  # deterministic: pair by pair
        ((0, 0, "-"), (1, 0, 0, 0, 0, 0)),  # unmasked: pair by pair
        ((0, 1, "-"), (1, 0, 0, 0, 0, 0)),
        ((1, 0, "plain"), (1, 0, 0, 0, 0, 0)),  # the old walk, to measure against
        ((1, 0, "l2,first"), (1, 1, 0, 1, 0, 0)),  # named options replace the defaults
        ((0, 1, "7,first"), (1, 1, 0, 0, 7, 0)),  # and apply whatever the problem
        ((1, 0, "plain,x"), (0,)),
        # Note [GQA head slices]: "heads<n>" alone keeps the walk's defaults
        ((1, 0, "heads1"), (1, 1, 1, 0, 0, 1)),
        ((1, 0, "plain,heads12"), (1, 0, 0, 0, 0, 12)),
        ((0, 0, "3,heads2"), (1, 0, 0, 0, 3, 2)),
        ((1, 0, "heads0"), (0,)),
        ((1, 0, "heads"), (0,)),
        ((1, 0, "heads2x"), (0,)),
        ((1, 0, "first,heads"), (0,)),
    ],
)
def test_bwd_default_tile_order(case, want, harness, tmp_path):
    """Note [default tile order]: the backward's options when FA4_BWD_TILE_ORDER is unset, and
    that any value set replaces them."""
    (tmp_path / "in.txt").write_text(" ".join(map(str, case)) + "\n")
    _run(harness, "bwdopts", tmp_path / "in.txt", tmp_path / "out.txt")
    got = tuple(int(x) for x in (tmp_path / "out.txt").read_text().split())
    assert got[: len(want)] == want, case


@pytest.mark.parametrize(
    "case, want",
    [
        # (seqlen_q, group, d, dv, given): q heads per item. 8k rows at d = 128: 8.45 MB a head.
        ((8192, 7, 128, 128, 0), 1),  # Qwen 28:4: 59 MB a group, past half the L2
        ((8192, 4, 128, 128, 0), 1),  # Llama 32:8: 34 MB
        ((8192, 8, 64, 64, 0), 2),  # gpt-oss 64:8 hd64: 4.3 MB a head, two fit 10 MiB
        ((4096, 4, 128, 128, 0), 4),  # 17 MB: whole groups
        ((1024, 4, 128, 128, 0), 4),
        ((16384, 7, 128, 128, 0), 1),  # 17 MB a head: still one
        ((2048, 16, 64, 64, 0), 16),  # 17 MB: whole
        ((8192, 7, 128, 128, 3), 3),  # given
        ((128, 7, 128, 128, 9), 7),  # given past the group: whole groups
        ((0, 4, 128, 128, 0), 4),  # no rows
    ],
)
def test_bwd_slice_heads(case, want, harness, tmp_path):
    """Note [GQA head slices]: whole groups while a group's Q, dO, dQ and row statistics fit
    half the L2, else as many heads as fit 10 MiB; a given count wins, capped at the group."""
    (tmp_path / "in.txt").write_text(" ".join(map(str, case)) + "\n")
    _run(harness, "slices", tmp_path / "in.txt", tmp_path / "out.txt")
    assert int((tmp_path / "out.txt").read_text()) == want, case


BWD_GRID_CASES = [
    # (n_tiles, heads_kv, batch, descending, ctas, pair_bytes, FA4_BWD_TILE_ORDER): (section,
    # rotation). 2k rows at d = 128: 16 tiles, 16 heads, batch 8, 2 MB a pair.
    ((16, 16, 8, 0, 132, 2 << 20, "-"), (1, 0)),  # pair by pair
    ((16, 16, 8, 0, 132, 2 << 20, "wave"), (8, 0)),  # 132 / 16
    ((16, 16, 8, 0, 132, 2 << 20, "l2"), (12, 0)),  # 25 MB / 2 MB
    ((16, 16, 8, 0, 132, 2 << 20, "l2,first"), (12, 1920)),  # 128 = 10 * 12 + 8: 120 * 16
    ((16, 16, 8, 1, 132, 2 << 20, "l2,wave,first"), (8, 0)),  # the smallest cap; 128 = 16 * 8
    ((16, 16, 8, 1, 132, 2 << 20, "5,first"), (5, 2000)),  # 125 * 16; deterministic: n descending
    ((4, 3, 5, 0, 132, 1 << 20, "100"), (15, 0)),  # capped at the pairs there are
    ((7, 1, 1, 0, 132, 1 << 20, "wave"), (1, 0)),  # one pair: nothing to order
    ((3, 5, 2, 0, 1, 1 << 20, "wave"), (1, 0)),  # 1 CTA / 3 tiles: one pair a section
    ((16, 16, 8, 0, 132, 2 << 20, "wave,x"), None),  # unknown token
    # Note [GQA head slices]: (batch, kv head, slice) pairs, slices of a kv head adjacent
    ((16, 4, 1, 0, 132, 2 << 20, "wave", 4), (8, 0)),  # 16 pairs, 132 / 16
    ((16, 2, 3, 0, 132, 2 << 20, "l2,first", 3), (12, 192)),  # 18 pairs = 12 + 6: 12 * 16 before
    ((5, 3, 1, 1, 132, 1 << 20, "-", 2), (1, 0)),  # pair by pair, n descending
]


def _parse_bwdgrid(text: str):
    for blk in text.split("case ")[1:]:
        lines = blk.strip().splitlines()
        ok, section, rotation = (int(x) for x in lines[0].split())
        items = np.array([[int(x) for x in ln.split()] for ln in lines[1:]], dtype=np.int64)
        yield ok, section, rotation, items.reshape(-1, 4)


def test_bwd_grid_orders(harness, tmp_path):
    """Note [bwd tile order options]: every kv tile of every (batch, kv head, slice) once
    (Note [GQA head slices]: a case's 8th value, 1 when absent); sections of pairs, each walked
    with the kv tile slowest (ascending, or descending in deterministic mode) and the pair
    fastest; the partial section first under "first"."""
    cases = [(c if len(c) == 8 else (*c, 1), want) for c, want in BWD_GRID_CASES]
    (tmp_path / "in.txt").write_text("".join(" ".join(map(str, c)) + "\n" for c, _ in cases))
    _run(harness, "bwdgrid", tmp_path / "in.txt", tmp_path / "out.txt")
    parsed = list(_parse_bwdgrid((tmp_path / "out.txt").read_text()))
    assert len(parsed) == len(BWD_GRID_CASES)
    for (case, want), (ok, section, rotation, items) in zip(cases, parsed, strict=True):
        if want is None:
            assert ok == 0, case
            continue
        n_tiles, heads_kv, batch, descending, *_, slices = case
        assert ok == 1 and (section, rotation) == want, case
        n, h, b, sl = items.T
        pair = (b * heads_kv + h) * slices + sl
        key = pair * n_tiles + n
        pairs = heads_kv * batch * slices
        assert np.array_equal(np.sort(key), np.arange(n_tiles * pairs)), case
        sec = pair // section
        if rotation:  # the partial last section is walked first
            sec = np.where(sec == pairs // section, -1, sec)
        assert np.all(np.diff(sec) >= 0), case
        for s in np.unique(sec):
            sel = sec == s
            size = np.unique(pair[sel]).size
            steps = n[sel].reshape(n_tiles, size)  # kv tile slowest ...
            assert np.all(steps == steps[:, :1]), case
            order = steps[:, 0]
            want_n = np.arange(n_tiles)[::-1] if descending else np.arange(n_tiles)
            assert np.array_equal(order, want_n), case
            assert np.all(np.diff(pair[sel].reshape(n_tiles, size), axis=1) > 0), (
                case
            )  # pair fastest


# --- softmax: whole problems against the tile model -------------------------------------------


def _ex2_rounded(x: torch.Tensor) -> torch.Tensor:
    """Note [host exp2] in csrc/common/softmax.cuh: the model's MUFU.EX2 stand-in, computed in fp64
    and rounded, as the harness does (torch's fp32 exp2 and glibc's differ in 1 ulp for ~6 % of
    arguments; either is an equally good model of MUFU, which has ~2 ulp of error)."""
    return torch.exp2(x.double()).float().masked_fill(x < -126.0, 0.0)


@pytest.fixture
def gen(request) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))


def _grid_qk(gen, shape, mult: float = 1.0) -> torch.Tensor:
    """N(0, mult^2) rounded to multiples of 1/16 in (-8, 8): exact in bf16 and fp16, and every
    dot product of them (multiples of 2^-8 below 2^15 for d <= 256) is exact in fp32, so the
    harness's scores equal the model's bit for bit whatever the summation order."""
    x = torch.randn(*shape, generator=gen) * mult
    return (x * 16).round().clamp(-127, 127) / 16


def _problem(gen, b, s_q, s_k, h, h_kv, d, d_v, dtype, mult=1.0, exact=True):
    if exact:
        q, k = _grid_qk(gen, (b, s_q, h, d), mult), _grid_qk(gen, (b, s_k, h_kv, d), mult)
    else:
        q = torch.randn(b, s_q, h, d, generator=gen) * mult
        k = torch.randn(b, s_k, h_kv, d, generator=gen) * mult
    v = torch.randn(b, s_k, h_kv, d_v, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _run_attention(exe, tmp, q, k, v, cu_q, cu_k, used, *, causal, window, scale, softcap, tau,
                   emu16, degree, fused, shape=0, plog2=0):  # fmt: skip
    """q (total_q, h, d) etc. packed; returns out (total_q, h, d_v), lse (h, total_q), counts.
    plog2: OnlineSoftmax's kPLog2 (P scaled by 2^plog2 in the exponent, as the FP8 forwards)."""
    h, h_kv = q.shape[1], k.shape[1]
    hdr = [len(cu_q) - 1, h, h_kv, q.shape[2], v.shape[2], int(causal), *window, emu16, degree,
           int(fused), int(q.dtype == FP16), int(used is not None), shape, plog2]  # fmt: skip
    ints = hdr + list(cu_q) + list(cu_k) + (list(used) if used is not None else [])
    blob = struct.pack(f"{len(ints)}i3f", *ints, scale, softcap, tau)
    blob += b"".join(t.float().contiguous().numpy().tobytes() for t in (q, k, v))
    (tmp / "attn.in").write_bytes(blob)
    text = _run(exe, "attn", tmp / "attn.in", tmp / "attn.out")
    res = np.fromfile(tmp / "attn.out", dtype=np.float32)
    n_out = q.shape[0] * h * v.shape[2]
    out = torch.from_numpy(res[:n_out].copy()).view(q.shape[0], h, v.shape[2])
    lse = torch.from_numpy(res[n_out:].copy()).view(h, q.shape[0])
    counts = {key: int(val) for key, val in (ln.split() for ln in text.splitlines())}
    return out, lse, counts


def _model(q, k, v, *, causal, window, scale, softcap, tau, emu16, degree, shape=0):
    bm, bn = ((128, 128), (64, 176))[shape]
    return attention_fa4_model(
        q, k, v, causal=causal, softmax_scale=scale, window_size=window, softcap=softcap,
        tau=tau, emu_fraction=emu16 / 16, emu_degree=degree, block_m=bm, block_n=bn,
    )  # fmt: skip


def _check_counts(name, counts, m_counts):
    """The harness's counts equal the model's; Note [stale-max vote]: keeps_max agreed with
    update_max on every row and block (it kept exactly the rows that had seen a key and were not
    rescaled), so it held at least on every skipped one."""
    counts = dict(counts)
    kept, mismatch = counts.pop("kept"), counts.pop("keep_mismatch")
    assert mismatch == 0 and kept >= counts["skipped"], f"{name}: kept {kept}, {mismatch} wrong"
    assert counts == {key: m_counts[key] for key in COUNT_KEYS}, f"{name}: {counts} vs {m_counts}"


def _check_close(name, out, lse, m_out, m_lse, v, out_tol, lse_tol=1e-6):
    """|out - model| <= out_tol · max|v|; |lse - model| <= lse_tol · max(1, |lse|), and -inf
    exactly where the model has it."""
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), name
    err = (out.double() - m_out.double()).abs().max().item() if out.numel() else 0.0
    assert err <= out_tol * v.float().abs().max().item(), f"{name}: out err {err:.3g}"
    inf = torch.isinf(m_lse)
    assert torch.equal(torch.isinf(lse), inf) and torch.equal(lse[inf], m_lse[inf]), name
    fin = ~inf
    if fin.any():
        lerr = (lse[fin].double() - m_lse[fin].double()).abs() / m_lse[fin].abs().clamp(min=1)
        assert lerr.max().item() <= lse_tol, f"{name}: lse err {lerr.max().item():.3g}"


def _dense_check(exe, tmp, q, k, v, *, out_tol, lse_tol=1e-6, **kw):
    b, s_q, h, _ = q.shape
    s_k = k.shape[1]
    cu_q, cu_k = [i * s_q for i in range(b + 1)], [i * s_k for i in range(b + 1)]
    out, lse, counts = _run_attention(
        exe, tmp, q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, None, **kw
    )
    model_kw = {n: kw[n] for n in kw if n not in ("fused", "plog2")}
    m_out, m_lse, m_counts = _model(q, k, v, **model_kw)
    m_lse = m_lse.permute(1, 0, 2).reshape(h, b * s_q)
    _check_counts("dense", counts, m_counts)
    _check_close("dense", out, lse, m_out.flatten(0, 1), m_lse, v, out_tol, lse_tol)
    return out.view(b, s_q, h, -1), lse.view(h, b, s_q).transpose(0, 1), counts


MODEL_KW = dict(scale=None, softcap=0.0, window=(-1, -1), causal=False, tau=8.0, emu16=0, degree=3)

# (s_q, s_k, h, h_kv, d, causal, window, tau, emu16, degree, dtype, shape)
EXACT_CASES = [
    (1, 1, 2, 1, 64, True, (-1, -1), 8.0, 4, 3, BF16, 0),
    (17, 17, 2, 2, 64, False, (-1, -1), 0.0, 16, 3, FP16, 0),
    (1, 113, 2, 2, 128, True, (-1, -1), 8.0, 0, 3, BF16, 0),
    (257, 113, 2, 1, 64, True, (-1, -1), 8.0, 4, 3, BF16, 0),
    (257, 113, 2, 2, 64, True, (-1, -1), 0.0, 16, 3, FP16, 0),
    (113, 257, 4, 2, 128, True, (-1, -1), 8.0, 3, 3, BF16, 0),
    (300, 300, 2, 2, 64, False, (40, 7), 8.0, 4, 3, BF16, 0),
    (300, 300, 2, 2, 64, True, (64, -1), 0.0, 4, 2, FP16, 0),
    (260, 420, 2, 1, 64, False, (-1, -1), 8.0, 16, 5, BF16, 1),
    (200, 150, 2, 2, 64, True, (-1, -1), 0.0, 0, 3, BF16, 1),
]


def _exact_id(c):
    s_q, s_k, h, h_kv, d, causal, win, tau, emu, deg, dt, shape = c
    parts = [f"{s_q}x{s_k}", f"h{h}_{h_kv}", f"d{d}"] + ["causal"] * causal
    parts += [f"win{win[0]}_{win[1]}"] * (win != (-1, -1)) + [f"tau{tau:g}", f"emu{emu}"]
    return "-".join(parts + [f"deg{deg}", "fp16" if dt == FP16 else "bf16", f"shape{shape}"])


@pytest.mark.parametrize("case", EXACT_CASES, ids=[_exact_id(c) for c in EXACT_CASES])
def test_softmax_reproduces_model(case, harness, tmp_path, gen, monkeypatch):
    """The model's own arithmetic (scores scaled in its three steps, scale_log2 = 1): P agrees
    bit for bit, so out and lse differ only by the order of the fp32 sums (l and P·V).
    Measured: out within 6.2e-8 · max|v|, lse within 2.1e-7 (relative); asserted 1e-6."""
    monkeypatch.setattr(reference, "_ex2_mufu", _ex2_rounded)
    s_q, s_k, h, h_kv, d, causal, window, tau, emu16, degree, dtype, shape = case
    q, k, v = _problem(gen, 2, s_q, s_k, h, h_kv, d, d, dtype)
    kw = dict(MODEL_KW, causal=causal, window=window, tau=tau, emu16=emu16, degree=degree)
    kw.update(scale=d**-0.5, shape=shape, fused=False)
    _dense_check(harness, tmp_path, q, k, v, out_tol=1e-6, **kw)


# (s_q, s_k, causal, window, softcap, tau, emu16, dtype, q/k multiplier)
FUSED_CASES = [
    (113, 257, False, (-1, -1), 0.0, 8.0, 4, BF16, 1.0),
    (257, 113, True, (-1, -1), 5.0, 8.0, 16, BF16, 1.0),
    (300, 300, True, (-1, -1), 2.0, 0.0, 4, FP16, 2.0),
    (300, 300, False, (33, 20), 0.0, 8.0, 0, BF16, 3.0),
]


# Degree-3 exp2_poly's max relative error (docs/numerics.md, "Error table"). Folded, the row
# max's own exponent is the rounding residual of x · scale_log2 (~1e-7, either sign), not the
# model's exact 0; a negative one reduces to f = x + 1 -> 1, where the polynomial's error is at
# its maximum instead of 0 at f = 0. So l, and lse, move by up to this much when emulated.
POLY3_ERR = 8.57e-5


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: f"{c[0]}x{c[1]}-cap{c[4]:g}-x{c[8]:g}")
def test_softmax_folded_scaling(case, harness, tmp_path, gen, monkeypatch):
    """The kernels' folded scaling (ScoreScale, apply_softcap; Note [score scaling]) on plain
    random inputs: the same decisions as the model, and out within the tolerance rule against
    exact attention. Against the model: lse within fp32 rounding plus POLY3_ERR; out within
    2^-12 · max|v|: P differs from the model's by an ulp or two (one rounding of x · c, tanhf
    vs torch's tanh), which moves some P across a 16-bit rounding boundary, each such P moving
    out by up to 2^-8 · P/l · |v|. Measured: 1.4e-5 .. 5.5e-5 · max|v|."""
    monkeypatch.setattr(reference, "_ex2_mufu", _ex2_rounded)
    s_q, s_k, causal, window, softcap, tau, emu16, dtype, mult = case
    q, k, v = _problem(gen, 2, s_q, s_k, 4, 2, 128, 128, dtype, mult=mult, exact=False)
    kw = dict(MODEL_KW, causal=causal, window=window, softcap=softcap, tau=tau, emu16=emu16)
    kw.update(scale=128**-0.5, fused=True)
    lse_tol = 2e-6 + (POLY3_ERR if emu16 else 0.0)
    out, lse, _ = _dense_check(harness, tmp_path, q, k, v, out_tol=2**-12, lse_tol=lse_tol, **kw)
    ref_kw = dict(causal=causal, window_size=window, softcap=softcap, softmax_scale=kw["scale"])
    ref, ref_lse = attention_ref(q, k, v, **ref_kw)
    pt, pt_lse = attention_ref(q, k, v, upcast=False, **ref_kw)
    assert_tolerance("out", out, ref, pt, dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, dtype)


@pytest.mark.parametrize("emu16,causal", [(0, True), (4, False)])
def test_softmax_p_scale_in_exponent(emu16, causal, harness, tmp_path, gen, monkeypatch):
    """Note [fp8 P scale]: OnlineSoftmax<Frag, 8> makes P' = 2^(x c - m + 8)
    (exp2_poly on the emulated columns sees arguments up to 8), l sums P', and finalize takes
    the 8 out of the LSE: the same decisions, out and lse as the model (P' · 2^-8 rounds to 16
    bits as P does, a power of two; the argument x c + (8 - m) rounds at a larger magnitude than
    x c - m, an ulp of P, hence the folded tolerances of test_softmax_folded_scaling). A finalize
    that kept the 8 would move lse by 8 ln 2."""
    monkeypatch.setattr(reference, "_ex2_mufu", _ex2_rounded)
    q, k, v = _problem(gen, 2, 257, 300, 4, 2, 128, 128, BF16, exact=False)
    kw = dict(MODEL_KW, causal=causal, tau=0.0, emu16=emu16, scale=128**-0.5, fused=True, plog2=8)
    lse_tol = 2e-6 + (POLY3_ERR if emu16 else 0.0)
    _dense_check(harness, tmp_path, q, k, v, out_tol=2**-12, lse_tol=lse_tol, **kw)


def _ramp(gen, growth: float, n_blocks: int = 4, d: int = 64):
    """Scores (log2 units) of key block j about growth·j: every block's row max exceeds the
    previous block's by ~growth binades. Exact inputs: k[..., 0] is a bf16 value >= 1/2
    (a multiple of 2^-8) or 0, the rest multiples of 1/16."""
    s = 128 * n_blocks
    q, k, v = _problem(gen, 1, 256, s, 2, 2, d, d, BF16, mult=0.1)
    q[..., 0] = 1.0
    log2_per_unit = d**-0.5 / math.log(2.0)
    k[..., 0] = ((torch.arange(s) // 128).view(1, s, 1) * (growth / log2_per_unit)).to(BF16)
    return q, k, v


@pytest.mark.parametrize("growth,tau", [(12.0, 8.0), (3.0, 8.0), (3.0, 0.0)])
def test_softmax_growing_scores(growth, tau, harness, tmp_path, gen, monkeypatch):
    """Adversarial: the max grows every key block, so rescales happen (and with growth 3 < tau
    the stale max is kept twice, then the third block rescales)."""
    monkeypatch.setattr(reference, "_ex2_mufu", _ex2_rounded)
    q, k, v = _ramp(gen, growth)
    kw = dict(MODEL_KW, tau=tau, emu16=4, scale=64**-0.5, fused=False)
    _, _, c = _dense_check(harness, tmp_path, q, k, v, out_tol=1e-6, **kw)
    rows = 2 * 256
    expect = {12.0: (3 * rows, 0), 3.0: (rows, 2 * rows)}[growth] if tau else (3 * rows, 0)
    assert (c["rescaled"], c["skipped"]) == expect, c
    assert c["warp_groups_skipped"] == (0 if expect[1] == 0 else 2 * 2 * 8), c


def _dot_with_log2_score(target: np.float32) -> list[float]:
    """Three bf16 values whose sum b (exact in fp32 in any order) has fl(b · log2 e) == target:
    three 8-bit pieces make any fp32 b, and near b = target / log2 e consecutive products are
    less than an ulp of target apart, so one of them lands on it."""
    log2e = np.float32(1.0 / math.log(2.0))
    b = np.float32(target / log2e)
    for _ in range(4):
        if b * log2e == target:
            break
        b = np.nextafter(b, np.float32(np.inf if b * log2e < target else -np.inf))
    assert b * log2e == target
    pieces, rest = [], b
    for _ in range(3):
        piece = torch.tensor(float(rest)).to(BF16).item()
        pieces.append(piece)
        rest = np.float32(rest - np.float32(piece))
    assert rest == 0 and np.float32(sum(pieces)) == b
    return pieces


@pytest.mark.parametrize("fused", [False, True], ids=["model_order", "folded"])
@pytest.mark.parametrize("tau", [0.0, 8.0])
def test_softmax_tie_keeps_stale_max(tau, fused, harness, tmp_path, gen, monkeypatch):
    """The rescale test is strict (Note [conditional rescale]): a block whose row max is exactly
    m + tau keeps the stale max. Block 0's scores are x0 = fl(1 · log2 e) (scale 1), block 1's
    exactly fl(x0 + tau) in fp32. Folded, the tolerances of test_softmax_folded_scaling."""
    monkeypatch.setattr(reference, "_ex2_mufu", _ex2_rounded)
    log2e = np.float32(1.0 / math.log(2.0))
    pieces = _dot_with_log2_score(np.float32(log2e + np.float32(tau)))
    q = torch.zeros(1, 64, 1, 64)
    k = torch.zeros(1, 256, 1, 64)
    q[..., :3] = 1.0
    k[:, :128, :, 0] = 1.0
    k[:, 128:, :, :3] = torch.tensor(pieces)
    v = torch.randn(1, 256, 1, 64, generator=gen)
    q, k, v = q.to(BF16), k.to(BF16), v.to(BF16)
    kw = dict(MODEL_KW, tau=tau, emu16=4, scale=1.0, fused=fused)
    tol = dict(out_tol=2**-12, lse_tol=2e-6 + POLY3_ERR) if fused else dict(out_tol=1e-6)
    _, _, c = _dense_check(harness, tmp_path, q, k, v, **tol, **kw)
    assert (c["rows_first_block"], c["rescaled"], c["skipped"]) == (64, 0, 64), c


def test_softmax_varlen_seqused(harness, tmp_path, gen, monkeypatch):
    """Varlen through SeqInfo: zero-length query and key sequences, seqused_k (which moves the
    causal diagonal); each sequence must equal the model run on it alone."""
    monkeypatch.setattr(reference, "_ex2_mufu", _ex2_rounded)
    lens_q, lens_k, used = [5, 0, 130, 40, 1], [7, 9, 200, 0, 300], [7, 3, 150, 0, 0]
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_k)])
    h, h_kv, d = 4, 2, 64
    q = _grid_qk(gen, (int(cu_q[-1]), h, d)).to(BF16)
    k = _grid_qk(gen, (int(cu_k[-1]), h_kv, d)).to(BF16)
    v = torch.randn(int(cu_k[-1]), h_kv, d, generator=gen).to(BF16)
    kw = dict(MODEL_KW, causal=True, window=(50, -1), emu16=4, scale=0.125)
    out, lse, counts = _run_attention(
        harness, tmp_path, q, k, v, cu_q.tolist(), cu_k.tolist(), used, fused=False, **kw
    )
    m_counts = dict.fromkeys(COUNT_KEYS, 0)
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i] + used[i])
        if qs.stop == qs.start:
            continue
        m_out, m_lse, st = _model(q[None, qs], k[None, ks], v[None, ks], **kw)
        _check_close(f"sequence {i}", out[qs], lse[:, qs], m_out[0], m_lse[0], v, 1e-6)
        for key in COUNT_KEYS:
            m_counts[key] += st[key]
    _check_counts("varlen", counts, m_counts)
    assert torch.isinf(lse[:, cu_q[3] : cu_q[4]]).all()  # seqused_k = 0: no key
    assert (out[cu_q[3] : cu_q[4]] == 0).all()


# --- device code ------------------------------------------------------------------------------


def test_compiles_as_device_code(tmp_path):
    """common/mask.cuh, common/softmax.cuh (QuadFrag, kThreadsPerRow = 4, and RowMajorFrag, 1) and
    common/tile_scheduler.cuh in __global__ functions for sm_90a and sm_100a; no local memory (an
    array indexed at run time, or spills, would show as a stack frame)."""
    nvcc = need_tool("nvcc", "compile the shared headers as device code")
    cmd = [nvcc, "-x", "cu", "-std=c++17", "-O3", f"-I{ROOT / 'csrc'}", "-c", "-o",
           str(tmp_path / "d.o")]  # fmt: skip
    cmd += ["-Xptxas", "-v", "-Werror", "all-warnings"]
    cmd += [
        "-gencode",
        "arch=compute_90a,code=sm_90a",
        "-gencode",
        "arch=compute_100a,code=sm_100a",
    ]
    res = subprocess.run([*cmd, str(DEVICE_SRC)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    report = re.findall(r"Compiling entry function '(\w+)' for '(sm_\w+)'", res.stderr)
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", res.stderr)
    assert len(report) == len(frames) and len(report) >= 6, res.stderr
    assert {arch for _, arch in report} == {"sm_90a", "sm_100a"}, report
    for (fn, arch), (frame, spill) in zip(report, frames, strict=True):
        assert frame == "0" and spill == "0", f"{fn} on {arch}: {frame} B stack, {spill} B spill"


# --- padded head dims ---------------------------------------------------------------------------


def test_cover_matches_manifest(harness, tmp_path):
    """Note [padded head dims]: csrc/common/head_dims.h's cover (what run_fwd_* / run_bwd_* pick)
    and fa4.manifest.cover (what dispatch and the support matrix assume) choose the same compiled
    instance for every admissible (d, d_v) over several builds' head-dim lists, and
    admissible_head_dim agrees with dispatch.admissible_head_dim."""
    full = [tuple(p) for p in manifest.HEAD_DIMS.values()]
    lists = [full, [(64, 64), (128, 128)], [(128, 128)], [(192, 128), (256, 256)], [(96, 96)]]
    queries = [(d, dv) for d in range(0, 272, 8) for dv in (8, 64, 72, 128, 136, 200, 256)]
    queries += [(84, 84), (4, 4), (264, 128)]
    lines = [f"{len(ks)} {' '.join(f'{a} {b}' for a, b in ks)} {d} {dv}" for ks in lists
             for d, dv in queries]  # fmt: skip
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    _run(harness, "cover", tmp_path / "in.txt", tmp_path / "out.txt")
    got = [tuple(map(int, ln.split())) for ln in (tmp_path / "out.txt").read_text().splitlines()]
    want = [(*(manifest.cover(ks, d, dv) or (0, 0)), int(dispatch.admissible_head_dim(d)))
            for ks in lists for d, dv in queries]  # fmt: skip
    assert got == want
    assert manifest.cover(full, 128, 64) == (128, 128)  # least D + D_v, not the (192, 128) pair
    assert manifest.cover(full, 80, 80) == (96, 96)
    assert manifest.cover(full, 160, 64) == (192, 128)
    assert manifest.cover([(64, 64)], 72, 72) is None
