"""The SM100 backward's TMEM data flow, executed on the CPU (the kernel itself cannot run here).

A model of tensor memory (128 lanes x 512 columns; a column holds one fp32 value or two 16-bit
values) replays the kernel's per-Q-block sequence (sm100/bwd/roles.cuh, Note [bwd MMA order])
with the column plan and the P / dS slice columns of the C++ header (BwdTmemPlan, printed by
tests/cpp/bwd_tmem_plan_harness.cpp): S = K·Qᵀ, P written over S by each compute warpgroup in its
32-column chunks, dV += P·dO reading P per 16-element K slice, S(i+1) over P, dP, dS over dP,
dK += dS·Q, dQ = dSᵀ·K over dS, the next dP over dQ. Writing 16-bit values into a column destroys
its fp32 value (NaN), so a plan whose regions or slices overlap a value still to be read gives
NaN or wrong gradients. Both warpgroup orders are replayed (warpgroup 0 first, then 1 first), and
both MMA orders (S(i+1) after dV(i) with two Q stages, after dQ(i) with one), and the dK, dV, dQ
of two Q blocks are compared with exact autograd in float64. Above d = 128 each of the tile's two
CTAs is replayed on its own column slice of dK, dV and dQ, with 64-row Q blocks and dQ in the
M = 64 MMA's lanes (Note [bwd head-dim split], Note [M = 64 dQ]), and the slices put together.

What this does not check: the PTX/SASS semantics of tcgen05 (operand majors, descriptors), which
only a Blackwell GPU can; docs/sm100.md says so.
"""

import math

import pytest
import torch
from models.tmem_model import N_LANES as N_KV
from models.tmem_model import Tmem, bwd_plans

pytestmark = pytest.mark.build
K_SLICE = 16


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return {(p["d"], p["hdv"]): p for p in bwd_plans(tmp_path_factory)}


