"""Role timeline of an SM100 kernel from a bring-up build (csrc/common/debug_wait.cuh):

    FA4_SM100_DEBUG=1 pip install --no-build-isolation -e .          # the debug build
    FA4_DEBUG_TRACE=1 python3 tools/trace_sm100.py --run fwd --seqlen 1024 -o fwd.png
    python3 tools/trace_sm100.py --area area.bin -o fwd.png           # a saved area (--save)

With FA4_DEBUG_TRACE=1 the first warp leader of each of the 16 warps of CTAs 0 and 1 logs every
mbarrier wait (begin, end), arrival and tcgen05.commit into a 1024-event ring of the debug area
(clock64 of its SM). This draws one lane per warp: a bar from each wait's begin to its end,
labelled with the barrier (kernel's table row and copy), ticks for arrivals (|) and commits (^);
a wait that never ended (a hang) runs to the right edge in red. The CTAs' clocks are aligned
through the %globaltimer read at kernel start (--ghz converts; ±1 µs). Waits of the tile ring
and the CTA-wide __syncthreads are not in the trace. The area also holds the hang records: they
are printed when present. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fa4 import debug  # noqa: E402


@dataclass
class Lane:
    """One row of the timeline: bars (x0, x1, label, open) and ticks (x, marker, label)."""

    label: str
    bars: list[tuple[float, float, str, bool]] = field(default_factory=list)
    ticks: list[tuple[float, str, str]] = field(default_factory=list)


def lanes(area: debug.Area, ghz: float = 1.9) -> list[Lane]:
    """The timeline lanes of an area's trace rings, x in cycles after the earliest kernel start
    (the CTAs' clocks aligned through their %globaltimer at start)."""
    if not area.rings:
        return []
    ns0 = min(r.start_ns for r in area.rings)
    end = 0.0
    out = []
    for ring in sorted(area.rings, key=lambda r: r.index):
        cta, warp = divmod(ring.index, area.warps)
        shift = (ring.start_ns - ns0) * ghz - ring.start_clock
        lane = Lane(f"CTA {cta} w{warp:<2d} {debug.role_name(ring.kernel, ring.role)}")
        open_wait: dict[tuple[int, int], float] = {}
        for e in ring.events:
            x = e.clock + shift
            end = max(end, x)
            name = debug.bar_name(ring.kernel, e.row, e.copy)
            if e.kind == "wait":
                open_wait[(e.row, e.copy)] = x
            elif e.kind == "done":
                x0 = open_wait.pop((e.row, e.copy), x)
                lane.bars.append((x0, x, f"{name} p{e.parity}", False))
            else:
                lane.ticks.append((x, "|" if e.kind == "arrive" else "^", name))
        for (row, copy), x0 in open_wait.items():
            lane.bars.append((x0, None, f"{debug.bar_name(ring.kernel, row, copy)} (never)", True))
        out.append(lane)
    for lane in out:  # waits that never ended run to the last event of any lane
        lane.bars = [(x0, end if x1 is None else x1, t, o) for x0, x1, t, o in lane.bars]
    return out


def draw_timeline(rows: list[Lane], path: str | Path, title: str, unit: str = "cycles"):
    """A PNG with one horizontal lane per Lane: its bars (grey, red when open) labelled inside
    when wide enough, its ticks as markers. Returns the matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(16, 0.45 * len(rows) + 1.5))
    ends = [x1 for r in rows for _, x1, _, _ in r.bars] + [x for r in rows for x, _, _ in r.ticks]
    span = max(ends + [1.0])
    for y, row in enumerate(rows):
        for x0, x1, text, is_open in row.bars:
            color = "tab:red" if is_open else "0.7"
            width = max(x1 - x0, span * 1e-4)
            ax.barh(y, width, left=x0, height=0.6, color=color, edgecolor="0.3", linewidth=0.3)
            if x1 - x0 > span * 0.03:
                ax.text((x0 + x1) / 2, y, text, ha="center", va="center", fontsize=6)
        for x, marker, _ in row.ticks:
            ax.plot(x, y + 0.35, marker=marker, color="tab:blue", markersize=4)
    ax.set_yticks(range(len(rows)), [r.label for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def _run(kind: str, seqlen: int, hdim: int, causal: bool) -> debug.Area:
    import torch

    import fa4

    if not debug.is_debug_build():
        raise SystemExit("fa4 is not a FA4_SM100_DEBUG=1 build: no trace to read")
    b, h = max(1, 16384 // seqlen), 2048 // hdim
    x = [torch.randn(b, seqlen, h, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    try:
        if kind == "fwd":
            fa4.attention(*x, causal=causal, backend="sm100")
        else:
            x = [t.requires_grad_() for t in x]
            fa4.attention(*x, causal=causal, backend="sm100").sum().backward()
        torch.cuda.synchronize()
    except Exception as e:  # a hang: the area still holds the trace up to it
        print(f"the run failed: {e}", file=sys.stderr)
    return debug.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", choices=("fwd", "bwd"), help="run one call and read its trace")
    src.add_argument("--area", help="a debug area saved with --save")
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--ghz", type=float, default=1.9, help="SM clock, to align the CTAs")
    ap.add_argument("--save", help="also write the raw area here")
    ap.add_argument("-o", "--out", default="trace_sm100.png")
    a = ap.parse_args()
    if a.area:
        area = debug.decode(Path(a.area).read_bytes())
    else:
        area = _run(a.run, a.seqlen, a.hdim, a.causal)
        if area is None:
            raise SystemExit("no debug area: the kernel never launched in this process")
    if a.save and not a.area:
        from fa4 import _C

        Path(a.save).write_bytes(debug.read_library(_C.__file__))
    text = debug.message(area)
    if text:
        print(text)
    rows = lanes(area, a.ghz)
    if not rows:
        raise SystemExit("the area holds no trace events (was FA4_DEBUG_TRACE=1 set?)")
    title = a.area or f"{a.run} hd{a.hdim} s={a.seqlen} causal={a.causal}"
    draw_timeline(rows, a.out, title)
    print(f"{a.out}: {len(rows)} warps, {sum(len(r.bars) for r in rows)} waits")


if __name__ == "__main__":
    main()
