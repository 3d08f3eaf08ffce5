"""The rules of an FP8 (e4m3) KV cache (attention_with_kvcache; Note [fp8 cache] in
csrc/decode/kernel.cuh): which FP8 uses fa4 has and the descales' shape, with fa4.dispatch's
error format."""

from __future__ import annotations

import torch

# An FP8 KV cache (attention_with_kvcache; Note [fp8 cache] in csrc/decode/kernel.cuh): e4m3
# k_cache and v_cache with fp16 / bf16 (or, on the reference, fp32 / fp64) q.
FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)


def check_fp8(q, k, v, fp8_cache: bool) -> bool:
    """Whether k/v are an FP8 cache; raises for every FP8 use fa4 does not have."""
    from . import dispatch  # imports this module: the error format is read at call time

    if q.dtype in FP8_DTYPES:
        dispatch.fail(
            "q",
            f"dtype {q.dtype} not supported: {dispatch.DTYPE_RULE}. FP8 queries (an FP8 "
            "forward) are not supported; an FP8 KV cache (float8_e4m3fn k_cache / v_cache) "
            "takes float16 or bfloat16 q in attention_with_kvcache",
            TypeError,
        )
    fp8 = [t.dtype in FP8_DTYPES for t in (k, v)]
    if not any(fp8):
        return False
    for name, t in (("k", k), ("v", v)):
        if not fp8_cache:
            dispatch.fail(
                name,
                f"dtype {t.dtype}: FP8 keys and values are supported as a KV cache only "
                "(attention_with_kvcache with float8_e4m3fn k_cache and v_cache)",
                TypeError,
            )
        if t.dtype != FP8_KV_DTYPE:
            dispatch.fail(
                name, f"dtype {t.dtype}: an FP8 cache is float8_e4m3fn, k and v both", TypeError
            )
    return True


def check_descales(k_descale, v_descale, q, k_cache) -> None:
    """FA3's descales of an FP8 cache: float32 (batch, kv heads), true value = stored x descale
    of the sequence's kv head; None = 1."""
    from . import dispatch

    fp8 = k_cache.dtype == FP8_KV_DTYPE
    want = (q.shape[0], k_cache.shape[2])
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        if not fp8:
            dispatch.fail(
                name, f"is for an FP8 (float8_e4m3fn) cache; the cache is {k_cache.dtype}"
            )
        if not isinstance(t, torch.Tensor):
            dispatch.fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
        if t.dtype != torch.float32:
            dispatch.fail(name, f"dtype must be torch.float32, got {t.dtype}", TypeError)
        if tuple(t.shape) != want:
            dispatch.fail(name, f"shape {tuple(t.shape)} must be (batch, kv heads) = {want}")
        if t.device != q.device:
            dispatch.fail(name, f"device {t.device} differs from q.device {q.device}")
