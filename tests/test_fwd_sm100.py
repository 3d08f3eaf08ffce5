"""SM100 forward kernel against the fp32 reference (tolerance rule of DESIGN.md §5), on a B200.

Compiled, not executed: no Blackwell GPU is available to this project, so these tests skip here
with the reason; they are the SM90 forward's cases (test_fwd_sm90.DENSE, varlen, seqused_k,
strided inputs, repeatability) through backend="sm100" and run unchanged on a CC 10.0 device.
"""

import pytest
import torch
from helpers import assert_tolerance
from test_fwd_sm90 import DENSE, check, make, poison

import fa4
from fa4 import build_info, reference

pytestmark = [pytest.mark.gpu, pytest.mark.sm100]

HDIMS = [(64, 64), (96, 96), (128, 128), (192, 192), (192, 128)]  # fwd_sm100.cu: no hd 256 yet


def _sm100_hdims():
    return [tuple(p) for p in build_info.KERNELS.get("fwd", {}).get("sm100", [])]


@pytest.fixture(autouse=True)
def _needs_sm100_kernel():  # the device check is conftest's (marker sm100)
    if torch.cuda.get_device_capability() != (10, 0):
        pytest.skip("the SM100 forward is dispatched on CC 10.0 only")
    if not _sm100_hdims():
        pytest.skip(f"no SM100 forward kernel in this build: {build_info.CONFIG.get('reason')}")


def run(q, k, v, **kw):
    poison()
    return fa4.attention(q, k, v, return_lse=True, backend="sm100", **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(DENSE)))
@pytest.mark.parametrize("hdims", HDIMS, ids=lambda p: f"d{p[0]}x{p[1]}")
def test_dense(hdims, case, dtype):
    if hdims not in _sm100_hdims():
        pytest.skip(f"head dims {hdims} not compiled (FA4_HDIMS)")
    b, s_q, s_k, h, h_kv, kw = DENSE[case]
    d, d_v = hdims
    q, k, v = make((b, s_q, h, d), (b, s_k, h_kv, d), d_v, dtype, seed=case * 31 + d)
    out, lse = run(q, k, v, **kw)
    check(q, k, v, out, lse, **kw)


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (50, 10)}])
def test_varlen(kw):
    d, d_v = _sm100_hdims()[0]
    lens_q = [0, 1, 17, 300, 129, 0, 1013]
    lens_k = [5, 0, 40, 300, 128, 0, 900]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32).cuda()
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32).cuda()
    q, k, v = make((sum(lens_q), 4, d), (sum(lens_k), 2, d), d_v, torch.bfloat16, seed=5)
    poison()
    out, lse = fa4.attention_varlen(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True, backend="sm100", **kw
    )
    ref, ref_lse = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, **kw)
    pt, pt_lse = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, upcast=False, **kw)
    assert_tolerance("out", out, ref, pt, q.dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def test_varlen_seqused_k():
    d, d_v = _sm100_hdims()[0]
    cu = torch.tensor([0, 200, 533, 597], dtype=torch.int32).cuda()
    used = torch.tensor([150, 333, 1], dtype=torch.int32).cuda()
    q, k, v = make((597, 2, d), (597, 2, d), d_v, torch.bfloat16, seed=6)
    poison()
    out, lse = fa4.attention_varlen(
        q, k, v, cu, cu, 333, 333, seqused_k=used, causal=True, return_lse=True, backend="sm100"
    )
    kw = {"seqused_k": used, "causal": True}
    ref, ref_lse = reference.attention_varlen_ref(q, k, v, cu, cu, **kw)
    pt, pt_lse = reference.attention_varlen_ref(q, k, v, cu, cu, upcast=False, **kw)
    assert_tolerance("out", out, ref, pt, q.dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def test_non_contiguous_heads_and_large_batch_heads():
    """Strided q (a slice of a packed qkv tensor) and more tiles than the grid has CTAs."""
    d, _ = _sm100_hdims()[0]
    qkv = torch.randn(64, 130, 3, 16, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    out, lse = run(q, k, v, causal=True)
    check(q, k, v, out, lse, causal=True)


def test_repeatable():
    """Same inputs, same bits: a moving result would mean a race."""
    d, d_v = _sm100_hdims()[0]
    q, k, v = make((4, 2048, 8, d), (4, 2048, 8, d), d_v, torch.bfloat16, seed=9)
    first = run(q, k, v, causal=True)
    for _ in range(3):
        again = run(q, k, v, causal=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
