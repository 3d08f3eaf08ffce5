"""fa4.kvcache.append_rotary on the CPU (its torch path): bit for bit against the naive
per-element reference of tests/kvcache_helpers.py (FA3's rules), and every validation error."""

import re

import pytest
import torch
from kvcache_helpers import make_case, naive

from fa4 import kvcache


def run(case):
    args, kw = case.args()
    q_used = kvcache.append_rotary(*args, **kw)
    return q_used, args[1], args[2], args


def check(case):
    q_used, k_cache, v_cache, args = run(case)
    q_ref, k_ref, v_ref = naive(case)
    assert torch.equal(q_used, q_ref), "q rotated"
    assert torch.equal(k_cache, k_ref), "k_cache after the append"
    assert torch.equal(v_cache, v_ref), "v_cache after the append"
    return q_used, args


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 8, 0])
def test_dense(dtype, interleaved, rotary_dim):
    check(make_case(dtype=dtype, interleaved=interleaved, rotary_dim=rotary_dim, seed=1))


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("s_q", [1, 3])
def test_q_rotation_position(per_row, s_q):
    check(make_case(per_row=per_row, s_q=s_q, seed=2))


@pytest.mark.parametrize("s_new", [1, 5, 0])
def test_new_lengths(s_new):
    check(make_case(s_new=s_new, seed=3))


@pytest.mark.parametrize("page_size", [1, 16, 256])
@pytest.mark.parametrize("interleaved", [False, True])
def test_paged_shuffled(page_size, interleaved):
    check(make_case(page_size=page_size, interleaved=interleaved, s_cache=40, seed=4))


@pytest.mark.parametrize("page_size", [None, 16])
def test_cache_batch_idx(page_size):
    check(make_case(batch_idx=True, page_size=page_size, b=3, seed=5))


@pytest.mark.parametrize("page_size", [None, 4])
def test_leftpad_moves_nothing(page_size):
    """FA3: cache_leftpad changes neither the write position nor the rotary position."""
    case = make_case(leftpad=True, page_size=page_size, seqlens=[7, 3], per_row=True, seed=6)
    assert case.kw["cache_leftpad"].tolist() != [0, 0]
    q_used, _ = check(case)
    del case.kw["cache_leftpad"]
    assert torch.equal(run(case)[0], q_used)


def test_zero_length_caches():
    check(make_case(seqlens=[0, 0], page_size=4, seed=7))
    check(make_case(seqlens=[0, 0], seed=7))


@pytest.mark.parametrize("seqlens", [[16, 32], [15, 31], [17, 11]])
def test_page_boundaries(seqlens):
    """Appends that start on a page boundary, end on one, or cross one (page size 16)."""
    check(make_case(seqlens=seqlens, s_cache=48, page_size=16, s_new=5, seed=8))
    check(make_case(seqlens=[s - 4 for s in seqlens], s_cache=48, page_size=16, s_new=4, seed=9))


def test_full_cache():
    """The append may fill the cache to its last row."""
    check(make_case(seqlens=[19, 0], s_cache=24, s_new=5, seed=10))


def test_rotary_only_q():
    case = make_case(new_kv=False, per_row=True, seed=11)
    check(case)


def test_nothing_to_do_returns_q():
    case = make_case(new_kv=False, rotary_dim=0, seed=12)
    q_used, k_cache, v_cache, args = run(case)
    assert q_used is args[0]
    assert torch.equal(k_cache, case.k_cache) and torch.equal(v_cache, case.v_cache)


def test_append_without_rotary_returns_q():
    case = make_case(rotary_dim=0, seed=13)
    q_used, args = check(case)
    assert q_used is args[0]


def test_rotary_dim_two_and_full():
    check(make_case(d=16, rotary_dim=2, seed=14))
    check(make_case(d=16, rotary_dim=2, interleaved=True, seed=14))
    check(make_case(d=16, d_v=16, rotary_dim=16, seed=15))


def test_strided_inputs():
    """q and k_new as views of wider tensors (row strides that are not the contiguous ones)."""
    case = make_case(seed=16)
    case.q = torch.cat([case.q, case.q], dim=2)[:, :, ::2]
    case.k_new = torch.cat([case.k_new, case.k_new], dim=-1)[..., :16]
    assert not case.q.is_contiguous() and not case.k_new.is_contiguous()
    check(case)


def test_rotate_nan_outside_table():
    """The torch rotation gives NaN in the rotated dims outside the table, as the kernel does."""
    x = torch.randn(1, 2, 1, 8)
    cos, sin = torch.ones(3, 2), torch.zeros(3, 2)
    out = kvcache.rotate(x, cos, sin, torch.tensor([[2, 3]]), False)
    assert torch.equal(out[0, 0], x[0, 0])
    assert out[0, 1, 0, :4].isnan().all() and torch.equal(out[0, 1, 0, 4:], x[0, 1, 0, 4:])


