"""The inference API on CPU tensors (docs/inference.md): learnable sinks, seqused_q,
paged KV, the KV-cache form (cache_batch_idx, cache_leftpad), num_splits, their autograd and
every validation rule. Expected values come from naive(), an independent float64 formula with an
explicit sink column in the softmax and an explicit page-by-page gather."""

import math
import re
from pathlib import Path

import pytest
import torch
from helpers import assert_tolerance, randn
from helpers import naive_attention as naive

import fa4
from fa4 import _ops, dispatch, reference, value_checks

BF16 = torch.bfloat16
I32 = torch.int32


def gather(pool, pt_row, start, stop):
    """Keys [start, stop) of a sequence, page by page: key j is row j % page_size of page
    pt_row[j // page_size]."""
    ps = pool.shape[1]
    rows = [pool[int(pt_row[j // ps]), j % ps] for j in range(start, stop)]
    return torch.stack(rows) if rows else pool.new_zeros(0, *pool.shape[2:])


def cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=I32)


def shuffled_pages(b, max_pages, num_pages, g, poison_from=None):
    """A page table of distinct, shuffled pages; entries at or past poison_from[i] (pages that
    no used key touches) are set to -1, which nothing may read."""
    pt = torch.randperm(num_pages, generator=g)[: b * max_pages].view(b, max_pages).to(I32)
    if poison_from is not None:
        for i, p in enumerate(poison_from):
            pt[i, p:] = -1
    return pt


def sink_of(h, g):
    return (torch.randn(h, generator=g) * 2).float()


def mask_kw(kw):
    return {
        "causal": kw.get("causal", False),
        "window": kw.get("window_size", (-1, -1)),
        "softcap": kw.get("softcap", 0.0),
    }


# ---------------------------------------------------------------------------------------------
# learnable sink


SINK_CASES = [
    {},
    {"causal": True},
    {"window_size": (5, 2)},
    {"causal": True, "window_size": (3, 0), "softcap": 4.0},
]


@pytest.mark.parametrize("kw", SINK_CASES)
def test_sink_dense_matches_naive(kw):
    g = torch.Generator().manual_seed(11)
    b, s_q, s_k, h, h_kv, d = 2, 19, 23, 4, 2, 64
    q, k, v = (randn(b, s, hh, d, generator=g) for s, hh in ((s_q, h), (s_k, h_kv), (s_k, h_kv)))
    sink = sink_of(h, g)
    out, lse = fa4.attention(q, k, v, learnable_sink=sink, return_lse=True, **kw)
    ref = [naive(q[i], k[i], v[i], sink=sink, **mask_kw(kw)) for i in range(b)]
    ref_out, ref_lse = torch.stack([r[0] for r in ref]), torch.stack([r[1] for r in ref])
    pt, pt_lse = reference.attention_ref(q, k, v, learnable_sink=sink, upcast=False, **kw)
    assert_tolerance("out", out, ref_out, pt, BF16)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)
    # the sink is in the denominator: lse exceeds the sink-free one by log(1 + exp(sink - lse0))
    _, lse0 = fa4.attention(q, k, v, return_lse=True, **kw)
    fin = torch.isfinite(lse0)
    expect = torch.logaddexp(lse0, sink.view(1, h, 1).expand_as(lse0))
    torch.testing.assert_close(lse[fin], expect[fin], rtol=0, atol=1e-5)


def test_sink_rows_without_keys_get_zero_out_and_lse_sink():
    g = torch.Generator().manual_seed(12)
    q, k, v = randn(1, 9, 2, 64, generator=g), randn(1, 4, 2, 64, generator=g), randn(1, 4, 2, 64)
    sink = torch.tensor([0.5, -3.0])
    out, lse = fa4.attention(q, k, v, causal=True, learnable_sink=sink, return_lse=True)
    # bottom-right causal: rows 0..4 see no key
    assert torch.equal(out[:, :5], torch.zeros_like(out[:, :5]))
    assert torch.equal(lse[0, :, :5], sink.view(2, 1).expand(2, 5))
    assert (lse[0, :, 5:] > sink.view(2, 1)).all()


def test_sink_of_minus_inf_is_no_sink():
    q, k, v = (randn(1, 7, 2, 64) for _ in range(3))
    a = fa4.attention(q, k, v, causal=True, return_lse=True)
    b = fa4.attention(
        q, k, v, causal=True, learnable_sink=torch.full((2,), -math.inf), return_lse=True
    )
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("kw", [{"causal": True}, {"window_size": (2, 1), "softcap": 3.0}])
def test_sink_gradcheck_float64(kw):
    g = torch.Generator().manual_seed(13)
    q = randn(2, 5, 2, 64, dtype=torch.float64, requires_grad=True, generator=g)
    k, v = (
        randn(2, 6, 1, 64, dtype=torch.float64, requires_grad=True, generator=g) for _ in range(2)
    )
    sink = torch.randn(2, dtype=torch.float64, generator=g).requires_grad_()

    def f(q, k, v, sink):
        return fa4.attention(q, k, v, learnable_sink=sink, return_lse=True, **kw)

    assert torch.autograd.gradcheck(f, (q, k, v, sink), fast_mode=True)
    # and the sink alone, on every entry of its Jacobian (it is (h,) = 2 columns)
    assert torch.autograd.gradcheck(lambda s: f(q.detach(), k.detach(), v.detach(), s), (sink,))


def test_sink_gradients_match_float64_autograd_of_naive():
    """d_sink (and dq, dk, dv) for a loss on out and LSE, against autograd through naive()."""
    g = torch.Generator().manual_seed(14)
    q, k, v = (
        randn(1, 9, 4, 64, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)
    )
    sink = torch.randn(4, dtype=torch.float64, generator=g).requires_grad_()
    w_out = torch.randn(1, 9, 4, 64, dtype=torch.float64, generator=g)
    w_lse = torch.randn(1, 4, 9, dtype=torch.float64, generator=g)
    out, lse = fa4.attention(q, k, v, causal=True, learnable_sink=sink, return_lse=True)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, sink)]
    n_out, n_lse = naive(leaves[0][0], leaves[1][0], leaves[2][0], causal=True, sink=leaves[3])
    ((n_out * w_out[0]).sum() + (n_lse * w_lse[0]).sum()).backward()
    for name, x, y in zip(["q", "k", "v", "sink"], (q, k, v, sink), leaves, strict=True):
        torch.testing.assert_close(x.grad, y.grad, msg=f"d{name}")
    assert sink.grad.abs().min() > 0


