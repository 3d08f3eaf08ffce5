"""Input rules a new user meets first on CPU: backend="auto"'s warning
off the GPU, torch.compile(dynamic=True), numpy scalars as options, varlen batch 0, and the
dtype error's wording."""

import warnings

import numpy as np
import pytest
import torch

import fa4
from fa4 import dispatch


def rand(*shape, dtype=torch.float32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)
    return t.requires_grad_(requires_grad)


AUTO_CPU = dispatch.AUTO_ON_HOST.format(device="cpu")


def _calls(fn, n=1):
    """fn() n times with every warning recorded; returns the messages."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            fn()
    return caught


# --- backend="auto" on CPU: the reference, with one warning -------------------------------------


def test_auto_on_cpu_warns_once_and_runs_the_reference():
    """README / docs/design.md: "auto" on CPU tensors runs the reference and warns once."""
    q, k, v = (rand(1, 12, 2, 64, seed=i) for i in range(3))
    dispatch._warned.discard(AUTO_CPU)
    caught = _calls(lambda: fa4.attention(q, k, v, causal=True), n=3)
    said = [str(w.message) for w in caught]
    assert said == [AUTO_CPU], said
    assert "backend='auto'" in said[0] and "reference" in said[0] and "cpu" in said[0]
    # it names the user's line, not one inside fa4
    assert caught[0].filename == __file__, caught[0].filename
    # once per process: later auto calls (dense or varlen) stay silent
    cu = torch.tensor([0, 12], dtype=torch.int32)
    assert not _calls(lambda: fa4.attention_varlen(q[0], k[0], v[0], cu, cu, 12, 12))
    out = fa4.attention(q, k, v, causal=True)
    assert torch.equal(out, fa4.attention(q, k, v, causal=True, backend="reference"))


@pytest.mark.parametrize("entry", ["attention", "attention_varlen", "attention_with_kvcache"])
def test_auto_warning_from_every_entry_point(entry):
    q, k, v = (rand(1, 6, 2, 64, seed=i) for i in range(3))
    cu = torch.tensor([0, 6], dtype=torch.int32)
    call = {
        "attention": lambda be: fa4.attention(q, k, v, backend=be),
        "attention_varlen": lambda be: fa4.attention_varlen(
            q[0], k[0], v[0], cu, cu, 6, 6, backend=be
        ),
        "attention_with_kvcache": lambda be: fa4.attention_with_kvcache(q, k, v, 6, backend=be),
    }[entry]
    dispatch._warned.discard(AUTO_CPU)
    assert not _calls(lambda: call("reference"))  # the explicit choice is silent
    said = [str(w.message) for w in _calls(lambda: call("auto"), n=2)]
    assert said == [AUTO_CPU], said


def test_compiled_auto_on_cpu_does_not_break_the_graph():
    """The warning is given by eager calls only: fullgraph compilation traces past it."""
    torch._dynamo.reset()
    dispatch._warned.discard(AUTO_CPU)
    q = rand(1, 9, 2, 64)
    f = torch.compile(lambda q: fa4.attention(q, q, q, causal=True), fullgraph=True)
    assert torch.equal(f(q), fa4.attention(q, q, q, causal=True, backend="reference"))


# --- torch.compile(fullgraph=True, dynamic=True) ------------------------------------------------


@pytest.mark.parametrize("scale", [None, 0.2])
def test_compile_dynamic_two_shapes(scale):
    """dynamic=True makes the default softmax_scale (head dim ** -0.5) and float options symbolic;
    validation must trace them (math.isfinite cannot) and give the eager results on each shape."""
    torch._dynamo.reset()
    f = torch.compile(fa4.attention, fullgraph=True, dynamic=True)
    kw = dict(causal=True, softmax_scale=scale, softcap=0.5, window_size=(7, 0), return_lse=True)
    for s_q, s_k in ((16, 19), (24, 40)):
        q = rand(2, s_q, 4, 64, seed=s_q, requires_grad=True)
        k = rand(2, s_k, 2, 64, seed=s_k + 1, requires_grad=True)
        v = rand(2, s_k, 2, 64, seed=s_k + 2, requires_grad=True)
        out, lse = f(q, k, v, backend="reference", **kw)
        ref, ref_lse = fa4.attention(q, k, v, backend="reference", **kw)
        assert out.shape == (2, s_q, 4, 64) and lse.shape == (2, 4, s_q)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
        for g, rg in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, rg, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compile_dynamic_still_rejects_bad_options(fullgraph):
    """Traced values are still judged: eager's ValueError without fullgraph (the graph breaks
    at the raise), and with fullgraph dynamo's error at fa4's check (a raise cannot be traced)."""
    torch._dynamo.reset()
    f = torch.compile(fa4.attention, fullgraph=fullgraph, dynamic=True)
    q = rand(1, 8, 2, 64)
    if fullgraph:
        exc, softcap_rule, scale_rule = Exception, "softcap", "softmax_scale"
    else:
        exc, softcap_rule = ValueError, "fa4: softcap: must be finite and >= 0"
        scale_rule = "fa4: softmax_scale: must be finite and > 0"
    with pytest.raises(exc, match=softcap_rule):
        f(q, q, q, softcap=float("nan"), backend="reference")
    with pytest.raises(exc, match=scale_rule):
        f(q, q, q, softmax_scale=-1.0, backend="reference")


def test_finite_matches_math_isfinite():
    for x in (0.0, 1.5, -2.0, 1e308, float("inf"), float("-inf"), float("nan"), 3):
        assert dispatch._finite(x) == np.isfinite(x), x


# --- numpy scalars ------------------------------------------------------------------------------


@pytest.mark.parametrize("ftype", [np.float32, np.float64, np.int64])
def test_numpy_scalars_as_float_options(ftype):
    q, k, v = (rand(1, 10, 2, 64, seed=i) for i in range(3))
    scale, cap = ftype(2), ftype(3)
    out, lse = fa4.attention(q, k, v, softmax_scale=scale, softcap=cap, return_lse=True,
                             backend="reference")  # fmt: skip
    want, want_lse = fa4.attention(q, k, v, softmax_scale=float(scale), softcap=float(cap),
                                   return_lse=True, backend="reference")  # fmt: skip
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    opts = dispatch.check_dense(q, k, v, causal=False, softmax_scale=scale, window_size=(-1, -1),
                                softcap=cap, deterministic=False, backend="reference")  # fmt: skip
    assert type(opts.softmax_scale) is float and type(opts.softcap) is float
    assert (opts.softmax_scale, opts.softcap) == (2.0, 3.0)


@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_numpy_integers_as_window_entries(itype):
    q, k, v = (rand(1, 12, 2, 64, seed=i) for i in range(3))
    window = (itype(3), itype(-1))
    out = fa4.attention(q, k, v, window_size=window, causal=True, backend="reference")
    want = fa4.attention(q, k, v, window_size=(3, -1), causal=True, backend="reference")
    assert torch.equal(out, want)
    opts = dispatch.check_dense(q, k, v, causal=False, softmax_scale=None, window_size=window,
                                softcap=0.0, deterministic=False, backend="reference")  # fmt: skip
    assert (opts.window_left, opts.window_right) == (3, -1)
    assert type(opts.window_left) is int and type(opts.window_right) is int
    shifted = dispatch.check_dense(q, k, v, causal=False, softmax_scale=None, softcap=0.0,
                                   window_size=(itype(-2), None), deterministic=False,
                                   backend="reference")  # fmt: skip
    assert (shifted.window_left, shifted.window_right) == (-2, -1)


@pytest.mark.parametrize(
    "kw, arg",
    [
        ({"softmax_scale": True}, "softmax_scale"),
        ({"softmax_scale": np.bool_(True)}, "softmax_scale"),
        ({"softcap": False}, "softcap"),
        ({"softcap": np.bool_(False)}, "softcap"),
        ({"window_size": (True, 0)}, "window_size"),
        ({"window_size": (np.bool_(True), 0)}, "window_size"),
        ({"window_size": (np.float64(3.0), 0)}, "window_size"),
        ({"softcap": np.complex64(1)}, "softcap"),
        ({"softmax_scale": "0.1"}, "softmax_scale"),
    ],
)
def test_bools_and_non_reals_still_rejected(kw, arg):
    q = rand(1, 4, 2, 64)
    with pytest.raises(TypeError, match=f"fa4: {arg}: "):
        fa4.attention(q, q, q, backend="reference", **kw)


@pytest.mark.parametrize("bad", [np.float32("nan"), np.float64("inf"), np.float64(-0.5)])
def test_numpy_non_finite_or_negative_softcap_rejected(bad):
    q = rand(1, 4, 2, 64)
    with pytest.raises(ValueError, match="softcap"):
        fa4.attention(q, q, q, softcap=bad, backend="reference")


# --- varlen batch 0 -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_batch_zero_returns_empty(dtype):
    """cu_seqlens = [0] with empty q/k/v is batch 0, as dense batch 0 is: empty out and LSE, and
    empty gradients."""
    q = torch.zeros(0, 4, 64, dtype=dtype, requires_grad=True)
    k = torch.zeros(0, 2, 64, dtype=dtype, requires_grad=True)
    v = torch.zeros(0, 2, 64, dtype=dtype, requires_grad=True)
    cu = torch.zeros(1, dtype=torch.int32)
    out, lse = fa4.attention_varlen(q, k, v, cu, cu, 0, 0, causal=True, return_lse=True,
                                    backend="reference")  # fmt: skip
    assert out.shape == (0, 4, 64) and out.dtype == dtype
    assert lse.shape == (4, 0) and lse.dtype == torch.float32
    (out.sum() + lse.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    # dense batch 0 behaves the same way
    dense = fa4.attention(q.detach()[None][:0], k.detach()[None][:0], v.detach()[None][:0],
                          backend="reference")  # fmt: skip
    assert dense.shape == (0, 0, 4, 64)


def test_varlen_batch_zero_with_seqused_and_pages():
    q = torch.zeros(0, 2, 64)
    cu = torch.zeros(1, dtype=torch.int32)
    none = torch.zeros(0, dtype=torch.int32)
    out = fa4.attention_varlen(q, q[:0, :1], q[:0, :1], cu, cu, 0, 0, seqused_k=none,
                               seqused_q=none, backend="reference")  # fmt: skip
    assert out.shape == (0, 2, 64)
    pool = torch.zeros(3, 16, 1, 64)
    out = fa4.attention_varlen(q, pool, pool, cu, None, 0, 0, seqused_k=none,
                               page_table=torch.zeros(0, 2, dtype=torch.int32),
                               backend="reference")  # fmt: skip
    assert out.shape == (0, 2, 64)


def test_varlen_batch_zero_keeps_the_other_rules():
    cu = torch.zeros(1, dtype=torch.int32)
    q = torch.zeros(3, 2, 64)  # three rows but no sequence
    with pytest.raises(ValueError, match=r"cu_seqlens_q.*last entry 0 must equal q.shape\[0\] = 3"):
        fa4.attention_varlen(q, q, q, cu, cu, 0, 0, backend="reference")
    with pytest.raises(ValueError, match=r"cu_seqlens_q.*>= 1 entries"):
        fa4.attention_varlen(q[:0], q[:0], q[:0], cu[:0], cu[:0], 0, 0, backend="reference")
    with pytest.raises(ValueError, match=r"cu_seqlens_k.*length 2 != cu_seqlens_q's 1"):
        fa4.attention_varlen(q[:0], q[:0], q[:0], cu, torch.zeros(2, dtype=torch.int32), 0, 0,
                             backend="reference")  # fmt: skip


# --- the dtype error ----------------------------------------------------------------------------


# float8_e4m3fn is the FP8 forward (tests/api/test_fp8_fwd.py); the other FP8 formats are not.
@pytest.mark.parametrize("dtype", [torch.int32, torch.float8_e5m2, torch.complex64])
def test_dtype_error_names_kernel_and_reference_dtypes(dtype):
    q = torch.zeros(1, 4, 2, 64, dtype=dtype)
    with pytest.raises(TypeError) as info:
        fa4.attention(q, q, q)
    msg = str(info.value)
    assert msg.startswith("fa4: q: dtype") and str(dtype) in msg
    for word in ("kernels", "float16", "bfloat16", "reference", "float32", "float64"):
        assert word in msg, msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_takes_fp32_and_fp64(dtype):
    q = rand(1, 4, 2, 64, dtype=dtype)
    assert fa4.attention(q, q, q, backend="reference").dtype == dtype