def test_kernel_not_used_on_cpu():
    case = make_case(seed=17)
    args, kw = case.args()
    assert not kvcache._kernel_fits(*args[:5], kw["rotary_cos"], kw["rotary_sin"], False)


def test_traces_without_data_checks_on_meta():
    """The shape rules alone run on meta tensors (no data read): what a CUDA call costs."""
    case = make_case(page_size=16, batch_idx=True, seed=18)
    args, kw = case.args(device="meta")
    out = kvcache.append_rotary(*args, **kw)
    assert out.shape == case.q.shape and out.device.type == "meta"


# Validation: every rule raises ValueError / TypeError "fa4: <arg>: <rule>".


def raises(exc, arg, *words):
    pattern = ".*".join(re.escape(w) for w in (f"fa4: {arg}:", *words))
    return pytest.raises(exc, match=pattern)


def call(case, **changes):
    args, kw = case.args()
    names = ["q", "k_cache", "v_cache", "k_new", "v_new", "cache_seqlens"]
    pos = dict(zip(names, args, strict=True))
    for k, v in changes.items():
        (pos if k in pos else kw)[k] = v
    return kvcache.append_rotary(*pos.values(), **kw)


BAD = [
    # (changes, exception, argument, words of the rule)
    ({"q": "q"}, TypeError, "q", "expected a torch.Tensor"),
    ({"q": torch.zeros(2, 3, 4)}, ValueError, "q", "expected 4 dims"),
    ({"q": torch.zeros(2, 3, 4, 16, dtype=torch.float64)}, TypeError, "q", "not supported"),
    ({"q": torch.zeros(2, 3, 16, 4).to(torch.bfloat16).transpose(2, 3)}, ValueError, "q",
     "last dimension must be contiguous"),
    ({"k_cache": torch.zeros(2, 24, 2, 16)}, TypeError, "k_cache", "differs from q.dtype"),
    ({"k_cache": torch.zeros(2, 24, 2, 8, dtype=torch.bfloat16)}, ValueError, "k_cache",
     "head dim 8 must equal q's 16"),
    ({"v_cache": torch.zeros(2, 23, 2, 8, dtype=torch.bfloat16)}, ValueError, "v_cache",
     "must match k_cache's"),
    ({"k_cache": torch.zeros(3, 24, 2, 16, dtype=torch.bfloat16),
      "v_cache": torch.zeros(3, 24, 2, 8, dtype=torch.bfloat16)}, ValueError, "k_cache",
     "batch 3 must equal q's 2 without cache_batch_idx"),
    ({"cache_seqlens": None}, ValueError, "cache_seqlens", "required"),
    ({"cache_seqlens": [1, 2]}, TypeError, "cache_seqlens", "expected a torch.Tensor"),
    ({"cache_seqlens": torch.zeros(2, dtype=torch.int64)}, TypeError, "cache_seqlens", "int32"),
    ({"cache_seqlens": torch.zeros(3, dtype=torch.int32)}, ValueError, "cache_seqlens",
     "expected shape (2,)"),
    ({"cache_seqlens": torch.zeros(2, 2, dtype=torch.int32)}, ValueError, "cache_seqlens",
     "expected a contiguous (b,)"),
    ({"v_new": None}, ValueError, "v_new", "k_new and v_new go together"),
    ({"k_new": None}, ValueError, "k_new", "k_new and v_new go together"),
    ({"k_new": torch.zeros(2, 5, 3, 16, dtype=torch.bfloat16)}, ValueError, "k_new",
     "expected shape (2, 5, 2, 16)"),
    ({"v_new": torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16)}, ValueError, "v_new",
     "expected shape (2, 5, 2, 8)"),
    ({"k_new": torch.zeros(2, 5, 2, 16)}, TypeError, "k_new", "differs from q.dtype"),
    ({"k_new": torch.zeros(2, 5, 2, 16, dtype=torch.bfloat16, device="meta")}, ValueError,
     "k_new", "device meta differs"),
    ({"rotary_sin": None}, ValueError, "rotary_sin", "cos and sin go together"),
    ({"rotary_cos": None}, ValueError, "rotary_cos", "cos and sin go together"),
    ({"rotary_cos": torch.zeros(30, 4)}, TypeError, "rotary_cos", "differs from q.dtype"),
    ({"rotary_cos": torch.zeros(30, 4, 1, dtype=torch.bfloat16)}, ValueError, "rotary_cos",
     "expected (seqlen_ro, rotary_dim / 2)"),
    ({"rotary_cos": torch.zeros(30, 2, dtype=torch.bfloat16)}, ValueError, "rotary_sin",
     "must equal rotary_cos's"),
    ({"rotary_cos": torch.zeros(30, 9, dtype=torch.bfloat16),
      "rotary_sin": torch.zeros(30, 9, dtype=torch.bfloat16)}, ValueError, "rotary_cos",
     "rotary_dim = 2 * 9 in [2, head dim 16]"),
    ({"rotary_cos": torch.zeros(0, 4, dtype=torch.bfloat16),
      "rotary_sin": torch.zeros(0, 4, dtype=torch.bfloat16)}, ValueError, "rotary_cos",
     "needs a row"),
    ({"rotary_interleaved": 1}, TypeError, "rotary_interleaved", "expected bool"),
    ({"rotate_q_per_row": None}, TypeError, "rotate_q_per_row", "expected bool"),
    ({"cache_batch_idx": torch.zeros(2, dtype=torch.int64)}, TypeError, "cache_batch_idx",
     "int32"),
    ({"cache_leftpad": torch.zeros(3, dtype=torch.int32)}, ValueError, "cache_leftpad",
     "expected shape (2,)"),
    ({"page_table": torch.zeros(2, 3, dtype=torch.int32).t()}, ValueError, "page_table",
     "contiguous rows"),
    ({"page_table": torch.zeros(3, 3, dtype=torch.int32)}, ValueError, "page_table",
     "expected 2 rows"),
    ({"page_table": torch.zeros(2, 3, dtype=torch.float32)}, TypeError, "page_table", "int32"),
]  # fmt: skip