def test_sink_grad_follows_the_spec_formula():
    """d_sink[h] = -sum over rows of exp(sink_h - lse) * (rowsum(dO * O) - dLSE), fp32."""
    g = torch.Generator().manual_seed(15)
    q, k, v = (randn(2, 11, 4, 64, generator=g, requires_grad=True) for _ in range(3))
    sink = sink_of(4, g).requires_grad_()
    out, lse = fa4.attention(q, k, v, learnable_sink=sink, return_lse=True)
    dout = randn(2, 11, 4, 64, generator=g)
    out.backward(dout)
    big_d = (dout.float() * out.float()).sum(-1).transpose(1, 2)
    expect = -(torch.exp(sink.detach().view(1, 4, 1) - lse) * big_d).sum((0, 2))
    assert sink.grad.dtype == torch.float32
    torch.testing.assert_close(sink.grad, expect, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# seqused_q


@pytest.mark.parametrize("kw", [{"causal": True}, {"window_size": (3, 1)}, {"softcap": 2.0}])
def test_seqused_q_forward_and_backward(kw):
    """Causal and local masks align on the used rows (FA3), which the backward must follow
    (Note [seqused_q backward] in fa4/_ops.py)."""
    g = torch.Generator().manual_seed(21)
    lens_q, lens_k, used_q = [6, 0, 9, 4], [8, 3, 5, 0], [4, 0, 9, 2]
    q = randn(sum(lens_q), 4, 64, generator=g, requires_grad=True)
    k, v = (randn(sum(lens_k), 2, 64, generator=g, requires_grad=True) for _ in range(2))
    sink = sink_of(4, g).requires_grad_()
    cu_q, cu_k, sq = cu(lens_q), cu(lens_k), torch.tensor(used_q, dtype=I32)
    out, lse = fa4.attention_varlen(
        q, k, v, cu_q, cu_k, 9, 8, seqused_q=sq, learnable_sink=sink, return_lse=True, **kw
    )
    dout = randn(*out.shape, generator=g)
    (out.float() * dout.float()).sum().backward()
    for i in range(4):
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        used, unused = slice(q0, q0 + used_q[i]), slice(q0 + used_q[i], q0 + lens_q[i])
        assert torch.equal(out[unused], torch.zeros_like(out[unused]))
        assert torch.isneginf(lse[:, unused]).all()
        assert torch.equal(q.grad[unused], torch.zeros_like(q.grad[unused]))
        if used_q[i] == 0:
            continue
        # the used rows: exactly a sequence of used_q[i] rows (mask aligned on them)
        ks = slice(k0, k0 + lens_k[i])
        ref_out, ref_lse = naive(q[used], k[ks], v[ks], sink=sink.detach(), **mask_kw(kw))
        assert (out[used].double() - ref_out).abs().max() < 2e-2
        assert (lse[:, used].double() - ref_lse).abs().max() < 1e-4
    # gradients: the same as a varlen problem that only has the used rows
    qs = torch.cat([q.detach()[int(cu_q[i]) : int(cu_q[i]) + used_q[i]] for i in range(4)])
    ds = torch.cat([dout[int(cu_q[i]) : int(cu_q[i]) + used_q[i]] for i in range(4)])
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (qs, k, v))
    sink2 = sink.detach().clone().requires_grad_()
    out2 = fa4.attention_varlen(q2, k2, v2, cu(used_q), cu_k, 9, 8, learnable_sink=sink2, **kw)
    (out2.float() * ds.float()).sum().backward()
    dq_used = torch.cat([q.grad[int(cu_q[i]) : int(cu_q[i]) + used_q[i]] for i in range(4)])
    assert torch.equal(dq_used, q2.grad)
    assert torch.equal(k.grad, k2.grad) and torch.equal(v.grad, v2.grad)
    torch.testing.assert_close(sink.grad, sink2.grad, rtol=1e-6, atol=1e-6)


def test_seqused_q_backward_marks_unused_rows_without_a_sync(monkeypatch):
    """fa4::bwd gets lse = +inf and dout = 0 on the unused rows; its CPU reference then gives the
    reference backward's own seqused_q gradients."""
    seen = {}
    real = _ops.bwd

    def spy(dout, q, k, v, out, lse, *rest):
        seen["dout"], seen["lse"] = dout.clone(), lse.clone()
        return real(dout, q, k, v, out, lse, *rest)

    monkeypatch.setattr(_ops, "bwd", spy)
    g = torch.Generator().manual_seed(22)
    cu_q, cu_k, sq = cu([5, 3]), cu([6, 4]), torch.tensor([2, 3], dtype=I32)
    q = randn(8, 2, 64, generator=g, requires_grad=True)
    k, v = (randn(10, 2, 64, generator=g, requires_grad=True) for _ in range(2))
    out, lse = fa4.attention_varlen(q, k, v, cu_q, cu_k, 5, 6, seqused_q=sq, return_lse=True)
    dout = randn(8, 2, 64, generator=g)
    out.backward(dout)
    unused = torch.tensor([0, 0, 1, 1, 1, 0, 0, 0], dtype=torch.bool)
    assert torch.isposinf(seen["lse"][:, unused]).all()
    assert torch.equal(seen["lse"][:, ~unused], lse[:, ~unused])
    assert not seen["dout"][unused].any() and torch.equal(seen["dout"][~unused], dout[~unused])
    grads = reference.attention_varlen_ref_bwd(
        dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, cu_q, cu_k, seqused_q=sq
    )
    for x, ref in zip((q, k, v), grads, strict=True):
        assert torch.equal(x.grad, ref.to(BF16))


# ---------------------------------------------------------------------------------------------
# paged KV (varlen)


