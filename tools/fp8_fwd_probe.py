"""The FP8 forward against fa4's bf16 forward and the FP8 GEMM ceiling, on one GPU in one call:
b 1, 16 heads, 16k tokens, hd 128 and 256, causal and not; triton's do_bench (median), the
Vᵀ pass inside the FP8 time. Prints TFLOP/s per point, the ratio to bf16 and the
8192³ e4m3 torch._scaled_mm ceiling (docs/perf.md, "FP8"). A probe; the standing rows come
from `bench/bench.py --dtype e4m3`.

    python3 tools/fp8_fwd_probe.py
"""

import functools

import torch
from triton.testing import do_bench

import fa4
from fa4 import reference_fp8 as rf


def main():
    torch.manual_seed(0)
    b, s, h = 1, 16384, 16
    for hd in (128, 256):
        for causal in (False, True):
            q, k, v = (
                torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3)
            )
            (q8, qd), (k8, kd), (v8, vd) = (rf.quantize(x.float(), h) for x in (q, k, v))
            ds = {"q_descale": qd, "k_descale": kd, "v_descale": vd}

            f8 = functools.partial(fa4.attention, q8, k8, v8, causal=causal, **ds)
            f16 = functools.partial(fa4.attention, q, k, v, causal=causal)

            gap = (f8().float() - f16().float()).abs().max().item()
            flops = 4 * b * h * s * s * hd / (2 if causal else 1)
            t8 = do_bench(f8, warmup=20, rep=100)
            t16 = do_bench(f16, warmup=20, rep=100)
            print(
                f"hd{hd} causal{int(causal)} fp8 {flops / t8 / 1e9:.0f} TFLOP/s bf16 "
                f"{flops / t16 / 1e9:.0f} ratio {t16 / t8:.2f} max|o8-o16| {gap:.3e}",
                flush=True,
            )
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    bm = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device="cuda")
    t = do_bench(
        lambda: torch._scaled_mm(a, bm, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        warmup=20,
        rep=100,
    )
    print(f"fp8 gemm 8192^3 {2 * 8192**3 / t / 1e9:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
