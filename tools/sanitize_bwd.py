"""Small backward problems for compute-sanitizer (memcheck / racecheck) on the GPU:

    compute-sanitizer --tool memcheck python3 tools/sanitize_bwd.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_bwd.py

One forward + backward per feature through the SM90 kernels, each small enough that the
instrumented run takes seconds. Exits non-zero if a gradient is not finite.
"""

import os

import torch
from sanitize_fwd import feature_cases  # tools/ is on sys.path when run as a script

import fa4


def run(name, q, k, v, varlen=None, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    if varlen is None:
        out = fa4.attention(*leaves, backend="sm90", **kw)
    else:
        cu_q, cu_k, mq, mk = varlen
        out = fa4.attention_varlen(*leaves, cu_q, cu_k, mq, mk, backend="sm90", **kw)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    for t, g in zip("qkv", leaves, strict=True):
        assert torch.isfinite(g.grad.float()).all(), f"{name}: d{t}"
    print(f"ok {name} {tuple(q.shape)}")


def main():
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    compiled = fa4.build_info.KERNELS["bwd"]["sm90"]
    for d, d_v in compiled:
        # 200 and 17 rows: a partial last 128-row block with more and with fewer than 64 rows
        for s_q in (200, 17):
            q = torch.randn(2, s_q, 4, d, device=dev, dtype=bf)
            k = torch.randn(2, 333, 2, d, device=dev, dtype=bf)
            v = torch.randn(2, 333, 2, d_v, device=dev, dtype=bf)
            run(f"dense d={d},{d_v}", q, k, v)
            run(f"causal d={d},{d_v}", q, k, v, causal=True)
            run(f"deterministic d={d},{d_v}", q, k, v, causal=True, deterministic=True)
            # Note [GQA head slices]: groups of 5 dealt as 2, 2, 1 q heads per item (forced:
            # BwdGrid::slice_heads keeps whole groups this small)
            q5 = torch.randn(2, s_q, 10, d, device=dev, dtype=bf)
            os.environ["FA4_BWD_TILE_ORDER"] = "heads2"
            run(f"gqa slices d={d},{d_v}", q5, k, v, causal=True)
            del os.environ["FA4_BWD_TILE_ORDER"]
    feature_cases(run, *compiled[0])


if __name__ == "__main__":
    main()
