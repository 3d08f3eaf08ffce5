"""The SM90 FP8 forward kernel (e4m3 q, k, v; bf16 out) through fa4.attention / attention_varlen
against the fp32 reference on the dequantized inputs, under docs/numerics.md "FP8"'s rule:
- out: max|out - ref| <= 2 · max|emu - ref| + 2 · bf16 rounding of ref, emu the baseline with P
  rounded to e4m3 (attention_fp8_ref(emulate_p=True): P · 2^8 per row, l from unrounded P);
- lse: DESIGN.md §5's rule with the baseline = the same attention in bf16 on the dequantized
  inputs rounded to bf16 (reference.attention_ref(upcast=False)).
Inputs are drawn fresh per case, quantized per (batch, kv head) by fa4.reference_fp8.quantize
from q and k with 30x outlier channels (so the descales differ per head); outputs are poisoned
(gpu_helpers.poison): an unwritten element fails as NaN.
"""

import pytest
import torch
from gpu_helpers import cu_seqlens, poison
from helpers import assert_tolerance

import fa4
from fa4 import build_info, reference
from fa4.reference_fp8 import attention_fp8_ref, dequantize, quantize

pytestmark = pytest.mark.gpu

HDIMS = build_info.instance_dims("sm90", "fwd", "e4m3")


@pytest.fixture(autouse=True)
def _needs_sm90_e4m3():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device: the FP8 forward kernel is SM90's")
    if not HDIMS:
        pytest.skip(
            f"no sm90 e4m3 forward instance in this build: {build_info.CONFIG.get('reason')}"
        )


