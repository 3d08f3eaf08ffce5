"""Every validation rule of the inference API (docs/inference.md "Validation") raises
`fa4: <argument>: <rule>` (ValueError / TypeError) before any work, on CPU tensors."""

import re

import pytest
import torch
from helpers import randn

import fa4
from fa4 import dispatch, value_checks

BF16 = torch.bfloat16
I32 = torch.int32


def cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=I32)


def raises(exc, *words):
    return pytest.raises(exc, match="fa4: " + ".*".join(re.escape(w) for w in words))


def _paged(b=2, ps=16, max_pages=3, num_pages=8, h=4):
    q = randn(b * 2, h, 64)
    pool = randn(num_pages, ps, 2, 64)
    pt = torch.arange(b * max_pages, dtype=I32).view(b, max_pages)
    return q, pool, pt


def _varlen_paged(**over):
    q, pool, pt = _paged()
    kw = dict(
        q=q,
        k=pool,
        v=pool,
        cu_seqlens_q=cu([2, 2]),
        cu_seqlens_k=None,
        max_seqlen_q=2,
        max_seqlen_k=48,
        seqused_k=torch.tensor([20, 48], dtype=I32),
        page_table=pt,
    )
    kw.update(over)
    return lambda: fa4.attention_varlen(**kw)


def _varlen(**over):
    q, k = randn(7, 4, 64), randn(9, 2, 64)
    kw = dict(
        q=q,
        k=k,
        v=k,
        cu_seqlens_q=cu([3, 4]),
        cu_seqlens_k=cu([4, 5]),
        max_seqlen_q=4,
        max_seqlen_k=5,
    )
    kw.update(over)
    return lambda: fa4.attention_varlen(**kw)


def _kvcache(paged=False, **over):
    q = randn(2, 3, 4, 64)
    if paged:
        kc = randn(8, 16, 2, 64)
        over.setdefault("page_table", torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32))
    else:
        kc = randn(2, 40, 2, 64)
    kw = dict(q=q, k_cache=kc, v_cache=kc.clone(), cache_seqlens=torch.tensor([5, 9], dtype=I32))
    kw.update(over)
    return lambda: fa4.attention_with_kvcache(**kw)


def _rot(n=64, half=16, dtype=BF16):
    return torch.randn(n, half).to(dtype), torch.randn(n, half).to(dtype)


def _kvnew(s_new=2, d=64, b=2, h_kv=2):
    return {"k_new": randn(b, s_new, h_kv, d), "v_new": randn(b, s_new, h_kv, d)}


