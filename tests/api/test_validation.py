"""Every bad input of DESIGN.md §4 raises ValueError/TypeError naming the argument and the rule."""

import re

import pytest
import torch

import fa4

B, S, H, D = 2, 8, 4, 64


def qkv(dtype=torch.bfloat16, s_k=S, h_kv=H, d=D, d_v=None):
    q = torch.randn(B, S, H, d, dtype=dtype)
    k = torch.randn(B, s_k, h_kv, d, dtype=dtype)
    v = torch.randn(B, s_k, h_kv, d_v or d, dtype=dtype)
    return q, k, v


def varlen_inputs(lens_q=(3, 5), lens_k=(4, 4)):
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), H, D, dtype=torch.bfloat16)
    k = torch.randn(int(cu_k[-1]), H, D, dtype=torch.bfloat16)
    return q, k, k.clone(), cu_q, cu_k, max(lens_q), max(lens_k)


def raises(exc, *words):
    pattern = ".*".join(re.escape(w) for w in words)
    return pytest.raises(exc, match=pattern)


DENSE_CASES = {
    # name: (kwargs of qkv or a callable making (q, k, v), attention kwargs, exception, words)
    "q_dtype_int": (
        lambda: (torch.ones(B, S, H, D, dtype=torch.int32),) * 3,
        {},
        TypeError,
        ["q", "dtype"],
    ),
    "k_dtype_mismatch": (
        lambda: (qkv()[0], *qkv(torch.float16)[1:]),
        {},
        TypeError,
        ["k", "differs from q.dtype"],
    ),
    "v_dtype_mismatch": (
        lambda: (*qkv()[:2], qkv(torch.float16)[2]),
        {},
        TypeError,
        ["v", "differs from q.dtype"],
    ),
    "q_not_tensor": (lambda: ([1.0], *qkv()[1:]), {}, TypeError, ["q", "torch.Tensor"]),
    "q_3d": (lambda: (qkv()[0][0], *qkv()[1:]), {}, ValueError, ["q", "expected 4 dims"]),
    "k_3d": (lambda: (qkv()[0], qkv()[1][0], qkv()[2]), {}, ValueError, ["k", "expected 4 dims"]),
    "last_stride": (
        lambda: (qkv(d=128)[0][..., ::2], *qkv()[1:]),
        {},
        ValueError,
        ["q", "contiguous", "stride 2"],
    ),
    "v_last_stride": (
        lambda: (*qkv()[:2], torch.randn(B, S, H, 2 * D, dtype=torch.bfloat16)[..., ::2]),
        {},
        ValueError,
        ["v", "stride 2"],
    ),
    "hdim_84": (lambda: qkv(d=84), {}, ValueError, ["q", "head dim 84", "multiple of 8"]),
    "hdim_264": (lambda: qkv(d=264), {}, ValueError, ["q", "head dim 264", "8 to 256"]),
    "hdim_v_60": (lambda: qkv(d=128, d_v=60), {}, ValueError, ["v", "head dim 60", "multiple"]),
    "hdim_k_mismatch": (
        lambda: (qkv(d=128)[0], *qkv(d=64)[1:]),
        {},
        ValueError,
        ["k", "head dim 64", "q's 128"],
    ),
    "gqa_ratio": (lambda: qkv(h_kv=3), {}, ValueError, ["heads of q (4)", "multiple", "(3)"]),
    "batch_mismatch": (
        lambda: (torch.randn(B + 1, S, H, D).bfloat16(), *qkv()[1:]),
        {},
        ValueError,
        ["k", "batch"],
    ),
    "kv_shape_mismatch": (
        lambda: (*qkv()[:2], qkv(s_k=S + 1)[2]),
        {},
        ValueError,
        ["v", "must match k"],
    ),
    "causal_type": (qkv, {"causal": 1}, TypeError, ["causal", "bool"]),
    "deterministic_type": (qkv, {"deterministic": "yes"}, TypeError, ["deterministic", "bool"]),
    "scale_negative": (qkv, {"softmax_scale": -1.0}, ValueError, ["softmax_scale", "> 0"]),
    "scale_nan": (qkv, {"softmax_scale": float("nan")}, ValueError, ["softmax_scale", "finite"]),
    "scale_type": (qkv, {"softmax_scale": "0.1"}, TypeError, ["softmax_scale", "float"]),
    "window_len": (qkv, {"window_size": (1, 2, 3)}, TypeError, ["window_size", "pair"]),
    "window_big": (qkv, {"window_size": (2**31, 0)}, ValueError, ["window_size", "int32"]),
    "window_str": (qkv, {"window_size": ("1", 0)}, TypeError, ["window_size", "int or None"]),
    "window_float": (qkv, {"window_size": (1.5, 0)}, TypeError, ["window_size", "int"]),
    "softcap_negative": (qkv, {"softcap": -1.0}, ValueError, ["softcap", ">= 0"]),
    "softcap_inf": (qkv, {"softcap": float("inf")}, ValueError, ["softcap", "finite"]),
    "backend_name": (qkv, {"backend": "cudnn"}, ValueError, ["backend", "one of"]),
    "backend_cpu": (qkv, {"backend": "sm90"}, ValueError, ["backend", "needs CUDA tensors"]),
}


