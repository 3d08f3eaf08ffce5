#!/usr/bin/env python3
"""What softcap costs the kernels (Note [softcap tanh]): fa4 forward and forward+backward
TFLOP/s with softcap 0 and with softcap 30, same inputs, one run. Needs a CUDA device and
triton (do_bench, as bench/bench.py).

    python tools/softcap_cost.py [--hdim 128] [--seqlens 2048,16384]

batch · seqlen = 16k tokens and heads · hdim = 2048, as bench/bench.py; FLOPs as DESIGN.md §6
(the tanh is not counted).
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

import fa4


def tflops(ms, b, h, s, d, bwd):
    flops = 4 * b * h * s * s * d * (3.5 if bwd else 1.0)
    return flops / ms / 1e9


def measure(q, k, v, dout, softcap):
    """Milliseconds of the forward and of forward + backward at this softcap."""

    def fwd():
        return fa4.attention(q, k, v, softcap=softcap)

    def fwd_bwd():
        return torch.autograd.grad(fa4.attention(q, k, v, softcap=softcap), (q, k, v), dout)

    return {
        name: do_bench(fn, warmup=25, rep=100) for name, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd))
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlens", default="2048,16384")
    args = ap.parse_args()
    d = args.hdim
    h = 2048 // d
    print("seqlen,direction,softcap,ms,tflops")
    for s in (int(x) for x in args.seqlens.split(",")):
        b = 16384 // s
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            (torch.randn(b, s, h, d, device="cuda", generator=g) * 2).bfloat16().requires_grad_()
            for _ in range(3)
        )
        dout = torch.randn_like(q)
        for softcap in (0.0, 30.0):
            for name, ms in measure(q, k, v, dout, softcap).items():
                tf = tflops(ms, b, h, s, d, name == "fwd+bwd")
                print(f"{s},{name},{softcap:g},{ms:.4f},{tf:.1f}")


if __name__ == "__main__":
    main()