def _inputs(b, s_q, s_k, h, h_kv, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s_q, h, d, device="cuda", generator=g)
    k = torch.randn(b, s_k, h_kv, d, device="cuda", generator=g)
    v = torch.randn(b, s_k, h_kv, d, device="cuda", generator=g) * 2.0
    q[..., :: max(1, d // 4)] *= 30.0  # outlier channels
    k[..., 1 :: max(1, d // 4)] *= 30.0
    (q8, qd), (k8, kd), (v8, vd) = (quantize(x, h_kv) for x in (q, k, v))
    return q8, k8, v8, {"q_descale": qd, "k_descale": kd, "v_descale": vd}


def _expected(q8, k8, v8, ds, **kw):
    """(ref, ref_lse, emu, lse baseline) of one dense batch, fp32."""
    ref, ref_lse = attention_fp8_ref(q8, k8, v8, *ds.values(), out_dtype=torch.float32, **kw)
    emu, _ = attention_fp8_ref(
        q8, k8, v8, *ds.values(), out_dtype=torch.float32, emulate_p=True, **kw
    )
    h_kv = k8.shape[2]
    deq = [
        dequantize(x, d, h_kv).to(torch.bfloat16)
        for x, d in zip((q8, k8, v8), ds.values(), strict=True)
    ]
    _, pt_lse = reference.attention_ref(*deq, upcast=False, **kw)
    return ref, ref_lse, emu, pt_lse.float()


def _check(out, lse, exp):
    ref, ref_lse, emu, pt_lse = exp
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert_tolerance("out", out.float(), ref, emu, torch.bfloat16)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


CASES = [
    # (b, s_q, s_k, h, h_kv, kwargs)
    (2, 1, 1, 4, 4, {}),
    (1, 1, 1000, 8, 2, {}),
    (2, 127, 127, 4, 4, {"causal": True}),
    (2, 127, 1000, 8, 1, {}),
    (1, 1000, 1000, 8, 2, {"causal": True}),
    (1, 1000, 127, 4, 2, {"causal": True}),  # rows that see no key: out 0, lse -inf
    (2, 300, 1000, 4, 4, {"softcap": 30.0}),
    (1, 512, 1000, 8, 2, {"causal": True, "softcap": 15.0}),
    (2, 257, 700, 4, 2, {"window_size": (100, 20)}),
    (1, 256, 1024, 4, 2, {"causal": True}),  # key counts whole blocks: no partial chunk
    (2, 128, 256, 4, 4, {}),
]


@pytest.mark.parametrize("hdims", HDIMS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_dense(hdims, case):
    b, s_q, s_k, h, h_kv, kw = CASES[case]
    q8, k8, v8, ds = _inputs(b, s_q, s_k, h, h_kv, hdims[0], seed=1000 * case + hdims[0])
    poison()
    out, lse = fa4.attention(q8, k8, v8, return_lse=True, backend="sm90", **ds, **kw)
    assert out.shape == (b, s_q, h, hdims[1]) and lse.shape == (b, h, s_q)
    _check(out, lse, _expected(q8, k8, v8, ds, **kw))


@pytest.mark.parametrize("hdims", HDIMS)
def test_no_descales_and_auto(hdims):
    """None descales mean 1, and backend="auto" takes the same kernel (bitwise equal). The
    inputs are e4m3 values of unit scale: the per-head-quantized ones of _inputs read with
    descale 1 would give scores of ~1e5 (entries up to 448), where no two fp32 orders of
    summation give the same softmax (on an H200, 2026-12-07: the emulated baseline itself 5.1
    from the reference)."""
    d = hdims[0]
    g = torch.Generator(device="cuda").manual_seed(d + 7)
    q8, k8, v8 = (
        torch.randn(2, n, h, d, device="cuda", generator=g).to(torch.float8_e4m3fn)
        for n, h in ((200, 4), (333, 2), (333, 2))
    )
    poison()
    out, lse = fa4.attention(q8, k8, v8, return_lse=True, backend="sm90")
    ones = {n: None for n in ("q_descale", "k_descale", "v_descale")}
    _check(out, lse, _expected(q8, k8, v8, ones))
    poison()
    assert torch.equal(fa4.attention(q8, k8, v8, backend="auto"), out)


@pytest.mark.parametrize("hdims", HDIMS)
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"causal": True, "softcap": 20.0}])
def test_varlen(hdims, kw):
    """Uneven packed sequences (one of length 1, one of 1000, one empty) with (num sequences,
    kv heads) descales: each sequence against its dense expectation."""
    d, h, h_kv = hdims[0], 8, 2
    lens_q, lens_k = [1, 127, 0, 1000, 33], [1, 1000, 5, 1000, 127]
    seqs = [_inputs(1, sq, sk, h, h_kv, d, seed=i + d)
            for i, (sq, sk) in enumerate(zip(lens_q, lens_k, strict=True))]  # fmt: skip
    q8, k8, v8 = (torch.cat([s[i][0] for s in seqs]) for i in range(3))
    ds = {n: torch.cat([s[3][n] for s in seqs]) for n in seqs[0][3]}
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    poison()
    out, lse = fa4.attention_varlen(q8, k8, v8, cu_q, cu_k, max(lens_q), max(lens_k),
                                    return_lse=True, backend="sm90", **ds, **kw)  # fmt: skip
    assert out.dtype == torch.bfloat16 and lse.shape == (h, sum(lens_q))
    for i, s in enumerate(seqs):
        lo, hi = int(cu_q[i]), int(cu_q[i + 1])
        if hi == lo:
            continue
        exp = [x[0] for x in _expected(*s, **kw)]  # (s, h, d), (h, s)
        _check(out[lo:hi], lse[:, lo:hi], exp)


@pytest.mark.parametrize("hdims", HDIMS)
def test_padded_head_dim_and_strided_v(hdims):
    """A head dim 32 below the instance's (the covering instance zero-fills the rest, Note
    [padded head dims]) with K and V as slices of one packed KV tensor, so the Vᵀ pass reads V
    through its own row stride."""
    d = hdims[0] - 32
    b, s_q, s_k, h, h_kv = 2, 200, 777, 4, 2
    q8, k8, v8, ds = _inputs(b, s_q, s_k, h, h_kv, d, seed=d + 11)
    kv = torch.stack([k8.view(torch.uint8), v8.view(torch.uint8)], dim=2).view(k8.dtype)
    k_s, v_s = kv[:, :, 0], kv[:, :, 1]
    assert not v_s.is_contiguous()
    poison()
    out, lse = fa4.attention(q8, k_s, v_s, return_lse=True, backend="sm90", causal=True, **ds)
    assert out.shape == (b, s_q, h, d)
    _check(out, lse, _expected(q8, k8, v8, ds, causal=True))
