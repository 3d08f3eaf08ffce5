"""SM100 TMEM plans (csrc/tmem.cuh, csrc/sm100/bwd/): the column plans of the forward and the
backward, printed on the host by tests/cpp/tmem_plan_harness.cpp and bwd_tmem_plan_harness.cpp
(models.tmem_model reads them), checked for overlapping regions and the 512-column limit at every
head dim. The tcgen05 helpers' SASS: tests/sass/test_sass_tmem_probe.py.
"""

import itertools

import pytest
from models.tmem_model import bwd_plans as read_bwd_plans
from models.tmem_model import fwd_plans

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return fwd_plans(tmp_path_factory)


def regions(p):
    # S1 is Q tile 1's S, or with one Q tile (hd 256) the second S buffer of tile 0
    out = [("S0", p["s0"], p["block_n"]), ("S1", p["s1"], p["block_n"]), ("O0", p["o0"], p["d_v"])]
    if p["q_tiles"] == 2:
        out += [("O1", p["o1"], p["d_v"])]
    return out


def test_every_head_dim_has_a_plan(plans):
    assert [p["d_v"] for p in plans] == [64, 96, 128, 192, 256]


def test_regions_disjoint_and_within_512_columns(plans):
    for p in plans:
        spans = sorted((start, start + width, name) for name, start, width in regions(p))
        for (a0, a1, an), (b0, b1, bn) in itertools.pairwise(spans):
            assert a1 <= b0, f"d_v={p['d_v']}: {an} [{a0},{a1}) overlaps {bn} [{b0},{b1})"
        assert spans[-1][1] == p["end"] <= p["alloc"] <= 512, p
        assert p["alloc"] >= 32 and p["alloc"] & (p["alloc"] - 1) == 0, "power of two >= 32"
        assert p["p_cols"] * 2 == p["block_n"], "16-bit P packs two values per column"


def test_ping_pong_wherever_two_tiles_fit(plans):
    by_dv = {p["d_v"]: p for p in plans}
    assert all(by_dv[d]["q_tiles"] == 2 for d in (64, 96, 128, 192))
    assert by_dv[256]["q_tiles"] == 1  # O0 | O1 alone would take all 512 columns
    assert by_dv[256]["block_n"] == 64 and by_dv[256]["end"] == 384  # S0 | S1 | O0
    assert by_dv[128]["end"] == 512


# ---- Backward (Note [bwd TMEM plan], Note [bwd head-dim split]) -------------------------------


@pytest.fixture(scope="module")
def bwd_plans(tmp_path_factory):
    return read_bwd_plans(tmp_path_factory)


def test_bwd_plan_head_dims_and_regions(bwd_plans):
    assert [(p["d"], p["hdv"]) for p in bwd_plans] == [
        (64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)
    ]  # fmt: skip
    for p in bwd_plans:
        m, d, dv = p["block_m"], p["slice_d"], p["slice_dv"]
        spans = sorted(
            [(p["s"], p["s"] + m, "S/P"), (p["dp"], p["dp"] + max(m, d), "dP/dS/dQ"),
             (p["dk"], p["dk"] + d, "dK"), (p["dv"], p["dv"] + dv, "dV")]
        )  # fmt: skip
        for (a0, a1, an), (b0, b1, bn) in itertools.pairwise(spans):
            assert a1 <= b0, f"{p['d'], p['hdv']}: {an} [{a0},{a1}) overlaps {bn} [{b0},{b1})"
        assert spans[0][0] == 0 and spans[-1][1] == p["end"] <= p["alloc"] <= 512, p
        assert p["dq"] == p["dp"], "dQ shares dP's columns (Note [bwd MMA order])"
    assert bwd_plans[2]["end"] == 512  # d = 128 uses all of TMEM
    # Unsplit, d = 192 would need 128 + 192 + 192 + 192 = 704 columns.
    assert 128 + 3 * 192 > 512


def test_bwd_split_halves_the_accumulators(bwd_plans):
    """Note [bwd head-dim split]: above 128, each of two CTAs owns half of dK / dQ (slice_d) and of
    dV (slice_dv), with 64-row Q blocks; at or below 128 one CTA owns all of it."""
    for p in bwd_plans:
        split = 2 if max(p["d"], p["hdv"]) > 128 else 1
        assert (p["slice_d"], p["slice_dv"]) == (p["d"] // split, p["hdv"] // split), p
        assert p["block_m"] == (128 if split == 1 else 64), p
        assert p["slice_d"] % 32 == 0 and p["slice_dv"] % 32 == 0, "32-column TMEM loads"


def test_bwd_p_slices_stay_in_the_writers_loaded_half(bwd_plans):
    """Each compute warpgroup w loads S columns [w·m/2, (w+1)·m/2) in 32-column chunks and writes
    its P (16-bit, 8 columns per 16-element K slice) over the first chunk only, so neither
    warpgroup overwrites S the other (or its own second chunk load) still needs."""
    for p in bwd_plans:
        half = p["block_m"] // 2
        per_wg = half // 16
        assert len(p["slices"]) == p["block_m"] // 16
        for k, col in enumerate(p["slices"]):
            w = k // per_wg
            assert p["s"] + w * half <= col and col + 8 <= p["s"] + w * half + 32, (p["d"], k)
        assert len(set(p["slices"])) == len(p["slices"])
