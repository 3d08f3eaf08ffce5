"""The torch.library ops: fa4::fwd and fa4::bwd, their fake (meta) kernels and the autograd glue.

One op pair serves dense and varlen problems: varlen when cu_seqlens_q is given. Dense tensors
are (b, s, h, d) with LSE (b, h, s_q); varlen tensors are (total, h, d) with LSE (h, total_q).
The CPU kernels are fa4.reference; the CUDA kernels call the compiled extension (fa4._C) when
it covers the problem, else the reference with one warning (dispatch.kernel_for).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import dispatch, reference

_OPTS = "causal softmax_scale window_left window_right softcap deterministic backend".split()


def _ref_kwargs(causal, softmax_scale, window_left, window_right, softcap):
    return dict(
        causal=causal,
        softmax_scale=softmax_scale,
        window_size=(window_left, window_right),
        softcap=softcap,
    )


def _ref_fwd(q, k, v, cu_q, cu_k, seqused_k, kw):
    """The reference forward, returned as the op promises: out in q's dtype, contiguous."""
    if cu_q is None:
        out, lse = reference.attention_ref(q, k, v, **kw)
    else:
        out, lse = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, seqused_k=seqused_k, **kw)
    return out.to(q.dtype).contiguous(), lse.to(_lse_dtype(q)).contiguous()


def _ref_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, seqused_k, kw):
    if cu_q is None:
        grads = reference.attention_ref_bwd(dout, q, k, v, out, lse, dlse=dlse, **kw)
    else:
        grads = reference.attention_varlen_ref_bwd(
            dout, q, k, v, out, lse, cu_q, cu_k, seqused_k=seqused_k, dlse=dlse, **kw
        )
    return tuple(g.to(q.dtype).contiguous() for g in grads)


def _lse_dtype(q):
    """LSE is fp32, except for fp64 inputs (reference only), where it keeps fp64 for gradcheck."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _check_data(q, k, cu_q, cu_k, seqused_k, max_q, max_k):
    if cu_q is not None:
        dispatch.check_varlen_data(cu_q, cu_k, seqused_k, q.shape[0], k.shape[0], max_q, max_k)


@torch.library.custom_op("fa4::fwd", mutates_args=(), device_types="cpu")
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    seqused_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    backend: str,
) -> tuple[Tensor, Tensor]:
    _check_data(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    kw = _ref_kwargs(causal, softmax_scale, window_left, window_right, softcap)
    return _ref_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, kw)


@fwd.register_kernel("cuda")
def _fwd_cuda(
    q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, wl, wr, softcap, det, backend
):
    _check_data(q, k, cu_q, cu_k, seqused_k, max_q, max_k)
    arch = dispatch.kernel_for(q, v, backend, "fwd", (q, k, v))
    if arch is not None:
        knobs = dispatch.runtime_knobs("fwd")  # num_sms, tile_schedule, tile_order
        args = (q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, wl, wr, softcap, det)
        return torch.ops.fa4._fwd_kernel(*args, *knobs)
    return _ref_fwd(q, k, v, cu_q, cu_k, seqused_k, _ref_kwargs(causal, scale, wl, wr, softcap))


@fwd.register_fake
def _fwd_fake(q, k, v, cu_q, *args):
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    if cu_q is None:
        b, s_q, h, _ = q.shape
        return out, q.new_empty((b, h, s_q), dtype=_lse_dtype(q))
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=_lse_dtype(q))


@torch.library.custom_op("fa4::bwd", mutates_args=(), device_types="cpu")
def bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    seqused_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    kw = _ref_kwargs(causal, softmax_scale, window_left, window_right, softcap)
    return _ref_bwd(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, seqused_k, kw)


@bwd.register_kernel("cuda")
def _bwd_cuda(dout, q, k, v, out, lse, dlse, cu_q, cu_k, seqused_k, max_q, max_k, *opts):
    causal, scale, wl, wr, softcap, det, backend = opts
    arch = dispatch.kernel_for(q, v, backend, "bwd", (dout, q, k, v, out))
    if arch is not None:
        knobs = dispatch.runtime_knobs("bwd")  # num_sms, tile_schedule, bwd_tile_order
        return torch.ops.fa4._bwd_kernel(
            dout, q, k, v, out, lse, dlse, cu_q, cu_k, seqused_k, max_q, max_k, *opts[:-1], *knobs
        )
    kw = _ref_kwargs(causal, scale, wl, wr, softcap)
    return _ref_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, seqused_k, kw)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, *opts = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k)
    ctx.max_seqlens = (max_q, max_k)
    ctx.opts = opts
    # An unused LSE's gradient stays None instead of a zero tensor of LSE's size, which autograd
    # would allocate and fill, and the backward's preprocess would read, on every step (1 MiB in
    # the bench's shapes: likely the 1 MiB by which our peak backward memory exceeded
    # flash-attn-4's at its causal points in docs/perf.md; not yet re-measured).
    ctx.set_materialize_grads(False)


def _grads(run_bwd, ctx, dout, dlse):
    """The gradients of fwd's inputs, computed by run_bwd (the op fa4::bwd, or its CUDA function
    on the eager path of Note [eager autograd path])."""
    q, k, v, out, lse, cu_q, cu_k, seqused_k = ctx.saved_tensors
    if dout is None and dlse is None:
        return (None,) * (3 + 3 + 2 + len(_OPTS))
    if dout is None:  # a loss on the LSE alone
        dout = torch.zeros_like(out)
    dq, dk, dv = run_bwd(
        dout.contiguous(),
        q,
        k,
        v,
        out,
        lse,
        None if dlse is None else dlse.contiguous(),  # BwdParams: dlse has lse's layout
        cu_q,
        cu_k,
        seqused_k,
        *ctx.max_seqlens,
        *ctx.opts,
    )
    return (dq, dk, dv) + (None,) * (3 + 2 + len(_OPTS))


def _backward(ctx, dout, dlse):
    return _grads(bwd, ctx, dout, dlse)


fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """Note [eager autograd path]: fa4::fwd with the autograd of register_autograd above, minus
    the torch.library layers. Host µs per call on the H200's host (tiny problem,
    tools/host_overhead.py --dir bwd, two calls): a recorded forward 82 / 159 here against 218 /
    328 through the op, its backward (autograd.grad) 206 / 197 against 206 / 240 (the rest of the
    backward's is torch's autograd: docs/decisions.md, 2026-12-03). The backward's host time is
    as long as its kernels at 512 tokens, where a slow host made the bench's backward host-bound
    (its "low mode"). Same CUDA functions, same saved tensors; taken only where nothing but
    autograd sees the call (call_fwd), so torch.compile, dispatch modes and functorch still see
    the op. A second derivative raises, as through the op (fa4::bwd has no autograd)."""

    # forward takes ctx (no setup_context): with a setup_context, Function.apply binds the
    # arguments through inspect.signature on every call.
    @staticmethod
    def forward(ctx, *args):
        output = _fwd_cuda(*args)
        _setup_context(ctx, args, output)
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        return _grads(_bwd_cuda, ctx, dout, dlse)


def _unobserved(*tensors: Tensor) -> bool:
    """Whether nothing but autograd would see the op: torch.compile, a dispatch mode
    (FakeTensorMode, tracing), functorch transforms and tensor subclasses all need it."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return False
    if _get_current_dispatch_mode() is not None:
        return False
    return all(type(t) is Tensor for t in tensors)


def needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def direct_call_ok(*tensors: Tensor) -> bool:
    """Note [inference fast path]: whether the forward may call the op's CUDA kernel function
    itself instead of going through the torch.library op. The op's Python dispatch costs 30 µs
    of host time per call on the H200's host (fa4.attention 46 µs direct, 76 through the op;
    docs/decisions.md, 2026-12-03), which a forward pays on top of its kernel wherever
    the host, not the GPU, is the slower side: small problems, launch-bound loops. (The bench's
    points are not such: the host stays ahead there, and their numbers do not move.) The op is
    still needed wherever something sees it (_unobserved), and a tensor that needs a gradient
    takes Note [eager autograd path] instead. Outside those the op would run the same function."""
    return _unobserved(*tensors) and not needs_grad(*tensors)


def eager_autograd_ok(*tensors: Tensor) -> bool:
    """Note [eager autograd path]: whether a forward that autograd must record may do so through
    _EagerAttention instead of the op."""
    return _unobserved(*tensors) and needs_grad(*tensors)


def call_fwd(
    q, k, v, opts: dispatch.Options, cu_q=None, cu_k=None, seqused_k=None, max_q=0, max_k=0
):
    args = (
        q, k, v, cu_q, cu_k, seqused_k, max_q, max_k,
        opts.causal, opts.softmax_scale, opts.window_left, opts.window_right,
        opts.softcap, opts.deterministic, opts.backend,
    )  # fmt: skip
    # direct_call_ok and eager_autograd_ok are the switches the tests and
    # tools/host_overhead.py turn off to time and compare the op's path.
    if q.is_cuda and direct_call_ok(q, k, v):
        return _fwd_cuda(*args)
    if q.is_cuda and eager_autograd_ok(q, k, v):
        return _EagerAttention.apply(*args)
    return fwd(*args)
