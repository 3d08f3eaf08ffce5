"""fa4.flash_attn_interface on an H100/H200: flash-attn's three functions on CUDA tensors run the
SM90 kernels (a fallback to the reference would warn; the warning is an error here) and match
the fp32 reference under the tolerance rule of DESIGN.md §5, with flash-attn's window spellings
(None, shifted, causal clipping), a padded head dim, GQA, varlen and a paged decode step."""

import pytest
import torch
from gpu_helpers import cu_seqlens
from helpers import assert_tolerance

from fa4 import flash_attn_interface as fai
from fa4 import reference

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("error::UserWarning")]

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _needs_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device")


def _rand(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(BF16)


@pytest.mark.parametrize(
    "kw, ref_kw",
    [
        ({"causal": True, "window_size": (64, 64)}, {"causal": True, "window_size": (64, 0)}),
        ({"window_size": (-40, None)}, {"window_size": (-40, -1)}),
        ({"window_size": (None, 16), "softcap": 5.0}, {"window_size": (-1, 16), "softcap": 5.0}),
        ({"causal": True}, {"causal": True}),
    ],
)
@pytest.mark.parametrize("d", [128, 80])
def test_func_forward_and_backward(kw, ref_kw, d):
    q, k, v = _rand(2, 333, 8, d, seed=1), _rand(2, 500, 2, d, seed=2), _rand(2, 500, 2, d, seed=3)
    dout = _rand(2, 333, 8, d, seed=4)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out, lse, _ = fai.flash_attn_func(*leaves, return_attn_probs=True, **kw)
    out.backward(dout)
    ref, ref_lse = reference.attention_ref(q, k, v, **ref_kw)
    pt, pt_lse = reference.attention_ref(q, k, v, upcast=False, **ref_kw)
    assert_tolerance("out", out, ref, pt, BF16)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)
    grads = reference.attention_ref_bwd(dout, q, k, v, ref, ref_lse, **ref_kw)
    low = reference.attention_ref_bwd(dout, q, k, v, ref, ref_lse, upcast=False, **ref_kw)
    for name, x, r, lo in zip(("dq", "dk", "dv"), leaves, grads, low, strict=True):
        assert_tolerance(name, x.grad, r, lo, BF16)


def test_varlen_func():
    lens_q, lens_k = [17, 300, 129], [40, 300, 128]
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    q = _rand(sum(lens_q), 4, 64, seed=5)
    k, v = _rand(sum(lens_k), 2, 64, seed=6), _rand(sum(lens_k), 2, 64, seed=7)
    out = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                     window_size=(50, 50))  # fmt: skip
    ref, _ = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True, window_size=(50, 0))
    pt, _ = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True, window_size=(50, 0),
                                           upcast=False)  # fmt: skip
    assert_tolerance("out", out, ref, pt, BF16)


def test_kvcache_paged_decode_step():
    b, page, per, h, h_kv, d = 3, 64, 8, 8, 2, 128
    pool_k, pool_v = _rand(b * per, page, h_kv, d, seed=8), _rand(b * per, page, h_kv, d, seed=9)
    table = torch.randperm(b * per, device="cuda").to(torch.int32).view(b, per)
    seqlens = torch.tensor([500, 1, 130], dtype=torch.int32, device="cuda")
    q = _rand(b, 1, h, d, seed=10)
    out = fai.flash_attn_with_kvcache(q, pool_k, pool_v, cache_seqlens=seqlens, block_table=table,
                                      causal=True)  # fmt: skip
    for i in range(b):
        n = int(seqlens[i])
        k = pool_k[table[i].long()].reshape(1, per * page, h_kv, d)[:, :n]
        v = pool_v[table[i].long()].reshape(1, per * page, h_kv, d)[:, :n]
        ref, _ = reference.attention_ref(q[i : i + 1], k, v, causal=True)
        pt, _ = reference.attention_ref(q[i : i + 1], k, v, causal=True, upcast=False)
        assert_tolerance("out", out[i : i + 1], ref, pt, BF16)