@pytest.mark.parametrize("changes, exc, arg, words", BAD, ids=[f"{b[2]}-{i}" for i, b in
                                                                enumerate(BAD)])  # fmt: skip
def test_validation(changes, exc, arg, words):
    with raises(exc, arg, words):
        call(make_case(seed=20), **changes)


def test_validation_paged_page_size():
    case = make_case(page_size=4, seed=21)
    with raises(ValueError, "k_cache", "page size (dim 1) must be >= 1"):
        call(case, k_cache=case.k_cache[:, :0], v_cache=case.v_cache[:, :0])


# The data rules, checked on CPU tensors.


def test_negative_seqlen():
    with raises(ValueError, "cache_seqlens", "entries must be >= 0, got -1"):
        call(make_case(seqlens=[-1, 0], seed=22))


def test_append_past_the_cache():
    with raises(ValueError, "k_new", "cache_seqlens[b] + s_new must be <= 24 (the cache length)"):
        call(make_case(seqlens=[20, 0], seed=23))
    with raises(ValueError, "k_new", "<= 24 (max_pages * page_size)"):
        call(make_case(seqlens=[20, 0], page_size=8, seed=23))


def test_leftpad_range():
    case = make_case(seqlens=[3, 4], seed=24)
    for pad in ([4, 0], [-1, 0]):
        with raises(ValueError, "cache_leftpad", "entries must be in [0, cache_seqlens[b]]"):
            call(case, cache_leftpad=torch.tensor(pad, dtype=torch.int32))


def test_batch_idx_range():
    case = make_case(batch_idx=True, seed=25)
    with raises(ValueError, "cache_batch_idx", "entries must be in [0, 4) (k_cache's batch)"):
        call(case, cache_batch_idx=torch.tensor([0, 4], dtype=torch.int32))
    case = make_case(batch_idx=True, page_size=8, seed=25)
    with raises(ValueError, "cache_batch_idx", "[0, 4) (page_table rows)"):
        call(case, cache_batch_idx=torch.tensor([-1, 0], dtype=torch.int32))


def test_page_out_of_range():
    case = make_case(page_size=8, seqlens=[0, 9], seed=26)
    bad = case.kw["page_table"].clone()
    bad[1, 1] = case.k_cache.shape[0]
    with raises(ValueError, "page_table", "pages the append writes must be in [0, 9)"):
        call(case, page_table=bad)
    bad[1, 1], bad[1, 2] = 0, -1  # a page past the append is not read
    call(case, page_table=bad)


def test_rotary_past_the_table():
    with raises(ValueError, "rotary_cos", "rotary position 23 is past the table (seqlen_ro 23)"):
        call(make_case(seqlens=[19, 0], seqlen_ro=23, seed=27))
    # q's rows per row reach cache_seqlens + s_q - 1; k's reach cache_seqlens + s_new - 1
    case = make_case(seqlens=[5, 0], s_new=1, s_q=3, per_row=True, seqlen_ro=7, seed=28)
    with raises(ValueError, "rotary_cos", "rotary position 7 is past the table (seqlen_ro 7)"):
        call(case)
    case.kw["rotate_q_per_row"] = False
    check(case)
