"""fa4.flash_attn_interface: flash-attn 2's functions on fa4, on CPU tensors.

Each function is checked against fa4's own API (the same computation: results must be equal)
and, for flash-attn's semantics (None windows, causal clipping the right window, negative softcap
off, interleaved rotary by default), against an independent float64 formula. Signatures are
compared with flash-attn 2's flash_attn/flash_attn_interface.py, as read at commit 00530025."""

import inspect
import math

import pytest
import torch
from helpers import naive_attention

import fa4
from fa4 import flash_attn_interface as fai

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # auto -> reference on CPU


def rnd(*shape, dtype=F32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(requires_grad)


def naive(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """Dense float64 attention, flash-attn's documented semantics: q (b, s_q, h, d), k/v (b, n,
    h_kv, ·); row i sees keys [i + n - s_q - left, i + n - s_q + right], right = 0 if causal.
    helpers.naive_attention per batch entry."""
    kw = dict(causal=causal, window=window, softcap=softcap, scale=scale)
    outs = [naive_attention(q[i], k[i], v[i], **kw) for i in range(q.shape[0])]
    return torch.stack([o for o, _ in outs]), torch.stack([lse for _, lse in outs])


def qkv(b=2, s_q=6, s_k=9, h=4, h_kv=2, d=64, dtype=F32, requires_grad=False):
    return (
        rnd(b, s_q, h, d, dtype=dtype, seed=1, requires_grad=requires_grad),
        rnd(b, s_k, h_kv, d, dtype=dtype, seed=2, requires_grad=requires_grad),
        rnd(b, s_k, h_kv, d, dtype=dtype, seed=3, requires_grad=requires_grad),
    )


# ---- signatures: flash-attn 2's, positional order and defaults ----------------------------

REQ = "<required>"
FA2_SIGNATURES = {
    "flash_attn_func": [
        ("q", REQ), ("k", REQ), ("v", REQ), ("dropout_p", 0.0), ("softmax_scale", None),
        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
        ("deterministic", False), ("return_attn_probs", False),
    ],
    "flash_attn_varlen_func": [
        ("q", REQ), ("k", REQ), ("v", REQ), ("cu_seqlens_q", REQ), ("cu_seqlens_k", REQ),
        ("max_seqlen_q", REQ), ("max_seqlen_k", REQ), ("dropout_p", 0.0),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
        ("return_attn_probs", False), ("block_table", None),
    ],
    "flash_attn_with_kvcache": [
        ("q", REQ), ("k_cache", REQ), ("v_cache", REQ), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
        ("num_splits", 0), ("return_softmax_lse", False),
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FA2_SIGNATURES))
def test_signature_is_flash_attn_2s(name):
    params = list(inspect.signature(getattr(fai, name)).parameters.values())
    got = [(p.name, REQ if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == FA2_SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert set(fai.__all__) == set(FA2_SIGNATURES)


# ---- flash_attn_func ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize(
    "kw, fa4_kw",
    [
        ({}, {}),
        ({"causal": True}, {"causal": True}),
        ({"softmax_scale": 0.3}, {"softmax_scale": 0.3}),
        ({"softcap": 2.5}, {"softcap": 2.5}),
        ({"window_size": (3, 1)}, {"window_size": (3, 1)}),
        ({"window_size": (None, 2)}, {"window_size": (-1, 2)}),
        ({"window_size": (4, None)}, {"window_size": (4, -1)}),
        ({"window_size": (None, None)}, {}),
        ({"causal": True, "window_size": (2, 3)}, {"causal": True, "window_size": (2, 0)}),
        ({"causal": True, "window_size": (None, 5)}, {"causal": True}),
        ({"window_size": (9, 100)}, {}),  # entries >= seqlen_k: unbounded (flash-attn: -1)
        ({"softcap": -1.0}, {}),  # flash-attn: softcap <= 0 is off
        ({"deterministic": True}, {"deterministic": True}),
    ],
)
def test_func_matches_fa4(dtype, kw, fa4_kw):
    q, k, v = qkv(dtype=dtype)
    out = fai.flash_attn_func(q, k, v, **kw)
    ref, _ = fa4.attention(q, k, v, return_lse=True, backend="reference", **fa4_kw)
    assert out.dtype == dtype and out.shape == (2, 6, 4, 64)
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    "kw, naive_kw",
    [
        ({"causal": True, "window_size": (2, 3)}, {"causal": True, "window": (2, -1)}),
        ({"window_size": (None, 1)}, {"window": (-1, 1)}),
        ({"window_size": (3, None), "softcap": 1.5}, {"window": (3, -1), "softcap": 1.5}),
        ({"softcap": -3.0, "softmax_scale": 0.2}, {"scale": 0.2}),
        ({"window_size": (1, 0)}, {"window": (1, 0)}),
    ],
)
def test_func_flash_attn_semantics(kw, naive_kw):
    q, k, v = qkv()
    out, lse, s_dmask = fai.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    ref, ref_lse = naive(q, k, v, **naive_kw)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=2e-5)
    assert s_dmask.shape == (0,)


def test_func_positional_call_and_return_conventions():
    q, k, v = qkv(dtype=BF16)
    # flash-attn 2's positional order: dropout_p, softmax_scale, causal, window_size, softcap
    res = fai.flash_attn_func(q, k, v, 0.0, 0.25, True, (4, -1), 0.0, None, False, True)
    ref, ref_lse = fa4.attention(
        q, k, v, causal=True, softmax_scale=0.25, window_size=(4, 0), return_lse=True,
        backend="reference",
    )  # fmt: skip
    assert isinstance(res, tuple) and len(res) == 3
    out, lse, s_dmask = res
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert lse.dtype == F32 and lse.shape == (2, 4, 6)  # (batch, nheads, seqlen_q)
    # flash-attn 2 with dropout_p == 0: S_dmask = torch.empty((0,), dtype=q.dtype)
    assert s_dmask.shape == (0,) and s_dmask.dtype == BF16 and s_dmask.device == q.device
    assert isinstance(fai.flash_attn_func(q, k, v), torch.Tensor)
    assert isinstance(fai.flash_attn_func(q, k, v, dropout_p=0), torch.Tensor)  # int 0 is 0.0


@pytest.mark.parametrize("deterministic", [False, True])
def test_func_backward_matches_fa4(deterministic):
    q, k, v = qkv(requires_grad=True)
    dout = rnd(2, 6, 4, 64, seed=9)
    out = fai.flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = fa4.attention(q, k, v, causal=True, deterministic=deterministic, backend="reference")
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.equal(g, r)


def test_arguments_reach_fa4(monkeypatch):
    """deterministic, softmax_scale and the window go to fa4.attention as flash-attn means them."""
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(kw)
        return fa4.attention(q, k, v, **kw)

    monkeypatch.setattr(fai, "attention", spy)
    q, k, v = qkv()
    fai.flash_attn_func(q, k, v, softmax_scale=0.5, causal=True, window_size=(None, 7),
                        deterministic=True)  # fmt: skip
    assert seen["deterministic"] is True and seen["softmax_scale"] == 0.5
    assert seen["window_size"] == (None, 7) and seen["causal"] is True and seen["softcap"] == 0.0
    fai.flash_attn_func(q, k, v, window_size=(-98, None), softcap=-1)  # fa4 takes flash-attn's
    assert seen["window_size"] == (-98, None) and seen["softcap"] == 0.0
    fai.flash_attn_func(q, k, v, window_size=(9, -3))  # s_k = 9: left unbounded, right kept
    assert seen["window_size"] == (None, -3)


# ---- flash_attn_varlen_func -----------------------------------------------------------------


def cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=I32)


