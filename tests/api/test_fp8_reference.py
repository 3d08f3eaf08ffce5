"""fa4.reference_fp8: the FP8 semantics (stored x descale per (batch, kv head)) and the tolerance
baseline (P rounded to e4m3 per row), against independent formulas, on CPU
(docs/numerics.md, "FP8")."""

import pytest
import torch
from helpers import naive_attention

from fa4 import reference_fp8 as r8

E4M3 = torch.float8_e4m3fn


def _qkv(b=2, s_q=7, s_k=33, h=4, h_kv=2, d=64, seed=0, outlier=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h, d, generator=g)
    k = torch.randn(b, s_k, h_kv, d, generator=g)
    v = torch.randn(b, s_k, h_kv, d, generator=g)
    k[:, :, 0, 5] *= outlier  # an outlier channel in kv head 0
    return q, k, v


def test_dequantize_is_stored_times_descale_per_kv_head():
    x8 = torch.randn(2, 3, 4, 8).to(E4M3)
    descale = torch.tensor([[0.5, 2.0], [3.0, 0.25]])
    got = r8.dequantize(x8, descale, heads_kv=2)
    for b in range(2):
        for h in range(4):  # q heads 0, 1 use kv head 0; 2, 3 kv head 1
            want = x8[b, :, h].float() * descale[b, h // 2]
            assert torch.equal(got[b, :, h], want)
    with pytest.raises(ValueError, match="descale must be float32"):
        r8.dequantize(x8, descale.double(), heads_kv=2)
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        r8.dequantize(x8, descale[:1], heads_kv=2)


def test_quantize_maps_each_kv_heads_max_to_e4m3_max():
    q, k, _ = _qkv(outlier=50.0)
    k8, kd = r8.quantize(k, heads_kv=2)
    assert k8.dtype == E4M3 and kd.shape == (2, 2) and kd.dtype == torch.float32
    assert torch.allclose(k8.float().abs().amax(dim=(1, 3)), torch.full((2, 2), r8.E4M3_MAX))
    back = r8.dequantize(k8, kd, 2)
    rel = ((back - k).abs() / k.abs().amax(dim=(1, 3), keepdim=True)).max()
    assert rel <= r8.E4M3_UNIT_ROUNDOFF  # within half an e4m3 step of each head's range


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (5, 2)}, {"softcap": 3.0}])
def test_reference_is_fp32_attention_on_dequantized_inputs(kw):
    q, k, v = _qkv(seed=1)
    (q8, qd), (k8, kd), (v8, vd) = (r8.quantize(x, 2) for x in (q, k, v))
    out, lse = r8.attention_fp8_ref(q8, k8, v8, qd, kd, vd, out_dtype=torch.float32, **kw)
    mask = {"causal": kw.get("causal", False), "window": kw.get("window_size", (-1, -1))}
    for b in range(2):
        qf, kf, vf = (r8.dequantize(x, s, 2)[b] for x, s in ((q8, qd), (k8, kd), (v8, vd)))
        want, want_lse = naive_attention(qf, kf, vf, softcap=kw.get("softcap", 0.0), **mask)
        torch.testing.assert_close(out[b].double(), want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(lse[b].double(), want_lse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("outlier", [1.0, 30.0])
@pytest.mark.parametrize("kw", [{}, {"causal": True}])
def test_p_quantization_error_obeys_the_derived_bound(kw, outlier):
    """docs/numerics.md "FP8": the baseline's error against the reference stays within
    (u + n 2^-10 / 256) max|v| (P scaled by 2^8, as the kernel does), and is not zero (P is
    really rounded)."""
    q, k, v = _qkv(s_q=16, s_k=300, seed=2, outlier=outlier)
    (q8, qd), (k8, kd), (v8, vd) = (r8.quantize(x, 2) for x in (q, k, v))
    ref, ref_lse = r8.attention_fp8_ref(q8, k8, v8, qd, kd, vd, out_dtype=torch.float32, **kw)
    emu, emu_lse = r8.attention_fp8_ref(q8, k8, v8, qd, kd, vd, out_dtype=torch.float32,
                                        emulate_p=True, **kw)  # fmt: skip
    err = (emu - ref).abs().max().item()
    assert 0 < err <= r8.p_rounding_bound(v8, vd, n_keys=300)
    torch.testing.assert_close(emu_lse, ref_lse, atol=1e-5, rtol=1e-5)  # l from unrounded P


def test_rows_with_no_key():
    q, k, v = _qkv(s_q=40, s_k=10, seed=3)
    (q8, qd), (k8, kd), (v8, vd) = (r8.quantize(x, 2) for x in (q, k, v))
    for emulate in (False, True):
        out, lse = r8.attention_fp8_ref(q8, k8, v8, qd, kd, vd, causal=True, emulate_p=emulate)
        assert torch.equal(out[:, :30], torch.zeros_like(out[:, :30]))  # bottom-right alignment
        assert torch.isneginf(lse[..., :30]).all() and torch.isfinite(lse[..., 30:]).all()
        assert out.dtype == torch.bfloat16