def dq_lanes(block_m):
    """TMEM lane of each dQ row: all 128 lanes for an M = 128 MMA; for M = 64 (the split's 64-row
    Q blocks) row r in lane 32·(r / 16) + r % 16 (Note [M = 64 dQ])."""
    if block_m == 128:
        return list(range(128))
    return [32 * (r // 16) + r % 16 for r in range(block_m)]


def a_operand(tmem, plan, region):
    """The 16-bit A operand of a TS MMA (P or dS, kv x q) as the MMA thread reads it: K slice k
    (16 query columns) at slice_column(region, k)."""
    slices = [plan["slices"][k] - plan["s"] + region for k in range(plan["block_m"] // K_SLICE)]
    return torch.cat([tmem.read16(col, K_SLICE) for col in slices], dim=1)


def replay(
    plan, h, q_blocks, k, v, dos, lse2s, dpsums, scale_log2, wg_order, s_early=True, read_lanes=None
):
    """One CTA's sequence (column slice h of dK, dV, dQ) for one kv tile over len(q_blocks) Q
    blocks; s_early: S(i+1) right after dV(i) (two Q stages) or after dQ(i) (one Q stage, d =
    256); read_lanes: the lanes the reduce warpgroup takes dQ's rows from (default: where the MMA
    wrote them). Returns this CTA's dK (unscaled) and dV columns and the dQ columns of each
    block."""
    m, sd, sdv = plan["block_m"], plan["slice_d"], plan["slice_dv"]
    cd, cdv = slice(h * sd, (h + 1) * sd), slice(h * sdv, (h + 1) * sdv)
    tm = Tmem()
    half = m // 2
    lanes = dq_lanes(m)
    read_lanes = lanes if read_lanes is None else read_lanes
    dq_out = []

    def compute_p(i):
        for w in wg_order:  # each warpgroup: its m/2 query columns in 32-column chunks
            c0 = w * half
            for c in range(half // 32):
                s = tm.read32(plan["s"] + c0 + 32 * c, 32)
                cols = slice(c0 + 32 * c, c0 + 32 * c + 32)
                p = torch.exp2(s * scale_log2 - lse2s[i][cols])
                first_slice = (c0 + 32 * c) // K_SLICE
                tm.write16(plan["slices"][first_slice] - plan["s"] + plan["s"], p)
                p_kept[i][:, cols] = p

    def compute_ds(i):
        for w in wg_order:
            c0 = w * half
            for c in range(half // 32):
                dp = tm.read32(plan["dp"] + c0 + 32 * c, 32)
                cols = slice(c0 + 32 * c, c0 + 32 * c + 32)
                ds = p_kept[i][:, cols] * (dp - dpsums[i][cols])
                first_slice = (c0 + 32 * c) // K_SLICE
                tm.write16(plan["slices"][first_slice] - plan["s"] + plan["dp"], ds)
                sds[:, cols] = ds  # the shared-memory copy dQ reads

    p_kept = [torch.empty(N_KV, m, dtype=torch.float64) for _ in q_blocks]
    sds = torch.empty(N_KV, m, dtype=torch.float64)
    tm.write32(plan["s"], k @ q_blocks[0].T)  # S(0): all of d
    tm.write32(plan["dp"], v @ dos[0].T)  # dP(0): all of d_v
    for i in range(len(q_blocks)):
        nxt = i + 1 < len(q_blocks)
        compute_p(i)
        dv_add = a_operand(tm, plan, plan["s"]) @ dos[i][:, cdv]  # dV += P·dO (reads P)
        tm.write32(plan["dv"], (tm.read32(plan["dv"], sdv) if i else 0) + dv_add)
        if nxt and s_early:
            tm.write32(plan["s"], k @ q_blocks[i + 1].T)  # S(i+1) over P(i)
        compute_ds(i)
        dk_add = a_operand(tm, plan, plan["dp"]) @ q_blocks[i][:, cd]  # dK += dS·Q (reads dS)
        tm.write32(plan["dk"], (tm.read32(plan["dk"], sd) if i else 0) + dk_add)
        # dQ = dSᵀ·K over dS, query rows in the MMA's lanes; the reduce warpgroup loads them.
        tm.write32_lanes(plan["dq"], sds.T @ k[:, cd], lanes)
        dq_out.append(tm.read32(plan["dq"], sd)[read_lanes])
        if nxt and not s_early:
            tm.write32(plan["s"], k @ q_blocks[i + 1].T)  # S(i+1) after dQ(i): one Q stage
        if nxt:
            tm.write32(plan["dp"], v @ dos[i + 1].T)  # dP(i+1) over dQ(i)
    return tm.read32(plan["dk"], sd), tm.read32(plan["dv"], sdv), dq_out


def replay_tile(plan, *args, **kw):
    """Every CTA of the tile (two when split), their columns put side by side."""
    split = plan["d"] // plan["slice_d"]
    parts = [replay(plan, h, *args, **kw) for h in range(split)]
    dk = torch.cat([p[0] for p in parts], dim=1)
    dv = torch.cat([p[1] for p in parts], dim=1)
    dqs = [torch.cat([p[2][i] for p in parts], dim=1) for i in range(len(parts[0][2]))]
    return dk, dv, dqs


PAIRS = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]


@pytest.mark.parametrize("dims", PAIRS, ids=lambda p: f"d{p[0]}x{p[1]}")
@pytest.mark.parametrize("wg_order", [(0, 1), (1, 0)], ids=["wg0-first", "wg1-first"])
@pytest.mark.parametrize("s_early", [True, False], ids=["two-q-stages", "one-q-stage"])
def test_tmem_dataflow_gives_exact_gradients(plans, dims, wg_order, s_early):
    d, dv_dim = dims
    plan = plans[dims]
    m = plan["block_m"]
    g = torch.Generator().manual_seed(d + dv_dim)
    scale = 1.0 / math.sqrt(d)
    blocks = 2
    q = torch.randn(blocks * m, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(N_KV, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(N_KV, dv_dim, generator=g, dtype=torch.float64, requires_grad=True)
    do = torch.randn(blocks * m, dv_dim, generator=g, dtype=torch.float64)
    # Exact gradients of one kv tile's contribution: softmax over these 128 keys only.
    s = q @ k.T * scale
    out = torch.softmax(s, dim=-1) @ v
    out.backward(do)
    lse = torch.logsumexp(s, dim=-1).detach()
    lse2 = lse / math.log(2)
    dpsum = (do * out.detach()).sum(-1)
    rows = [slice(i * m, (i + 1) * m) for i in range(blocks)]
    dk, dv, dqs = replay_tile(
        plan, [q.detach()[r] for r in rows], k.detach(), v.detach(), [do[r] for r in rows],
        [lse2[r] for r in rows], [dpsum[r] for r in rows], scale / math.log(2), wg_order,
        s_early=s_early,
    )  # fmt: skip
    torch.testing.assert_close(dv, v.grad)
    torch.testing.assert_close(dk * scale, k.grad)
    torch.testing.assert_close(torch.cat(dqs) * scale, q.grad)


def _two_blocks(plan, seed, d, dv):
    g = torch.Generator().manual_seed(seed)
    m = plan["block_m"]
    q, do = (torch.randn(m, x, generator=g, dtype=torch.float64) for x in (d, dv))
    k = torch.randn(N_KV, d, generator=g, dtype=torch.float64)
    v = torch.randn(N_KV, dv, generator=g, dtype=torch.float64)
    z = torch.zeros(m, dtype=torch.float64)
    return [q, q], k, v, [do, do], [z, z], [z, z], 0.1, (0, 1)


def test_an_overlapping_plan_is_caught(plans):
    """The check can fail: dQ placed over dK (instead of over dP) corrupts dK."""
    plan = plans[(128, 128)]
    args = _two_blocks(plan, 1, 128, 128)
    dk_bad, _, _ = replay_tile(dict(plan, dq=plan["dk"]), *args)
    dk_ok, _, _ = replay_tile(plan, *args)
    assert not torch.allclose(dk_bad, dk_ok)


def test_a_wrong_m64_lane_map_is_caught(plans):
    """The check can fail on the M = 64 layout: a reduce warpgroup reading dQ's rows from lanes
    0-63 (as if the MMA were M = 128) gets, for rows 16-31 of each 32, what dS and dP left in
    lanes 16-31 of each quarter instead of dQ."""
    plan = plans[(256, 256)]
    args = _two_blocks(plan, 2, 256, 256)
    _, _, dq_ok = replay_tile(plan, *args)
    _, _, dq_bad = replay_tile(plan, *args, read_lanes=list(range(64)))
    assert torch.isfinite(torch.cat(dq_ok)).all()
    assert not torch.allclose(torch.cat(dq_bad), torch.cat(dq_ok), equal_nan=True)
