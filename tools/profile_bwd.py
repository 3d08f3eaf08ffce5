#!/usr/bin/env python3
"""Per-kernel CUDA time of one backward call (fa4 and, if installed, flash-attn-4), from
torch.profiler: shows how the backward's time splits between the preprocess, the main kernel
and the postprocess (docs/decisions.md). Needs a CUDA device.

    python tools/profile_bwd.py [--hdim 128] [--seqlen 1024] [--causal] [--reps 5]

batch · seqlen = 16k tokens and heads · hdim = 2048, as bench/bench.py.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import fa4


def fa4_attention(q, k, v, causal):
    return fa4.attention(q, k, v, causal=causal)


def peer_attention():
    """flash-attn-4's attention(q, k, v, causal), or None when it is not installed."""
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        return None

    def run(q, k, v, causal):
        out = flash_attn_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return run


def kernel_times(fn, q, k, v, dout, causal, reps):
    """Mean microseconds per backward call of each CUDA kernel the backward launches."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    for _ in range(2):  # warm-up (and any JIT)
        fn(*leaves, causal).backward(dout)
    torch.cuda.synchronize()
    outs = [fn(*leaves, causal) for _ in range(reps)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for out in outs:
            out.backward(dout)
        torch.cuda.synchronize()
    total = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time / reps
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    b, h = max(1, 16384 // a.seqlen), max(1, 2048 // a.hdim)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (
        torch.randn(b, a.seqlen, h, a.hdim, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(4)
    )
    impls = {"fa4": fa4_attention}
    if (peer := peer_attention()) is not None:
        impls["flash-attn-4"] = peer
    print(f"backward, hd{a.hdim} s={a.seqlen} b={b} h={h} causal={a.causal}: us per call")
    for name, fn in impls.items():
        times = kernel_times(fn, q, k, v, dout, a.causal, a.reps)
        print(f"{name}: total {sum(times.values()):.1f}")
        for kname, t in sorted(times.items(), key=lambda kv: -kv[1]):
            print(f"  {t:9.1f}  {kname[:110]}")


if __name__ == "__main__":
    main()