def varlen_inputs(dtype=F32, requires_grad=False, lens_q=(3, 0, 5), lens_k=(4, 2, 7)):
    tq, tk = sum(lens_q), sum(lens_k)
    q = rnd(tq, 4, 64, dtype=dtype, seed=4, requires_grad=requires_grad)
    k = rnd(tk, 2, 64, dtype=dtype, seed=5, requires_grad=requires_grad)
    v = rnd(tk, 2, 64, dtype=dtype, seed=6, requires_grad=requires_grad)
    return q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize(
    "kw, fa4_kw",
    [
        ({}, {}),
        ({"causal": True}, {"causal": True}),
        ({"causal": True, "window_size": (1, 4)}, {"causal": True, "window_size": (1, 0)}),
        ({"window_size": (None, 1), "softcap": 3.0}, {"window_size": (-1, 1), "softcap": 3.0}),
        ({"softmax_scale": 0.2, "softcap": -0.5}, {"softmax_scale": 0.2}),
        ({"deterministic": True}, {"deterministic": True}),
    ],
)
def test_varlen_matches_fa4(dtype, kw, fa4_kw):
    q, k, v, cq, ck, mq, mk = varlen_inputs(dtype)
    out, lse, s_dmask = fai.flash_attn_varlen_func(
        q, k, v, cq, ck, mq, mk, return_attn_probs=True, **kw
    )
    ref, ref_lse = fa4.attention_varlen(
        q, k, v, cq, ck, mq, mk, return_lse=True, backend="reference", **fa4_kw
    )
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert lse.shape == (4, 8) and s_dmask.shape == (0,) and s_dmask.dtype == dtype
    plain = fai.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, **kw)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, ref)