@pytest.mark.parametrize("case", sorted(DENSE_CASES))
def test_dense_bad_input(case):
    make, kw, exc, words = DENSE_CASES[case]
    q, k, v = make()
    with raises(exc, *words):
        fa4.attention(q, k, v, **kw)


@pytest.mark.gpu
def test_device_mismatch():
    q, k, v = qkv()
    with raises(ValueError, "k", "device"):
        fa4.attention(q, k.cuda(), v)


def test_float32_rejected_by_kernel_backends_but_fine_on_reference():
    q, k, v = qkv(torch.float32)
    assert fa4.attention(q, k, v, backend="reference").dtype == torch.float32
    with raises(ValueError, "backend", "needs CUDA"):
        fa4.attention(q, k, v, backend="sm100")


def _varlen_case(mutate):
    args = list(varlen_inputs())
    kw = {}
    mutate(args, kw)
    return args, kw


VARLEN_CASES = {
    "cu_q_int64": (
        lambda a, kw: a.__setitem__(3, a[3].long()),
        TypeError,
        ["cu_seqlens_q", "torch.int32"],
    ),
    "cu_k_float": (
        lambda a, kw: a.__setitem__(4, a[4].float()),
        TypeError,
        ["cu_seqlens_k", "int32"],
    ),
    "cu_q_list": (
        lambda a, kw: a.__setitem__(3, [0, 3, 8]),
        TypeError,
        ["cu_seqlens_q", "torch.Tensor"],
    ),
    "cu_q_2d": (lambda a, kw: a.__setitem__(3, a[3][None]), ValueError, ["cu_seqlens_q", "1-D"]),
    "cu_q_short": (  # [0] is batch 0 (tests/api/test_input_rules.py); [] has no batch
        lambda a, kw: a.__setitem__(3, a[3][:0]),
        ValueError,
        ["cu_seqlens_q", ">= 1 entries"],
    ),
    "cu_len_mismatch": (
        lambda a, kw: a.__setitem__(4, torch.tensor([0, 4], dtype=torch.int32)),
        ValueError,
        ["cu_seqlens_k", "length 2", "3"],
    ),
    "cu_q_not_monotone": (
        lambda a, kw: a.__setitem__(3, torch.tensor([0, 6, 8, 3], dtype=torch.int32)[[0, 1, 3]]),
        ValueError,
        ["cu_seqlens_q", "non-decreasing"],
    ),
    "cu_q_start": (
        lambda a, kw: a.__setitem__(3, torch.tensor([1, 3, 8], dtype=torch.int32)),
        ValueError,
        ["cu_seqlens_q", "start at 0"],
    ),
    "cu_q_total": (
        lambda a, kw: a.__setitem__(3, torch.tensor([0, 3, 7], dtype=torch.int32)),
        ValueError,
        ["cu_seqlens_q", "must equal q.shape[0] = 8"],
    ),
    "cu_k_over": (
        lambda a, kw: a.__setitem__(4, torch.tensor([0, 4, 9], dtype=torch.int32)),
        ValueError,
        ["cu_seqlens_k", "exceeds k.shape[0] = 8"],
    ),
    "max_q_small": (
        lambda a, kw: a.__setitem__(5, 4),
        ValueError,
        ["max_seqlen_q", "longest query", "5"],
    ),
    "max_k_small": (
        lambda a, kw: a.__setitem__(6, 3),
        ValueError,
        ["max_seqlen_k", "longest key", "4"],
    ),
    "max_q_type": (lambda a, kw: a.__setitem__(5, 4.5), TypeError, ["max_seqlen_q", "int"]),
    "seqused_dtype": (
        lambda a, kw: kw.update(seqused_k=torch.tensor([1, 2])),
        TypeError,
        ["seqused_k", "int32"],
    ),
    "seqused_len": (
        lambda a, kw: kw.update(seqused_k=torch.tensor([1], dtype=torch.int32)),
        ValueError,
        ["seqused_k", "length 1", "batch 2"],
    ),
    "seqused_range": (
        lambda a, kw: kw.update(seqused_k=torch.tensor([1, 5], dtype=torch.int32)),
        ValueError,
        ["seqused_k", "entries must lie"],
    ),
    "q_4d": (lambda a, kw: a.__setitem__(0, a[0][None]), ValueError, ["q", "expected 3 dims"]),
}


