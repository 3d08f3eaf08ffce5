"""CPU test of tools/host_overhead.py's per-call timeline (the --dir bwd reading of the bench's
loop): kernel records grouped by the flush that precedes them."""

from pathlib import Path

from helpers import load_script

TOOL = Path(__file__).resolve().parents[2] / "tools" / "host_overhead.py"
ns = load_script(TOOL, "host_overhead")


def test_timeline_groups_kernels_by_flush():
    flush = "fill<int8>"
    records = [
        (0, 80, flush),  # call 1: back to back, 2 + 5 µs idle
        (82, 182, "pre"),
        (187, 587, "main"),
        (600, 680, flush),  # call 2: the host late by 50 µs, one kernel
        (730, 1130, "main"),
        (1200, 1280, flush),  # call 3: three kernels
        (1281, 1381, "pre"),
        (1381, 1781, "main"),
        (1781, 1801, "post"),
    ]
    t = ns.per_call_timeline(records, {flush})
    # spans 507, 450, 521; busy 500, 400, 520; leads 2, 50, 1; kernels 2, 1, 3
    assert t == {"span": 507, "busy": 500, "lead": 2, "kernels": 2}


def test_timeline_ignores_kernels_before_the_first_flush_and_empty_calls():
    records = [(0, 5, "stray"), (10, 90, "f"), (100, 400, "k"), (500, 580, "f")]
    t = ns.per_call_timeline(records, {"f"})
    assert t == {"span": 310, "busy": 300, "lead": 10, "kernels": 1}
