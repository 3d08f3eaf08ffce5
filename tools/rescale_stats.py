#!/usr/bin/env python3
"""How often conditional rescaling skips the O rescale on random inputs (docs/numerics.md,
"Conditional rescaling and the tile model").

Runs fa4.reference.attention_fa4_model on N(0, 1) bf16 inputs (batch 1, 2 heads, default
softmax scale, seed 0) for head dims 64/128, causal or not, seqlen 1024/4096, and prints a
Markdown table: the fraction of (row, tile) decisions that keep the stale max with tau = 8, the
same per 32-row warp, and, for comparison, the fractions that rescale in the classic algorithm
(tau = 0). Two more rows multiply q and k by 2 and 3 (score std 4 and 9 instead of 1) to show
where skipping starts to fail. About 10 s on one core.

Usage: python tools/rescale_stats.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fa4.reference import attention_fa4_model  # noqa: E402  (needs the path above)

HEADS = 2


def _warps_skipped(st: dict) -> float:
    return st["warp_groups_skipped"] / st["warp_groups_total"]


def _row(hd: int, causal: bool, s: int, qk_scale: float = 1.0) -> str:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, s, HEADS, hd, generator=gen) for _ in range(3))
    q, k, v = (q * qk_scale).bfloat16(), (k * qk_scale).bfloat16(), v.bfloat16()
    t0 = time.perf_counter()
    st8 = attention_fa4_model(q, k, v, causal=causal, tau=8.0)[2]
    st0 = attention_fa4_model(q, k, v, causal=causal, tau=0.0)[2]
    secs = time.perf_counter() - t0
    decided = st0["rescaled"] + st0["skipped"]
    cells = [hd, "yes" if causal else "no", s, f"{qk_scale:g}", decided]
    cells += [f"{st8['fraction_skipped']:.4f}", f"{_warps_skipped(st8):.4f}"]
    cells += [f"{1 - st0['fraction_skipped']:.4f}", f"{1 - _warps_skipped(st0):.4f}"]
    cells += [f"{secs:.1f}"]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main() -> None:
    print("| hd | causal | seqlen | q, k × | (row, tile) decisions | skipped, τ=8 "
          "| warps skipped, τ=8 | rescaled, τ=0 | warps rescaled, τ=0 | time (s) |")  # fmt: skip
    print("| ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for hd in (64, 128):
        for causal in (False, True):
            for s in (1024, 4096):
                print(_row(hd, causal, s), flush=True)
    for qk_scale in (2.0, 3.0):
        print(_row(128, False, 4096, qk_scale), flush=True)


if __name__ == "__main__":
    main()
