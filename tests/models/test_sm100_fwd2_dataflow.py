"""The SM100 2-CTA forward's TMEM data flow (csrc/sm100/fwd/kernel_2cta.cuh, Note [fwd 2-CTA]),
executed on the CPU in float64 (the kernel itself cannot run here).

A cluster of two CTAs owns 256 query rows: CTA r holds Q tile r (rows [128 r, 128 r + 128)) in
its 128 TMEM lanes, with its own TMEM of the plan FwdTmemPlan<d_v, 128> (printed by
tests/cpp/tmem_plan_harness.cpp: S0 | S1 | O). The even CTA's cta_group::2 MMAs are replayed as
the hardware composes them from both CTAs' operands:
  S = Q·Kᵀ   M 256 (each CTA's 128 rows into its lanes), N 128 keys; B's N is split: CTA 0's
             sK holds keys [0, 64) of the block, CTA 1's keys [64, 128) (the load role's half
             block 2 n + rank); every CTA's S buffer gets all 128 key columns
  O += P·V   M 256, K 128 keys, N d_v; A: P from each CTA's own TMEM, 16-bit over the first 64
             columns of its S buffer, read per 16-key K slice 8 columns apart; B's N (d_v) is
             split: CTA 0's sV holds columns [0, d_v / 2) of all 128 keys, CTA 1 the rest
in the one-tile order (Note [one-tile order]): S(0), S(1), then per block PV(i) and S(i + 2)
into P(i)'s buffer. K and V go through the two shared-memory stages in load order. The row
statistics use the exact row max (the online rescale is tests/models/test_reference_model.py's
business), so each CTA's out must equal softmax(Q·Kᵀ)·V of its rows exactly; a plan with
overlapping regions, or K halves in the wrong CTA, gives NaN or a wrong O.

What this does not check: tcgen05's PTX semantics (how cta_group::2 really splits the B
operand), which only a Blackwell GPU can; the kernel's text is checked to use the replayed
addresses and halves.
"""

import math
import re
from pathlib import Path

import pytest
import torch
from models.tmem_model import N_LANES, Tmem, fwd_pair_plans

pytestmark = pytest.mark.build
ROOT = Path(__file__).resolve().parents[2]
KERNEL = (ROOT / "csrc/sm100/fwd/kernel_2cta.cuh").read_text()
K_SLICE = 16
BLOCK_N = 128  # keys per KV block (FwdTraits2::kBlockN)
STAGES = 2  # FwdTraits2::kStages


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return {p["d_v"]: p for p in fwd_pair_plans(tmp_path_factory)}


