"""Two backward calls of one implementation on one shape, for a profiler to pick the second:

    ncu --clock-control none -k regex:bwd_kernel --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight python3 tools/bwd_once.py fa4 1 16384 0
    ncu ... -k regex:BackwardSm90 ... python3 tools/bwd_once.py flash-attn-4 1 16384 0

Arguments: implementation (fa4 or flash-attn-4), batch, seqlen, causal (0/1), and optionally
head dim (128), heads (2048 / hd, the bench's 16k-token shapes) and kv heads (= heads; fewer for
GQA, as bench_util.MODEL_POINTS). bf16, fresh N(0, 1) inputs.
"""

import sys

import torch
from profile_bwd import fa4_attention, peer_attention  # tools/ is this script's sys.path[0]


def attention_fn(name):
    fn = fa4_attention if name == "fa4" else peer_attention() if name == "flash-attn-4" else None
    if fn is None:
        raise SystemExit(f"{name!r}: not fa4 or an installed flash-attn-4")
    return fn


def main():
    fn = attention_fn(sys.argv[1])
    b, s, causal = map(int, sys.argv[2:5])
    d = int(sys.argv[5]) if len(sys.argv) > 5 else 128
    h = int(sys.argv[6]) if len(sys.argv) > 6 else 2048 // d
    h_kv = int(sys.argv[7]) if len(sys.argv) > 7 else h
    if h % h_kv:
        raise SystemExit(f"heads {h} is not a multiple of kv heads {h_kv}")
    q, k, v = (
        torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for heads in (h, h_kv, h_kv)
    )
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        fn(q, k, v, causal=bool(causal)).backward(dout)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
