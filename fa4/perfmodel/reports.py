"""Validation against the H200 measurements, the B200 predictions and the docs' tables."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace

from .model import (
    B200,
    BLOCK_M,
    EMU_SIXTEENTHS,
    H200,
    Arch,
    emu_balance,
    fwd_flops,
    predict,
    sm90_config,
    sm100_config,
    softmax_cycles,
    softmax_ops,
    steady_tflops,
    tile_units,
)

# --- validation against the H200 measurements -----------------------------------------------

# Earlier SM90 kernel versions, same command and day (docs/decisions.md, 2026-11-29; seqlen
# 16k, TFLOP/s): the serial consumer loop (49ba030) and + intra-warpgroup overlap (8358e87).
HISTORY_16K = {
    "serial loop (49ba030)": {
        (64, False): 368,
        (128, False): 533,
        (128, True): 470,
        (256, False): 583,
        (256, True): 360,
    },
    "+ intra-WG overlap (8358e87)": {
        (64, False): 415,
        (128, False): 593,
        (128, True): 526,
        (256, False): 686,
        (256, True): 441,
    },
}
# exp2 emulation A/B at hd128, one device call (docs/decisions.md, 2026-11-29): kEmuSixteenths
# 0 / 3 / 6 -> TFLOP/s, keyed by (causal, seqlen).
EMU_AB_HD128 = {
    (False, 16384): (595, 547, 500),
    (True, 16384): (510, 471, 442),
    (False, 1024): (534, 501, 468),
}


@dataclass(frozen=True)
class Check:
    """One measured point against the serial and overlapped predictions."""

    hdim: int
    causal: bool
    seqlen: int
    measured: float
    serial: float
    overlapped: float

    def err(self, pred: float) -> float:
        return pred / self.measured - 1

    def hidden(self) -> float:
        """Share of the serial-to-overlapped gap the kernel closes (1: fully overlapped)."""
        t_s, t_o, t_m = 1 / self.serial, 1 / self.overlapped, 1 / self.measured
        return (t_s - t_m) / (t_s - t_o)


def read_measured(path, impl: str = "fa4") -> dict[tuple[int, bool, int], float]:
    """{(hdim, causal, seqlen): TFLOP/s} of one implementation's passing forward rows."""
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["impl"] == impl and row["direction"] == "fwd" and row["status"] == "ok":
                key = (int(row["hdim"]), row["causal"] in ("1", "True"), int(row["seqlen"]))
                out[key] = float(row["tflops"])
    return out


