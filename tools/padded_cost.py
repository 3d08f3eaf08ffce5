"""What a padded head dim costs (Note [padded head dims]): fa4's SM90 forward and forward +
backward at head dims that run on a covering instance, beside the instance's native head dim,
same tokens and heads.

    python3 tools/padded_cost.py            # on an H100 / H200 with the extension built

bf16, batch 2 x 8k tokens, 16 heads, non-causal. Each line: the head dim, the instance that ran it
(fa4.manifest.cover over the build's pairs), triton's do_bench median in ms, and TFLOP/s counted
with the problem's own d (4 · b · h · s² · d forward, 3.5× that for forward + backward), so a
padded point shows its waste as lower TFLOP/s at about the instance's time.
"""

import torch
from triton.testing import do_bench

import fa4
from fa4 import build_info, manifest


def point(d, b=2, s=8192, h=16):
    compiled = build_info.KERNELS.get("fwd", {}).get("sm90", [])
    inst = manifest.cover(compiled, d, d)
    if inst is None:
        print(f"d{d}: no instance covers it in this build", flush=True)
        return
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (
        torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)
    )
    fwd_ms = do_bench(lambda: fa4.attention(q, k, v, backend="sm90"), warmup=50, rep=300)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    dout = torch.randn_like(q)

    def step():
        out = fa4.attention(*leaves, backend="sm90")
        torch.autograd.grad(out, leaves, dout)

    fb_ms = do_bench(step, warmup=20, rep=300)
    flops = 4 * b * h * s * s * d
    print(
        f"d{d} on {inst[0]}x{inst[1]}: fwd {fwd_ms:.3f} ms {flops / fwd_ms / 1e9:.0f} TFLOP/s, "
        f"fwd+bwd {fb_ms:.3f} ms {3.5 * flops / fb_ms / 1e9:.0f} TFLOP/s",
        flush=True,
    )


def main():
    for d in (64, 72, 80, 96, 112, 128):
        point(d)


if __name__ == "__main__":
    main()
