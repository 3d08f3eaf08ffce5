"""The FP8 (e4m3) KV cache of attention_with_kvcache on the CPU: the reference path's semantics
(FA3's descales) against fa4.reference_fp8, the append's quantization, and every FP8 use fa4
rejects, with its message. The kernel path is tests/gpu/test_decode_fp8.py."""

import pytest
import torch

import fa4
from fa4 import kvcache
from fa4.reference_fp8 import attention_fp8_ref, dequantize, quantize

E4M3 = torch.float8_e4m3fn


def _cache(b, cap, h_kv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, cap, h_kv, d, generator=g)
    k[..., ::8] *= 20.0  # outlier channels
    v = torch.randn(b, cap, h_kv, d, generator=g)
    (k8, kd), (v8, vd) = quantize(k, h_kv), quantize(v, h_kv)
    return k8, v8, kd, vd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,softcap", [(False, 0.0), (True, 0.0), (True, 20.0)])
def test_reference_matches_dequantized(dtype, causal, softcap):
    """The reference on an FP8 cache is attention on the dequantized cache (per-head descales
    differ: quantize scales each (batch, kv head) on its own)."""
    k8, v8, kd, vd = _cache(2, 40, 2, 32)
    q = torch.randn(2, 3, 4, 32).to(dtype)
    out, lse = fa4.attention_with_kvcache(
        q, k8, v8, 40, k_descale=kd, v_descale=vd, causal=causal, softcap=softcap,
        return_lse=True, backend="reference",
    )  # fmt: skip
    ref, ref_lse = attention_fp8_ref(
        q.float(), k8, v8, None, kd, vd, causal=causal, softcap=softcap, out_dtype=torch.float32
    )
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert kd.std() > 0 and vd.std() > 0  # the per-head descales are not all equal


def test_no_descale_is_one():
    k8, v8, _, _ = _cache(1, 16, 1, 16, seed=1)
    q = torch.randn(1, 1, 2, 16)
    out = fa4.attention_with_kvcache(q, k8, v8, 16, backend="reference")
    ref = fa4.attention_with_kvcache(q, k8.float(), v8.float(), 16, backend="reference")
    torch.testing.assert_close(out, ref)


def test_paged_and_cache_batch_idx():
    """Descales belong to the sequence (q's batch row), not to the cache row or page."""
    k8, v8, kd, vd = _cache(3, 32, 2, 16, seed=2)
    q = torch.randn(2, 1, 4, 16)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    kd_seq, vd_seq = kd[idx.long()], vd[idx.long()]
    out = fa4.attention_with_kvcache(
        q, k8, v8, torch.tensor([32, 17], dtype=torch.int32), cache_batch_idx=idx,
        k_descale=kd_seq, v_descale=vd_seq, backend="reference",
    )  # fmt: skip
    k, v = dequantize(k8, kd, 2), dequantize(v8, vd, 2)
    exp = fa4.attention_with_kvcache(
        q, k, v, torch.tensor([32, 17], dtype=torch.int32), cache_batch_idx=idx,
        backend="reference",
    )  # fmt: skip
    torch.testing.assert_close(out, exp, atol=1e-5, rtol=1e-5)
    # the same cache as pages of 8 keys
    pages_k, pages_v = k8.reshape(12, 8, 2, 16), v8.reshape(12, 8, 2, 16)
    table = (idx.long()[:, None] * 4 + torch.arange(4)).int()
    paged = fa4.attention_with_kvcache(
        q, pages_k, pages_v, torch.tensor([32, 17], dtype=torch.int32), page_table=table,
        k_descale=kd_seq, v_descale=vd_seq, backend="reference",
    )  # fmt: skip
    torch.testing.assert_close(paged, out)


