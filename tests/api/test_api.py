"""fa4.attention / attention_varlen on CPU tensors: results, autograd, torch.compile, op checks."""

import pytest
import torch
from helpers import assert_tolerance, naive_attention, randn

import fa4
from fa4 import _ops, reference


def naive(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """Independent float64 attention that materializes every score (small shapes only):
    helpers.naive_attention per batch entry; out (b, s_q, h, d_v), lse (b, h, s_q)."""
    kw = dict(causal=causal, window=window, softcap=softcap, scale=scale)
    outs = [naive_attention(q[i], k[i], v[i], **kw) for i in range(q.shape[0])]
    return torch.stack([o for o, _ in outs]), torch.stack([lse for _, lse in outs])


CASES = [
    # (b, s_q, s_k, h, h_kv, d, d_v, kwargs)
    (2, 17, 17, 4, 4, 64, 64, {}),
    (1, 1, 1, 1, 1, 128, 128, {"causal": True}),
    (2, 113, 257, 4, 2, 128, 128, {"causal": True}),
    (2, 257, 113, 4, 1, 64, 64, {"causal": True}),  # rows with no key: out 0, lse -inf
    (1, 100, 100, 2, 2, 96, 96, {"window_size": (7, 3)}),
    (1, 64, 130, 2, 2, 192, 128, {"softcap": 5.0}),
    (3, 33, 65, 6, 3, 256, 256, {"window_size": (16, -1), "softcap": 2.0}),
    (1, 40, 40, 2, 1, 64, 64, {"causal": True, "window_size": (5, 0), "softmax_scale": 0.3}),
    # flash-attn's window rules: shifted windows (negative entries), causal clipping the right
    (1, 100, 100, 2, 2, 64, 64, {"window_size": (-20, None)}),
    (2, 70, 90, 4, 2, 128, 128, {"window_size": (40, -10)}),
    (1, 50, 50, 2, 1, 64, 64, {"causal": True, "window_size": (10, 10)}),
    # Note [padded head dims]: any multiple of 8 up to 256, d and d_v independent
    (1, 50, 70, 2, 1, 80, 80, {}),
    (2, 40, 40, 2, 2, 128, 64, {"causal": True}),
    (1, 33, 33, 2, 1, 8, 8, {}),
    (1, 33, 47, 4, 2, 40, 256, {"window_size": (10, 5)}),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_matches_reference(case, dtype):
    b, s_q, s_k, h, h_kv, d, d_v, kw = CASES[case]
    g = torch.Generator().manual_seed(1000 * case + (dtype == torch.float16))
    q, k = (
        randn(b, s_q, h, d, dtype=dtype, generator=g),
        randn(b, s_k, h_kv, d, dtype=dtype, generator=g),
    )
    v = randn(b, s_k, h_kv, d_v, dtype=dtype, generator=g)
    out, lse = fa4.attention(q, k, v, return_lse=True, **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == (b, s_q, h, d_v) and lse.shape == (b, h, s_q)
    mask_kw = {"causal": kw.get("causal", False), "window": kw.get("window_size", (-1, -1))}
    ref, ref_lse = naive(
        q, k, v, softcap=kw.get("softcap", 0.0), scale=kw.get("softmax_scale"), **mask_kw
    )
    pt, pt_lse = reference.attention_ref(q, k, v, upcast=False, **kw)
    assert_tolerance("out", out, ref, pt, dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def test_empty_rows_are_zero_with_lse_minus_inf():
    q, k, v = randn(1, 9, 2, 64), randn(1, 4, 2, 64), randn(1, 4, 2, 64)
    out, lse = fa4.attention(q, k, v, causal=True, return_lse=True)
    # bottom-right alignment: rows 0..4 see no key (row i sees keys j <= i - 5)
    assert torch.equal(out[:, :5], torch.zeros_like(out[:, :5]))
    assert torch.isneginf(lse[..., :5]).all() and torch.isfinite(lse[..., 5:]).all()


def test_reference_is_memory_bounded_at_16k():
    """seqlen 16k on a CPU: blocks of SCORE_BUDGET scores, and sampled rows are exact."""
    s, d = 16384, 64
    assert reference._block_rows(1, 1, s) * s <= reference.SCORE_BUDGET
    g = torch.Generator().manual_seed(7)
    q, k, v = (randn(1, s, 1, d, dtype=torch.bfloat16, generator=g) for _ in range(3))
    out, lse = fa4.attention(q, k, v, causal=True, return_lse=True)
    for r in (0, 1, 4095, 8192, s - 1):  # causal row r sees exactly keys 0..r
        row_out, row_lse = naive(q[:, r : r + 1], k[:, : r + 1], v[:, : r + 1])
        assert (out[0, r].double() - row_out[0, 0]).abs().max() < 1e-2
        assert abs(lse[0, 0, r].item() - row_lse[0, 0, 0].item()) < 1e-4


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"causal": True, "softcap": 1.5},
        {"window_size": (3, 2)},
        {"causal": True, "window_size": (4, 0)},
    ],
)
def test_gradcheck_float64(kw):
    g = torch.Generator().manual_seed(3)
    q = randn(2, 6, 2, 64, dtype=torch.float64, requires_grad=True, generator=g)
    k = randn(2, 7, 1, 64, dtype=torch.float64, requires_grad=True, generator=g)
    v = randn(2, 7, 1, 64, dtype=torch.float64, requires_grad=True, generator=g)
    f = lambda q, k, v: fa4.attention(q, k, v, return_lse=True, **kw)  # noqa: E731
    # fast_mode checks random projections of the Jacobian (one column per input, not all 2.5k)
    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)


