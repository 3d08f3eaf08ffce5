"""`python -m fa4.perfmodel`: the per-unit breakdown of a configuration, the tables, the plots."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from . import backward
from .model import (
    ARCHS,
    EMU_SIXTEENTHS,
    UNITS,
    Config,
    emu_balance,
    predict,
    sm90_config,
    sm100_config,
    steady_tflops,
    tile_units,
)
from .reports import (
    asymmetry_table,
    emu_ab_table,
    emu_table_text,
    history_table,
    peer_table,
    roofline,
    sm100_sensitivity,
    sm100_table,
    validate,
    validation_summary,
    validation_table,
)

# --- command line ---------------------------------------------------------------------------

POLICIES = ("serial", "partial", "overlapped", "pingpong")


def config_from_args(args) -> Config:
    arch = ARCHS[args.arch]
    kw = {
        "batch": args.batch,
        "heads": args.heads,
        "block_n": args.block_n,
        "two_cta": args.two_cta,
    }
    if args.two_cta:
        # the 2-CTA forward as built (sm100/fwd/kernel_2cta.cuh): one Q tile per CTA, 128 keys
        kw["q_tiles"] = 1
        kw["block_n"] = args.block_n or 128
    if args.policy:
        kw["policy"] = args.policy
    if args.emu is not None:
        kw["emu"] = args.emu
    if arch.tmem_bytes_clk:
        return sm100_config(args.hdim, args.causal, args.seqlen, style=args.style, **kw)
    return sm90_config(args.hdim, args.causal, args.seqlen, arch=arch, **kw)


def breakdown(cfg: Config) -> str:
    """The per-unit cycles of one 128 x N tile, the bound unit and the predictions."""
    p = predict(cfg)
    name = "SM100" if cfg.arch.tmem_bytes_clk else "SM90"
    lines = [
        f"{cfg.arch.name} ({name}), hd {cfg.hdim}, {'causal' if cfg.causal else 'non-causal'}, "
        f"seqlen {cfg.seqlen}, batch {cfg.b}, heads {cfg.h}; tile 128 x {cfg.n}, "
        f"{cfg.q_tiles} Q tile(s)/CTA, {'2-CTA' if cfg.two_cta else '1-CTA'}, "
        f"emu {cfg.emu:.3f} ({cfg.emu * 16:.1f}/16), policy {cfg.policy}",
        "cycles per 128 x N tile-block:",
    ]
    for k in (*UNITS, "chain"):
        lines.append(f"  {k:6s} {p.units[k]:8.0f}  ({p.units[k] / p.period * 100:5.1f}% of period)")
    lines += [
        f"period {p.period:.0f} clk; bound: {p.bound}; MUFU = FMA-side balance at "
        f"{emu_balance(cfg) * 16:.1f}/16 of the exponentials; kernel default "
        f"{EMU_SIXTEENTHS.get((name.lower(), cfg.hdim), '-')}/16 (EMU_SIXTEENTHS)",
        f"steady loop {steady_tflops(cfg):.0f} TFLOP/s; whole problem {p.tflops:.0f} TFLOP/s "
        f"({p.time_us:.1f} us; balanced schedule {p.balanced_tflops():.0f}); peak "
        f"{cfg.arch.peak_tflops():.0f}, GEMM ceiling {cfg.arch.gemm_tflops():.0f}",
        "by policy: "
        + ", ".join(f"{pol} {predict(replace(cfg, policy=pol)).tflops:.0f}" for pol in POLICIES),
    ]
    return "\n".join(lines)


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (seqlen, head dim, batch, heads, block_n)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _fraction(text: str) -> float:
    """argparse type: the emulated share of the exponentials, a number in [0, 1] (Config.emu)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= x <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"must lie in [0, 1] (the share of exp2 emulated; 0.25 = 4/16), got {text}"
        )
    return x


