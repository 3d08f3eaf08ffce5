"""CUDA tensors where no kernel covers the problem (float32 inputs, or SM100 on an H200): the
reference fallback, loud explicit backends; and the binding's path into the C++ API."""

import warnings

import pytest
import torch
from helpers import assert_tolerance, randn

import fa4
from fa4 import build_info, dispatch, reference

pytestmark = pytest.mark.gpu


def cuda_qkv(s=300, h=4, h_kv=2, d=128, dtype=torch.float32):
    g = torch.Generator().manual_seed(11)
    q = randn(2, s, h, d, dtype=dtype, generator=g).cuda().requires_grad_()
    k = randn(2, s + 17, h_kv, d, dtype=dtype, generator=g).cuda().requires_grad_()
    v = randn(2, s + 17, h_kv, d, dtype=dtype, generator=g).cuda().requires_grad_()
    return q, k, v


def test_auto_falls_back_to_reference_with_one_warning():
    """float32 has no kernel (kernels take 16-bit inputs): fwd and bwd each warn once."""
    dispatch._warned.clear()
    q, k, v = cuda_qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fa4.attention(q, k, v, causal=True)
        out.sum().backward()
        fa4.attention(q, k, v, causal=True).sum().backward()
    fallback = [str(w.message) for w in caught if "running the reference" in str(w.message)]
    assert len(fallback) == 2, fallback
    assert any(" fwd " in m for m in fallback) and any(" bwd " in m for m in fallback), fallback
    assert out.is_cuda and out.dtype == torch.float32
    ref, _ = reference.attention_ref(q.detach().cpu().double(), k.detach().cpu().double(),
                                     v.detach().cpu().double(), causal=True)  # fmt: skip
    assert (out.detach().cpu().double() - ref).abs().max().item() < 1e-5
    assert q.grad.is_cuda and torch.isfinite(q.grad).all()


def test_explicit_backend_without_kernel_raises():
    q, k, v = cuda_qkv()
    for backend in ("sm90", "sm100"):  # float32: no kernel takes it, rejected before any op
        with pytest.raises(TypeError, match=f"float32 not supported by backend '{backend}'"):
            fa4.attention(q, k, v, backend=backend)
    q, k, v = (x.detach().to(torch.bfloat16) for x in (q, k, v))
    other = "sm100" if torch.cuda.get_device_capability() != (10, 0) else "sm90"
    with pytest.raises(RuntimeError, match=f"{other}.*cannot run this fwd"):
        fa4.attention(q, k, v, backend=other)


@pytest.mark.skipif(not build_info.CONFIG.get("built"), reason="fa4._C not built in this install")
def test_binding_reaches_cpp_api():
    """Calls the compiled ops directly: tensors become Fwd/BwdParams and validate() judges them;
    with a kernel for the device, the gradients are the reference's; without one, run_bwd
    reports kUnsupported (never a fake result). The last three arguments are the knobs
    (dispatch.runtime_knobs): all SMs, the stream's tile counter, the default tile order; an
    unknown tile order token is refused by validate(), naming the variable the text stands for."""
    q, k, v = (x.detach().to(torch.bfloat16) for x in cuda_qkv())
    # max_seqlen_q / _k, causal, scale, window, softcap, deterministic: both ops take these
    common = (0, 0, True, 0.088, -1, 0, 0.0, False)
    # cu_seqlens_q / _k, seqused_k / _q, page_table, cache_batch_idx, leftpad_k, learnable_sink;
    # then num_splits and the knobs
    args = (q, k, v, *[None] * 8, *common, 0, 0, 0, "")
    bad = (q, k[:, :, :1].expand(-1, -1, 3, -1), v[:, :, :1].expand(-1, -1, 3, -1), *args[3:])
    with pytest.raises(RuntimeError, match="fa4 \\(invalid\\).*heads"):  # 4 % 3: C++ validate()
        torch.ops.fa4._fwd_kernel(*bad)
    with pytest.raises(RuntimeError, match="fa4 \\(invalid\\): FA4_TILE_ORDER=first,bogus: its"):
        torch.ops.fa4._fwd_kernel(*args[:-1], "first,bogus")
    with pytest.raises(RuntimeError, match="tile_schedule=3 must be 0"):
        torch.ops.fa4._fwd_kernel(*args[:-2], 3, "")
    with pytest.raises(RuntimeError, match="num_sms=-1 must be >= 0"):
        torch.ops.fa4._fwd_kernel(*args[:-3], -1, 0, "")
    # The backward's inputs need only their shapes here: validate() refuses before any launch.
    out0, lse0 = torch.zeros_like(q), torch.zeros(2, 4, 300, device="cuda")
    bwd0 = (torch.zeros_like(q), q, k, v, out0, lse0, None, None, None, None, *common, 0, 0)
    with pytest.raises(RuntimeError, match="fa4 \\(invalid\\): FA4_BWD_TILE_ORDER=l2,: its"):
        torch.ops.fa4._bwd_kernel(*bwd0, "l2,")
    arch = {(9, 0): "sm90", (10, 0): "sm100"}.get(torch.cuda.get_device_capability())
    has_fwd = arch is not None and build_info.missing_kernel(arch, "fwd", (128, 128)) is None
    if not has_fwd:
        with pytest.raises(RuntimeError, match="fa4 \\(unsupported\\)"):
            torch.ops.fa4._fwd_kernel(*args)
        return
    out, lse = torch.ops.fa4._fwd_kernel(*args)
    dout = torch.randn_like(out)
    bwd_args = (dout, q, k, v, out, lse, None, None, None, None, *common, 0, 0, "")
    if build_info.missing_kernel(arch, "bwd", (128, 128)) is not None:
        with pytest.raises(RuntimeError, match="fa4 \\(unsupported\\)"):
            torch.ops.fa4._bwd_kernel(*bwd_args)
        return
    got = torch.ops.fa4._bwd_kernel(*bwd_args)
    kw = {"causal": True, "softmax_scale": 0.088}
    ref_out, ref_lse = reference.attention_ref(q, k, v, **kw)
    ref = reference.attention_ref_bwd(dout, q, k, v, ref_out, ref_lse, **kw)
    low = reference.attention_ref_bwd(dout, q, k, v, ref_out, ref_lse, upcast=False, **kw)
    for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low, strict=True):
        assert_tolerance(name, g, r, lo, torch.bfloat16)
