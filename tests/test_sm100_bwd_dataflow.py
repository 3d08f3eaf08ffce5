"""The SM100 backward's TMEM data flow, executed on the CPU (the kernel itself cannot run here).

A model of tensor memory (128 lanes x 512 columns; a column holds one fp32 value or two 16-bit
values) replays the kernel's per-Q-block sequence (bwd_sm100_roles.cuh, Note [bwd MMA order])
with the column plan and the P / dS slice columns of the C++ header (BwdTmemPlan, printed by
tests/cpp/bwd_tmem_plan_harness.cpp): S = K·Qᵀ, P written over S by each compute warpgroup in its
32-column chunks, dV += P·dO reading P per 16-element K slice, S(i+1) over P, dP, dS over dP,
dK += dS·Q, dQ = dSᵀ·K over dS, the next dP over dQ. Writing 16-bit values into a column destroys
its fp32 value (NaN), so a plan whose regions or slices overlap a value still to be read gives
NaN or wrong gradients. Both warpgroup orders are replayed (warpgroup 0 first, then 1 first), and
the dK, dV, dQ of two Q blocks are compared with exact autograd in float64.

What this does not check: the PTX/SASS semantics of tcgen05 (operand majors, descriptors), which
only a Blackwell GPU can; docs/sm100.md says so.
"""