def test_varlen_semantics_per_sequence():
    """Each packed sequence is flash_attn_func on that sequence alone (bottom-right masks)."""
    q, k, v, cq, ck, mq, mk = varlen_inputs()
    out = fai.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=True, window_size=(2, 9))
    for i in range(3):
        sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if cq[i + 1] == cq[i]:
            continue
        ref, _ = naive(q[None, sq], k[None, sk], v[None, sk], causal=True, window=(2, -1))
        torch.testing.assert_close(out[sq].double(), ref[0], atol=2e-5, rtol=2e-5)


def test_varlen_backward_matches_fa4():
    q, k, v, cq, ck, mq, mk = varlen_inputs(requires_grad=True)
    dout = rnd(*q.shape, seed=8)
    out = fai.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=True, deterministic=True)
    ref = fa4.attention_varlen(q, k, v, cq, ck, mq, mk, causal=True, backend="reference")
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for g, r in zip(grads, torch.autograd.grad(ref, (q, k, v), dout), strict=True):
        assert torch.equal(g, r)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_varlen_block_table_is_paged_kv(dtype):
    """block_table: k/v are page pools, cu_seqlens_k gives the key counts (flash-attn 2)."""
    q, k, v, cq, ck, mq, mk = varlen_inputs(dtype)
    lens_k, page, max_pages = [4, 2, 7], 3, 3
    num_pages = 12
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(0))
    block_table = perm[: 3 * max_pages].view(3, max_pages).to(I32).contiguous()
    pool_k = rnd(num_pages, page, 2, 64, dtype=dtype, seed=11)
    pool_v = rnd(num_pages, page, 2, 64, dtype=dtype, seed=12)
    for i, n in enumerate(lens_k):  # the same keys as k/v, written page by page
        for j in range(n):
            p, r = int(block_table[i, j // page]), j % page
            pool_k[p, r], pool_v[p, r] = k[ck[i] + j], v[ck[i] + j]
    with torch.no_grad():
        out, lse, _ = fai.flash_attn_varlen_func(
            q, pool_k, pool_v, cq, ck, mq, mk, causal=True, return_attn_probs=True,
            block_table=block_table,
        )  # fmt: skip
        ref, ref_lse = fa4.attention_varlen(
            q, k, v, cq, ck, mq, mk, causal=True, return_lse=True, backend="reference"
        )
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=0)


# ---- flash_attn_with_kvcache ----------------------------------------------------------------


def rotate(x, cos, sin, pos, interleaved):
    """x (s, h, d) rotated at positions pos (s,) over the first 2 * cos.shape[1] dims."""
    rd = 2 * cos.shape[1]
    c, s_ = cos[pos].double()[:, None], sin[pos].double()[:, None]
    xr, rest = x[..., :rd].double(), x[..., rd:].double()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        y = torch.stack([x1 * c - x2 * s_, x1 * s_ + x2 * c], -1).flatten(-2)
    else:
        x1, x2 = xr.chunk(2, -1)
        y = torch.cat([x1 * c - x2 * s_, x1 * s_ + x2 * c], -1)
    return torch.cat([y, rest], -1)


def cache_inputs(dtype=F32, b=2, s_cache=16, s_new=2, s_q=2):
    q = rnd(b, s_q, 4, 64, dtype=dtype, seed=21)
    k_cache = rnd(b, s_cache, 2, 64, dtype=dtype, seed=22)
    v_cache = rnd(b, s_cache, 2, 64, dtype=dtype, seed=23)
    k_new = rnd(b, s_new, 2, 64, dtype=dtype, seed=24)
    v_new = rnd(b, s_new, 2, 64, dtype=dtype, seed=25)
    ang = torch.arange(s_cache)[:, None] * 0.1 * torch.arange(1, 17)[None, :]  # rotary_dim 32
    return q, k_cache, v_cache, k_new, v_new, ang.cos().to(dtype), ang.sin().to(dtype)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"causal": True},
        {"causal": True, "window_size": (3, 2)},
        {"window_size": (None, 1), "softcap": 2.0, "softmax_scale": 0.3},
        {"num_splits": 3},
    ],
)
def test_kvcache_append_rotary_matches_fa4(dtype, kw):
    """k/v appended in place, rotary with flash-attn's interleaved default, out and lse as fa4's
    attention_with_kvcache(rotary_interleaved=True)."""
    q, kc, vc, kn, vn, cos, sin = cache_inputs(dtype)
    seqlens = torch.tensor([5, 9], dtype=I32)
    kc2, vc2 = kc.clone(), vc.clone()
    with torch.no_grad():
        out, lse = fai.flash_attn_with_kvcache(
            q, kc, vc, kn, vn, cos, sin, seqlens, return_softmax_lse=True, **kw
        )
        fa4_kw = dict(kw)
        if kw.get("causal") and "window_size" in kw:
            fa4_kw["window_size"] = (kw["window_size"][0], 0)
        if kw.get("window_size", (0, 0))[0] is None:
            fa4_kw["window_size"] = (-1, kw["window_size"][1])
        ref, ref_lse = fa4.attention_with_kvcache(
            q, kc2, vc2, seqlens, k_new=kn, v_new=vn, rotary_cos=cos, rotary_sin=sin,
            rotary_interleaved=True, return_lse=True, backend="reference", **fa4_kw,
        )  # fmt: skip
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert lse.shape == (2, 4, 2) and lse.dtype == F32


