"""Two forward calls on one shape, for a profiler to pick the second (ncu --launch-skip 1):

    ncu --clock-control none -k regex:fwd_kernel --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight python3 tools/fwd_once.py 16 1024 0

Arguments: batch, seqlen, causal (0/1), and optionally head dim (128) and heads (2048 / hd, the
bench's 16k-token shapes: 16 at hd128). bf16, fresh N(0, 1) inputs. perf.md's "where the hd128
forward's cycles go" ran it with 16 heads at hd128.
"""

import sys

import torch

import fa4


def main():
    b, s, causal = map(int, sys.argv[1:4])
    d = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    h = int(sys.argv[5]) if len(sys.argv) > 5 else 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(2):
        fa4.attention(q, k, v, causal=bool(causal))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
