"""CPU tests of tools/trace_sm100.py: a synthetic debug area (two traced warps of two CTAs, one
wait that never ended) becomes the timeline lanes it encodes, aligned across CTAs through their
%globaltimer, and a PNG."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import load_script

from fa4 import debug

ROOT = Path(__file__).resolve().parents[2]
ts = load_script(ROOT / "tools" / "trace_sm100.py", "trace_sm100")
CAPACITY, CTAS, WARPS, EVENTS = 64, 2, 16, 1024
KIND = {"wait": 1, "done": 2, "arrive": 3, "commit": 4}
ROW = {b: i for i, b in enumerate(debug.KERNELS[1].bars)}


def _area(rings: dict[int, tuple[tuple, list[tuple]]]) -> bytes:
    """Area bytes with the given rings: index -> (header, events (clock, kind, bar, copy,
    parity, block))."""
    head = debug.HEADER.pack(debug.AREA_MAGIC, debug.VERSION, 0, CAPACITY, CTAS, WARPS, EVENTS,
                             debug.RECORD.size)  # fmt: skip
    ring_bytes = debug.RING_HEADER.size + EVENTS * debug.EVENT.size
    trace = bytearray(CTAS * WARPS * ring_bytes)
    for i, (header, events) in rings.items():
        at = i * ring_bytes
        trace[at : at + debug.RING_HEADER.size] = debug.RING_HEADER.pack(len(events), *header)
        for j, (clock, kind, bar, copy, parity, block) in enumerate(events):
            code = KIND[kind] | parity << 4 | copy << 8 | (ROW[bar] + 1) << 16
            e = at + debug.RING_HEADER.size + j * debug.EVENT.size
            trace[e : e + debug.EVENT.size] = debug.EVENT.pack(clock, 0, code, block)
    return head + bytes(CAPACITY * debug.RECORD.size) + bytes(trace)


# CTA 0 warp 12 (MMA), SM 3, clock 1000 at start, globaltimer 5000 ns
MMA = ((1, 3, 3, 1000, 0, 5000, 0), [
    (1100, "wait", "kKFull", 0, 0, 7), (1300, "done", "kKFull", 0, 0, 7),
    (1310, "commit", "kSFull", 0, 0, 7), (1400, "wait", "kPFull", 0, 0, 7),
    (1900, "done", "kPFull", 0, 0, 7), (1950, "wait", "kPFull", 1, 1, 6),
])  # fmt: skip
# CTA 1 warp 0 (softmax0), SM 9, clock 7000 at start, 100 ns after CTA 0's start
SOFTMAX = ((1, 0, 9, 7000, 0, 5100, 0), [
    (7050, "wait", "kSFull", 0, 0, 7), (7500, "done", "kSFull", 0, 0, 7),
    (7600, "arrive", "kPFull", 0, 0, 7),
])  # fmt: skip


def test_lanes_pair_waits_align_ctas_and_keep_open_waits():
    area = debug.decode(_area({12: MMA, WARPS + 0: SOFTMAX}))
    mma, softmax = ts.lanes(area, ghz=2.0)
    assert mma.label.startswith("CTA 0 w12") and mma.label.endswith("MMA warp")
    assert softmax.label.startswith("CTA 1 w0") and softmax.label.endswith("softmax0 warpgroup")
    # CTA 0: x = clock - 1000; CTA 1: x = clock - 7000 + 100 ns * 2 GHz
    assert mma.bars[:2] == [(100, 300, "kKFull[0] p0", False), (400, 900, "kPFull[0] p0", False)]
    assert mma.ticks == [(310, "^", "kSFull[0]")]
    assert softmax.bars == [(250, 700, "kSFull[0] p0", False)]
    assert softmax.ticks == [(800, "|", "kPFull[0]")]
    # the MMA warp's last wait never ended: open, to the last event of any lane (x = 950)
    assert mma.bars[2] == (950, 950, "kPFull[1] (never)", True)


def test_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    area = debug.decode(_area({12: MMA, WARPS + 0: SOFTMAX}))
    png = tmp_path / "t.png"
    fig = ts.draw_timeline(ts.lanes(area), png, "synthetic")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("CTA 0 w12") and labels[1].startswith("CTA 1 w0")
    assert len(ax.patches) == 4  # the four waits


def test_cli_on_a_saved_area(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    dump = tmp_path / "area.bin"
    dump.write_bytes(_area({12: MMA}))
    out = tmp_path / "cli.png"
    monkeypatch.setattr("sys.argv", ["trace_sm100.py", "--area", str(dump), "-o", str(out)])
    ts.main()
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert f"{out}: 1 warps, 3 waits" in capsys.readouterr().out
