"""Note [inference fast path] and Note [eager autograd path] (fa4/_ops.py): when nothing needs to
see the torch.library op, the CUDA forward calls the op's kernel function itself, and a forward
that autograd records goes through a plain autograd.Function running the op's CUDA functions.
The predicates and the Function's gradients (on the reference backend) are tested on the CPU;
the results (bitwise those of the op) and CUDA-graph capture on the GPU."""

import pytest
import torch
from helpers import randn
from torch._subclasses.fake_tensor import FakeTensorMode

import fa4
from fa4 import _ops, build_info


def qkv(requires_grad=False):
    g = torch.Generator().manual_seed(5)
    ts = [randn(1, 33, 2, 64, dtype=torch.bfloat16, generator=g) for _ in range(3)]
    return [t.requires_grad_(requires_grad) for t in ts]


def test_direct_call_only_where_nothing_sees_the_op():
    plain = qkv()
    assert _ops.direct_call_ok(*plain)
    grads = qkv(requires_grad=True)
    assert not _ops.direct_call_ok(*grads), "autograd must record the op"
    with torch.no_grad():
        assert _ops.direct_call_ok(*grads), "no grad mode: nothing to record"
    with torch.inference_mode():
        assert _ops.direct_call_ok(*grads)
    with FakeTensorMode():
        assert not _ops.direct_call_ok(*plain), "a dispatch mode must see the op"

    class Sub(torch.Tensor):
        pass

    assert not _ops.direct_call_ok(plain[0].as_subclass(Sub), *plain[1:])
    seen = []

    def probe(x):
        seen.append(_ops.direct_call_ok(x))
        return x

    torch.func.vmap(probe)(plain[0])
    assert seen == [False], "functorch transforms must see the op"


def test_eager_autograd_only_where_only_autograd_sees_the_op():
    grads = qkv(requires_grad=True)
    assert _ops.eager_autograd_ok(*grads)
    assert not _ops.eager_autograd_ok(*qkv()), "nothing to record: the direct call"
    with torch.no_grad():
        assert not _ops.eager_autograd_ok(*grads)
    with FakeTensorMode():
        fake = [torch.empty(1, 33, 2, 64, requires_grad=True) for _ in range(3)]
        assert not _ops.eager_autograd_ok(*fake), "a dispatch mode must see the op"

    class Sub(torch.Tensor):
        pass

    assert not _ops.eager_autograd_ok(grads[0].as_subclass(Sub), *grads[1:])


def reference_args(q, k, v, causal=True):
    return (q, k, v, None, None, None, 0, 0, causal, q.shape[-1] ** -0.5, -1, -1, 0.0, False,
            "reference")  # fmt: skip


@pytest.mark.parametrize("loss", ["out", "lse", "both"])
def test_eager_autograd_function_has_the_ops_gradients(loss):
    """The Function and the op's registered autograd save the same tensors and call the same
    backward (here the reference's, on the CPU): bitwise equal gradients, for a loss on the
    output, on the LSE alone (the backward's zero dout) and on both."""
    grads = []
    for f in (_ops._EagerAttention.apply, _ops.fwd):
        q, k, v = qkv(requires_grad=True)
        out, lse = f(*reference_args(q, k, v))
        losses = {"out": (out.float() ** 2).sum(), "lse": lse.sum()}
        losses["both"] = losses["out"] + losses["lse"]
        grads.append(torch.autograd.grad(losses[loss], (q, k, v)))
        assert all(torch.isfinite(g).all() for g in grads[-1])
        # The LSE does not depend on v: dv is zero for a loss on the LSE alone.
        assert all(g.abs().sum() > 0 for g in grads[-1][: 2 if loss == "lse" else 3])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("path", ["eager", "op"])
def test_second_derivative_raises_on_both_paths(path):
    """Neither path has a second derivative (fa4::bwd has no autograd; the Function's backward is
    once_differentiable): differentiating a gradient raises instead of returning a wrong one."""
    f = _ops._EagerAttention.apply if path == "eager" else _ops.fwd
    q, k, v = qkv(requires_grad=True)
    out, _ = f(*reference_args(q, k, v))
    (dq,) = torch.autograd.grad(out.float().sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dq.float().sum(), (q,))


cuda_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)
    or build_info.missing_kernel("sm90", "fwd", (128, 128)) is not None,
    reason="needs an SM90 GPU and the hd128 sm90 forward in the build",
)  # fmt: skip


def cuda_qkv(requires_grad=False):
    g = torch.Generator().manual_seed(9)
    ts = [randn(2, 300, 4, 128, dtype=torch.bfloat16, generator=g).cuda() for _ in range(3)]
    return [t.requires_grad_(requires_grad) for t in ts]


@pytest.mark.gpu
@cuda_kernel
def test_fast_path_is_bitwise_the_op(monkeypatch):
    q, k, v = cuda_qkv()
    direct = fa4.attention(q, k, v, causal=True, return_lse=True)
    monkeypatch.setattr(_ops, "direct_call_ok", lambda *ts: False)
    through_op = fa4.attention(q, k, v, causal=True, return_lse=True)
    for a, b in zip(direct, through_op, strict=True):
        assert torch.equal(a, b)
    monkeypatch.undo()
    grads = []
    for eager in (True, False):
        monkeypatch.setattr(_ops, "eager_autograd_ok", lambda *ts, e=eager: e)
        q, k, v = cuda_qkv(requires_grad=True)
        out = fa4.attention(q, k, v, causal=True, deterministic=True)
        assert ("_EagerAttention" in type(out.grad_fn).__name__) == eager, type(out.grad_fn)
        out.float().square().sum().backward()
        grads.append((out, q.grad, k.grad, v.grad))
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b)


@pytest.mark.gpu
@cuda_kernel
@pytest.mark.parametrize("grad", [False, True])
def test_cuda_graph_capture_and_replay(grad):
    """The forward captured in a CUDA graph (through the fast path for inputs without grad,
    through Note [eager autograd path] for inputs that need one) replays to the eager result for
    new values copied into the captured inputs."""
    q, k, v = cuda_qkv(requires_grad=grad)
    fa4.attention(q, k, v, causal=True)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa4.attention(q, k, v, causal=True)
    assert (out.grad_fn is not None) == grad
    with torch.no_grad():
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fa4.attention(q, k, v, causal=True))
