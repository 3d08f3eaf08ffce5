"""fa4.distributed on one GPU: an NCCL world of size 1 (the one multi-process transport this
project's single-GPU machines can run), ring_attention forward and backward on the SM90 kernels
against fa4.attention on the same tensors (tolerance rule of DESIGN.md §5 against the fp32
reference), and the ring machinery's overhead timed against the plain call."""

import socket

import pytest
import torch
import torch.distributed as dist
from helpers import assert_tolerance

import fa4
from fa4 import distributed as fd
from fa4 import reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl_world():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device")
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (300, 0)}])
def test_ring_matches_attention(nccl_world, layout, kw):
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 1024, 8, 128, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 1024, 2, 128, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2))  # fmt: skip
    dout = torch.randn_like(q)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out, lse = fd.ring_attention(*leaves, layout=layout, return_lse=True, backend="sm90", **kw)
    out.backward(dout)
    ref, ref_lse = reference.attention_ref(q, k, v, **kw)
    pt, pt_lse = reference.attention_ref(q, k, v, upcast=False, **kw)
    assert_tolerance("out", out, ref, pt, torch.bfloat16)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)
    grads = reference.attention_ref_bwd(dout, q, k, v, ref, ref_lse, **kw)
    low = reference.attention_ref_bwd(dout, q, k, v, ref, ref_lse, upcast=False, **kw)
    for name, x, r, lo in zip(("dq", "dk", "dv"), leaves, grads, low, strict=True):
        assert_tolerance(name, x.grad, r, lo, torch.bfloat16)


def test_ring_overhead_one_rank(nccl_world):
    """World of one: what the ring machinery (chunking, merges, autograd function) adds to the
    plain call at 32k causal tokens, printed; it must not be a multiple of it."""
    from triton.testing import do_bench

    g = torch.Generator(device="cuda").manual_seed(6)
    q, k, v = (torch.randn(1, 32768, 16, 128, device="cuda", generator=g).to(torch.bfloat16)
               for _ in range(3))  # fmt: skip
    ring = do_bench(lambda: fd.ring_attention(q, k, v, causal=True, backend="sm90"), rep=200)
    plain = do_bench(lambda: fa4.attention(q, k, v, causal=True, backend="sm90"), rep=200)
    print(f"ring_attention world 1: {ring:.3f} ms, fa4.attention: {plain:.3f} ms")
    assert ring < 1.5 * plain
