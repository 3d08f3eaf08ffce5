"""The torch.library ops: fa4::fwd and fa4::bwd, their fake (meta) kernels and the autograd glue.

One op pair serves dense and varlen problems: varlen when cu_seqlens_q is given. Dense tensors
are (b, s, h, d) with LSE (b, h, s_q); varlen tensors are (total, h, d) with LSE (h, total_q).
The CPU kernels are fa4.reference; the CUDA kernels call the compiled extension (fa4._C) when
it covers the problem, else the reference with one warning (dispatch.kernel_for).

fa4::fwd's serving arguments (seqused_q, page_table, cache_batch_idx, leftpad_k, learnable_sink,
num_splits) come last, with defaults, so that earlier positional callers keep working; the
compiled fa4::_fwd_kernel takes them in its own order (_fwd_cuda maps one to the other).
fa4::bwd has none of them: Note [serving backward].
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import debug, dispatch, fp8_cache, reference, reference_fp8, value_checks

_OPTS = "causal softmax_scale window_left window_right softcap deterministic backend".split()


def _ref_kwargs(causal, softmax_scale, window_left, window_right, softcap):
    return dict(
        causal=causal,
        softmax_scale=softmax_scale,
        window_size=(window_left, window_right),
        softcap=softcap,
    )


def _ref_fwd(q, k, v, cu_q, cu_k, seqused_k, kw, serving=None):
    """The reference forward, returned as the op promises: out in q's dtype, contiguous.
    serving: Serving (the op's serving arguments) or None."""
    sv = serving or NO_SERVING
    if q.dtype == fp8_cache.E4M3:
        return _ref_fwd_fp8(q, k, v, cu_q, cu_k, seqused_k, kw, sv)
    sink = sv.learnable_sink
    out_dtype, post = q.dtype, None
    if k.dtype in fp8_cache.FP8_DTYPES:
        q, k, v, post = _fp8_for_reference(q, k, v, sv)
    if cu_q is not None:
        out, lse = reference.attention_varlen_ref(
            q, k, v, cu_q, cu_k, seqused_k=seqused_k, seqused_q=sv.seqused_q,
            page_table=sv.page_table, learnable_sink=sink, **kw,
        )  # fmt: skip
    elif not _kv_indexed(seqused_k, sv):
        out, lse = reference.attention_ref(q, k, v, learnable_sink=sink, **kw)
    else:
        out, lse = reference.attention_kvcache_ref(
            q, k, v, seqused_k, cache_batch_idx=sv.cache_batch_idx, leftpad_k=sv.leftpad_k,
            page_table=sv.page_table, learnable_sink=sink, **kw,
        )  # fmt: skip
    if post is not None:
        out = out.float() * post
    return out.to(out_dtype).contiguous(), lse.to(_lse_dtype(q)).contiguous()


def _ref_fwd_fp8(q, k, v, cu_q, cu_k, seqused_k, kw, sv):
    """The FP8 forward (e4m3 q, k, v) on the reference: fp32 attention on the dequantized inputs
    (fa4.reference_fp8), out bf16, LSE fp32."""
    descales = (sv.q_descale, sv.k_descale, sv.v_descale)
    if cu_q is None:
        out, lse = reference_fp8.attention_fp8_ref(q, k, v, *descales, **kw)
    else:
        out, lse = reference_fp8.attention_fp8_varlen_ref(
            q, k, v, cu_q, cu_k, *descales, seqused_k=seqused_k, **kw
        )
    return out.contiguous(), lse.contiguous()


def _out_dtype(q):
    """fa4::fwd's out dtype: q's, except bf16 for the FP8 forward (e4m3 q)."""
    return fp8_cache.FP8_OUT_DTYPE if q.dtype == fp8_cache.E4M3 else q.dtype


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


class Serving(NamedTuple):
    """fa4::fwd's serving arguments, in its schema's order (after backend)."""

    seqused_q: Tensor | None = None
    page_table: Tensor | None = None
    cache_batch_idx: Tensor | None = None
    leftpad_k: Tensor | None = None
    learnable_sink: Tensor | None = None
    num_splits: int = 0
    k_descale: Tensor | None = None  # an FP8 cache's or the FP8 forward's descales (fp8_cache)
    v_descale: Tensor | None = None
    q_descale: Tensor | None = None  # the FP8 forward's (e4m3 q)


NO_SERVING = Serving()


def _fp8_for_reference(q, k, v, sv: Serving):
    """An FP8 cache as the reference reads it: k, v in fp32 and k's descale folded into q (the
    score of sequence b, kv head h is (q . k) k_descale[b, h]); returns them and the per-head
    factor of the output (v_descale), or None."""
    h, h_kv = q.shape[2], k.shape[2]
    q = q.float() if q.dtype != torch.float64 else q
    if sv.k_descale is not None:
        q = q * sv.k_descale.to(q.dtype).repeat_interleave(h // h_kv, dim=1)[:, None, :, None]
    post = None
    if sv.v_descale is not None:
        post = sv.v_descale.repeat_interleave(h // h_kv, dim=1)[:, None, :, None]
    return q, k.to(q.dtype), v.to(q.dtype), post


def takes_decode(cu_k, seqused_k, sv: Serving, arch: str) -> bool:
    """csrc/decode/plan.h takes_decode: the serving arguments, or a sink on SM100."""
    return (
        any(t is not None for t in (sv.seqused_q, sv.page_table, sv.cache_batch_idx, sv.leftpad_k))
        or (seqused_k is not None and cu_k is None)
        or sv.num_splits > 1
        or (sv.learnable_sink is not None and arch == "sm100")
    )


def _check_data(q, k, cu_q, cu_k, seqused_k, max_q, max_k, sv=NO_SERVING):
    """The value rules of value_checks.check_*_data (one host read of the index tensors;
    skipped while a CUDA graph is captured)."""
    if cu_q is not None:
        value_checks.check_varlen_data(
            cu_q, cu_k, seqused_k, q.shape[0], k.shape[0], max_q, max_k,
            seqused_q=sv.seqused_q, page_table=sv.page_table, page_shape=k.shape[:2],
        )  # fmt: skip
    elif _kv_indexed(seqused_k, sv):
        value_checks.check_kvcache_data(
            seqused_k, sv.leftpad_k, sv.cache_batch_idx, sv.page_table, k, q.shape[0]
        )


def _kv_indexed(seqused_k, sv: Serving) -> bool:
    """Whether a dense-q call reads k/v as a KV cache (Note [kv cache keys] in reference.py)."""
    return any(t is not None for t in (seqused_k, sv.page_table, sv.cache_batch_idx, sv.leftpad_k))


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
    seqused_q: Tensor | None = None,
    page_table: Tensor | None = None,
    cache_batch_idx: Tensor | None = None,
    leftpad_k: Tensor | None = None,
    learnable_sink: Tensor | None = None,
    num_splits: int = 0,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    q_descale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    sv = Serving(
        seqused_q, page_table, cache_batch_idx, leftpad_k, learnable_sink, num_splits, k_descale,
        v_descale, q_descale,
    )  # fmt: skip
    _check_data(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, sv)
    kw = _ref_kwargs(causal, softmax_scale, window_left, window_right, softcap)
    # num_splits changes only the kernels' summation order: the reference ignores it.
    return _ref_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, kw, sv)


@fwd.register_kernel("cuda")
def fwd_route(q, k, v, cu_q, cu_k, seqused_k, sv: Serving, backend: str) -> str | None:
    """The kernel _fwd_cuda runs for these CUDA tensors: "decode" (csrc/decode), the prefill
    family "sm90" / "sm100", or None for the fp32 reference. Varlen with no sequence
    (cu_seqlens = [0]) has nothing to compute and the C++ API wants batch >= 1, so its empty
    outputs come from the reference. fa4.support routes its matrix cells through it."""
    if cu_q is not None and cu_q.shape[0] < 2:
        return None
    arch = dispatch.kernel_for(q, v, backend, "fwd", (q, k, v))
    if arch is None or q.dtype == fp8_cache.E4M3:  # the FP8 forward: the prefill kernel's
        return arch
    fp8 = k.dtype == fp8_cache.FP8_KV_DTYPE  # Note [fp8 cache]: the decode kernel's alone
    return "decode" if fp8 or takes_decode(cu_k, seqused_k, sv, arch) else arch


def _fwd_cuda(
    q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, wl, wr, softcap, det, backend,
    seqused_q=None, page_table=None, cache_batch_idx=None, leftpad_k=None, learnable_sink=None,
    num_splits=0, k_descale=None, v_descale=None, q_descale=None,
):  # fmt: skip
    sv = Serving(
        seqused_q, page_table, cache_batch_idx, leftpad_k, learnable_sink, num_splits, k_descale,
        v_descale, q_descale,
    )  # fmt: skip
    _check_data(q, k, cu_q, cu_k, seqused_k, max_q, max_k, sv)
    if fwd_route(q, k, v, cu_q, cu_k, seqused_k, sv, backend) is not None:
        knobs = dispatch.runtime_knobs("fwd")  # num_sms, tile_schedule, tile_order
        # fa4::_fwd_kernel's order (csrc/api/bindings.cpp); for e4m3 q (the FP8 forward) the op
        # allocates the bf16 out itself.
        # debug.guard: the op itself, or in a bring-up build the op and a hang check
        return debug.guard(torch.ops.fa4._fwd_kernel)(
            q, k, v, cu_q, cu_k, seqused_k, sv.seqused_q, sv.page_table, sv.cache_batch_idx,
            sv.leftpad_k, sv.learnable_sink, max_q, max_k, causal, scale, wl, wr, softcap, det,
            sv.num_splits, *knobs, sv.k_descale, sv.v_descale, sv.q_descale,
        )  # fmt: skip
    kw = _ref_kwargs(causal, scale, wl, wr, softcap)
    return _ref_fwd(q, k, v, cu_q, cu_k, seqused_k, kw, sv)


@fwd.register_fake
def _fwd_fake(q, k, v, cu_q, *args, **kwargs):
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],), dtype=_out_dtype(q))
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
    no_batch = cu_q is not None and cu_q.shape[0] < 2  # as in _fwd_cuda
    arch = None if no_batch else dispatch.kernel_for(q, v, backend, "bwd", (dout, q, k, v, out))
    if arch is not None:
        knobs = dispatch.runtime_knobs("bwd")  # num_sms, tile_schedule, bwd_tile_order
        return debug.guard(torch.ops.fa4._bwd_kernel)(
            dout, q, k, v, out, lse, dlse, cu_q, cu_k, seqused_k, max_q, max_k, *opts[:-1], *knobs
        )
    kw = _ref_kwargs(causal, scale, wl, wr, softcap)
    return _ref_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, seqused_k, kw)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, *rest = inputs
    opts, sv = rest[: len(_OPTS)], Serving(*rest[len(_OPTS) :])
    check_differentiable(cu_q, seqused_k, sv, q)
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, sv.seqused_q, sv.learnable_sink)
    ctx.max_seqlens = (max_q, max_k)
    ctx.opts = opts
    ctx.n_inputs = len(inputs)
    # An unused LSE's gradient stays None instead of a zero tensor of LSE's size, which autograd
    # would allocate and fill, and the backward's preprocess would read, on every step (1 MiB in
    # the bench's shapes: likely the 1 MiB by which our peak backward memory exceeded
    # flash-attn-4's at its causal points in docs/perf.md; not yet re-measured).
    ctx.set_materialize_grads(False)