@pytest.mark.parametrize("case", sorted(VARLEN_CASES))
def test_varlen_bad_input(case):
    mutate, exc, words = VARLEN_CASES[case]
    args, kw = _varlen_case(mutate)
    with raises(exc, *words):
        fa4.attention_varlen(*args, **kw)


def test_varlen_good_input_passes():
    """The base case of the table above is valid, so each failure is due to its one mutation."""
    args, kw = _varlen_case(lambda a, kw: None)
    assert fa4.attention_varlen(*args, **kw).shape == (8, H, D)
    q, k, v = qkv()
    assert fa4.attention(q, k, v).shape == (B, S, H, D)


def test_tma_alignment_rule():
    """Tensors the kernels cannot address with TMA are named before any launch; auto then runs
    the reference (kernel_for), an explicit backend raises."""
    from fa4.dispatch import tma_incompatible

    base = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    assert tma_incompatible(base) is None
    assert tma_incompatible(base[:, :, :1].expand(2, 16, 3, 64)) is None  # stride 0 is fine
    odd = torch.randn(2, 16, 4 * 64 + 4, dtype=torch.bfloat16)[..., : 4 * 64].view(2, 16, 4, 64)
    assert "multiples of 8 elements" in tma_incompatible(odd)  # row stride 260
    shifted = torch.randn(2 * 16 * 4 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 16, 4, 64)
    assert "16-byte aligned" in tma_incompatible(shifted)
    one_row = torch.randn(1, 1, 4, 65, dtype=torch.bfloat16)[..., :64]  # extent-1 dims exempt
    assert "multiples" in tma_incompatible(one_row)  # the head stride (65) still counts


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_unverified_kernel_is_used_with_one_warning(monkeypatch, direction):
    """A kernel that has never run on its hardware (the SM100 forward and backward) is dispatched
    on that hardware, but says so once per process (README's support matrix)."""
    import warnings

    from fa4 import build_info, dispatch

    monkeypatch.setattr(dispatch, "_capability", lambda *_: (10, 0))
    monkeypatch.setattr(build_info, "missing_kernel", lambda *_: None)
    dispatch._warned.clear()
    q = torch.zeros(1, 8, 1, 128, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dispatch.kernel_for(q, q, "auto", direction) == "sm100"
        assert dispatch.kernel_for(q, q, "sm100", direction) == "sm100"
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "never executed" in said[0] and direction in said[0], said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(dispatch, "_capability", lambda *_: (9, 0))
        assert dispatch.kernel_for(q, q, "auto", direction) == "sm90"
    assert not caught