def test_kvcache_rotary_default_is_interleaved():
    """The appended keys are rotated with interleaved pairs (2i, 2i + 1) at cache_seqlens + t."""
    q, kc, vc, kn, vn, cos, sin = cache_inputs()
    seqlens = torch.tensor([5, 9], dtype=I32)
    with torch.no_grad():
        fai.flash_attn_with_kvcache(q, kc, vc, kn, vn, cos, sin, seqlens, causal=True)
    for b in range(2):
        pos = torch.arange(2) + int(seqlens[b])
        written = kc[b, pos]
        torch.testing.assert_close(written.double(), rotate(kn[b], cos, sin, pos, True))
        assert not torch.allclose(written.double(), rotate(kn[b], cos, sin, pos, False))
        assert torch.equal(vc[b, pos], vn[b])


def test_kvcache_semantics_against_naive():
    """Causal with a right window: flash-attn clips right to 0; keys [0, seqlens + s_new)."""
    q, kc, vc, kn, vn, cos, sin = cache_inputs()
    seqlens = torch.tensor([5, 9], dtype=I32)
    with torch.no_grad():
        out = fai.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True,
                                          window_size=(4, 3))  # fmt: skip
    for b in range(2):
        n = int(seqlens[b]) + 2
        ref, _ = naive(q[b : b + 1], kc[b : b + 1, :n], vc[b : b + 1, :n], causal=True,
                       window=(4, -1))  # fmt: skip
        torch.testing.assert_close(out[b].double(), ref[0], atol=2e-5, rtol=2e-5)