def check_differentiable(cu_q, seqused_k, sv: Serving, q=None) -> None:
    """Note [serving backward]: the paged and KV-cache forms of fa4::fwd are forward only, and so
    is the FP8 forward (e4m3 q; fp8_cache.check_fwd says it first)."""
    if q is not None and q.dtype == fp8_cache.E4M3:
        dispatch.fail("q", "the FP8 forward (float8_e4m3fn q, k, v) has no backward")
    for name in ("page_table", "cache_batch_idx", "leftpad_k"):
        if getattr(sv, name) is not None:
            dispatch.fail(
                name,
                "the paged / KV-cache forward has no backward: call it under torch.no_grad() "
                "or torch.inference_mode(), or detach the inputs",
            )
    if cu_q is None and seqused_k is not None:
        dispatch.fail("seqused_k", "the dense KV-cache forward has no backward")


def _seqused_q_rows(cu_q, seqused_q, n_rows, align_end):
    """Note [seqused_q backward]: (src, used) over the packed query rows, device ops only (no
    host sync). Row r of sequence b (local index t, length L, U = seqused_q[b] used rows) takes
    row cu_q[b] + (t + U) % L when align_end, a rotation that moves the used rows to the end
    of their segment; src is None otherwise. used: whether row r (after the rotation) is used."""
    rows = torch.arange(n_rows, device=cu_q.device, dtype=torch.int64)
    last = seqused_q.shape[0] - 1
    seq = torch.searchsorted(cu_q[1:], rows.to(cu_q.dtype), right=True).clamp_(max=last)
    start = cu_q.long()[seq]
    t, length, n_used = rows - start, cu_q.long()[seq + 1] - start, seqused_q.long()[seq]
    if not align_end:
        return None, t < n_used
    return start + (t + n_used) % length.clamp(min=1), t >= length - n_used


