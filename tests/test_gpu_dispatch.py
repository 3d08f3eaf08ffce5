"""CUDA tensors where no kernel covers the problem (the backward, or SM100 on an H200): the
reference fallback, loud explicit backends, and the binding's path into the C++ API (which must
answer kUnsupported, not a fake result)."""

import warnings

import pytest
import torch
from helpers import assert_tolerance, randn

import fa4
from fa4 import build_info, dispatch, reference

pytestmark = pytest.mark.gpu


def cuda_qkv(s=300, h=4, h_kv=2, d=128, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(11)
    q = randn(2, s, h, d, dtype=dtype, generator=g).cuda().requires_grad_()
    k = randn(2, s + 17, h_kv, d, dtype=dtype, generator=g).cuda().requires_grad_()
    v = randn(2, s + 17, h_kv, d, dtype=dtype, generator=g).cuda().requires_grad_()
    return q, k, v


def test_auto_falls_back_to_reference_with_one_warning():
    dispatch._warned.clear()
    q, k, v = cuda_qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fa4.attention(q, k, v, causal=True)
        out.sum().backward()  # no backward kernel yet: the reference runs, warning once
        fa4.attention(q, k, v, causal=True).sum().backward()
    fallback = [w for w in caught if "running the reference" in str(w.message)]
    assert len(fallback) == 1 + (build_info.missing_kernel("sm90", "fwd", (128, 128)) is not None)
    assert out.is_cuda and out.dtype == torch.bfloat16
    ref, _ = reference.attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True)
    pt, _ = reference.attention_ref(q, k, v, causal=True, upcast=False)
    assert_tolerance("out", out.cpu(), ref, pt.cpu(), torch.bfloat16)
    assert q.grad.is_cuda and torch.isfinite(q.grad.float()).all()


def test_explicit_backend_without_kernel_raises():
    q, k, v = cuda_qkv()
    cc = torch.cuda.get_device_capability()
    for backend, arch_cc in (("sm90", (9, 0)), ("sm100", (10, 0))):
        if arch_cc != cc or build_info.missing_kernel(backend, "fwd", (128, 128)):
            with pytest.raises(RuntimeError, match=f"{backend}.*cannot run this fwd"):
                fa4.attention(q, k, v, backend=backend)
        else:  # the forward kernel runs; the backward has none yet
            with pytest.raises(RuntimeError, match=f"{backend}.*cannot run this bwd"):
                fa4.attention(q, k, v, backend=backend).sum().backward()


@pytest.mark.skipif(not build_info.CONFIG.get("built"), reason="fa4._C not built in this install")
def test_binding_reaches_cpp_api_and_reports_unsupported():
    """Calls the compiled ops directly: tensors become BwdParams, validate() accepts them, and
    run_bwd honestly reports that no kernel is compiled (changes when the backward lands)."""
    q, k, v = (x.detach() for x in cuda_qkv())
    args = (q, k, v, None, None, None, 0, 0, True, 0.088, -1, 0, 0.0, False)
    out = torch.zeros_like(q)
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], device="cuda")
    bwd_args = (out, q, k, v, out, lse, None, *args[3:])
    with pytest.raises(RuntimeError, match="fa4 \\(unsupported\\).*no backward kernel"):
        torch.ops.fa4._bwd_kernel(*bwd_args)
    bad = (q, k[:, :, :1].expand(-1, -1, 3, -1), v[:, :, :1].expand(-1, -1, 3, -1), *args[3:])
    with pytest.raises(RuntimeError, match="fa4 \\(invalid\\).*heads"):  # 4 % 3: C++ validate()
        torch.ops.fa4._fwd_kernel(*bad)