def test_kvcache_window_beyond_cache_is_unbounded():
    """flash-attn sets a window entry >= the cache length to -1, so such a window is not local
    and q is rotated at cache_seqlens for every row (as with no window)."""
    q, kc, vc, kn, vn, cos, sin = cache_inputs()
    seqlens = torch.tensor([5, 9], dtype=I32)
    outs = []
    for window in [(-1, 16), (-1, -1), (-1, 15)]:
        kc2, vc2 = kc.clone(), vc.clone()
        with torch.no_grad():
            outs.append(fai.flash_attn_with_kvcache(q, kc2, vc2, kn, vn, cos, sin, seqlens,
                                                    window_size=window))  # fmt: skip
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[2], outs[1])  # a real window: q rotated per row


def test_kvcache_int_and_none_cache_seqlens():
    q, kc, vc, _, _, _, _ = cache_inputs()
    with torch.no_grad():
        full = fai.flash_attn_with_kvcache(q, kc, vc)  # None: every row of the cache
        as_int = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=16)
        six = fai.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=6)
    ref = fa4.attention(q, kc, vc, backend="reference")
    assert torch.equal(full, ref) and torch.equal(as_int, ref)
    torch.testing.assert_close(six, fa4.attention(q, kc[:, :6], vc[:, :6], backend="reference"))
    with pytest.raises(ValueError, match="cache_seqlens: required when k/v are given"):
        fai.flash_attn_with_kvcache(q, kc, vc, kc[:, :1], vc[:, :1])


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_kvcache_paged_batch_idx_leftpad(dtype):
    """block_table, cache_batch_idx and cache_leftpad pass through to fa4 unchanged."""
    q, _, _, kn, vn, cos, sin = cache_inputs(dtype)
    page, max_pages, num_pages = 4, 4, 20
    pool_k = rnd(num_pages, page, 2, 64, dtype=dtype, seed=31)
    pool_v = rnd(num_pages, page, 2, 64, dtype=dtype, seed=32)
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(3))
    block_table = perm[:12].view(3, max_pages).to(I32).contiguous()  # 3 cache rows
    batch_idx = torch.tensor([2, 0], dtype=I32)
    seqlens = torch.tensor([7, 3], dtype=I32)
    leftpad = torch.tensor([2, 1], dtype=I32)
    pk2, pv2 = pool_k.clone(), pool_v.clone()
    with torch.no_grad():
        out, lse = fai.flash_attn_with_kvcache(
            q, pool_k, pool_v, kn, vn, cos, sin, seqlens, batch_idx, leftpad, block_table,
            causal=True, return_softmax_lse=True,
        )  # fmt: skip
        ref, ref_lse = fa4.attention_with_kvcache(
            q, pk2, pv2, seqlens, k_new=kn, v_new=vn, rotary_cos=cos, rotary_sin=sin,
            rotary_interleaved=True, cache_batch_idx=batch_idx, cache_leftpad=leftpad,
            page_table=block_table, causal=True, return_lse=True, backend="reference",
        )  # fmt: skip
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert torch.equal(pool_k, pk2) and torch.equal(pool_v, pv2)
    with torch.no_grad():  # None cache_seqlens with a block table: max_pages * page_size keys
        full = fai.flash_attn_with_kvcache(q, pool_k, pool_v, block_table=block_table[:2])
        ref_full = fa4.attention_with_kvcache(q, pool_k, pool_v, 16, page_table=block_table[:2],
                                              backend="reference")  # fmt: skip
    assert torch.equal(full, ref_full)