@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
def test_paged_varlen_matches_naive_gather(page_size):
    g = torch.Generator().manual_seed(31 + page_size)
    h, h_kv, d = 4, 2, 64
    lens_q = [3, 1, 4, 2, 1]
    # a zero-length cache, one at a page boundary, one just past it, longer ones
    used_k = [0, page_size, page_size + 1, 2 * page_size + 7, 3 * page_size - 1]
    max_pages = max(-(-n // page_size) for n in used_k) + 1
    num_pages = len(used_k) * max_pages + 3
    k_pool, v_pool = (randn(num_pages, page_size, h_kv, d, generator=g) for _ in range(2))
    poison = [-(-n // page_size) for n in used_k]
    pt = shuffled_pages(len(used_k), max_pages, num_pages, g, poison_from=poison)
    q = randn(sum(lens_q), h, d, generator=g)
    sink = sink_of(h, g)
    cu_q, sk = cu(lens_q), torch.tensor(used_k, dtype=I32)
    kw = {"causal": True, "learnable_sink": sink}
    out, lse = fa4.attention_varlen(
        q,
        k_pool,
        v_pool,
        cu_q,
        None,
        4,
        max(used_k),
        seqused_k=sk,
        page_table=pt,
        return_lse=True,
        **kw,
    )
    ref_out, ref_lse = torch.zeros(out.shape, dtype=torch.float64), torch.zeros(lse.shape).double()
    for i, n in enumerate(used_k):
        qs = slice(int(cu_q[i]), int(cu_q[i + 1]))
        kk, vv = gather(k_pool, pt[i], 0, n), gather(v_pool, pt[i], 0, n)
        ref_out[qs], ref_lse[:, qs] = naive(q[qs], kk, vv, causal=True, sink=sink)
    pt_out, pt_lse = reference.attention_varlen_ref(
        q, k_pool, v_pool, cu_q, None, seqused_k=sk, page_table=pt, upcast=False, **kw
    )
    assert_tolerance("out", out, ref_out, pt_out, BF16)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)
    assert torch.equal(lse[:, :3], sink.view(h, 1).expand(h, 3))  # the zero-length cache


def test_paged_equals_packed():
    """The same keys packed (cu_seqlens_k) and paged give bitwise the same result on CPU."""
    g = torch.Generator().manual_seed(33)
    lens_q, lens_k, ps = [2, 5], [37, 16], 16
    k, v = (randn(sum(lens_k), 2, 64, generator=g) for _ in range(2))
    pt = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=I32)
    k_pool, v_pool = torch.zeros(6, ps, 2, 64, dtype=BF16), torch.zeros(6, ps, 2, 64, dtype=BF16)
    for i, n in enumerate(lens_k):
        for j in range(n):
            src = sum(lens_k[:i]) + j
            k_pool[pt[i, j // ps], j % ps], v_pool[pt[i, j // ps], j % ps] = k[src], v[src]
    q = randn(sum(lens_q), 4, 64, generator=g)
    kw = {"window_size": (9, 1), "return_lse": True}
    packed = fa4.attention_varlen(q, k, v, cu(lens_q), cu(lens_k), 5, 37, **kw)
    paged = fa4.attention_varlen(
        q,
        k_pool,
        v_pool,
        cu(lens_q),
        None,
        5,
        37,
        seqused_k=torch.tensor(lens_k, dtype=I32),
        page_table=pt,
        **kw,
    )
    assert torch.equal(packed[0], paged[0]) and torch.equal(packed[1], paged[1])


def test_paged_with_grad_raises_before_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(_ops, "fwd", lambda *a: calls.append(a) or (None, None))
    k_pool = randn(4, 16, 2, 64, requires_grad=True)
    q = randn(3, 2, 64)
    pt, sk = torch.tensor([[0, 1]], dtype=I32), torch.tensor([20], dtype=I32)
    with pytest.raises(ValueError, match="fa4: page_table: paged attention is forward only"):
        fa4.attention_varlen(q, k_pool, k_pool, cu([3]), None, 3, 20, seqused_k=sk, page_table=pt)
    assert not calls
    with torch.no_grad():
        fa4.attention_varlen(q, k_pool, k_pool, cu([3]), None, 3, 20, seqused_k=sk, page_table=pt)
    assert len(calls) == 1


def test_op_refuses_a_backward_through_paged_calls():
    """Calling fa4::fwd directly with a page table and grad-requiring inputs fails at once (its
    setup_context), not with wrong gradients later."""
    q = randn(3, 2, 64, requires_grad=True)
    k_pool = randn(2, 16, 2, 64)
    args = (
        q,
        k_pool,
        k_pool,
        cu([3]),
        None,
        torch.tensor([20], dtype=I32),
        3,
        20,
        False,
        0.125,
        -1,
        -1,
        0.0,
        False,
        "reference",
    )
    with pytest.raises(ValueError, match="fa4: page_table: .*forward has no backward"):
        _ops.fwd(*args, page_table=torch.tensor([[1, 0]], dtype=I32))


# ---------------------------------------------------------------------------------------------
# the KV-cache form (no append)

KV_CASES = {
    # name: (page_size or None, cache_batch_idx, leftpad, attention kwargs)
    "dense": (None, False, False, {}),
    "dense_batch_idx_leftpad_causal": (None, True, True, {"causal": True}),
    "paged1_window": (1, False, True, {"window_size": (6, 0)}),
    "paged16_batch_idx_causal_sink": (16, True, False, {"causal": True, "sink": True}),
    "paged64_leftpad_window_sink": (64, False, True, {"window_size": (40, 3), "sink": True}),
    "paged256_all": (256, True, True, {"causal": True, "softcap": 5.0, "sink": True}),
}


@pytest.mark.parametrize("case", sorted(KV_CASES))
def test_kvcache_matches_naive(case):
    page_size, use_idx, use_left, kw = KV_CASES[case]
    kw = dict(kw)
    g = torch.Generator().manual_seed(41 + len(case))
    b, s_q, h, h_kv, d = 4, 3, 4, 2, 64
    ps = page_size or 1
    s_cache = 3 * max(ps, 16)
    seqlens = [0, ps if page_size else 16, s_cache - 5, s_cache]  # empty, page boundary, full
    b_cache = b + 2 if use_idx else b
    idx = torch.randperm(b_cache, generator=g)[:b].to(I32) if use_idx else None
    left = [0, 0, 0, 0]
    if use_left:
        left = [0, seqlens[1] // 2, 7, seqlens[3] - 2]
    row_of = idx.tolist() if use_idx else list(range(b))
    if page_size is None:
        k_cache, v_cache = (randn(b_cache, s_cache, h_kv, d, generator=g) for _ in range(2))
        pt = None
    else:
        max_pages = s_cache // ps
        num_pages = b_cache * max_pages + 1
        k_cache, v_cache = (randn(num_pages, ps, h_kv, d, generator=g) for _ in range(2))
        pt = shuffled_pages(b_cache, max_pages, num_pages, g)
    sink = sink_of(h, g) if kw.pop("sink", False) else None
    q = randn(b, s_q, h, d, generator=g)
    seqlens_t = torch.tensor(seqlens, dtype=I32)
    leftpad = torch.tensor(left, dtype=I32) if use_left else None
    out, lse = fa4.attention_with_kvcache(
        q,
        k_cache,
        v_cache,
        seqlens_t,
        cache_batch_idx=idx,
        cache_leftpad=leftpad,
        page_table=pt,
        learnable_sink=sink,
        return_lse=True,
        **kw,
    )
    ref_out = torch.zeros(out.shape, dtype=torch.float64)
    ref_lse = torch.zeros(lse.shape, dtype=torch.float64)
    for i in range(b):
        r = row_of[i]
        if pt is None:
            kk, vv = k_cache[r, left[i] : seqlens[i]], v_cache[r, left[i] : seqlens[i]]
        else:
            kk, vv = (gather(x, pt[r], left[i], seqlens[i]) for x in (k_cache, v_cache))
        o, l_ = naive(q[i], kk, vv, sink=sink, **mask_kw(kw))
        ref_out[i], ref_lse[i] = o, l_
    pt_out, pt_lse = reference.attention_kvcache_ref(
        q,
        k_cache,
        v_cache,
        seqlens_t,
        cache_batch_idx=idx,
        leftpad_k=leftpad,
        page_table=pt,
        learnable_sink=sink,
        upcast=False,
        **kw,
    )
    assert_tolerance("out", out, ref_out, pt_out, BF16)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # the zero-length cache
    if sink is None:
        assert torch.isneginf(lse[0]).all()
    else:
        assert torch.equal(lse[0], sink.view(h, 1).expand(h, s_q))


def test_kvcache_leftpad_masks_align_on_the_key_count_after_leftpad():
    """FA3: with cache_leftpad, causal/window are bottom-right aligned on cache_seqlens -
    leftpad keys. Equivalent: the dense call on the cache rows [leftpad, cache_seqlens)."""
    g = torch.Generator().manual_seed(42)
    q = randn(1, 5, 2, 64, generator=g)
    kc, vc = (randn(1, 20, 2, 64, generator=g) for _ in range(2))
    kw = {"causal": True, "window_size": (3, 0)}
    out = fa4.attention_with_kvcache(
        q, kc, vc, 14, cache_leftpad=torch.tensor([6], dtype=I32), **kw
    )
    dense = fa4.attention(q, kc[:, 6:14], vc[:, 6:14], **kw)
    assert torch.equal(out, dense)


def test_kvcache_int_seqlens_equals_tensor():
    g = torch.Generator().manual_seed(43)
    q = randn(3, 2, 4, 64, generator=g)
    kc, vc = (randn(3, 32, 2, 64, generator=g) for _ in range(2))
    a = fa4.attention_with_kvcache(q, kc, vc, 17, causal=True, return_lse=True)
    b = fa4.attention_with_kvcache(
        q, kc, vc, torch.full((3,), 17, dtype=I32), causal=True, return_lse=True
    )
    c = fa4.attention(q, kc[:, :17], vc[:, :17], causal=True, return_lse=True)
    for x, y, z in zip(a, b, c, strict=True):
        assert torch.equal(x, y) and torch.equal(x, z)


def test_kvcache_reads_no_cache_row_outside_its_keys():
    """Rows outside [leftpad, seqlen) of the cache, and unused pages, are never read: NaN there
    changes nothing."""
    g = torch.Generator().manual_seed(44)
    q = randn(2, 2, 2, 64, generator=g)
    pool_k, pool_v = (randn(8, 4, 2, 64, generator=g) for _ in range(2))
    pt = torch.tensor([[6, 2, 0, 5], [1, 3, 7, 4]], dtype=I32)
    seqlens, left = torch.tensor([9, 5], dtype=I32), torch.tensor([2, 4], dtype=I32)
    args = dict(cache_leftpad=left, page_table=pt, causal=True)
    clean = fa4.attention_with_kvcache(q, pool_k, pool_v, seqlens, **args)
    for pool in (pool_k, pool_v):
        pool[6, :2] = pool[0, 1:] = pool[5] = math.nan  # seq 0: keys 0, 1 and 9.. ; page 5
        pool[1] = pool[3, 1:] = pool[7] = pool[4] = math.nan  # seq 1: keys 0..3, 5..
    assert torch.equal(fa4.attention_with_kvcache(q, pool_k, pool_v, seqlens, **args), clean)


def test_kvcache_is_forward_only():
    q = randn(1, 1, 2, 64, requires_grad=True)
    kc = randn(1, 8, 2, 64)
    with pytest.raises(ValueError, match="fa4: q: attention_with_kvcache is forward only"):
        fa4.attention_with_kvcache(q, kc, kc, 4)
    with torch.inference_mode():
        assert fa4.attention_with_kvcache(q, kc, kc, 4).shape == (1, 1, 2, 64)


def test_kvcache_reads_the_index_values_once(monkeypatch):
    """attention_with_kvcache checks the values before its append; the op inside does not read
    them again (one device sync per call on GPU, not two)."""
    reads = []
    real = value_checks._host

    def spy(*ts):
        got = real(*ts)
        reads.append(got is not None)
        return got

    monkeypatch.setattr(value_checks, "_host", spy)
    q, pool = randn(2, 1, 4, 64), randn(6, 8, 2, 64)
    pt = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32)
    fa4.attention_with_kvcache(q, pool, pool, torch.tensor([5, 20], dtype=I32), page_table=pt)
    assert reads.count(True) == 1 and len(reads) == 2
    reads.clear()
    fa4.attention_varlen(q[:, 0], pool, pool, cu([1, 1]), None, 1, 24, page_table=pt,
                         seqused_k=torch.tensor([5, 20], dtype=I32))  # fmt: skip
    assert reads == [True]


def test_skip_value_checks_knob(monkeypatch):
    """FA4_SKIP_VALUE_CHECKS=1: no value rule is read (for callers that guarantee them); the shape
    rules stay."""
    pool = randn(6, 8, 2, 64)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32)
    full = torch.tensor([5, 24], dtype=I32)  # 24 + an append of 1 > the capacity 24
    monkeypatch.setenv("FA4_SKIP_VALUE_CHECKS", "1")
    value_checks.check_cache_append_data(full, 1, None, None, table, pool, None, 1)
    monkeypatch.delenv("FA4_SKIP_VALUE_CHECKS")
    with pytest.raises(ValueError, match="fa4: cache_seqlens: entries"):
        value_checks.check_cache_append_data(full, 1, None, None, table, pool, None, 1)
    monkeypatch.setenv("FA4_SKIP_VALUE_CHECKS", "1")
    with pytest.raises(ValueError, match="fa4: page_table: has 2 rows, expected batch = 3"):
        fa4.attention_with_kvcache(randn(3, 1, 4, 64), pool, pool, 3, page_table=table)


def test_kvcache_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(52)
    q = randn(2, 3, 4, 64, generator=g)
    pool = randn(6, 8, 2, 64, generator=g)
    pt = torch.tensor([[4, 1, 0], [2, 3, 5]], dtype=I32)
    lens, left = torch.tensor([20, 9], dtype=I32), torch.tensor([3, 0], dtype=I32)

    def f(q, pool, lens):
        return fa4.attention_with_kvcache(
            q, pool, pool, lens, page_table=pt, cache_leftpad=left, causal=True, return_lse=True
        )

    got = torch.compile(f, fullgraph=True)(q, pool, lens)
    want = f(q, pool, lens)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("num_splits", [0, 1, 2, 3, 16])
def test_num_splits_changes_nothing_on_cpu(num_splits):
    g = torch.Generator().manual_seed(51)
    q = randn(2, 4, 4, 64, generator=g)
    pool = randn(12, 16, 2, 64, generator=g)
    pt = torch.arange(12, dtype=I32).flip(0).view(2, 6)
    seqlens = torch.tensor([80, 33], dtype=I32)
    kw = dict(page_table=pt, causal=True, return_lse=True)
    base = fa4.attention_with_kvcache(q, pool, pool, seqlens, **kw)
    got = fa4.attention_with_kvcache(q, pool, pool, seqlens, num_splits=num_splits, **kw)
    assert torch.equal(base[0], got[0]) and torch.equal(base[1], got[1])
    qv = q.flatten(0, 1)
    kw_v = dict(seqused_k=seqlens, page_table=pt, causal=True)
    base_v = fa4.attention_varlen(qv, pool, pool, cu([4, 4]), None, 4, 80, **kw_v)
    got_v = fa4.attention_varlen(
        qv, pool, pool, cu([4, 4]), None, 4, 80, num_splits=num_splits, **kw_v
    )
    assert torch.equal(base_v, got_v)
    assert torch.equal(base_v.view(2, 4, 4, 64), base[0])  # dense q == varlen q, same keys


# ---------------------------------------------------------------------------------------------
# attention_with_kvcache with an append and rotary (fa4.kvcache does the append)


def exact_rotary(seqlen_ro, half, g, dtype=BF16):
    """cos/sin tables of random multiples of 90 degrees: every rotation is exact in any
    arithmetic, so the cache after the append can be compared bit for bit, and a wrong position
    or pairing changes it."""
    quarter = torch.randint(0, 4, (seqlen_ro, half), generator=g).double() * (math.pi / 2)
    return torch.cos(quarter).round().to(dtype), torch.sin(quarter).round().to(dtype)


def naive_rotate(x, pos, cos, sin, interleaved):
    """x (s, h, d) with row i at position pos[i]: pairs (2j, 2j+1) if interleaved, else
    (j, j + rotary_dim / 2), for j < rotary_dim / 2; the other dims unchanged."""
    half = cos.shape[1]
    y = x.double().clone()
    for i, p in enumerate(pos):
        for j in range(half):
            a, b = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
            c, s_ = cos[p, j].double(), sin[p, j].double()
            y[i, :, a] = x[i, :, a].double() * c - x[i, :, b].double() * s_
            y[i, :, b] = x[i, :, a].double() * s_ + x[i, :, b].double() * c
    return y.to(x.dtype)


APPEND_CASES = {
    # name: (page_size, cache_batch_idx, leftpad, rotary: None / "neox" / "interleaved", kwargs)
    "dense_plain": (None, False, False, None, {"causal": True}),
    "dense_neox_causal": (None, True, True, "neox", {"causal": True}),
    "dense_interleaved_noncausal": (None, False, True, "interleaved", {}),
    "dense_neox_window": (None, True, False, "neox", {"window_size": (7, 0)}),
    "paged1_interleaved_causal": (1, True, True, "interleaved", {"causal": True, "sink": True}),
    "paged16_neox_noncausal": (16, True, True, "neox", {"sink": True}),
    "paged64_plain_causal": (64, False, False, None, {"causal": True}),
}


@pytest.mark.parametrize("case", sorted(APPEND_CASES))
def test_kvcache_append_matches_naive(case):
    page_size, use_idx, use_left, rot, kw = APPEND_CASES[case]
    kw = dict(kw)
    g = torch.Generator().manual_seed(71 + len(case))
    b, s_q, s_new, h, h_kv, d, half = 3, 4, 3, 4, 2, 64, 16
    ps = page_size or 1
    s_cache = max(3 * ps, 40)
    # a zero-length cache; an append that crosses a page boundary; one that fills the cache
    seqlens = [0, (ps - 1) if page_size else 17, s_cache - s_new]
    b_cache = b + 2 if use_idx else b
    idx = torch.randperm(b_cache, generator=g)[:b].to(I32) if use_idx else None
    rows = idx.tolist() if use_idx else list(range(b))
    left = [0, seqlens[1] // 2, 5] if use_left else [0, 0, 0]
    if page_size is None:
        k_cache, v_cache = (randn(b_cache, s_cache, h_kv, d, generator=g) for _ in range(2))
        pt = None
    else:
        max_pages = -(-s_cache // ps)
        num_pages = b_cache * max_pages + 2
        k_cache, v_cache = (randn(num_pages, ps, h_kv, d, generator=g) for _ in range(2))
        pt = shuffled_pages(b_cache, max_pages, num_pages, g)
    k_new, v_new = (randn(b, s_new, h_kv, d, generator=g) for _ in range(2))
    q = randn(b, s_q, h, d, generator=g)
    sink = sink_of(h, g) if kw.pop("sink", False) else None
    cos = sin = None
    if rot is not None:
        cos, sin = exact_rotary(s_cache + s_q, half, g)
    interleaved = rot == "interleaved"
    per_row = kw.get("causal", False) or kw.get("window_size", (-1, -1)) != (-1, -1)
    # expected: the append and the rotations done by hand
    k_exp, v_exp = k_cache.clone(), v_cache.clone()
    q_rot = q.clone()
    for i in range(b):
        pos = [seqlens[i] + t for t in range(s_new)]
        kn = naive_rotate(k_new[i], pos, cos, sin, interleaved) if cos is not None else k_new[i]
        for t, p in enumerate(pos):
            slot = (rows[i], p) if pt is None else (int(pt[rows[i], p // ps]), p % ps)
            k_exp[slot], v_exp[slot] = kn[t], v_new[i, t]
        if cos is not None:
            q_pos = [seqlens[i] + (t if per_row else 0) for t in range(s_q)]
            q_rot[i] = naive_rotate(q[i], q_pos, cos, sin, interleaved)
    seqlens_t = torch.tensor(seqlens, dtype=I32)
    leftpad = torch.tensor(left, dtype=I32) if use_left else None
    out, lse = fa4.attention_with_kvcache(
        q,
        k_cache,
        v_cache,
        seqlens_t,
        k_new=k_new,
        v_new=v_new,
        rotary_cos=cos,
        rotary_sin=sin,
        rotary_interleaved=interleaved,
        cache_batch_idx=idx,
        cache_leftpad=leftpad,
        page_table=pt,
        learnable_sink=sink,
        return_lse=True,
        **kw,
    )
    assert torch.equal(k_cache, k_exp) and torch.equal(v_cache, v_exp), "the append"
    ref_out = torch.zeros(out.shape, dtype=torch.float64)
    ref_lse = torch.zeros(lse.shape, dtype=torch.float64)
    for i in range(b):
        stop = seqlens[i] + s_new
        if pt is None:
            kk, vv = k_exp[rows[i], left[i] : stop], v_exp[rows[i], left[i] : stop]
        else:
            kk, vv = (gather(x, pt[rows[i]], left[i], stop) for x in (k_exp, v_exp))
        ref_out[i], ref_lse[i] = naive(q_rot[i], kk, vv, sink=sink, **mask_kw(kw))
    pt_out, pt_lse = reference.attention_kvcache_ref(
        q_rot,
        k_exp,
        v_exp,
        seqlens_t + s_new,
        cache_batch_idx=idx,
        leftpad_k=leftpad,
        page_table=pt,
        learnable_sink=sink,
        upcast=False,
        **kw,
    )
    assert_tolerance("out", out, ref_out, pt_out, BF16)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def test_kvcache_rotary_without_append_rotates_q_only():
    g = torch.Generator().manual_seed(72)
    q = randn(2, 3, 2, 64, generator=g)
    kc, vc = (randn(2, 20, 2, 64, generator=g) for _ in range(2))
    cos, sin = exact_rotary(20, 8, g)
    kc0 = kc.clone()
    out = fa4.attention_with_kvcache(q, kc, vc, 9, rotary_cos=cos, rotary_sin=sin, causal=True)
    assert torch.equal(kc, kc0)
    q_rot = torch.stack([naive_rotate(q[i], [9, 10, 11], cos, sin, False) for i in range(2)])
    assert torch.equal(out, fa4.attention(q_rot, kc[:, :9], vc[:, :9], causal=True))


def test_kvcache_int_seqlens_with_append():
    g = torch.Generator().manual_seed(73)
    q = randn(2, 1, 4, 64, generator=g)
    kc, vc = (randn(2, 16, 2, 64, generator=g) for _ in range(2))
    kn, vn = (randn(2, 1, 2, 64, generator=g) for _ in range(2))
    kc2, vc2 = kc.clone(), vc.clone()
    out = fa4.attention_with_kvcache(q, kc, vc, 6, k_new=kn, v_new=vn)
    assert torch.equal(kc[:, 6], kn[:, 0]) and torch.equal(vc[:, 6], vn[:, 0])
    assert torch.equal(kc[:, :6], kc2[:, :6]) and torch.equal(kc[:, 7:], kc2[:, 7:])
    assert torch.equal(out, fa4.attention(q, kc[:, :7], vc[:, :7]))
    out2 = fa4.attention_with_kvcache(
        q, kc2, vc2, torch.full((2,), 6, dtype=I32), k_new=kn, v_new=vn
    )
    assert torch.equal(out, out2) and torch.equal(kc, kc2)


# ---------------------------------------------------------------------------------------------
# the op: schema, fake kernel, the eager CUDA functions' handling of the new arguments


def test_opcheck_with_sink_and_seqused_q():
    g = torch.Generator().manual_seed(61)
    q = randn(8, 2, 64, generator=g, requires_grad=True)
    k, v = (randn(9, 2, 64, generator=g, requires_grad=True) for _ in range(2))
    sink = torch.randn(2, generator=g).requires_grad_()
    c_q, c_k = cu([3, 5]), cu([4, 5])
    args = (
        q,
        k,
        v,
        c_q,
        c_k,
        None,
        5,
        5,
        True,
        0.125,
        -1,
        0,
        0.0,
        False,
        "reference",
        torch.tensor([2, 5], dtype=I32),
        None,
        None,
        None,
        sink,
        3,
    )
    torch.library.opcheck(_ops.fwd, args)


def test_opcheck_paged_kvcache():
    g = torch.Generator().manual_seed(62)
    q = randn(2, 3, 4, 64, generator=g)
    pool = randn(6, 8, 2, 64, generator=g)
    args = (
        q,
        pool,
        pool,
        None,
        None,
        torch.tensor([10, 3], dtype=I32),
        3,
        24,
        True,
        0.125,
        -1,
        0,
        0.0,
        False,
        "reference",
        None,
        torch.tensor([[4, 1, 0], [2, 3, 5]], dtype=I32),
        torch.tensor([1, 0], dtype=I32),
        torch.tensor([2, 0], dtype=I32),
        None,
        0,
    )
    torch.library.opcheck(_ops.fwd, args)


def _fwd_kernel_schema() -> torch._C.FunctionSchema:
    """The schema csrc/api/bindings.cpp declares for fa4::_fwd_kernel (its m.def literals)."""
    src = (Path(__file__).resolve().parents[2] / "csrc" / "api" / "bindings.cpp").read_text()
    for call in re.findall(r'm\.def\(\s*((?:"[^"]*"\s*)+)\);', src):
        text = "".join(re.findall(r'"([^"]*)"', call))
        if text.startswith("_fwd_kernel("):
            return torch._C.parse_schema(f"fa4::{text}")
    raise AssertionError("no m.def of _fwd_kernel in csrc/api/bindings.cpp")


def test_cuda_function_passes_serving_arguments_by_name(monkeypatch):
    """_fwd_cuda (the op's CUDA kernel, the direct call and the eager autograd path) hands every
    serving argument to fa4::_fwd_kernel at the position csrc/api/bindings.cpp declares."""
    calls = []

    class Spy:
        def _fwd_kernel(self, *args):
            calls.append(args)
            return "out", "lse"

    monkeypatch.setattr(torch.ops, "fa4", Spy())
    monkeypatch.setattr(dispatch, "kernel_for", lambda *a, **kw: "sm90")
    monkeypatch.setattr(_ops, "_check_data", lambda *a, **kw: None)  # stand-in tensors
    t = {  # two entries: a one-entry cu_seqlens_q is an empty batch, which skips the kernel
        n: torch.zeros(2) + i
        for i, n in enumerate(
            "q k v cu_q cu_k seqused_k seqused_q page_table cache_batch_idx leftpad_k sink".split()
        )
    }
    _ops._fwd_cuda(
        t["q"],
        t["k"],
        t["v"],
        t["cu_q"],
        t["cu_k"],
        t["seqused_k"],
        11,
        12,
        True,
        0.5,
        7,
        8,
        2.5,
        False,
        "auto",
        seqused_q=t["seqused_q"],
        page_table=t["page_table"],
        cache_batch_idx=t["cache_batch_idx"],
        leftpad_k=t["leftpad_k"],
        learnable_sink=t["sink"],
        num_splits=5,
    )
    (args,) = calls
    names = [a.name for a in _fwd_kernel_schema().arguments]
    assert len(args) == len(names)
    got = dict(zip(names, args, strict=True))
    for name, key in (
        ("cu_seqlens_q", "cu_q"),
        ("cu_seqlens_k", "cu_k"),
        ("learnable_sink", "sink"),
        *((n, n) for n in "q k v seqused_k seqused_q page_table cache_batch_idx leftpad_k".split()),
    ):
        assert got[name] is t[key], name
    assert (got["max_seqlen_q"], got["max_seqlen_k"], got["num_splits"]) == (11, 12, 5)
    assert (got["window_left"], got["window_right"], got["softcap"]) == (7, 8, 2.5)


def test_eager_autograd_function_handles_sink_and_seqused_q(monkeypatch):
    """Note [eager autograd path] with the serving arguments: the same gradients as the op's
    registered autograd (the CUDA functions run the reference here)."""
    monkeypatch.setattr(dispatch, "kernel_for", lambda *a, **kw: None)
    g = torch.Generator().manual_seed(63)
    base = [
        randn(8, 2, 64, generator=g),
        randn(9, 2, 64, generator=g),
        randn(9, 2, 64, generator=g),
        torch.randn(2, generator=g),
    ]
    grads = []
    for f in (_ops._EagerAttention.apply, _ops.fwd):
        q, k, v, sink = (x.clone().requires_grad_() for x in base)
        args = (
            q,
            k,
            v,
            cu([3, 5]),
            cu([4, 5]),
            None,
            5,
            5,
            True,
            0.125,
            -1,
            0,
            0.0,
            False,
            "auto",
            torch.tensor([2, 4], dtype=I32),
            None,
            None,
            None,
            sink,
            0,
        )
        out, lse = f(*args)
        (out.float().square().sum() + lse[torch.isfinite(lse)].sum()).backward()
        grads.append([x.grad for x in (q, k, v, sink)])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
    assert grads[0][3].abs().min() > 0


def test_torch_compile_with_sink_and_seqused_q():
    g = torch.Generator().manual_seed(64)
    q = randn(8, 2, 64, generator=g, requires_grad=True)
    k, v = (randn(9, 2, 64, generator=g, requires_grad=True) for _ in range(2))
    sink = torch.randn(2, generator=g).requires_grad_()
    c_q, c_k, sq = cu([3, 5]), cu([4, 5]), torch.tensor([3, 2], dtype=I32)

    def f(q, k, v, sink):
        return fa4.attention_varlen(
            q, k, v, c_q, c_k, 5, 5, seqused_q=sq, learnable_sink=sink, causal=True
        )

    out = torch.compile(f, fullgraph=True)(q, k, v, sink)
    assert torch.equal(out, f(q, k, v, sink))
    out.float().sum().backward()
    assert sink.grad is not None and torch.isfinite(sink.grad).all()


# ---------------------------------------------------------------------------------------------
# the Python layer under CUDA-graph capture (GPU only)


def _decode_kernel_reason():
    from fa4 import build_info

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return "needs an SM90 GPU"
    if [128, 128] not in [list(p) for p in build_info.KERNELS.get("fwd", {}).get("decode", [])]:
        return "this build has no hd128 decode kernel"
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{"causal": True}, {"window_size": (40, 0)}, {}])
def test_sink_and_seqused_q_on_cuda(kw):
    """The CUDA path of attention_varlen with a sink and seqused_q, forward and backward (the
    kernels, Note [seqused_q backward]'s rotation, d_sink from the kernels' LSE) against the fp32
    reference under the tolerance rule."""
    from fa4 import build_info

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 GPU")
    for direction in ("fwd", "bwd"):
        why = build_info.missing_kernel("sm90", direction, (128, 128))
        if why:
            pytest.skip(why)
    g = torch.Generator().manual_seed(91)
    lens_q, lens_k, used_q = [100, 1, 300, 77], [120, 50, 300, 0], [64, 1, 211, 77]
    q = randn(sum(lens_q), 8, 128, generator=g)
    k, v = (randn(sum(lens_k), 2, 128, generator=g) for _ in range(2))
    sink = sink_of(8, g)
    dout = randn(sum(lens_q), 8, 128, generator=g)
    w_lse = torch.randn(8, sum(lens_q), generator=g)
    c_q, c_k, sq = cu(lens_q), cu(lens_k), torch.tensor(used_q, dtype=I32)

    def run(q, k, v, sink, device, **extra):
        leaves = [x.detach().to(device).requires_grad_() for x in (q, k, v, sink)]
        c = (c_q.to(device), c_k.to(device))
        out, lse = fa4.attention_varlen(
            *leaves[:3], *c, 300, 300, seqused_q=sq.to(device), learnable_sink=leaves[3],
            return_lse=True, **kw, **extra,
        )  # fmt: skip
        fin = torch.isfinite(lse)
        loss = (out.float() * dout.to(device).float()).sum()
        loss = loss + (lse[fin] * w_lse.to(device)[fin]).sum()
        loss.backward()
        return [t.detach().cpu() for t in (out, lse, *(x.grad for x in leaves))]

    got = run(q, k, v, sink, "cuda")
    ref = run(*(x.float() for x in (q, k, v)), sink, "cpu")
    low = [
        x.detach().requires_grad_() for x in (q, k, v, sink)
    ]  # the naive low-precision computation (the tolerance rule's baseline)
    out_pt, lse_pt = reference.attention_varlen_ref(
        *low[:3], c_q, c_k, seqused_q=sq, learnable_sink=low[3], upcast=False, **kw
    )
    fin = torch.isfinite(lse_pt)
    ((out_pt.float() * dout.float()).sum() + (lse_pt[fin] * w_lse[fin]).sum()).backward()
    pts = [out_pt, lse_pt, *(x.grad for x in low)]
    for name, a, r, p in zip(["out", "lse", "dq", "dk", "dv"], got, ref, pts, strict=False):
        dt = torch.float32 if name == "lse" else BF16
        assert_tolerance(name, a, r, p.detach(), dt)
    torch.testing.assert_close(got[5], ref[5], rtol=2e-2, atol=2e-2)  # d_sink


@pytest.mark.gpu
def test_kvcache_decode_step_in_a_cuda_graph():
    """attention_with_kvcache (append, rotary, paged, sink, int32 cache_seqlens) captured once and
    replayed: the same cache and output as eager calls (bitwise), and the eager calls within the
    tolerance rule of the CPU reference."""
    reason = _decode_kernel_reason()
    if reason:
        pytest.skip(reason)
    dev, g = "cuda", torch.Generator().manual_seed(81)
    b, h, h_kv, d, ps, max_pages = 4, 16, 4, 128, 64, 8
    pool_k, pool_v = (randn(b * max_pages, ps, h_kv, d, generator=g).to(dev) for _ in range(2))
    pt = shuffled_pages(b, max_pages, b * max_pages, g).to(dev)
    cos, sin = (t.to(dev) for t in exact_rotary(max_pages * ps, d // 2, g))
    sink = sink_of(h, g).to(dev)
    seqlens = torch.tensor([0, 63, 200, 300], dtype=I32, device=dev)
    inputs = [
        [
            randn(*shape, generator=g).to(dev)
            for shape in ((b, 1, h, d), (b, 1, h_kv, d), (b, 1, h_kv, d))
        ]
        for _ in range(3)
    ]
    static = [x.clone() for x in inputs[0]]

    def step(q, k, v, caches, lens):
        return fa4.attention_with_kvcache(
            q,
            *caches,
            lens,
            k_new=k,
            v_new=v,
            rotary_cos=cos,
            rotary_sin=sin,
            page_table=pt,
            causal=True,
            learnable_sink=sink,
            return_lse=True,
        )

    with torch.inference_mode():
        eager_caches, eager_lens = (pool_k.clone(), pool_v.clone()), seqlens.clone()
        graph_caches, graph_lens = (pool_k.clone(), pool_v.clone()), seqlens.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            warm = (pool_k.clone(), pool_v.clone())
            step(*static, warm, seqlens.clone())  # warm-up outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out_g, lse_g = step(*static, graph_caches, graph_lens)
        torch.cuda.current_stream().wait_stream(stream)
        for q, k, v in inputs:
            cpu_caches = tuple(c.cpu() for c in eager_caches)
            cpu_lens = eager_lens.cpu()
            out_e, lse_e = step(q, k, v, eager_caches, eager_lens)
            for dst, src in zip(static, (q, k, v), strict=True):
                dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out_g, out_e) and torch.equal(lse_g, lse_e)
            assert all(torch.equal(a, e) for a, e in zip(graph_caches, eager_caches, strict=True))
            ref = fa4.attention_with_kvcache(
                q.cpu().float(),
                *(c.float() for c in cpu_caches),
                cpu_lens,
                k_new=k.cpu().float(),
                v_new=v.cpu().float(),
                rotary_cos=cos.cpu().float(),
                rotary_sin=sin.cpu().float(),
                page_table=pt.cpu(),
                causal=True,
                learnable_sink=sink.cpu(),
                return_lse=True,
            )
            pt_out = fa4.attention_with_kvcache(
                q.cpu(),
                *cpu_caches,
                cpu_lens,
                k_new=k.cpu(),
                v_new=v.cpu(),
                rotary_cos=cos.cpu(),
                rotary_sin=sin.cpu(),
                page_table=pt.cpu(),
                causal=True,
                learnable_sink=sink.cpu(),
                return_lse=True,
            )
            assert_tolerance("out", out_e.cpu(), ref[0], pt_out[0], BF16, slack=4.0)
            torch.testing.assert_close(lse_e.cpu(), ref[1], rtol=0, atol=1e-3)
            eager_lens += 1
            graph_lens += 1


def test_cuda_function_runs_an_empty_varlen_batch_without_a_kernel(monkeypatch):
    """cu_seqlens = [0] (no sequence): _fwd_cuda / _bwd_cuda never ask for a kernel (the C++ API
    wants batch >= 1) and return the reference's empty outputs."""

    def no_kernel(*a, **kw):
        raise AssertionError("kernel_for called for an empty batch")

    monkeypatch.setattr(dispatch, "kernel_for", no_kernel)
    cu = torch.zeros(1, dtype=torch.int32)
    q, k, v = torch.zeros(0, 4, 64), torch.zeros(0, 2, 64), torch.zeros(0, 2, 64)
    out, lse = _ops._fwd_cuda(
        q, k, v, cu, cu, None, 0, 0, False, 0.125, -1, -1, 0.0, False, "auto"
    )  # fmt: skip
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    grads = _ops._bwd_cuda(
        out, q, k, v, out, lse, None, cu, cu, None, 0, 0, False, 0.125, -1, -1, 0.0, False, "auto"
    )  # fmt: skip
    assert [tuple(g.shape) for g in grads] == [(0, 4, 64), (0, 2, 64), (0, 2, 64)]
