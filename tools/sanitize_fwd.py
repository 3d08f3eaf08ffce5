"""Small forward problems for compute-sanitizer (memcheck / racecheck) on the GPU:

    compute-sanitizer --tool memcheck python3 tools/sanitize_fwd.py
    compute-sanitizer --tool racecheck python3 tools/sanitize_fwd.py

One call per feature, each small enough that the instrumented run takes seconds. Exits non-zero
if a result is not finite where it must be.
"""

import torch

import fa4
from fa4.reference_fp8 import quantize


def run(name, q, k, v, varlen=None, **kw):
    if varlen is None:
        out = fa4.attention(q, k, v, backend="sm90", **kw)
    else:
        cu_q, cu_k, mq, mk = varlen
        out = fa4.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, backend="sm90", **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all(), name
    print(f"ok {name} {tuple(q.shape)}")


def feature_cases(run, d, d_v):
    """Window, softcap, fp16 and varlen (with zero-length sequences) at one head dim, through
    `run(name, q, k, v, varlen=None, **kw)`; sanitize_bwd.py runs them through the backward."""
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(1, 257, 2, d, device=dev, dtype=bf)
    k = torch.randn(1, 257, 2, d, device=dev, dtype=bf)
    v = torch.randn(1, 257, 2, d_v, device=dev, dtype=bf)
    run("window", q, k, v, window_size=(40, 8))
    run("softcap", q, k, v, softcap=5.0)
    run("fp16", q.half(), k.half(), v.half(), causal=True)
    lens = [0, 5, 130, 1, 256]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    qv = torch.randn(sum(lens), 2, d, device=dev, dtype=bf)
    kv = torch.randn(sum(lens), 1, d, device=dev, dtype=bf)
    vv = torch.randn(sum(lens), 1, d_v, device=dev, dtype=bf)
    run("varlen causal", qv, kv, vv, varlen=(cu, cu, max(lens), max(lens)), causal=True)


def main():
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    compiled = fa4.build_info.KERNELS["fwd"]["sm90"]
    for d, d_v in compiled:
        q = torch.randn(2, 200, 4, d, device=dev, dtype=bf)
        k = torch.randn(2, 333, 2, d, device=dev, dtype=bf)
        v = torch.randn(2, 333, 2, d_v, device=dev, dtype=bf)
        run(f"dense d={d},{d_v}", q, k, v)
        run(f"causal d={d},{d_v}", q, k, v, causal=True)
    feature_cases(run, *compiled[0])
    # More tiles than SMs at every head dim: the CTAs claim tiles from the counter and go around
    # the tile ring (Note [dynamic tiles]) several times.
    for d, d_v in compiled:
        q = torch.randn(4, 600, 16, d, device=dev, dtype=bf)
        k = torch.randn(4, 600, 4, d, device=dev, dtype=bf)
        v = torch.randn(4, 600, 4, d_v, device=dev, dtype=bf)
        run(f"many tiles causal d={d},{d_v}", q, k, v, causal=True)
        run(f"many tiles d={d},{d_v}", q, k, v)
    # The FP8 forward (Note [fp8 forward], Note [fp8 kBlockN]) where the build has e4m3
    # instances: partial key blocks, GQA, causal, varlen, and more KV blocks than stages.
    for d, d_v in fa4.build_info.instance_dims("sm90", "fwd", "e4m3"):
        q, k, v = (
            torch.randn(2, s, h, x, device=dev)
            for s, h, x in ((130, 4, d), (1000, 2, d), (1000, 2, d_v))
        )
        (q8, qd), (k8, kd), (v8, vd) = (quantize(x, 2) for x in (q, k, v))
        ds = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
        run(f"fp8 d={d},{d_v}", q8, k8, v8, **ds)
        run(f"fp8 causal d={d},{d_v}", q8, k8, v8, causal=True, **ds)
        cu_q = torch.tensor([0, 50, 130], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, 333, 1000], dtype=torch.int32, device=dev)
        run(
            f"fp8 varlen d={d},{d_v}", q8[0], k8[0], v8[0], (cu_q, cu_k, 80, 667), causal=True, **ds
        )


if __name__ == "__main__":
    main()
