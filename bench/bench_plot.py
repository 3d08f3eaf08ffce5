"""TFLOP/s vs seqlen: one figure per direction, one panel per hdim × causal, one line per impl."""

from __future__ import annotations

from pathlib import Path


def plot(rows: list[dict], direction: str, path: Path, title: str = "") -> Path | None:
    """Writes a PNG of the ok rows of `direction`; None when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["direction"] == direction and r["status"].startswith("ok")]
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
    fig.suptitle(f"{direction}, bf16 {title}".strip(), fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path