@pytest.mark.parametrize("window", [(-2, None), (5, -2), (-3, 1)])
def test_gradcheck_shifted_windows_float64(window):
    """Shifted windows leave rows with no key (out 0): the gradient of out, not of lse = -inf."""
    g = torch.Generator().manual_seed(6)
    q = randn(1, 6, 2, 64, dtype=torch.float64, requires_grad=True, generator=g)
    k = randn(1, 7, 1, 64, dtype=torch.float64, requires_grad=True, generator=g)
    v = randn(1, 7, 1, 64, dtype=torch.float64, requires_grad=True, generator=g)
    f = lambda q, k, v: fa4.attention(q, k, v, window_size=window)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)


def test_gradcheck_varlen_float64():
    cu_q = torch.tensor([0, 5, 5, 11], dtype=torch.int32)  # every query row sees a key
    cu_k = torch.tensor([0, 7, 10, 16], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    q = randn(11, 4, 64, dtype=torch.float64, requires_grad=True, generator=g)
    k = randn(16, 2, 64, dtype=torch.float64, requires_grad=True, generator=g)
    v = randn(16, 2, 64, dtype=torch.float64, requires_grad=True, generator=g)
    used = torch.tensor([6, 3, 6], dtype=torch.int32)

    def f(q, k, v):
        return fa4.attention_varlen(
            q, k, v, cu_q, cu_k, 7, 6, seqused_k=used, causal=True, return_lse=True
        )

    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)


def test_backward_matches_autograd_of_naive():
    g = torch.Generator().manual_seed(5)
    q, k, v = (
        randn(2, 37, 4, 128, dtype=torch.bfloat16, generator=g, requires_grad=True)
        for _ in range(3)
    )
    dout = randn(2, 37, 4, 128, dtype=torch.bfloat16, generator=g)
    fa4.attention(q, k, v, causal=True).backward(dout)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    naive(*leaves, causal=True)[0].backward(dout.double())
    pt = [x.detach().requires_grad_() for x in (q, k, v)]
    reference.attention_ref(*pt, causal=True, upcast=False)[0].backward(dout)
    for name, x, ref, low in zip("qkv", (q, k, v), leaves, pt, strict=True):
        assert_tolerance(f"d{name}", x.grad, ref.grad, low.grad, torch.bfloat16)


