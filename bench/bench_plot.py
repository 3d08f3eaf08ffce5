"""TFLOP/s vs seqlen: one figure per direction, one panel per hdim × causal, one line per impl;
and the decode sweep's GB/s per case (plot_decode)."""

from __future__ import annotations

from pathlib import Path


def plot(
    rows: list[dict], direction: str, path: Path, title: str = "", dtype: str = "bf16"
) -> Path | None:
    """Writes a PNG of the ok rows of `direction`; None when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The panels are per hdim and causal over the standard sweep's seqlens (16k tokens, 2048
    # hidden): the labelled model points (GQA, other shapes) are left out; the tables have them.
    rows = [
        r
        for r in rows
        if r["direction"] == direction and r["status"].startswith("ok") and not r.get("label")
    ]
    if not rows:
        return None
    hdims = sorted({int(r["hdim"]) for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, axes = plt.subplots(
        len(hdims), 2, figsize=(10, 3.2 * len(hdims)), squeeze=False, sharey=True
    )
    for i, hd in enumerate(hdims):
        for j, causal in enumerate((0, 1)):
            ax = axes[i][j]
            for impl in impls:
                pts = sorted(
                    (int(r["seqlen"]), float(r["tflops"]))
                    for r in rows
                    if r["impl"] == impl and int(r["hdim"]) == hd and int(r["causal"]) == causal
                )
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"hd{hd} {'causal' if causal else 'non-causal'}", fontsize=10)
            ax.grid(alpha=0.3)
            if i == len(hdims) - 1:
                ax.set_xlabel("seqlen (16k tokens per batch)")
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if ax.lines:
                ax.legend(fontsize=8)
    fig.suptitle(f"{direction}, {dtype} {title}".strip(), fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def plot_decode(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """The decode sweep (bench_decode.py): GB/s of K and V read per case (one bar per impl),
    with the HBM datasheet peak and 93 % of it as lines; None when no row is ok."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"].startswith("ok") and r["gbps"]]
    if not ok:
        return None
    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in ok))
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(cases) + 2), 5.2))
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for i, c in enumerate(cases):
            for r in ok:
                if r["impl"] == impl and r["case"] == c:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(float(r["gbps"]))
        ax.bar(xs, ys, width=width, label=impl)
    peaks = {float(r["hbm_peak_gbps"]) for r in rows if r.get("hbm_peak_gbps")}
    if len(peaks) == 1:
        peak = peaks.pop()
        ax.axhline(peak, color="k", lw=1.2, label=f"HBM peak {peak:.0f} GB/s")
        ax.axhline(0.93 * peak, color="k", lw=0.8, ls="--", label="93 % of peak")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("GB/s of K and V read")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(", ".join(t for t in ("decode, bf16, 32 q heads", title) if t), fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path