def test_append_quantizes_into_the_cache():
    b, cap, h_kv, d = 2, 16, 2, 16
    k_cache = torch.zeros(b, cap, h_kv, d, dtype=E4M3)
    v_cache = torch.zeros(b, cap, h_kv, d, dtype=E4M3)
    kd = torch.tensor([[0.5, 2.0], [1.0, 0.25]])
    vd = torch.tensor([[1.0, 1.0], [4.0, 0.5]])
    k_new = torch.randn(b, 3, h_kv, d)
    k_new[0, 0, 0, 0] = 1e6  # beyond e4m3's range after the descale: saturates, no NaN
    v_new = torch.randn(b, 3, h_kv, d)
    q = torch.randn(b, 1, 4, d)
    seqlens = torch.tensor([5, 0], dtype=torch.int32)
    fa4.attention_with_kvcache(
        q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new, k_descale=kd, v_descale=vd,
        backend="reference",
    )  # fmt: skip
    want_k = kvcache.quantize_for_cache(k_new, kd, E4M3)
    want_v = kvcache.quantize_for_cache(v_new, vd, E4M3)
    assert torch.equal(k_cache[0, 5:8].view(torch.uint8), want_k[0].view(torch.uint8))
    assert torch.equal(v_cache[1, 0:3].view(torch.uint8), want_v[1].view(torch.uint8))
    assert k_cache[0, 5, 0, 0].float() == 448.0
    assert not torch.isnan(k_cache.float()).any()
    assert (k_cache[0, :5].float() == 0).all() and (k_cache[0, 8:].float() == 0).all()
    # each value rounds to the nearest e4m3 value of x / descale: within half a step, 2^-4
    # relative in the normal range, 2^-10 absolute (times the descale) among the subnormals
    d = kd[:, None, :, None].expand_as(k_new)
    err = (want_k.float() * d - k_new).abs()[:, 1:]
    bound = torch.maximum(k_new.abs() * 2.0**-4, d * 2.0**-10)[:, 1:]
    assert (err <= bound * (1 + 1e-6)).all()


@pytest.mark.parametrize(
    "case,exc,needle",
    [
        ("q_fp8", TypeError, "FP8 queries"),
        ("e5m2_cache", TypeError, "float8_e4m3fn, k and v both"),
        ("mixed_cache", TypeError, "float8_e4m3fn, k and v both"),
        ("descale_shape", ValueError, "(batch, kv heads) = (2, 2)"),
        ("descale_dtype", TypeError, "torch.float32"),
        ("descale_without_fp8", ValueError, "is for an FP8"),
    ],
)
def test_kvcache_errors(case, exc, needle):
    k8, v8, kd, vd = _cache(2, 16, 2, 16)
    q = torch.randn(2, 1, 4, 16)
    kw = {}
    if case == "q_fp8":
        q = q.to(E4M3)
    elif case == "e5m2_cache":
        k8, v8 = k8.float().to(torch.float8_e5m2), v8.float().to(torch.float8_e5m2)
    elif case == "mixed_cache":
        v8 = v8.float()
    elif case == "descale_shape":
        kw["k_descale"] = kd[:1]
    elif case == "descale_dtype":
        kw["v_descale"] = vd.double()
    elif case == "descale_without_fp8":
        k8, v8 = k8.float(), v8.float()
        kw["k_descale"] = kd
    with pytest.raises(exc, match=needle.replace("(", r"\(").replace(")", r"\)")):
        fa4.attention_with_kvcache(q, k8, v8, 16, backend="reference", **kw)


def test_fp8_kv_with_16bit_q_outside_the_cache_is_rejected():
    """e4m3 k/v with 16-bit q is an FP8 cache, attention_with_kvcache's alone; e4m3 q, k and v
    is the FP8 forward (tests/api/test_fp8_fwd.py)."""
    q = torch.randn(1, 4, 2, 16)
    k8 = torch.randn(1, 4, 2, 16).to(E4M3)
    with pytest.raises(TypeError, match="an FP8 KV cache"):
        fa4.attention(q, k8, k8, backend="reference")
    with pytest.raises(TypeError, match="mixing FP8 and 16-bit"):
        fa4.attention(q.to(E4M3), k8, k8.float(), backend="reference")
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(TypeError, match="an FP8 KV cache"):
        fa4.attention_varlen(q[0], k8[0], k8[0], cu, cu, 4, 4, backend="reference")
