"""Backward half of the cycle model: one iteration = one KV tile of a CTA against one 64-row Q
block (the loop body of the SM90 backward as built, sm90/bwd/kernel.cuh), its units, the
schedule of those iterations, and the same for the SM100 FA4 backward (docs/sm100.md) on B200.

SM90, as built (the two consumer warpgroups meet at a named barrier every block, so their
elementwise phases coincide and the tensor cores idle during what is not overlapped):
    period = S + dP + exposed(dS) + dV + dK + dQ + sync
with P (all the exponentials) hidden under the dP GEMM when it is shorter, and each GEMM at the
larger of its MMA and shared-memory times. SM100 FA4 design: TMEM holds S, P, dP, dS, the MMA
warp keeps the tensor core busy while compute warps turn dP into dS (the five-stage overlap), so
the slowest unit sets the period.

docs/perfmodel.md ("Backward") has the counts, the validation against the H200 backward sweep and
the B200 predictions. Standard library only.

    python -m fa4.perfmodel --bwd --hdim 128 [--causal] [--arch sm100 --two-cta]
    python -m fa4.perfmodel --validate-bwd bench/results/2026-11-29-fa4-bwd-sm90.csv --bwd-b200
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import B200, H200, HIDDEN, TOKENS, Arch, fwd_flops

BLOCK_M = 64  # query rows per iteration (BwdConfig.m: 128 for the SM90 kernel at d <= 64)
# Thread-instructions per score element of the unmasked, softcap-free P and dS code, counted in
# the SASS of the hd128 instance (bf16): the P loop ~3 (FFMA, MUFU.EX2, half an LDS of lse, a
# select), the dS loop ~3.5 (FADD, FMUL, two half F2FP, half an LDS of D, the stmatrix share).
P_ISSUE, DS_ISSUE = 3.0, 3.5
# Per iteration: STSM + fence + named barrier + wgmma waits + pipeline handshakes, an estimate
# from the ncu source counters of commit 02802a5 (barrier and wait stalls ~10 % of the loop).
SYNC_CLK = 400.0
# Per CTA outside the loop: K, V load, dK, dV stores, launch of the CTA (estimate).
TILE_US = 2.0
# wgmma rate of a 64 x 32 (SS) GEMM relative to 64 x N >= 64, measured by bench/wgmma_rate.cu on
# the H200 (2026-11-29, commit e1eda39): 646.4 against 972.6 TFLOP/s. N >= 64 runs at the same
# rate as N = 256 in both SS and RS forms, so only the split variant's Sᵀ and dPᵀ (N = 32 per
# warpgroup) pay it.
N32_RATE = 646.4 / 972.6


@dataclass(frozen=True)
class BwdConfig:
    arch: Arch
    hdim: int
    causal: bool = False
    seqlen: int = 16384
    hdim_v: int | None = None
    batch: int | None = None
    heads: int | None = None
    style: str = "sm90"  # sm90 (as built) | fa4 (SM100 design) | fa3 (SM90 structure on B200)
    two_cta: bool = False  # SM100: each CTA stages half of the B operands (cta_group::2)

    @property
    def dv(self) -> int:
        return self.hdim_v or self.hdim

    @property
    def split(self) -> bool:
        """The SM90 split-d variant (d or d_v > 128) and its 64-row KV tiles."""
        return self.style != "fa4" and max(self.hdim, self.dv) > 128

    @property
    def m(self) -> int:
        """Query rows per iteration: the SM90 kernel takes 128-row Q blocks at d, d_v <= 64
        (sm90/bwd/common.cuh, BwdTraits::kBlockM), 64 elsewhere; the SM100 design 128."""
        if self.style == "fa4" or (self.style == "sm90" and max(self.hdim, self.dv) <= 64):
            return 128  # the SM100 kernel (sm100/bwd/kernel.cuh) takes 128-row Q blocks too
        return BLOCK_M

    @property
    def n(self) -> int:
        if self.style == "fa4":
            return 128
        return 64 if self.split else 128

    @property
    def b(self) -> int:
        return self.batch or max(1, TOKENS // self.seqlen)

    @property
    def h(self) -> int:
        return self.heads or max(1, HIDDEN // self.hdim)


def bwd_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    """The benchmark's count: 2.5 times the forward's."""
    return 2.5 * fwd_flops(b, h, s, d, causal)


def gemm_flops(cfg: BwdConfig) -> dict[str, float]:
    """The five GEMMs of one iteration (N kv rows x 64 query rows)."""
    n, m, d, dv = cfg.n, cfg.m, cfg.hdim, cfg.dv
    return {"s": 2 * n * m * d, "dp": 2 * n * m * dv, "dv": 2 * n * m * dv,
            "dk": 2 * n * m * d, "dq": 2 * n * m * d}  # fmt: skip


def gemm_smem_bytes(cfg: BwdConfig) -> dict[str, float]:
    """Shared-memory operand bytes each GEMM reads in one iteration (both warpgroups).

    SM90 d <= 128 (two warpgroups of 64 kv rows): Sᵀ, dPᵀ read K/V rows and all Q/dO rows per
    warpgroup; dV, dK take Pᵀ, dSᵀ from registers (B only); dQ reads dS and half of K each.
    Split (64 kv rows, warpgroups split N): Sᵀ, dPᵀ read all of K/V and half of Q/dO each; dV, dK,
    dQ read Pᵀ/dSᵀ/dS (64 x 64) and half of their B each. SM100 (one 128-row MMA): each operand
    once, Pᵀ and dSᵀ from TMEM, B halved by 2-CTA.
    """
    n, m, d, dv, el = cfg.n, cfg.m, cfg.hdim, cfg.dv, 2
    if cfg.style == "fa4":
        half = 2 if cfg.two_cta else 1
        return {"s": (n * d + m * d / half) * el, "dp": (n * dv + m * dv / half) * el,
                "dv": m * dv / half * el, "dk": m * d / half * el,
                "dq": (m * n + n * d / half) * el}  # fmt: skip
    if cfg.split:
        pt = n * m * el  # Pᵀ or dSᵀ, read whole by each warpgroup
        return {"s": 2 * n * d * el + m * d * el, "dp": 2 * n * dv * el + m * dv * el,
                "dv": 2 * pt + m * dv * el, "dk": 2 * pt + m * d * el,
                "dq": 2 * pt + n * d * el}  # fmt: skip
    return {"s": 2 * (n // 2 + m) * d * el, "dp": 2 * (n // 2 + m) * dv * el,
            "dv": 2 * m * dv * el, "dk": 2 * m * d * el,
            "dq": 2 * (m * n + n * d // 2) * el}  # fmt: skip


def iteration_units(cfg: BwdConfig) -> dict[str, float]:
    """Cycles per iteration of each GEMM (max of MMA and smem), and of the elementwise parts."""
    a = cfg.arch
    rate = a.mma_flop_clk * a.mma_eff
    fl, sm = gemm_flops(cfg), gemm_smem_bytes(cfg)
    slow = {"s", "dp"} if cfg.split else set()
    units = {
        k: max(fl[k] / (rate * (N32_RATE if k in slow else 1.0)), sm[k] / a.smem_bytes_clk)
        for k in fl
    }
    elems = cfg.n * cfg.m
    units["mufu"] = elems / a.mufu_clk
    units["p_issue"] = elems * P_ISSUE / a.issue_clk
    units["ds_issue"] = elems * DS_ISSUE / a.issue_clk
    if cfg.style == "fa4":  # S, dP loaded (fp32) and P, dS stored (16-bit) through TMEM
        units["tmem"] = elems * (4 + 4 + 2 + 2) / a.tmem_bytes_clk
    return units


def period(cfg: BwdConfig) -> float:
    u = iteration_units(cfg)
    gemms = u["s"] + u["dp"] + u["dv"] + u["dk"] + u["dq"]
    p_time = max(u["mufu"], u["p_issue"])
    if cfg.style == "fa4":  # five-stage overlap: the slowest unit sets the pace
        simt = p_time + u["ds_issue"]
        return max(gemms, simt, u["tmem"]) + SYNC_CLK / 4
    exposed_p = max(0.0, p_time - u["dp"])
    return gemms + exposed_p + u["ds_issue"] + SYNC_CLK


def cta_iterations(cfg: BwdConfig) -> list[int]:
    """Iterations of each KV tile of one head (s_q = s_k; causal: the Q blocks at or below the
    tile's diagonal)."""
    m_blocks = math.ceil(cfg.seqlen / cfg.m)
    tiles = math.ceil(cfg.seqlen / cfg.n)
    if not cfg.causal:
        return [m_blocks] * tiles
    return [m_blocks - (t * cfg.n) // cfg.m for t in range(tiles)]


def prepost_us(cfg: BwdConfig) -> float:
    """The preprocess (read O, dO, LSE; write D, lse₂ and the zeroed fp32 dQ) and postprocess
    (read fp32 dQ, write dQ) kernels: HBM-bound, plus their two launches."""
    rows_h = cfg.b * cfg.seqlen * cfg.h
    pre = rows_h * (2 * cfg.dv * 2 + 4 + cfg.hdim * 4 + 8)
    post = rows_h * cfg.hdim * (4 + 2)
    return (pre + post) / (cfg.arch.hbm_tbs * 1e6) + 2 * cfg.arch.launch_us


def predict_us(cfg: BwdConfig) -> tuple[float, float]:
    """(main kernel, whole backward) in µs: greedy list schedule of the CTAs in launch order
    (tile fastest, then head, then batch) on the SMs, plus launch; then pre/postprocess."""
    clk_us = 1.0 / (cfg.arch.clock_ghz * 1e3)
    per_tile = [it * period(cfg) * clk_us + TILE_US for it in cta_iterations(cfg)]
    free = [0.0] * cfg.arch.sms
    for _ in range(cfg.b * cfg.h):
        for cost in per_tile:
            i = min(range(len(free)), key=free.__getitem__)
            free[i] += cost
    main = max(free) + cfg.arch.launch_us
    return main, main + prepost_us(cfg)


def predict_tflops(cfg: BwdConfig) -> float:
    total = predict_us(cfg)[1]
    return bwd_flops(cfg.b, cfg.h, cfg.seqlen, cfg.hdim, cfg.causal) / (total * 1e-6) / 1e12


def validate(rows: list[dict]) -> list[tuple]:
    """(hdim, causal, seqlen, measured, predicted, error) for the fa4 bwd rows of a bench CSV."""
    out = []
    for r in rows:
        if r["impl"] != "fa4" or r["direction"] != "bwd" or r["status"] != "ok":
            continue
        d, causal, s = int(r["hdim"]), r["causal"] in ("1", "True", "true"), int(r["seqlen"])
        meas = float(r["tflops"])
        pred = predict_tflops(BwdConfig(H200, d, causal, s))
        out.append((d, causal, s, meas, pred, (pred - meas) / meas))
    return out


def b200_table() -> list[tuple]:
    """(hdim, causal, fa4 design, as built, FA3-style structure) TFLOP/s on B200 at 16k. "As
    built" is the 1-CTA kernel of sm100/bwd/kernel.cuh (hd <= 128; None where it has no kernel);
    hd 128 now dispatches to the 2-CTA kernel (sm100/bwd/kernel_2cta.cuh), whose single-staged order
    this model does not describe."""
    rows = []
    for d in (64, 128, 256):
        for causal in (False, True):
            fa4 = predict_tflops(BwdConfig(B200, d, causal, style="fa4", two_cta=d >= 128))
            built = predict_tflops(BwdConfig(B200, d, causal, style="fa4")) if d <= 128 else None
            fa3 = predict_tflops(BwdConfig(B200, d, causal, style="fa3"))
            rows.append((d, causal, fa4, built, fa3))
    return rows


def breakdown(cfg: BwdConfig) -> str:
    u = iteration_units(cfg)
    main, total = predict_us(cfg)
    lines = [
        f"bwd {cfg.arch.name} {cfg.style} hd{cfg.hdim}x{cfg.dv} causal={cfg.causal} "
        f"s={cfg.seqlen} b={cfg.b} h={cfg.h}: kv tile {cfg.n} x Q block {cfg.m}",
        "cycles per iteration: " + ", ".join(f"{k} {v:.0f}" for k, v in u.items()),
        f"period {period(cfg):.0f} clk; main kernel {main:.0f} us, with pre/post {total:.0f} us; "
        f"{predict_tflops(cfg):.0f} TFLOP/s",
    ]
    return "\n".join(lines)


def validation_text(csv_path) -> str:
    import csv

    with open(csv_path, newline="") as f:
        rows = validate(list(csv.DictReader(f)))
    out = ["| hd | causal | seqlen | measured | model | error |", "|---|---|---|---|---|---|"]
    for d, causal, s, meas, pred, err in rows:
        causal_s = "yes" if causal else "no"
        out.append(f"| {d} | {causal_s} | {s} | {meas:.0f} | {pred:.0f} | {100 * err:+.0f} % |")
    return "\n".join(out)


def b200_text() -> str:
    head = (
        "| hd | causal | fa4 design (TMEM, overlapped, 2-CTA at hd >= 128) | as built (1-CTA) "
        "| FA3-style | design / FA3-style |"
    )
    out = [head, "|---|---|---|---|---|---|"]
    for d, causal, fa4, built, fa3 in b200_table():
        b = f"{built:.0f}" if built is not None else "no kernel"
        out.append(
            f"| {d} | {'yes' if causal else 'no'} | {fa4:.0f} | {b} | {fa3:.0f} | {fa4 / fa3:.2f} |"
        )
    return "\n".join(out)