def validate(path, impl: str = "fa4") -> list[Check]:
    checks = []
    for (h, c, s), tf in sorted(read_measured(path, impl).items()):
        ser = predict(sm90_config(h, c, s, policy="serial")).tflops
        ovl = predict(sm90_config(h, c, s, policy="overlapped")).tflops
        checks.append(Check(h, c, s, tf, ser, ovl))
    return checks


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def validation_table(path) -> str:
    rows = [
        "| hd | causal | seqlen | measured | serial | err | overlapped | err | hidden |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in validate(path):
        rows.append(
            f"| {c.hdim} | {'yes' if c.causal else 'no'} | {c.seqlen} | "
            f"{c.measured:.0f} | {c.serial:.0f} | {_pct(c.err(c.serial))} | "
            f"{c.overlapped:.0f} | {_pct(c.err(c.overlapped))} | {c.hidden():.2f} |"
        )
    return "\n".join(rows)


def validation_summary(path) -> str:
    checks = validate(path)
    ser = [abs(c.err(c.serial)) for c in checks]
    ovl = [abs(c.err(c.overlapped)) for c in checks]
    inside = sum(min(c.serial, c.overlapped) * 0.95 <= c.measured <= c.overlapped for c in checks)
    return (
        f"{len(checks)} points; serial: max |err| {max(ser) * 100:.1f}%, mean "
        f"{sum(ser) / len(ser) * 100:.1f}%, {sum(e <= 0.15 for e in ser)} within 15%; "
        f"overlapped: max |err| {max(ovl) * 100:.1f}%, mean {sum(ovl) / len(ovl) * 100:.1f}%, "
        f"{sum(e <= 0.15 for e in ovl)} within 15%; {inside} of {len(checks)} between "
        f"0.95 x serial and overlapped"
    )


def peer_table(path, impl: str = "flash-attn-4") -> str:
    """The peer against the overlapped bound with a balanced schedule: an upper bound for any
    kernel with these tile shapes, so every ratio should be below 1."""
    rows = ["| hd | causal | seqlen | flash-attn-4 | bound | ratio |", "|---|---|---|---|---|---|"]
    for (h, c, s), tf in sorted(read_measured(path, impl).items()):
        bound = predict(sm90_config(h, c, s, policy="overlapped")).balanced_tflops()
        rows.append(
            f"| {h} | {'yes' if c else 'no'} | {s} | {tf:.0f} | {bound:.0f} | {tf / bound:.2f} |"
        )
    return "\n".join(rows)


def history_table() -> str:
    rows = [
        "| kernel version | hd | causal | measured | serial | err | overlapped | err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, pts in HISTORY_16K.items():
        for (h, c), tf in pts.items():
            ser = predict(sm90_config(h, c, policy="serial")).tflops
            ovl = predict(sm90_config(h, c, policy="overlapped")).tflops
            rows.append(
                f"| {name} | {h} | {'yes' if c else 'no'} | {tf} | {ser:.0f} | "
                f"{_pct(ser / tf - 1)} | {ovl:.0f} | {_pct(ovl / tf - 1)} |"
            )
    return "\n".join(rows)


def emu_ab_table() -> str:
    """Measured and predicted TFLOP/s relative to kEmuSixteenths = 0, at 3/16 and 6/16."""
    rows = [
        "| causal | seqlen | measured 0 / 3 / 6 | measured ratio | serial ratio | "
        "overlapped ratio |",
        "|---|---|---|---|---|---|",
    ]
    for (c, s), meas in EMU_AB_HD128.items():
        cells = []
        for pol in ("serial", "overlapped"):
            tf = [predict(sm90_config(128, c, s, emu=k / 16, policy=pol)).tflops for k in (0, 3, 6)]
            cells.append(f"{tf[1] / tf[0]:.3f} / {tf[2] / tf[0]:.3f}")
        rows.append(
            f"| {'yes' if c else 'no'} | {s} | {' / '.join(map(str, meas))} | "
            f"{meas[1] / meas[0]:.3f} / {meas[2] / meas[0]:.3f} | {cells[0]} | "
            f"{cells[1]} |"
        )
    return "\n".join(rows)


# --- B200 predictions -----------------------------------------------------------------------

HEADLINE_TFLOPS = 1613  # the seed's FA4 forward on B200 (71 % of the 2.25 PFLOP/s peak)


def sm100_rows(seqlens=(8192, 16384), hdims=(64, 128, 256)):
    for h in hdims:
        for c in (False, True):
            for s in seqlens:
                fa4 = predict(sm100_config(h, c, s))
                fa3 = predict(sm100_config(h, c, s, style="fa3"))
                fa3s = predict(sm100_config(h, c, s, style="fa3", policy="serial"))
                yield h, c, s, fa4, fa3, fa3s


def sm100_table() -> str:
    rows = [
        "| hd | causal | seqlen | FA4 design | % peak | bound | emu | balanced sched | "
        "FA3-style | FA4 / FA3-style | no overlap | FA4 / no overlap |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    peak = B200.peak_tflops()
    for h, c, s, fa4, fa3, fa3s in sm100_rows():
        rows.append(
            f"| {h} | {'yes' if c else 'no'} | {s} | {fa4.tflops:.0f} | "
            f"{fa4.tflops / peak * 100:.0f}% | {fa4.bound} | {round(fa4.cfg.emu * 16)}/16 | "
            f"{fa4.balanced_tflops():.0f} | {fa3.tflops:.0f} | {fa4.tflops / fa3.tflops:.2f} | "
            f"{fa3s.tflops:.0f} | {fa4.tflops / fa3s.tflops:.2f} |"
        )
    return "\n".join(rows)


def sm100_sensitivity(hdim: int = 128, seqlen: int = 8192) -> str:
    """How the hd128 prediction moves with the estimated parameters."""
    rows = ["| parameter | value | FA4 design | FA3-style | ratio |", "|---|---|---|---|---|"]

    def row(name, value, **kw):
        fa4 = predict(sm100_config(hdim, False, seqlen, **kw)).tflops
        fa3 = predict(sm100_config(hdim, False, seqlen, style="fa3", **kw)).tflops
        rows.append(f"| {name} | {value} | {fa4:.0f} | {fa3:.0f} | {fa4 / fa3:.2f} |")

    for sync in (0, 300, 600, 900):
        row("sync_clk", sync, sync_clk=sync)
    for eff in (0.7, 0.8, 0.9, 1.0):
        row("mma_eff", eff, arch=replace(B200, mma_eff=eff))
    return "\n".join(rows)


# --- asymmetric scaling ---------------------------------------------------------------------


def asymmetry_row(arch: Arch, hdim: int) -> dict[str, float]:
    """Per 128 x N tile without the FA4 techniques (all exponentials on MUFU, O rescaled every
    block, scalar FP32), with the MMA at the datasheet peak (mma_eff 1) as a roofline does."""
    peak = replace(arch, mma_eff=1.0)
    if arch.tmem_bytes_clk:
        cfg = sm100_config(hdim, style="fa3", arch=peak)
    else:
        cfg = sm90_config(hdim, arch=peak)
    u = tile_units(cfg)
    ops = softmax_ops(cfg)
    mufu_issue = BLOCK_M * cfg.n * (1 - cfg.emu)
    other = (ops["issue"] + ops["oissue"] - mufu_issue) / arch.issue_clk
    return {
        "n": cfg.n,
        "mma": u["mma"],
        "mufu": u["mufu"],
        "other": other,
        "smem": u["smem"],
        "max": max(u[k] for k in ("mufu", "fp32", "alu", "issue", "smem", "tmem")),
        "sum": u["mufu"] + other,
    }


def asymmetry_table() -> str:
    rows = [
        "| GPU | hd | kBlockN | MMA | exp (MUFU) | other softmax | smem | slowest non-MMA / "
        "MMA | exp + other / MMA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arch in (("H100/H200", H200), ("B200", B200)):
        for h in (64, 128, 192, 256):
            r = asymmetry_row(arch, h)
            rows.append(
                f"| {name} | {h} | {r['n']} | {r['mma']:.0f} | {r['mufu']:.0f} | "
                f"{r['other']:.0f} | {r['smem']:.0f} | {_pct(r['max'] / r['mma'] - 1)} | "
                f"{_pct(r['sum'] / r['mma'] - 1)} |"
            )
    return "\n".join(rows)


def emu_table_text() -> str:
    rows = [
        "| arch | hd | kEmuSixteenths | balance point | steady TFLOP/s at 0 | at choice |",
        "|---|---|---|---|---|---|",
    ]
    for (arch, h), k in EMU_SIXTEENTHS.items():
        cfg = sm90_config(h) if arch == "sm90" else sm100_config(h, emu=0.0)
        tf0 = steady_tflops(cfg)
        tfk = steady_tflops(replace(cfg, emu=k / 16))
        rows.append(
            f"| {arch} | {h} | {k} | {emu_balance(cfg) * 16:.1f}/16 | {tf0:.0f} | {tfk:.0f} |"
        )
    return "\n".join(rows)


def unit_rate_table() -> str:
    rows = ["| unit | H100/H200 (SM90) | B200 (SM100) |", "|---|---|---|"]
    fields = (
        ("SMs", "sms"),
        ("clock GHz", "clock_ghz"),
        ("MMA FLOP/clk/SM", "mma_flop_clk"),
        ("MMA efficiency", "mma_eff"),
        ("MUFU.EX2 /clk/SM", "mufu_clk"),
        ("FP32 lanes /clk/SM", "fp32_clk"),
        ("ALU lanes /clk/SM", "alu_clk"),
        ("issue (thread-instr) /clk/SM", "issue_clk"),
        ("smem B/clk/SM", "smem_bytes_clk"),
        ("TMEM B/clk/SM", "tmem_bytes_clk"),
        ("HBM TB/s (H200; H100 3.0)", "hbm_tbs"),
    )
    for label, f in fields:
        a, b = getattr(H200, f), getattr(B200, f)
        fmt = (lambda v: f"{v:.3f}") if isinstance(a, float) else str
        rows.append(f"| {label} | {fmt(a)} | {fmt(b)} |")
    return "\n".join(rows)


# --- roofline ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RooflinePoint:
    hdim: int
    seqlen: int
    style: str  # "fa4" (the kernel / design) or "fa3" (FA3-style scheduling, SM100 only)
    intensity: float  # forward FLOP per HBM byte (Q, K, V read once, O written once)
    tflops: float  # the model's prediction (predict(cfg).tflops)
    softmax_roof: float  # TFLOP/s if the softmax side alone set the pace (no MMA limit)


def roofline(arch: Arch, seqlens=(1024, 4096, 16384), hdims=(64, 128, 256)) -> dict:
    """One arch's roofline (non-causal forward): the HBM slope (TB/s), the MMA roof (datasheet
    and achievable), and per configuration its place (operational intensity = s / 2 FLOP per
    byte, predicted TFLOP/s) and its softmax roof: tile FLOPs over the softmax side's cycles (its
    slowest SIMT pipe), the ceiling the non-matmul work puts on that tile shape. SM90: the fa4
    kernel as built; SM100: the FA4 design and FA3-style scheduling."""
    styles = ("fa4", "fa3") if arch.tmem_bytes_clk else ("fa4",)
    points = []
    for h in hdims:
        for s in seqlens:
            for st in styles:
                if arch.tmem_bytes_clk:
                    cfg = sm100_config(h, seqlen=s, style=st, arch=arch)
                else:
                    cfg = sm90_config(h, seqlen=s, arch=arch)
                flops = fwd_flops(cfg.b, cfg.h, cfg.seqlen, cfg.hdim, cfg.causal)
                hbm = 4.0 * cfg.b * cfg.h * cfg.seqlen * cfg.hdim * 2  # Q, K, V, O, 16-bit
                tile_flops = 4.0 * BLOCK_M * cfg.n * cfg.hdim
                clk = softmax_cycles(tile_units(cfg))
                soft = tile_flops / clk * arch.sms * arch.clock_ghz * 1e-3
                points.append(RooflinePoint(h, s, st, flops / hbm, predict(cfg).tflops, soft))
    return {
        "hbm_tbs": arch.hbm_tbs,
        "peak": arch.peak_tflops(),
        "achievable": arch.gemm_tflops(),
        "points": points,
    }