def test_lse_gradient_flows():
    """A loss on the LSE alone: its gradient (dlse through D) matches float64 autograd."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (
        randn(1, 12, 2, 64, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)
    )
    _, lse = fa4.attention(q, k, v, return_lse=True)
    (lse * torch.arange(12.0, dtype=torch.float64)).sum().backward()
    q2, k2 = (x.detach().requires_grad_() for x in (q, k))
    (naive(q2, k2, v.detach())[1] * torch.arange(12.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(q.grad, q2.grad)
    torch.testing.assert_close(k.grad, k2.grad)
    assert torch.count_nonzero(v.grad) == 0


def test_unused_lse_gets_no_materialized_gradient(monkeypatch):
    """The backward gets dlse=None when the LSE is unused (autograd would otherwise allocate and
    fill a zero tensor of LSE's size on every step, which the kernel's preprocess then reads),
    and a zero dout when only the LSE is."""
    seen = []
    real = _ops.bwd

    def spy(dout, q, k, v, out, lse, dlse, *rest):
        seen.append((bool(dout.any()), dlse))
        return real(dout, q, k, v, out, lse, dlse, *rest)

    monkeypatch.setattr(_ops, "bwd", spy)
    q, k, v = (randn(1, 9, 2, 64, requires_grad=True) for _ in range(3))
    fa4.attention(q, k, v).sum().backward()
    _, lse = fa4.attention(q, k, v, return_lse=True)
    lse.sum().backward()
    assert len(seen) == 2
    assert seen[0][0] and seen[0][1] is None
    assert not seen[1][0] and seen[1][1] is not None


def test_varlen_equals_dense_per_sequence():
    lens_q, lens_k = [5, 0, 17, 1], [9, 3, 17, 0]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    g = torch.Generator().manual_seed(8)
    q, k, v = (
        randn(23, 4, 64, generator=g),
        randn(29, 2, 64, generator=g),
        randn(29, 2, 64, generator=g),
    )
    out, lse = fa4.attention_varlen(q, k, v, cu_q, cu_k, 17, 17, causal=True, return_lse=True)
    assert lse.shape == (4, 23)
    for i in range(4):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if lens_q[i] == 0:
            continue
        if lens_k[i] == 0:
            assert (
                torch.equal(out[qs], torch.zeros_like(out[qs])) and torch.isneginf(lse[:, qs]).all()
            )
            continue
        seg_out, seg_lse = fa4.attention(
            q[None, qs], k[None, ks], v[None, ks], causal=True, return_lse=True
        )
        assert torch.equal(out[qs], seg_out[0]) and torch.equal(lse[:, qs], seg_lse[0])


def test_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(9)
    q, k, v = (randn(2, 33, 4, 64, generator=g, requires_grad=True) for _ in range(3))
    f = torch.compile(
        lambda q, k, v: fa4.attention(q, k, v, causal=True, return_lse=True), fullgraph=True
    )
    out, lse = f(q, k, v)
    eager, eager_lse = fa4.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)
    out.float().square().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()


def test_torch_compile_varlen():
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (randn(12, 2, 64) for _ in range(3))
    f = torch.compile(lambda q, k, v: fa4.attention_varlen(q, k, v, cu, cu, 7, 7), fullgraph=True)
    assert torch.equal(f(q, k, v), fa4.attention_varlen(q, k, v, cu, cu, 7, 7))


@pytest.mark.parametrize("varlen", [False, True])
def test_opcheck(varlen):
    if varlen:
        cu = torch.tensor([0, 3, 8], dtype=torch.int32)
        q, k, v = (randn(8, 2, 64, requires_grad=True) for _ in range(3))
        extra = (cu, cu, None, 5, 5)
    else:
        q, k, v = (randn(2, 8, 2, 64, requires_grad=True) for _ in range(3))
        extra = (None, None, None, 0, 0)
    args = (q, k, v, *extra, True, 0.125, -1, 0, 0.0, False, "reference")
    torch.library.opcheck(_ops.fwd, args)


def test_deterministic_flag_accepted_and_reproducible():
    q, k, v = (randn(1, 20, 2, 64, requires_grad=True) for _ in range(3))
    grads = []
    for _ in range(2):
        for x in (q, k, v):
            x.grad = None
        fa4.attention(q, k, v, deterministic=True).sum().backward()
        grads.append([x.grad.clone() for x in (q, k, v)])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_build_info_summary_is_honest():
    from fa4 import build_info

    text = build_info.summary()
    assert text.startswith(f"fa4 {fa4.__version__}")
    if not build_info.CONFIG.get("built"):
        assert "not built" in text and build_info.CONFIG.get("reason")
        assert build_info.missing_kernel("sm90", "fwd", (128, 128)) is not None