import math
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import build_gxx
from tmem_model import N_LANES as N_KV
from tmem_model import Tmem

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.build
M_Q, K_SLICE = 128, 16


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    exe = build_gxx(
        ROOT / "tests/cpp/bwd_tmem_plan_harness.cpp", tmp_path_factory.mktemp("df") / "p"
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    keys = "d block_m s dp dq dk dv end alloc".split()
    rows = []
    for line in out.splitlines():
        v = list(map(int, line.split()))
        rows.append({**dict(zip(keys, v[:9], strict=True)), "slices": v[9:]})
    return {p["d"]: p for p in rows}


def a_operand(tmem, plan, region):
    """The 16-bit A operand of a TS MMA (P or dS, kv x q) as the MMA thread reads it: K slice k
    (16 query columns) at slice_column(region, k)."""
    slices = [plan["slices"][k] - plan["s"] + region for k in range(M_Q // K_SLICE)]
    return torch.cat([tmem.read16(col, K_SLICE) for col in slices], dim=1)


def replay(plan, q_blocks, k, v, dos, lse2s, dpsums, scale_log2, wg_order):
    """The kernel's sequence for one kv tile over len(q_blocks) Q blocks; returns dK (unscaled),
    dV, and the dQ of each block."""
    d = plan["d"]
    tm = Tmem()
    half = M_Q // 2
    dq_out = []

    def compute_p(i):
        for w in wg_order:  # each warpgroup: its 64 query columns in two 32-column chunks
            c0 = w * half
            for c in range(2):
                s = tm.read32(plan["s"] + c0 + 32 * c, 32)
                cols = slice(c0 + 32 * c, c0 + 32 * c + 32)
                p = torch.exp2(s * scale_log2 - lse2s[i][cols])
                first_slice = (c0 + 32 * c) // K_SLICE
                tm.write16(plan["slices"][first_slice] - plan["s"] + plan["s"], p)
                p_kept[i][:, cols] = p

    def compute_ds(i):
        for w in wg_order:
            c0 = w * half
            for c in range(2):
                dp = tm.read32(plan["dp"] + c0 + 32 * c, 32)
                cols = slice(c0 + 32 * c, c0 + 32 * c + 32)
                ds = p_kept[i][:, cols] * (dp - dpsums[i][cols])
                first_slice = (c0 + 32 * c) // K_SLICE
                tm.write16(plan["slices"][first_slice] - plan["s"] + plan["dp"], ds)
                sds[:, cols] = ds  # the shared-memory copy dQ reads

    p_kept = [torch.empty(N_KV, M_Q, dtype=torch.float64) for _ in q_blocks]
    sds = torch.empty(N_KV, M_Q, dtype=torch.float64)
    tm.write32(plan["s"], k @ q_blocks[0].T)  # S(0)
    tm.write32(plan["dp"], v @ dos[0].T)  # dP(0)
    for i in range(len(q_blocks)):
        compute_p(i)
        dv_add = a_operand(tm, plan, plan["s"]) @ dos[i]  # dV += P·dO (reads P)
        tm.write32(plan["dv"], (tm.read32(plan["dv"], d) if i else 0) + dv_add)
        if i + 1 < len(q_blocks):
            tm.write32(plan["s"], k @ q_blocks[i + 1].T)  # S(i+1) over P(i)
        compute_ds(i)
        dk_add = a_operand(tm, plan, plan["dp"]) @ q_blocks[i]  # dK += dS·Q (reads dS)
        tm.write32(plan["dk"], (tm.read32(plan["dk"], d) if i else 0) + dk_add)
        tm.write32(plan["dq"], (sds.T @ k)[:, :d])  # dQ = dSᵀ·K over dS (query rows as lanes)
        dq_out.append(tm.read32(plan["dq"], d))  # the reduce warpgroup loads it
        if i + 1 < len(q_blocks):
            tm.write32(plan["dp"], v @ dos[i + 1].T)  # dP(i+1) over dQ(i)
    return tm.read32(plan["dk"], d), tm.read32(plan["dv"], d), dq_out


@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("wg_order", [(0, 1), (1, 0)], ids=["wg0-first", "wg1-first"])
def test_tmem_dataflow_gives_exact_gradients(plans, d, wg_order):
    g = torch.Generator().manual_seed(d)
    scale = 1.0 / math.sqrt(d)
    blocks = 2
    q = torch.randn(blocks * M_Q, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(N_KV, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(N_KV, d, generator=g, dtype=torch.float64, requires_grad=True)
    do = torch.randn(blocks * M_Q, d, generator=g, dtype=torch.float64)
    # Exact gradients of one kv tile's contribution: softmax over these 128 keys only.
    s = q @ k.T * scale
    out = torch.softmax(s, dim=-1) @ v
    out.backward(do)
    lse = torch.logsumexp(s, dim=-1).detach()
    lse2 = lse / math.log(2)
    dpsum = (do * out.detach()).sum(-1)
    qb = [q.detach()[i * M_Q : (i + 1) * M_Q] for i in range(blocks)]
    dob = [do[i * M_Q : (i + 1) * M_Q] for i in range(blocks)]
    dk, dv, dqs = replay(
        plans[d], qb, k.detach(), v.detach(), dob,
        [lse2[i * M_Q : (i + 1) * M_Q] for i in range(blocks)],
        [dpsum[i * M_Q : (i + 1) * M_Q] for i in range(blocks)],
        scale / math.log(2), wg_order,
    )  # fmt: skip
    torch.testing.assert_close(dv, v.grad)
    torch.testing.assert_close(dk * scale, k.grad)
    torch.testing.assert_close(torch.cat(dqs) * scale, q.grad)


def test_an_overlapping_plan_is_caught(plans):
    """The check can fail: dQ placed over dK (instead of over dP) corrupts dK."""
    bad = dict(plans[128], dq=plans[128]["dk"])
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(128, 128, generator=g, dtype=torch.float64) for _ in range(4))
    lse2 = torch.zeros(M_Q, dtype=torch.float64)
    dk_bad, _, _ = replay(bad, [q, q], k, v, [do, do], [lse2, lse2], [lse2, lse2], 0.1, (0, 1))
    dk_ok, _, _ = replay(
        plans[128], [q, q], k, v, [do, do], [lse2, lse2], [lse2, lse2], 0.1, (0, 1)
    )
    assert not torch.allclose(dk_bad, dk_ok)
