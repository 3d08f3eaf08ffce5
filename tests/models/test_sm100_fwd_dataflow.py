"""The SM100 forward's TMEM data flow, executed on the CPU (the kernel itself cannot run here).

With the column plan of the C++ header (FwdTmemPlan, printed by tests/cpp/tmem_plan_harness.cpp)
and a model of tensor memory (tests/tmem_model.py), the kernel's MMA order is replayed over a few
KV blocks: two Q tiles, PV0(i), S0(i+1), PV1(i), S1(i+1) (sm100/fwd/kernel.cuh); one Q tile at hd
256 with its S double-buffered, PV(i), S(i+2) into P(i)'s buffer (Note [one-tile order]). The
softmax reads S (fp32) from its buffer and writes P (16-bit) over its first kBlockN / 2 columns;
P·V reads P per 16-element K slice, 8 columns apart; O accumulates in its region. The row
statistics use the exact row max (the online rescale is the tile model's business,
tests/models/test_reference_model.py), so out must equal softmax(Q·Kᵀ)·V in float64: an overlap
of S, P and O regions, or a buffer reused before its reader, gives NaN or a wrong O.

What this does not check: tcgen05's PTX semantics, which only a Blackwell GPU can.
"""

import math

import pytest
import torch
from models.tmem_model import N_LANES, Tmem, fwd_plans

pytestmark = pytest.mark.build
K_SLICE = 16


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return {p["d_v"]: p for p in fwd_plans(tmp_path_factory)}


def replay(plan, qs, k, v, scale):
    """out of each Q tile after the kernel's MMA order over len(k) // block_n KV blocks."""
    n, dv, tiles = plan["block_n"], plan["d_v"], plan["q_tiles"]
    nblk = k.shape[0] // n
    tm = Tmem()
    s_cols = [plan["s0"], plan["s1"]]
    o_cols = [plan["o0"], plan["o1"]]
    row_max = [(q @ k.T * scale).max(dim=1, keepdim=True).values for q in qs]
    row_sum = [torch.zeros(N_LANES, 1, dtype=torch.float64) for _ in qs]
    kb = [k[i * n : (i + 1) * n] for i in range(nblk)]
    vb = [v[i * n : (i + 1) * n] for i in range(nblk)]

    def mma_s(t, i, buf):
        tm.write32(s_cols[buf], qs[t] @ kb[i].T)

    def softmax(t, buf):  # S row from TMEM, P (16-bit) over the first n / 2 columns of S
        s = tm.read32(s_cols[buf], n)
        p = torch.exp(s * scale - row_max[t])
        row_sum[t] += p.sum(dim=1, keepdim=True)
        tm.write16(s_cols[buf], p)

    def mma_pv(t, i, buf):
        p = torch.cat([tm.read16(s_cols[buf] + kk * (K_SLICE // 2), K_SLICE)
                       for kk in range(n // K_SLICE)], dim=1)  # fmt: skip
        acc = tm.read32(o_cols[t], dv) if i > 0 else 0
        tm.write32(o_cols[t], acc + p @ vb[i])

    if tiles == 2:  # S_t in buffer t
        for t in range(2):
            mma_s(t, 0, t)
        for i in range(nblk):
            for t in range(2):
                softmax(t, t)
            for t in range(2):
                mma_pv(t, i, t)
                if i + 1 < nblk:
                    mma_s(t, i + 1, t)  # over P_t(i), after PV_t(i)
    else:  # one tile, S(i) in buffer i % 2
        for i in range(min(2, nblk)):
            mma_s(0, i, i % 2)
        for i in range(nblk):
            softmax(0, i % 2)
            mma_pv(0, i, i % 2)
            if i + 2 < nblk:
                mma_s(0, i + 2, i % 2)  # over P(i), after PV(i)
    return [tm.read32(o_cols[t], dv) / row_sum[t] for t in range(tiles)]


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_tmem_dataflow_gives_exact_attention(plans, d):
    plan = plans[d]
    g = torch.Generator().manual_seed(d)
    scale = 1.0 / math.sqrt(d)
    nblk = 3
    qs = [torch.randn(N_LANES, d, generator=g, dtype=torch.float64) for _ in range(plan["q_tiles"])]
    k = torch.randn(nblk * plan["block_n"], d, generator=g, dtype=torch.float64)
    v = torch.randn(nblk * plan["block_n"], d, generator=g, dtype=torch.float64)
    outs = replay(plan, qs, k, v, scale)
    for q, out in zip(qs, outs, strict=True):
        torch.testing.assert_close(out, torch.softmax(q @ k.T * scale, dim=-1) @ v)


def test_an_overlapping_plan_is_caught(plans):
    """The check can fail: hd 256's O placed over its second S buffer is destroyed by S(1)."""
    bad = dict(plans[256], o0=plans[256]["s1"])
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(N_LANES if i == 0 else 3 * 64, 256, generator=g, dtype=torch.float64)
               for i in range(3))  # fmt: skip
    (out,) = replay(bad, [q], k, v, 1 / 16)
    assert not torch.allclose(out, torch.softmax(q @ k.T / 16, dim=-1) @ v, equal_nan=False)