def _csv_file(text: str) -> str:
    """argparse type: an existing file (a bench.py CSV)."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r} (a bench.py CSV)")
    return text


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m fa4.perfmodel", description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm90", choices=sorted(ARCHS))
    ap.add_argument("--hdim", type=_positive_int, default=128)
    ap.add_argument("--seqlen", type=_positive_int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--emu", type=_fraction, default=None, help="emulated share of exp2 (0..1)")
    ap.add_argument("--block-n", type=_positive_int, default=None)
    ap.add_argument("--two-cta", action="store_true")
    ap.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help="default: serial on SM90 (the measured kernel), pingpong on SM100",
    )
    ap.add_argument("--style", choices=("fa4", "fa3"), default="fa4", help="SM100 only")
    ap.add_argument("--batch", type=_positive_int, default=None)
    ap.add_argument("--heads", type=_positive_int, default=None)
    ap.add_argument(
        "--validate", metavar="CSV", type=_csv_file, help="SM90 predictions vs a bench.py CSV"
    )
    ap.add_argument("--sm100-table", action="store_true", help="B200 predictions")
    ap.add_argument("--asymmetry", action="store_true", help="non-MMA work vs MMA per tile")
    ap.add_argument("--emu-table", action="store_true", help="the kEmuSixteenths table")
    ap.add_argument("--plot", metavar="DIR", help="write the PNGs (needs matplotlib)")
    ap.add_argument("--bwd", action="store_true", help="the backward's breakdown (this config)")
    ap.add_argument(
        "--validate-bwd", metavar="CSV", type=_csv_file, help="SM90 backward vs a bench.py CSV"
    )
    ap.add_argument("--bwd-b200", action="store_true", help="B200 backward predictions")
    return ap


def main(argv=None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (an optional dependency, for --plot only)
        except ImportError:
            ap.error("--plot needs matplotlib, which fa4 does not install: pip install matplotlib")
    out = []
    if args.validate:
        out += [
            validation_table(args.validate),
            validation_summary(args.validate),
            "",
            peer_table(args.validate),
            "",
            history_table(),
            "",
            emu_ab_table(),
        ]
    if args.sm100_table:
        out += [sm100_table(), "", sm100_sensitivity()]
    if args.asymmetry:
        out.append(asymmetry_table())
    if args.emu_table:
        out.append(emu_table_text())
    if args.plot:
        out += plot_all(Path(args.plot), args.validate, args.validate_bwd)
    if args.validate_bwd:
        out.append(backward.validation_text(args.validate_bwd))
    if args.bwd_b200:
        out.append(backward.b200_text())
    if args.bwd:
        arch = ARCHS[args.arch]
        style = "sm90" if not arch.tmem_bytes_clk else args.style
        cfg = backward.BwdConfig(arch, args.hdim, args.causal, args.seqlen, batch=args.batch,
                                 heads=args.heads, style=style, two_cta=args.two_cta)  # fmt: skip
        out.append(backward.breakdown(cfg))
    if not out:
        out.append(breakdown(config_from_args(args)))
    print("\n".join(out))


# --- plots (matplotlib imported here only) --------------------------------------------------


def plot_all(folder: Path, csv_path=None, bwd_csv=None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    written = [plot_units(folder / "perfmodel_units.png")]
    written.append(plot_roofline(folder / "perfmodel_roofline.png"))
    if csv_path:
        written.append(plot_validation(folder / "perfmodel_h200.png", csv_path))
    if bwd_csv:
        written.append(plot_bwd_validation(folder / "perfmodel_h200_bwd.png", bwd_csv))
    return [f"wrote {p}" for p in written]


def plot_units(path: Path) -> Path:
    """Per-unit cycles of one tile (relative to its MMA) for each configuration: a roofline
    per arch in unit terms, the configuration's bar above 1 where a unit outlasts the MMA."""
    import matplotlib.pyplot as plt

    cases = [(f"H200 hd{h}", sm90_config(h)) for h in (64, 128, 256)]
    cases += [
        (f"B200 hd{h} {st}", sm100_config(h, style=st))
        for h in (64, 128, 256)
        for st in ("fa3", "fa4")
    ]
    keys = ("mufu", "fp32", "alu", "issue", "smem", "tmem", "chain")
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=90)
    width = 0.8 / len(keys)
    for j, k in enumerate(keys):
        vals = [tile_units(c)[k] / tile_units(c)["mma"] for _, c in cases]
        ax.bar([i + j * width for i in range(len(cases))], vals, width, label=k)
    ax.axhline(1.0, color="black", lw=1, label="MMA (achievable rate)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
    ax.set_xticklabels([n for n, _ in cases], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("cycles / MMA cycles, per 128 x N tile")
    ax.set_title("Per-tile unit times relative to the MMA (FA4 emulation defaults)")
    ax.legend(ncol=4, fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_roofline(path: Path) -> Path:
    """Roofline per arch (H200, B200), non-causal forward at 1k, 4k, 16k: HBM slope, MMA roofs,
    each configuration's predicted point and, dashed, the lowest softmax roof of its head dim
    (on B200 the FA3-style one: the FA4 techniques lift it) (docs/perfmodel.md)."""
    import matplotlib.pyplot as plt

    from .model import B200, H200

    colors = {64: "tab:blue", 128: "tab:orange", 256: "tab:green"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=90)
    for ax, arch in zip(axes, (H200, B200), strict=True):
        r = roofline(arch)
        xs = [2.0**k for k in range(3, 15)]
        ax.plot(xs, [min(x * r["hbm_tbs"], r["peak"]) for x in xs], color="black", lw=1.5,
                label=f"HBM {r['hbm_tbs']} TB/s / datasheet peak")  # fmt: skip
        ax.axhline(r["achievable"], color="gray", ls="-.", lw=1, label="achievable GEMM")
        for h, color in colors.items():
            pts = [p for p in r["points"] if p.hdim == h]
            for st, marker in (("fa4", "o"), ("fa3", "x")):
                sel = [p for p in pts if p.style == st]
                if sel:
                    ax.scatter([p.intensity for p in sel], [p.tflops for p in sel], color=color,
                               marker=marker, label=f"hd{h} {st}")  # fmt: skip
            roof = min(p.softmax_roof for p in pts)
            ax.axhline(roof, color=color, ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("FLOP per HBM byte (forward, non-causal: s / 2)")
        ax.set_ylabel("TFLOP/s (model)")
        ax.set_title(
            f"{arch.name.upper()}: dashed = softmax roof per head dim"
            + (" (FA3-style, the lower)" if arch.tmem_bytes_clk else ""),
            fontsize=10,
        )
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_validation(path: Path, csv_path) -> Path:
    import matplotlib.pyplot as plt

    checks = validate(csv_path)
    fig, ax = plt.subplots(figsize=(6, 5), dpi=90)
    for c in checks:
        color = {64: "tab:blue", 128: "tab:orange", 256: "tab:green"}.get(c.hdim, "gray")
        ax.plot([c.measured, c.measured], [c.serial, c.overlapped], color=color, lw=2, alpha=0.5)
        ax.scatter([c.measured], [c.serial], color=color, marker="v")
        ax.scatter([c.measured], [c.overlapped], color=color, marker="^")
    lim = (200, 800)
    ax.plot(lim, lim, color="black", lw=1)
    ax.plot(lim, [x * 1.15 for x in lim], ":", color="gray")
    ax.plot(lim, [x * 0.85 for x in lim], ":", color="gray")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("measured fa4 TFLOP/s (H200, 6fc9543)")
    ax.set_ylabel("predicted: serial (v) .. overlapped (^)")
    ax.set_title("SM90 fwd vs H200: hd64 blue, hd128 orange, hd256 green", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_bwd_validation(path: Path, csv_path) -> Path:
    """The backward model (an upper bound of the SM90 schedule) against the measured sweep."""
    import csv

    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        checks = backward.validate(list(csv.DictReader(f)))
    fig, ax = plt.subplots(figsize=(6, 5), dpi=90)
    for d, causal, s, meas, pred, _ in checks:
        color = {64: "tab:blue", 128: "tab:orange", 256: "tab:green"}.get(d, "gray")
        ax.scatter([meas], [pred], color=color, marker="o" if s >= 16384 else "s",
                   facecolors="none" if causal else color)  # fmt: skip
    lim = (100, 700)
    ax.plot(lim, lim, color="black", lw=1)
    ax.plot(lim, [x * 1.15 for x in lim], ":", color="gray")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel(f"measured fa4 backward TFLOP/s (H200, {Path(csv_path).name})")
    ax.set_ylabel("model (upper bound of the SM90 schedule)")
    ax.set_title("SM90 bwd: hd64 blue, hd128 orange, hd256 green; o 16k, s 1k; open: causal",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
