"""The decode kernel with an FP8 (e4m3) KV cache (Note [fp8 cache] in csrc/decode/kernel.cuh)
through torch.ops.fa4._fwd_kernel, against the fp32 reference on the dequantized cache under the
tolerance rule of DESIGN.md §5 (docs/numerics.md, "FP8"). The low-precision baseline is the same
attention in q's dtype on the dequantized cache rounded to that dtype.

Caches are quantized per (sequence, kv head) by fa4.reference_fp8.quantize, from keys with outlier
channels (a few channels 20x larger, as real K caches have), so the descales differ per head.
Outputs are poisoned (gpu_helpers.poison): an unwritten element fails as NaN.
"""

import pytest
import torch
from gpu_helpers import poison
from helpers import assert_tolerance

from fa4 import build_info, reference
from fa4.reference_fp8 import dequantize, quantize

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device: the decode kernel is not executed elsewhere")


HDIMS = [tuple(p) for p in build_info.KERNELS.get("fwd", {}).get("decode", []) if p[0] % 16 == 0]


def _op(q, k8, v8, kd, vd, *, seqused_k, page_table=None, causal=False, softcap=0.0, splits=0,
        window=(-1, -1)):  # fmt: skip
    poison()
    return torch.ops.fa4._fwd_kernel(
        q, k8, v8, None, None, seqused_k, None, page_table, None, None, None, 0,
        int(seqused_k.max()), causal,
        q.shape[-1] ** -0.5, window[0], window[1], softcap, False, splits, 0, 0, None, kd, vd,
    )  # fmt: skip


def _cache(b, cap, h_kv, d, d_v, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(b, cap, h_kv, d, device="cuda", generator=g)
    k[..., :: max(1, d // 4)] *= 20.0  # outlier channels
    v = torch.randn(b, cap, h_kv, d_v, device="cuda", generator=g) * 3.0
    (k8, kd), (v8, vd) = quantize(k, h_kv), quantize(v, h_kv)
    return k8, v8, kd, vd


def _expected(q, k8, v8, kd, vd, lens, **kw):
    """fp32 reference and the baseline in q's dtype, on the dequantized cache, per sequence."""
    h_kv = k8.shape[2]
    k, v = dequantize(k8, kd, h_kv), dequantize(v8, vd, h_kv)
    outs, lses, pts, pt_lses = [], [], [], []
    for b in range(q.shape[0]):
        kb, vb, qb = k[b : b + 1, : lens[b]], v[b : b + 1, : lens[b]], q[b : b + 1]
        o, lse = reference.attention_ref(qb, kb, vb, **kw)
        pt, pt_lse = reference.attention_ref(qb, kb.to(q.dtype), vb.to(q.dtype), upcast=False, **kw)
        outs.append(o.float())
        lses.append(lse.float())
        pts.append(pt.float())
        pt_lses.append(pt_lse.float())
    return torch.cat(outs), torch.cat(lses), torch.cat(pts), torch.cat(pt_lses)


def _check(out, lse, exp, dtype):
    ref, ref_lse, pt, pt_lse = exp
    assert_tolerance("out", out.float(), ref, pt, dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


@pytest.mark.parametrize("hdims", HDIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "s_q,h,h_kv,causal,splits,softcap",
    [(1, 8, 2, False, 0, 0.0), (1, 8, 8, False, 3, 0.0), (4, 8, 2, True, 1, 0.0),
     (8, 16, 2, True, 0, 30.0), (40, 8, 2, True, 0, 0.0)],
)  # fmt: skip
def test_dense_fp8_cache(hdims, dtype, s_q, h, h_kv, causal, splits, softcap):
    d, d_v = hdims
    k8, v8, kd, vd = _cache(3, 1000, h_kv, d, d_v, seed=d + s_q)
    q = torch.randn(3, s_q, h, d, device="cuda").to(dtype)
    lens = [0, 1, 777]
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = _op(q, k8, v8, kd, vd, seqused_k=used, causal=causal, softcap=softcap, splits=splits)
    exp = _expected(q, k8, v8, kd, vd, lens, causal=causal, softcap=softcap)
    _check(out, lse, exp, dtype)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("splits", [1, 0])
def test_paged_fp8_cache(page_size, splits):
    d = 128
    k8, v8, kd, vd = _cache(4, 700, 2, d, d, seed=page_size)
    q = torch.randn(4, 1, 8, d, device="cuda").to(torch.bfloat16)
    b, cap = k8.shape[:2]
    per = -(-cap // page_size)
    pad = per * page_size - cap
    kp = torch.nn.functional.pad(k8.view(torch.uint8), (0, 0, 0, 0, 0, pad))
    vp = torch.nn.functional.pad(v8.view(torch.uint8), (0, 0, 0, 0, 0, pad))
    kp, vp = (x.reshape(b * per, page_size, 2, d).view(torch.float8_e4m3fn) for x in (kp, vp))
    perm = torch.randperm(b * per, generator=torch.Generator().manual_seed(page_size)).cuda()
    pool_k, pool_v = torch.empty_like(kp), torch.empty_like(vp)
    pool_k[perm], pool_v[perm] = kp, vp
    table = perm.view(b, per).to(torch.int32).contiguous()
    lens = [0, page_size * (600 // page_size), 699, 3]
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = _op(q, pool_k, pool_v, kd, vd, seqused_k=used, page_table=table, splits=splits)
    _check(out, lse, _expected(q, k8, v8, kd, vd, lens), torch.bfloat16)


def test_no_descale_and_saturation():
    """No descales (1), and bf16 queries beyond fp16's range: the fp16 MMAs saturate them at
    +-65504 (api/fa4.h), which the reference on saturated queries reproduces."""
    k8, v8, _, _ = _cache(2, 300, 1, 128, 128, seed=7)
    q = torch.randn(2, 1, 4, 128, device="cuda")
    q[0, 0, 0, 0] = 1e6
    q = q.to(torch.bfloat16)
    lens = [300, 129]
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = _op(q, k8, v8, None, None, seqused_k=used)
    q_sat = q.float().clamp(-65504, 65504).to(torch.bfloat16)
    exp = _expected(q_sat, k8, v8, None, None, lens)
    assert torch.isfinite(out.float()).all()
    _check(out, lse, exp, torch.bfloat16)