def _seqused_q_inputs(cu_q, seqused_q, opts, q, out, lse, dout, dlse):
    """Note [seqused_q backward]: the backward's q, out, lse, dout and dlse for a forward with
    seqused_q. fa4::bwd has no seqused_q: it gets lse = +inf and dout = 0 on the unused rows,
    so that P = exp(S - lse) = 0 there (zero dq, nothing into dk and dv). Causal and local masks
    are aligned on the used rows of each sequence (as FA3), but the backward aligns them on the
    whole segment of cu_seqlens_q; so with such a mask every segment is rotated to put its used
    rows last, where the bottom-right alignment puts them at the forward's offsets, and dq is
    rotated back by the caller (src)."""
    align_end = dispatch.window_bounded(opts[0], opts[2], opts[3])  # causal, left, right
    src, used = _seqused_q_rows(cu_q, seqused_q, lse.shape[-1], align_end)
    if src is not None:
        q, out, dout, lse = q[src], out[src], dout[src], lse[:, src]
        dlse = None if dlse is None else dlse[:, src]
    lse = torch.where(used, lse, torch.full_like(lse, math.inf))
    dout = dout * used.view(-1, 1, 1).to(dout.dtype)
    return src, q, out, lse, dout, dlse


def _grads(run_bwd, ctx, dout, dlse):
    """The gradients of fwd's inputs, computed by run_bwd (the op fa4::bwd, or its CUDA function
    on the eager path of Note [eager autograd path]).

    Note [serving backward]: fa4::bwd knows none of the serving arguments. A learnable sink is in
    the forward's LSE, which is all the backward of q, k, v needs; the sink's own gradient is
    computed here (reference.learnable_sink_grad: device ops in fp32). seqused_q: Note
    [seqused_q backward]. The paged and KV-cache forms have no backward (check_differentiable)."""
    q, k, v, out, lse, cu_q, cu_k, seqused_k, seqused_q, sink = ctx.saved_tensors
    nones = (None,) * (ctx.n_inputs - 3)
    if dout is None and dlse is None:
        return (None, None, None) + nones
    if dout is None:  # a loss on the LSE alone
        dout = torch.zeros_like(out)
    src = None
    if seqused_q is not None:
        src, q, out, lse, dout, dlse = _seqused_q_inputs(
            cu_q, seqused_q, ctx.opts, q, out, lse, dout, dlse
        )
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
    if src is not None:
        dq = torch.empty_like(dq).index_copy_(0, src, dq)
    grads = [dq, dk, dv, *nones]
    if sink is not None and ctx.needs_input_grad[_SINK_INPUT]:
        grads[_SINK_INPUT] = reference.learnable_sink_grad(dout, out, lse, sink, dlse=dlse)
    return tuple(grads)


# The position of learnable_sink among fa4::fwd's inputs.
_SINK_INPUT = 8 + len(_OPTS) + Serving._fields.index("learnable_sink")


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
        check_differentiable(args[3], args[5], Serving(*args[8 + len(_OPTS) :]), args[0])
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
    q,
    k,
    v,
    opts: dispatch.Options,
    cu_q=None,
    cu_k=None,
    seqused_k=None,
    max_q=0,
    max_k=0,
    serving: Serving = NO_SERVING,
):
    args = (
        q, k, v, cu_q, cu_k, seqused_k, max_q, max_k,
        opts.causal, opts.softmax_scale, opts.window_left, opts.window_right,
        opts.softcap, opts.deterministic, opts.backend, *serving,
    )  # fmt: skip
    seen = (q, k, v) if serving.learnable_sink is None else (q, k, v, serving.learnable_sink)
    # direct_call_ok and eager_autograd_ok are the switches the tests and
    # tools/host_overhead.py turn off to time and compare the op's path.
    if q.is_cuda and direct_call_ok(*seen):
        return _fwd_cuda(*args)
    if q.is_cuda and eager_autograd_ok(*seen):
        return _EagerAttention.apply(*args)
    return fwd(*args)
