"""Spread of one forward shape's speed across fresh allocations (and schedules):

    python3 tools/fwd_spread.py [--seqlen 16384] [--hdim 128] [--causal] [--trials 12]

The A/B calls of 2026-12-01 (docs/decisions.md) read hd128 causal 16k at 590 in most runs and at
653-660 in a few, with the same build. This runs the bench's shape (batch 16k / seqlen, heads
2048 / hd, bf16) `--trials` times, each with newly allocated q, k, v, under the run-time tile
counter and under FA4_STATIC_SCHEDULE=1 alternately, and prints per trial the median time of
`--reps` calls (CUDA events) and where the inputs lie (address mod 2 MiB), so that a speed that
follows the allocation, the schedule or neither can be told apart.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

import fa4


def median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    s, d = a.seqlen, a.hdim
    b, h = max(1, 16384 // s), 2048 // d
    flops = 4 * b * h * s * s * d / (2 if a.causal else 1)
    print(f"hd{d} s={s} b={b} h={h} causal={a.causal}")
    print("trial schedule  ms      TFLOP/s  q/k/v address mod 2 MiB (KiB)")
    keep = []  # earlier trials' inputs stay allocated, so that each trial gets new addresses
    for trial in range(a.trials):
        keep.append(torch.empty(4096 * 37 * (trial + 1), dtype=torch.uint8, device="cuda"))
        x = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        keep.append(x)
        where = "/".join(str((t.data_ptr() % (1 << 21)) >> 10) for t in x)
        for sched in ("counter", "static"):
            if sched == "static":
                os.environ["FA4_STATIC_SCHEDULE"] = "1"
            else:
                os.environ.pop("FA4_STATIC_SCHEDULE", None)
            ms = median_ms(lambda x=x: fa4.attention(*x, causal=a.causal), a.reps)
            print(f"{trial:5d} {sched:8s} {ms:7.4f} {flops / ms / 1e9:7.1f}  {where}")
    os.environ.pop("FA4_STATIC_SCHEDULE", None)


if __name__ == "__main__":
    main()
