"""Decode timing probe of the compiled op (no peers): GB/s of K and V read per decode step.

    python3 tools/decode_probe.py            # on an H100 / H200 with the extension built

bf16, one query token, 32 q heads; dense caches of full length, then paged ones (page 16 and
256, shuffled tables), then forced split counts. Each line: the case, triton's do_bench median,
GB/s = batch * seqlen_k * kv_heads * (d + d_v) * 2 bytes / time, and the max |error| against
torch SDPA (enable_gqa) on the dense cache. bench/bench.py --decode is the sweep with the peers;
this is the quick look (docs/perf.md, "Decode").
"""

import torch
from triton.testing import do_bench

import fa4  # noqa: F401  (registers torch.ops.fa4)


def case(b, sk, hq, hkv, d, splits=0, page=0):
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    table, kk, vv = None, k, v
    if page:
        per = sk // page
        perm = torch.randperm(b * per, device="cuda")
        kk, vv = torch.empty(b * per, page, hkv, d, device="cuda", dtype=k.dtype), None
        vv = torch.empty_like(kk)
        kk[perm], vv[perm] = k.reshape(b * per, page, hkv, d), v.reshape(b * per, page, hkv, d)
        table = perm.view(b, per).int().contiguous()

    def f():
        return torch.ops.fa4._fwd_kernel(
            q, kk, vv, None, None, used, None, table, None, None, None, 0, sk, False, d**-0.5,
            -1, -1, 0.0, False, splits, 0, 0, None,
        )  # fmt: skip

    ms = do_bench(f, warmup=50, rep=200)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True
    ).transpose(1, 2)
    err = (f()[0].float() - ref.float()).abs().max().item()
    gbps = b * sk * hkv * d * 2 * 2 / ms / 1e6
    print(
        f"b{b} sk{sk} hq{hq} hkv{hkv} d{d} splits{splits} page{page}: {ms * 1e3:.1f} us "
        f"{gbps:.0f} GB/s err {err:.2e}",
        flush=True,
    )


def main():
    torch.manual_seed(0)
    for b, sk, hkv in ((16, 8192, 8), (64, 32768, 8), (4, 131072, 8), (16, 8192, 4)):
        case(b, sk, 32, hkv, 128)
    for page in (16, 256):
        case(16, 8192, 32, 8, 128, page=page)
    for s in (4, 8, 16, 32):
        case(4, 131072, 32, 8, 128, splits=s)


if __name__ == "__main__":
    main()