S4 = torch.zeros(4)
BAD = {
    # sink
    "sink_dtype": (
        lambda: fa4.attention(
            *(randn(1, 4, 4, 64) for _ in range(3)), learnable_sink=torch.zeros(4, dtype=BF16)
        ),
        TypeError,
        ["learnable_sink", "dtype must be torch.float32"],
    ),
    "sink_shape": (
        lambda: fa4.attention(
            *(randn(1, 4, 4, 64) for _ in range(3)), learnable_sink=torch.zeros(2)
        ),
        ValueError,
        ["learnable_sink", "shape must be (heads of q,) = (4,)"],
    ),
    "sink_type": (
        lambda: fa4.attention(*(randn(1, 4, 4, 64) for _ in range(3)), learnable_sink=[0.0] * 4),
        TypeError,
        ["learnable_sink", "torch.Tensor"],
    ),
    "sink_noncontig": (
        _varlen(learnable_sink=torch.zeros(8)[::2]),
        ValueError,
        ["learnable_sink", "contiguous"],
    ),
    "sink_kvcache_shape": (
        _kvcache(learnable_sink=torch.zeros(4, 1)),
        ValueError,
        ["learnable_sink", "shape"],
    ),
    # seqused_q
    "seqused_q_dtype": (
        _varlen(seqused_q=torch.tensor([1, 2])),
        TypeError,
        ["seqused_q", "torch.int32"],
    ),
    "seqused_q_len": (
        _varlen(seqused_q=torch.tensor([1], dtype=I32)),
        ValueError,
        ["seqused_q", "length 1 != batch 2"],
    ),
    "seqused_q_value": (
        _varlen(seqused_q=torch.tensor([4, 1], dtype=I32)),
        ValueError,
        ["seqused_q", "[0, length of query sequence i]", "[4, 1]"],
    ),
    "seqused_q_negative": (
        _varlen(seqused_q=torch.tensor([1, -1], dtype=I32)),
        ValueError,
        ["seqused_q", "[0, length"],
    ),
    # num_splits
    "num_splits_negative": (_varlen(num_splits=-1), ValueError, ["num_splits", ">= 0"]),
    "num_splits_type": (_varlen(num_splits=2.0), TypeError, ["num_splits", "int"]),
    "num_splits_bool": (_kvcache(num_splits=True), TypeError, ["num_splits", "int"]),
    # paged varlen
    "paged_cu_k": (
        _varlen_paged(cu_seqlens_k=cu([20, 48])),
        ValueError,
        ["cu_seqlens_k", "must be None with a page_table"],
    ),
    "paged_no_seqused": (
        _varlen_paged(seqused_k=None),
        ValueError,
        ["seqused_k", "required with a page_table"],
    ),
    "page_table_dtype": (
        _varlen_paged(page_table=torch.zeros(2, 3, dtype=torch.int64)),
        TypeError,
        ["page_table", "torch.int32"],
    ),
    "page_table_1d": (
        _varlen_paged(page_table=torch.zeros(6, dtype=I32)),
        ValueError,
        ["page_table", "2 dims (batch, max_pages)"],
    ),
    "page_table_rows": (
        _varlen_paged(page_table=torch.zeros(3, 3, dtype=I32)),
        ValueError,
        ["page_table", "3 rows, expected batch = 2"],
    ),
    "page_table_stride": (
        _varlen_paged(page_table=torch.zeros(2, 6, dtype=I32)[:, ::2]),
        ValueError,
        ["page_table", "rows must be contiguous"],
    ),
    "page_table_type": (
        _varlen_paged(page_table=[[0, 1, 2]] * 2),
        TypeError,
        ["page_table", "torch.Tensor"],
    ),
    "paged_k_3d": (
        _varlen_paged(k=randn(8, 2, 64), v=randn(8, 2, 64)),
        ValueError,
        ["k", "expected 4 dims"],
    ),
    "page_size_0": (
        _varlen_paged(k=randn(8, 0, 2, 64), v=randn(8, 0, 2, 64)),
        ValueError,
        ["k", "page_size", ">= 1"],
    ),
    "paged_max_seqlen_k": (
        _varlen_paged(max_seqlen_k=49),
        ValueError,
        ["max_seqlen_k", "49 exceeds", "capacity", "= 48"],
    ),
    "paged_seqused_capacity": (
        _varlen_paged(seqused_k=torch.tensor([20, 49], dtype=I32)),
        ValueError,
        ["seqused_k", "max_pages * page_size = 48"],
    ),
    "paged_seqused_max_k": (
        _varlen_paged(seqused_k=torch.tensor([20, 48], dtype=I32), max_seqlen_k=40),
        ValueError,
        ["max_seqlen_k", "40 is less than the longest key sequence 48"],
    ),
    "page_entry_out_of_pool": (
        _varlen_paged(page_table=torch.tensor([[0, 8, 2], [3, 4, 5]], dtype=I32)),
        ValueError,
        ["page_table", "entry [0, 1] = 8", "keys [0, 20) of sequence 0", "[0, num_pages = 8)"],
    ),
    "page_entry_negative": (
        _varlen_paged(page_table=torch.tensor([[0, 1, 2], [3, -1, 5]], dtype=I32)),
        ValueError,
        ["page_table", "entry [1, 1] = -1"],
    ),
    # attention_with_kvcache
    "cache_seqlens_type": (_kvcache(cache_seqlens=3.0), TypeError, ["cache_seqlens", "int"]),
    "cache_seqlens_bool": (_kvcache(cache_seqlens=True), TypeError, ["cache_seqlens", "int"]),
    "cache_seqlens_negative_int": (
        _kvcache(cache_seqlens=-1),
        ValueError,
        ["cache_seqlens", ">= 0"],
    ),
    "cache_seqlens_dtype": (
        _kvcache(cache_seqlens=torch.tensor([1, 2])),
        TypeError,
        ["cache_seqlens", "torch.int32"],
    ),
    "cache_seqlens_len": (
        _kvcache(cache_seqlens=torch.tensor([1, 2, 3], dtype=I32)),
        ValueError,
        ["cache_seqlens", "length 3 != batch 2"],
    ),
    "cache_seqlens_over": (
        _kvcache(cache_seqlens=torch.tensor([5, 41], dtype=I32)),
        ValueError,
        ["cache_seqlens", "capacity", "[5, 41]"],
    ),
    "cache_seqlens_int_over": (
        _kvcache(cache_seqlens=39, **_kvnew()),
        ValueError,
        ["cache_seqlens", "39 + 2 exceeds the cache's capacity 40"],
    ),
    "cache_seqlens_append_over": (
        _kvcache(cache_seqlens=torch.tensor([5, 39], dtype=I32), **_kvnew()),
        ValueError,
        ["cache_seqlens", "entries + s_new (2)", "capacity"],
    ),
    "cache_seqlens_negative": (
        _kvcache(cache_seqlens=torch.tensor([-1, 3], dtype=I32)),
        ValueError,
        ["cache_seqlens", "[0, 40]"],
    ),
    "k_cache_batch": (
        _kvcache(k_cache=randn(3, 40, 2, 64), v_cache=randn(3, 40, 2, 64)),
        ValueError,
        ["k_cache", "batch 3 differs from q's 2"],
    ),
    "k_cache_3d": (_kvcache(k_cache=randn(40, 2, 64)), ValueError, ["k_cache", "4 dims"]),
    "v_cache_dtype": (
        _kvcache(v_cache=torch.zeros(2, 40, 2, 64)),
        TypeError,
        ["v", "dtype", "differs from q.dtype"],
    ),
    "batch_idx_dtype": (
        _kvcache(cache_batch_idx=torch.tensor([0, 1])),
        TypeError,
        ["cache_batch_idx", "torch.int32"],
    ),
    "batch_idx_len": (
        _kvcache(cache_batch_idx=torch.tensor([0], dtype=I32)),
        ValueError,
        ["cache_batch_idx", "length 1 != batch 2"],
    ),
    "batch_idx_range": (
        _kvcache(cache_batch_idx=torch.tensor([0, 2], dtype=I32)),
        ValueError,
        ["cache_batch_idx", "[0, 2)", "[0, 2]"],
    ),
    "batch_idx_paged_range": (
        _kvcache(paged=True, cache_batch_idx=torch.tensor([2, 0], dtype=I32)),
        ValueError,
        ["cache_batch_idx", "[0, 2)"],
    ),
    "leftpad_dtype": (
        _kvcache(cache_leftpad=torch.tensor([0, 1], dtype=torch.int16)),
        TypeError,
        ["cache_leftpad", "torch.int32"],
    ),
    "leftpad_over": (
        _kvcache(cache_leftpad=torch.tensor([6, 0], dtype=I32)),
        ValueError,
        ["cache_leftpad", "[0, cache_seqlens[i]]", "[6, 0]"],
    ),
    "leftpad_negative": (
        _kvcache(cache_leftpad=torch.tensor([0, -2], dtype=I32)),
        ValueError,
        ["cache_leftpad", "[0, cache_seqlens[i]]"],
    ),
    "kv_page_table_rows": (
        _kvcache(paged=True, page_table=torch.zeros(3, 3, dtype=I32)),
        ValueError,
        ["page_table", "3 rows, expected batch = 2"],
    ),
    "kv_page_table_dtype": (
        _kvcache(paged=True, page_table=torch.zeros(2, 3)),
        TypeError,
        ["page_table", "torch.int32"],
    ),
    "kv_page_entry": (
        _kvcache(paged=True, page_table=torch.tensor([[0, 1, 2], [9, 4, 5]], dtype=I32)),
        ValueError,
        ["page_table", "entry [1, 0] = 9", "[0, num_pages = 8)"],
    ),
    "kv_page_entry_append": (
        _kvcache(
            paged=True,
            cache_seqlens=torch.tensor([5, 15], dtype=I32),
            page_table=torch.tensor([[0, 1, 2], [3, -1, 5]], dtype=I32),
            **_kvnew(),
        ),
        ValueError,
        ["page_table", "entry [1, 1] = -1", "keys [0, 17)"],
    ),
    "kv_paged_capacity": (
        _kvcache(paged=True, cache_seqlens=49),
        ValueError,
        ["cache_seqlens", "capacity 48"],
    ),
    "k_new_alone": (
        _kvcache(k_new=randn(2, 1, 2, 64)),
        ValueError,
        ["v_new", "k_new and v_new go together"],
    ),
    "k_new_shape": (
        _kvcache(k_new=randn(2, 1, 4, 64), v_new=randn(2, 1, 4, 64)),
        ValueError,
        ["k_new", "(batch, s_new, h_kv, d) = (2, 1, 2, 64)"],
    ),
    "v_new_shape": (
        _kvcache(k_new=randn(2, 1, 2, 64), v_new=randn(2, 2, 2, 64)),
        ValueError,
        ["v_new", "shape (2, 2, 2, 64)"],
    ),
    "k_new_dtype": (
        _kvcache(k_new=torch.zeros(2, 1, 2, 64), v_new=randn(2, 1, 2, 64)),
        TypeError,
        ["k_new", "dtype"],
    ),
    "k_new_3d": (
        _kvcache(k_new=randn(2, 2, 64), v_new=randn(2, 2, 64)),
        ValueError,
        ["k_new", "4 dims"],
    ),
    "rotary_cos_alone": (
        _kvcache(rotary_cos=_rot()[0], **_kvnew()),
        ValueError,
        ["rotary_sin", "go together"],
    ),
    "rotary_dtype": (
        _kvcache(
            rotary_cos=_rot(dtype=torch.float32)[0],
            rotary_sin=_rot(dtype=torch.float32)[1],
            **_kvnew(),
        ),
        TypeError,
        ["rotary_cos", "must equal q.dtype"],
    ),
    "rotary_1d": (
        _kvcache(
            rotary_cos=torch.zeros(64, dtype=BF16),
            rotary_sin=torch.zeros(64, dtype=BF16),
            **_kvnew(),
        ),
        ValueError,
        ["rotary_cos", "2 dims"],
    ),
    "rotary_shapes_differ": (
        _kvcache(rotary_cos=_rot()[0], rotary_sin=_rot(half=8)[1], **_kvnew()),
        ValueError,
        ["rotary_sin", "differs"],
    ),
    "rotary_dim_over_d": (
        _kvcache(rotary_cos=_rot(half=33)[0], rotary_sin=_rot(half=33)[1], **_kvnew()),
        ValueError,
        ["rotary_cos", "rotary_dim <= headdim 64", "got rotary_dim 66"],
    ),
    "rotary_noncontig": (
        _kvcache(
            rotary_cos=torch.zeros(16, 64, dtype=BF16).t(),
            rotary_sin=torch.zeros(16, 64, dtype=BF16).t(),
            **_kvnew(),
        ),
        ValueError,
        ["rotary_cos", "contiguous"],
    ),
    "rotary_interleaved_type": (
        _kvcache(rotary_interleaved=1),
        TypeError,
        ["rotary_interleaved", "bool"],
    ),
    "rotary_too_short_int": (
        _kvcache(cache_seqlens=30, rotary_cos=_rot(31)[0], rotary_sin=_rot(31)[1], **_kvnew()),
        ValueError,
        ["rotary_cos", "seqlen_ro = 31", "32 are needed"],
    ),
    "rotary_too_short_causal_q": (
        _kvcache(rotary_cos=_rot(11)[0], rotary_sin=_rot(11)[1], causal=True, **_kvnew()),
        ValueError,
        ["rotary_cos", "seqlen_ro = 11", "up to", "= 11"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input(case):
    call, exc, words = BAD[case]
    with raises(exc, *words):
        call()


def test_rotary_window_q_needs_rows_for_every_q_position():
    """Non-causal, non-local: q sits at cache_seqlens only (1 row past it); causal or windowed:
    at cache_seqlens + i (s_q rows). The check accepts exactly the needed length."""
    cos, sin = _rot(12)
    q = randn(2, 3, 4, 64)
    kc = randn(2, 40, 2, 64)
    seqlens = torch.tensor([5, 9], dtype=I32)  # 9 + 3 = 12 rows needed when per row
    kw = dict(rotary_cos=cos, rotary_sin=sin)
    assert (
        dispatch.rotary_span(
            q, 0, dispatch._check_options(q, False, None, (-1, -1), 0.0, False, "auto")
        )
        == 1
    )
    value_checks.check_cache_append_data(seqlens, 0, None, None, None, kc, cos, 3)
    with raises(ValueError, "rotary_cos", "seqlen_ro = 12", "= 12"):
        value_checks.check_cache_append_data(seqlens + 1, 0, None, None, None, kc, cos, 3)
    with raises(ValueError, "rotary_cos", "seqlen_ro = 11"):
        fa4.attention_with_kvcache(
            q,
            kc,
            kc,
            seqlens,
            window_size=(4, 0),
            **dict(kw, rotary_cos=cos[:11], rotary_sin=sin[:11]),
        )


def test_value_checks_are_skipped_under_graph_capture(monkeypatch):
    """The value rules read the index tensors; while a CUDA graph is captured they cannot, and are
    skipped (shape rules still apply)."""
    monkeypatch.setattr(value_checks, "_host", lambda *ts: None)
    q, pool, pt = _paged()
    bad = torch.tensor([[0, 8, 2], [3, 4, 5]], dtype=I32)
    value_checks.check_varlen_data(
        cu([2, 2]),
        None,
        torch.tensor([20, 48], dtype=I32),
        4,
        8,
        2,
        48,
        page_table=bad,
        page_shape=pool.shape[:2],
    )
    value_checks.check_kvcache_data(torch.tensor([20, 48], dtype=I32), None, None, bad, pool, 2)
    with raises(ValueError, "cache_batch_idx", "is required when page_table rows (2)"):
        value_checks.check_kvcache_data(torch.tensor([20], dtype=I32), None, None, bad, pool, 1)


def test_page_entries_past_the_keys_are_not_checked():
    """Note [page check fast path]: a table with an out-of-pool entry (-1 or num_pages, as
    engines pad) takes the exact check, which looks only at the pages the keys touch: padding
    past cache_seqlens passes and gives the clean table's result, while the same entry on a
    touched page fails."""
    q, kc = randn(2, 3, 4, 64), randn(8, 16, 2, 64)
    lens = torch.tensor([5, 15], dtype=I32)

    def call(pt, seqlens=lens):
        return fa4.attention_with_kvcache(
            q, kc, kc, seqlens, page_table=torch.tensor(pt, dtype=I32)
        )

    clean = call([[0, 1, 2], [3, 4, 5]])
    for pad in (-1, 8):
        assert torch.equal(call([[0, 1, pad], [3, 4, pad]]), clean)
        with raises(ValueError, "page_table", f"entry [0, 1] = {pad}"):
            call([[0, pad, 2], [3, 4, 5]], torch.tensor([17, 15], dtype=I32))
