"""fa4's FP8 (e4m3) rules, with fa4.dispatch's error format: an FP8 KV cache
(attention_with_kvcache: e4m3 k_cache / v_cache with 16-bit q; Note [fp8 cache] in
csrc/decode/kernel.cuh) and the FP8 forward (attention / attention_varlen: e4m3 q, k and v,
bf16 out; docs/numerics.md "FP8"). Which FP8 uses fa4 has, and the descales' shape."""

from __future__ import annotations

import torch

# The one FP8 format fa4 computes with: e4m3 (an FP8 cache, and q, k, v of the FP8 forward).
FP8_KV_DTYPE = torch.float8_e4m3fn
E4M3 = FP8_KV_DTYPE
FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)
FP8_OUT_DTYPE = torch.bfloat16  # the FP8 forward's output
FP8_FWD_RULE = "the FP8 forward takes float8_e4m3fn q, k and v (all three)"


def _fail(*args):
    from . import dispatch  # imports this module: the error format is read at call time

    dispatch.fail(*args)


def check_fp8(q, k, v, fp8_cache: bool) -> bool:
    """Whether this is an FP8 call: an FP8 cache (fp8_cache: attention_with_kvcache) or the FP8
    forward (all of q, k, v e4m3); raises for every FP8 use fa4 does not have."""
    from . import dispatch

    for name, t in (("q", q), ("k", k), ("v", v))[: 1 if fp8_cache else 3]:
        if t.dtype in FP8_DTYPES and t.dtype != E4M3:
            _fail(
                name,
                f"dtype {t.dtype} not supported: {dispatch.DTYPE_RULE}; FP8 is "
                f"float8_e4m3fn only ({FP8_FWD_RULE}; an FP8 KV cache is e4m3)",
                TypeError,
            )
    if q.dtype == E4M3:
        if fp8_cache:
            _fail(
                "q",
                f"dtype {q.dtype} not supported: {dispatch.DTYPE_RULE}. FP8 queries are "
                "not supported by attention_with_kvcache (an FP8 KV cache takes float16 or "
                f"bfloat16 q); fa4.attention / attention_varlen: {FP8_FWD_RULE}",
                TypeError,
            )
        for name, t in (("k", k), ("v", v)):
            if t.dtype != E4M3:
                _fail(
                    name,
                    f"dtype {t.dtype} with float8_e4m3fn q: {FP8_FWD_RULE}; mixing "
                    "FP8 and 16-bit inputs is not supported",
                    TypeError,
                )
        return True
    if not any(t.dtype in FP8_DTYPES for t in (k, v)):
        return False
    for name, t in (("k", k), ("v", v)):
        if not fp8_cache:
            _fail(
                name,
                f"dtype {t.dtype} with {q.dtype} q: {FP8_FWD_RULE}; FP8 keys and values "
                "with 16-bit q are an FP8 KV cache (attention_with_kvcache)",
                TypeError,
            )
        if t.dtype != E4M3:
            _fail(name, f"dtype {t.dtype}: an FP8 cache is float8_e4m3fn, k and v both", TypeError)
    return True


def _check_descale(name, t, want, q) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dtype != torch.float32:
        _fail(name, f"dtype must be torch.float32, got {t.dtype}", TypeError)
    if tuple(t.shape) != want[1]:
        _fail(name, f"shape {tuple(t.shape)} must be {want[0]} = {want[1]}")
    if t.device != q.device:
        _fail(name, f"device {t.device} differs from q.device {q.device}")


def check_descales(k_descale, v_descale, q, k_cache) -> None:
    """FA3's descales of an FP8 cache: float32 (batch, kv heads), true value = stored x descale
    of the sequence's kv head; None = 1."""
    fp8 = k_cache.dtype == E4M3
    want = ("(batch, kv heads)", (q.shape[0], k_cache.shape[2]))
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        if not fp8:
            _fail(name, f"is for an FP8 (float8_e4m3fn) cache; the cache is {k_cache.dtype}")
        _check_descale(name, t, want, q)


def check_fwd(q, k, v, descales: dict, batch=None, *, learnable_sink=None, **serving) -> None:
    """The FP8 forward's own rules (attention / attention_varlen): descales float32 (batch, kv
    heads) (varlen: batch = the number of sequences) or None; head dims multiples of 16; no
    learnable sink and no decode-kernel feature (serving: page_table, seqused_q, num_splits > 1);
    forward only. A 16-bit call must pass no descale. batch None: q.shape[0] (dense)."""
    fp8 = q.dtype == E4M3
    for name, t in descales.items():
        if t is not None and not fp8:
            _fail(name, f"is for the FP8 forward (float8_e4m3fn q, k, v); q is {q.dtype}")
    if not fp8:
        return
    rows = "(batch, kv heads)" if batch is None else "(num sequences, kv heads)"
    want = (rows, (q.shape[0] if batch is None else batch, k.shape[-2]))
    for name, t in descales.items():
        if t is not None:
            _check_descale(name, t, want, q)
    for name, d in (("q", q.shape[-1]), ("v", v.shape[-1])):
        if d % 16:
            _fail(name, f"head dim {d}: the FP8 forward needs multiples of 16 (16-byte rows)")
    if learnable_sink is not None:
        _fail("learnable_sink", f"is not supported by the FP8 forward ({FP8_FWD_RULE})")
    for name, value in serving.items():
        if value is not None and not (name == "num_splits" and value <= 1):
            _fail(
                name,
                f"is not supported by the FP8 forward ({FP8_FWD_RULE}): it would take "
                "the decode kernel, whose queries are 16-bit",
            )
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        _fail(
            "q",
            "the FP8 forward has no backward (FP8 attention is not differentiable in "
            "fa4): call it under torch.no_grad() or torch.inference_mode(), or detach q, k, v",
        )
