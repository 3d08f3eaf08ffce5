"""Two forward calls on one shape, for a profiler to pick the second (ncu --launch-skip 1):

    ncu --clock-control none -k regex:fwd_kernel --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight python3 tools/fwd_once.py 16 1024 0

Arguments: batch, seqlen, causal (0/1), and optionally head dim (128), heads (2048 / hd, the
bench's 16k-token shapes: 16 at hd128) and the implementation: fa4 (default) or cudnn (torch
SDPA's cuDNN backend, for the same pages of the peer). bf16, fresh N(0, 1) inputs. "Where the
hd128 forward's cycles go" (docs/decisions.md, 2026-12-01) ran it with 16 heads at hd128. The
second call runs between cudaProfilerStart and Stop, so that `ncu --profile-from-start off` sees
only its kernels:

    ncu --profile-from-start off --clock-control none --section LaunchStats \
        python3 tools/fwd_once.py 32 512 1 128 16 cudnn
"""

import sys

import torch

import fa4


def cudnn_attention(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        return sdpa(qt, kt, vt, is_causal=causal).transpose(1, 2)


def main():
    b, s, causal = map(int, sys.argv[1:4])
    d = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    h = int(sys.argv[5]) if len(sys.argv) > 5 else 2048 // d
    impl = sys.argv[6] if len(sys.argv) > 6 else "fa4"
    call = {"fa4": fa4.attention, "cudnn": cudnn_attention}[impl]
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    call(q, k, v, causal=bool(causal))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call(q, k, v, causal=bool(causal))
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