def replay(plan, q, k, v, scale, k_half_of=lambda rank: rank, v_half_of=lambda rank: rank):
    """out (256 × d_v: CTA 0's rows, then CTA 1's) after the pair's MMA order over
    len(k) // 128 KV blocks. k_half_of / v_half_of: which half of the block's keys (of V's
    columns) CTA `rank` loads (the kernel: its rank)."""
    n, dv = plan["block_n"], plan["d_v"]
    assert n == BLOCK_N and plan["q_tiles"] == 1
    nblk = k.shape[0] // n
    tm = [Tmem(), Tmem()]  # each CTA's tensor memory
    qs = [q[:N_LANES], q[N_LANES:]]  # each CTA's Q tile (sQ)
    s_cols = [plan["s0"], plan["s1"]]
    o_col = plan["o0"]
    # per CTA and stage: 64 K rows (sK) and 128 × d_v / 2 V columns (sV); None: not loaded
    sk = [[None] * STAGES for _ in range(2)]
    sv = [[None] * STAGES for _ in range(2)]
    row_max = [(qr @ k.T * scale).max(dim=1, keepdim=True).values for qr in qs]
    row_sum = [torch.zeros(N_LANES, 1, dtype=torch.float64) for _ in qs]

    def load(i):  # both CTAs' load threads: block i's halves into stage i % 2
        kb, vb = k[i * n : (i + 1) * n], v[i * n : (i + 1) * n]
        for r in range(2):
            h = k_half_of(r)
            sk[r][i % STAGES] = kb[h * (n // 2) : (h + 1) * (n // 2)]
            c = v_half_of(r)
            sv[r][i % STAGES] = vb[:, c * (dv // 2) : (c + 1) * (dv // 2)]

    def mma_s(i, buf):  # B's N: CTA 0's 64 rows of sK, then CTA 1's
        b = torch.cat([sk[0][i % STAGES], sk[1][i % STAGES]], dim=0)
        for r in range(2):
            tm[r].write32(s_cols[buf], qs[r] @ b.T)

    def softmax(i, buf):  # each CTA's softmax: S from its TMEM, P (16-bit) over S's first 64
        for r in range(2):
            s = tm[r].read32(s_cols[buf], n)
            p = torch.exp(s * scale - row_max[r])
            row_sum[r] += p.sum(dim=1, keepdim=True)
            tm[r].write16(s_cols[buf], p)

    def mma_pv(i, buf):  # B's N: CTA 0's d_v / 2 columns of sV, then CTA 1's; K: 128 keys
        b = torch.cat([sv[0][i % STAGES], sv[1][i % STAGES]], dim=1)
        for r in range(2):
            p = torch.cat([tm[r].read16(s_cols[buf] + kk * (K_SLICE // 2), K_SLICE)
                           for kk in range(n // K_SLICE)], dim=1)  # fmt: skip
            acc = tm[r].read32(o_col, dv) if i > 0 else 0
            tm[r].write32(o_col, acc + p @ b)

    for i in range(min(STAGES, nblk)):
        load(i)
    for i in range(min(2, nblk)):
        mma_s(i, i % 2)
    for i in range(nblk):
        softmax(i, i % 2)
        mma_pv(i, i % 2)
        # stage i % 2 is free again (kKEmpty after S(i), kVEmpty after PV(i)): block i + 2's
        # load; S(i + 2) over P(i), after PV(i) read it
        if i + STAGES < nblk:
            load(i + STAGES)
        if i + 2 < nblk:
            mma_s(i + 2, i % 2)
    return torch.cat([tm[r].read32(o_col, dv) / row_sum[r] for r in range(2)], dim=0)


def _inputs(d, nblk, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2 * N_LANES, d, generator=g, dtype=torch.float64)
    k = torch.randn(nblk * BLOCK_N, d, generator=g, dtype=torch.float64)
    v = torch.randn(nblk * BLOCK_N, d, generator=g, dtype=torch.float64)
    return q, k, v, 1.0 / math.sqrt(d)


def test_pair_plans_from_the_header(plans):
    # FwdTraits2::Plan is FwdTmemPlan<kHeadDimV, kBlockN> with kBlockN 128, one Q tile per CTA
    assert "using Plan = FwdTmemPlan<kHeadDimV, kBlockN>;" in KERNEL
    assert re.search(r"static constexpr int kBlockN = 128;", KERNEL)
    assert sorted(plans) == [192, 256]
    for dv, p in plans.items():
        assert p["block_n"] == BLOCK_N and p["q_tiles"] == 1
        assert (p["s0"], p["s1"], p["o0"]) == (0, 128, 256)
        assert p["end"] == 256 + dv <= p["alloc"] == 512
        assert p["p_cols"] == 64


def test_kernel_uses_the_replayed_halves_and_addresses():
    # the load role's halves (K: half block 2 n + rank; V: column block rank), the S buffer of
    # S(i), P's K slices 8 columns apart, O at kO0
    assert "tKgK(_, 2 * n + rank)" in KERNEL
    assert "make_coord(_, rank));" in KERNEL  # gV: this CTA's column half
    assert "tmem + Plan::kS0 + uint32_t(b) * T::kBlockN, k > 0 ? 1u : 0u, idesc_s" in KERNEL
    assert re.search(r"tmem \+ Plan::kS0 \+ uint32_t\(b\) \* T::kBlockN \+ k \* "
                     r"(\(T::kMmaK / 2\)|T::kPSliceColumns)", KERNEL)  # fmt: skip
    assert "tmem + Plan::kO0, (i > 0 || k > 0) ? 1u : 0u" in KERNEL
    assert "if (i + 2 < nblk) issue_s();" in KERNEL


@pytest.mark.parametrize("nblk", [1, 2, 3, 5])
@pytest.mark.parametrize("d", [192, 256])
def test_pair_dataflow_gives_exact_attention(plans, d, nblk):
    q, k, v, scale = _inputs(d, nblk, seed=d + nblk)
    out = replay(plans[d], q, k, v, scale)
    # both CTAs' rows: CTA 0's [0, 128), CTA 1's [128, 256)
    torch.testing.assert_close(out, torch.softmax(q @ k.T * scale, dim=-1) @ v)


@pytest.mark.parametrize("what", ["k", "v"])
def test_halves_in_the_wrong_cta_are_caught(plans, what):
    """The check can fail: the K halves (or V's column halves) swapped between the CTAs."""
    q, k, v, scale = _inputs(256, 3, seed=7)
    swap = {f"{what}_half_of": lambda rank: 1 - rank}
    out = replay(plans[256], q, k, v, scale, **swap)
    assert not torch.allclose(out, torch.softmax(q @ k.T * scale, dim=-1) @ v)


@pytest.mark.parametrize(
    "change",
    [{"o0": 128}, {"s1": 64}, {"o0": 192}],
    ids=["O-over-S1", "S1-over-S0", "O-over-half-of-S1"],
)
def test_an_overlapping_plan_is_caught(plans, change):
    q, k, v, scale = _inputs(256, 3, seed=11)
    out = replay(dict(plans[256], **change), q, k, v, scale)
    assert not torch.allclose(out, torch.softmax(q @ k.T * scale, dim=-1) @ v)
