"""CUDA tensors before any kernel exists: the reference fallback, loud explicit backends, and the
binding's path into the C++ API (which must answer kUnsupported, not a fake result)."""

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
        fa4.attention(q, k, v, causal=True)
    fallback = [w for w in caught if "running the reference" in str(w.message)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    assert out.is_cuda and out.dtype == torch.bfloat16
    ref, _ = reference.attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True)
    pt, _ = reference.attention_ref(q, k, v, causal=True, upcast=False)
    assert_tolerance("out", out.cpu(), ref, pt.cpu(), torch.bfloat16)
    out.sum().backward()
    assert q.grad.is_cuda and torch.isfinite(q.grad.float()).all()


def test_explicit_backend_without_kernel_raises():
    q, k, v = cuda_qkv()
    for backend in ("sm90", "sm100"):
        with pytest.raises(RuntimeError, match=f"{backend}.*cannot run this fwd"):
            fa4.attention(q, k, v, backend=backend)


@pytest.mark.skipif(not build_info.CONFIG.get("built"), reason="fa4._C not built in this install")
def test_binding_reaches_cpp_api_and_reports_unsupported():
    """Calls the compiled op directly: tensors become FwdParams, validate() accepts them, and
    run_fwd honestly reports that no kernel is compiled (changes when kernels land)."""
    q, k, v = (x.detach() for x in cuda_qkv())
    args = (q, k, v, None, None, None, 0, 0, True, 0.088, -1, 0, 0.0, False)
    with pytest.raises(RuntimeError, match="fa4 \\(unsupported\\).*no forward kernel"):
        torch.ops.fa4._fwd_kernel(*args)
    bad = (q, k[:, :, :1].expand(-1, -1, 3, -1), v[:, :, :1].expand(-1, -1, 3, -1), *args[3:])
    with pytest.raises(RuntimeError, match="fa4 \\(invalid\\).*heads"):  # 4 % 3: C++ validate()
        torch.ops.fa4._fwd_kernel(*bad)