def test_kvcache_arguments_reach_fa4(monkeypatch):
    """flash-attn's names and defaults become fa4's: k/v -> k_new/v_new, block_table ->
    page_table, rotary_interleaved True, num_splits, return_softmax_lse -> return_lse."""
    seen = {}

    def spy(q, k_cache, v_cache, cache_seqlens, **kw):
        seen.update(kw, cache_seqlens=cache_seqlens)
        return "sentinel"

    monkeypatch.setattr(fai, "attention_with_kvcache", spy)
    q, kc, vc, kn, vn, cos, sin = cache_inputs()
    bt = torch.zeros(2, 4, dtype=I32)
    res = fai.flash_attn_with_kvcache(
        q,
        kc,
        vc,
        kn,
        vn,
        cos,
        sin,
        3,
        block_table=bt,
        num_splits=5,
        return_softmax_lse=True,
        softcap=-2.0,
    )
    assert res == "sentinel"
    assert seen["k_new"] is kn and seen["v_new"] is vn and seen["page_table"] is bt
    assert seen["rotary_cos"] is cos and seen["rotary_sin"] is sin
    assert seen["rotary_interleaved"] is True and seen["num_splits"] == 5
    assert seen["return_lse"] is True and seen["softcap"] == 0.0 and seen["cache_seqlens"] == 3
    fai.flash_attn_with_kvcache(q, kc, vc, rotary_interleaved=False, cache_seqlens=2)
    assert seen["rotary_interleaved"] is False and seen["return_lse"] is False


# ---- what raises ----------------------------------------------------------------------------


def _calls():
    q, k, v = qkv()
    vq, vk, vv, cq, ck, mq, mk = varlen_inputs()
    cq_, kc, vc, _, _, _, _ = cache_inputs()
    return {
        "func": lambda **kw: fai.flash_attn_func(q, k, v, **kw),
        "varlen": lambda **kw: fai.flash_attn_varlen_func(vq, vk, vv, cq, ck, mq, mk, **kw),
        "kvcache": lambda **kw: fai.flash_attn_with_kvcache(cq_, kc, vc, cache_seqlens=8, **kw),
    }


@pytest.mark.parametrize("fn", ["func", "varlen"])
@pytest.mark.parametrize("p", [0.1, 1e-6])
def test_dropout_raises(fn, p):
    with pytest.raises(NotImplementedError, match=rf"dropout_p={p!r} is not supported"):
        _calls()[fn](dropout_p=p)


def test_dropout_type_error():
    with pytest.raises(TypeError, match="dropout_p: expected float"):
        _calls()["func"](dropout_p="0")


@pytest.mark.parametrize("fn", ["func", "varlen", "kvcache"])
def test_alibi_raises(fn):
    with pytest.raises(NotImplementedError, match="alibi_slopes=.* fa4 has no ALiBi"):
        _calls()[fn](alibi_slopes=torch.ones(4))


@pytest.mark.parametrize(
    "window, causal, naive_window",
    [
        ((-2, None), False, (-2, -1)),  # shifted: keys from 2 past the diagonal on
        ((None, -2), False, (-1, -2)),  # keys up to 2 before the diagonal
        ((3, -2), False, (3, -2)),
        ((-2, -1), False, (-1, -1)),  # two negative entries: no window (every flash-attn)
        ((-3, -5), True, (-1, 0)),  # ... and causal then sets right = 0
        ((-3, 1), False, (-3, 1)),  # left + right < 0: no row sees a key
        ((-2, 5), True, (-2, 0)),  # causal clips right to 0: empty as well
    ],
)
def test_negative_windows(window, causal, naive_window):
    """flash-attn-4's shifted windows, through the flash-attn module and fa4.attention alike."""
    q, k, v = qkv()
    out, lse, _ = fai.flash_attn_func(
        q, k, v, causal=causal, window_size=window, return_attn_probs=True
    )
    ref, ref_lse = naive(q, k, v, causal=causal, window=naive_window)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=2e-5)
    own = fa4.attention(q, k, v, causal=causal, window_size=window, backend="reference")
    assert torch.equal(out, own)


def test_fa4_validation_still_applies():
    """What flash-attn also rejects keeps fa4's own error (naming the argument)."""
    calls = _calls()
    with pytest.raises(ValueError, match="softcap"):
        calls["func"](softcap=math.inf)
    with pytest.raises(TypeError, match="window_size"):
        calls["func"](window_size=(1.5, -1))
    with pytest.raises(TypeError, match="window_size"):
        calls["varlen"](window_size=3)
