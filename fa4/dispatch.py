"""Validation and backend choice: every bad input fails here, before any work is launched.

Two stages. check_dense / check_varlen / check_kvcache run in the Python wrappers on shapes,
dtypes, devices and options only, so they trace cleanly under torch.compile. The checks that
read index values (cu_seqlens, seqused, page tables) are fa4/value_checks.py's: they run inside
the op implementation (eager), still before any kernel.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import sys
import warnings
from dataclasses import dataclass

import torch

from . import build_info, fp8_cache
from .fp8_cache import FP8_KV_DTYPE, check_descales, check_fp8

# Note [padded head dims] (csrc/common/head_dims.h): any multiple of 8 up to 256, served by the
# compiled instance that covers it (manifest.cover), whose loads zero-fill the columns past d.
HEAD_DIM_RULE = "a multiple of 8 from 8 to 256"


def admissible_head_dim(d: int) -> bool:
    return 8 <= d <= 256 and d % 8 == 0


KERNEL_DTYPES = (torch.float16, torch.bfloat16)
# fp32/fp64 inputs are accepted by the reference backend only (fp64 is what gradcheck needs).
REFERENCE_DTYPES = KERNEL_DTYPES + (torch.float32, torch.float64)
DTYPE_RULE = (
    "the kernels take float16 or bfloat16; the reference backend also takes float32 or float64"
)
BACKENDS = ("auto", "reference", "sm90", "sm100")
_ARCH_OF_BACKEND = {"sm90": (9, 0), "sm100": (10, 0)}
# Kernels in the build that have not run on their hardware yet (README's support matrix):
# dispatch uses them, with one warning per process. "fwd e4m3": the FP8 forward (SM90's ran and
# passed tests/gpu/test_fp8_fwd_gpu.py on an H200, 2026-12-07).
UNVERIFIED = {("sm100", "fwd"), ("sm100", "bwd"), ("sm100", "fwd e4m3")}
# The FP8 forward where no e4m3 instance serves it: an error, not the reference's fallback (an
# fp32 reference in place of an FP8 kernel is no choice to make silently).
NO_FP8_KERNEL = (
    "FP8 forward: no e4m3 kernel for this device/head dim in this build; backend='reference' "
    "runs it on the CPU reference"
)


@dataclass(frozen=True)
class Options:
    """Normalized keyword arguments, in the form the ops take them."""

    causal: bool
    softmax_scale: float
    window_left: int
    window_right: int
    softcap: float
    deterministic: bool
    backend: str


def _fail(arg: str, rule: str, exc=ValueError):
    raise exc(f"fa4: {arg}: {rule}")


fail = _fail  # for fa4._ops and fa4.__init__


def _check_tensor(name: str, t, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dim() != ndim:
        _fail(name, f"expected {ndim} dims, got shape {tuple(t.shape)}")
    if t.dim() and t.stride(-1) != 1:
        _fail(name, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")


def _check_common(q, k, v, layout: str, fp8_cache: bool = False) -> None:
    """q/k/v agree in dtype and device (k/v may be an FP8 cache where fp8_cache allows it);
    heads and head dims are supported. Dim -2 is heads."""
    fp8 = check_fp8(q, k, v, fp8_cache)
    if q.dtype not in REFERENCE_DTYPES and q.dtype != FP8_KV_DTYPE:  # e4m3: the FP8 forward
        _fail("q", f"dtype {q.dtype} not supported: {DTYPE_RULE}", TypeError)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype and not fp8:
            _fail(name, f"dtype {t.dtype} differs from q.dtype {q.dtype}", TypeError)
        if t.device != q.device:
            _fail(name, f"device {t.device} differs from q.device {q.device}")
    if k.shape[:-1] != v.shape[:-1]:
        _fail("v", f"shape {tuple(v.shape)} must match k {tuple(k.shape)} except the last dim")
    if k.shape[-1] != q.shape[-1]:
        _fail("k", f"head dim {k.shape[-1]} must equal q's {q.shape[-1]} ({layout})")
    h, h_kv = q.shape[-2], k.shape[-2]
    if h < 1 or h_kv < 1 or h % h_kv != 0:
        _fail("k", f"heads of q ({h}) must be a positive multiple of heads of k/v ({h_kv})")
    for name, d in (("q", q.shape[-1]), ("v", v.shape[-1])):
        if not admissible_head_dim(d):
            _fail(name, f"head dim {d} not supported: {HEAD_DIM_RULE}")


def _is_real(x) -> bool:
    """A real number for a float option: int, float, numpy's scalars (numbers.Real), or a
    symbolic float/int under torch.compile; not bool (numpy's bool_ is no numbers.Real)."""
    return isinstance(x, (int, float, numbers.Real, torch.SymInt, torch.SymFloat)) and not (
        isinstance(x, bool)
    )


def _is_integer(x) -> bool:
    """An integer for an int option: int, numpy's integer scalars (numbers.Integral), or a
    symbolic int under torch.compile; not bool."""
    return isinstance(x, (int, numbers.Integral, torch.SymInt)) and not isinstance(x, bool)


def _finite(x) -> bool:
    """math.isfinite that also takes torch.compile's symbolic floats (dynamic=True), where
    math.isfinite cannot be traced: comparisons can (NaN fails both)."""
    return -math.inf < x < math.inf


INT32_MAX = 2**31 - 1


def window_entries(window_size, causal: bool) -> tuple[int, int]:
    """flash-attn's window rules as the (left, right) pair the ops take, with -1 = unbounded
    (Note [window entries] in csrc/common/mask.cuh):
    - None and -1 leave that side unbounded (flash-attn-4 spells it None, flash-attn 2 and FA3
      -1); any other entry is literal, and a negative one shifts that edge past the diagonal:
      (-98, None) sees only keys from 98 past the diagonal on (flash-attn-4's shifted windows);
    - two negative integers mean no window at all, as in every flash-attn;
    - causal=True sets right to 0 whatever it was, as flash-attn does (so a causal model may pass
      a symmetric window and get its left half).
    A band with left + right < 0 sees no key: its rows get out = 0 and lse = -inf."""
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        _fail("window_size", f"expected a pair (left, right), got {window_size!r}", TypeError)
    if not all(w is None or _is_integer(w) for w in window_size):
        _fail("window_size", f"entries must be int or None, got {window_size!r}", TypeError)
    left, right = (-1 if w is None else int(w) for w in window_size)  # numpy ints become ints
    if not all(-INT32_MAX <= w <= INT32_MAX for w in (left, right)):
        _fail("window_size", f"entries must fit int32, got {window_size!r}")
    if None not in window_size and left < 0 and right < 0:
        left = right = -1
    return left, 0 if causal else right


def window_bounded(causal: bool, window_left: int, window_right: int) -> bool:
    """Whether causal or a window edge limits the keys a row sees (csrc's is_banded): FA3 then
    places q's rows at their own positions (rotary, the seqused_q alignment)."""
    return causal or window_left != -1 or window_right != -1


def _check_options(q, causal, softmax_scale, window_size, softcap, deterministic, backend):
    if not isinstance(causal, bool):
        _fail("causal", f"expected bool, got {type(causal).__name__}", TypeError)
    if not isinstance(deterministic, bool):
        _fail("deterministic", f"expected bool, got {type(deterministic).__name__}", TypeError)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    elif not _is_real(softmax_scale):
        _fail(
            "softmax_scale",
            f"expected float or None, got {type(softmax_scale).__name__}",
            TypeError,
        )
    if not (_finite(softmax_scale) and softmax_scale > 0):
        _fail("softmax_scale", f"must be finite and > 0, got {softmax_scale}")
    left, right = window_entries(window_size, causal)
    if not _is_real(softcap):
        _fail("softcap", f"expected float, got {type(softcap).__name__}", TypeError)
    if not (_finite(softcap) and softcap >= 0):
        _fail("softcap", f"must be finite and >= 0 (0 = off), got {softcap}")
    backend = resolve_backend(q, backend)
    return Options(
        causal, float(softmax_scale), left, right, float(softcap), deterministic, backend
    )


# README, docs/design.md: backend="auto" on tensors outside a GPU runs the reference and warns
# once (per device type). backend="reference" says the same choice without the warning.
AUTO_ON_HOST = (
    "fa4: backend='auto' on {device} tensors runs the reference (fa4.reference, PyTorch ops; no "
    "compiled kernel runs off CUDA); pass backend='reference' to choose it without this warning"
)


def resolve_backend(q: torch.Tensor, backend: str) -> str:
    """The backend name the ops run: 'reference', 'sm90' or 'sm100' ('auto' may still become
    'reference' inside the CUDA op when no kernel covers the problem; see kernel_for)."""
    if backend not in BACKENDS:
        _fail("backend", f"must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if q.device.type == "cuda":
            return "auto"
        if not torch.compiler.is_compiling():  # traced: said by the eager calls, if any
            warn_once(AUTO_ON_HOST.format(device=q.device.type), at_caller=True)
        return "reference"
    if backend == "reference":
        return backend
    if q.device.type != "cuda":
        _fail("backend", f"{backend!r} needs CUDA tensors, got device {q.device}")
    if q.dtype not in KERNEL_DTYPES + (FP8_KV_DTYPE,):
        _fail(
            "q",
            f"dtype {q.dtype} not supported by backend {backend!r}: float16 or bfloat16 "
            "(float32 and float64 run on backend='reference')",
            TypeError,
        )
    return backend


def check_dense(q, k, v, *, learnable_sink=None, descales=None, **kw) -> Options:
    """descales: the FP8 forward's {"q_descale": ..., ...} (fp8_cache.check_fwd)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 4)
    _check_common(q, k, v, "(batch, seqlen, heads, headdim)")
    if k.shape[0] != q.shape[0]:
        _fail("k", f"batch {k.shape[0]} differs from q's {q.shape[0]}")
    fp8_cache.check_fwd(q, k, v, descales or {}, learnable_sink=learnable_sink)
    check_sink(learnable_sink, q)
    return _check_options(q, **kw)


def check_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, *,
    seqused_q=None, page_table=None, learnable_sink=None, num_splits=0, descales=None, **kw,
) -> Options:  # fmt: skip
    paged = page_table is not None
    _check_tensor("q", q, 3)
    for name, t in (("k", k), ("v", v)):
        _check_tensor(name, t, 4 if paged else 3)
    layout = "(num_pages, page_size, heads, headdim)" if paged else "(total_tokens, heads, headdim)"
    _check_common(q, k, v, layout)
    _check_index_tensor("cu_seqlens_q", cu_seqlens_q, q.device)
    if cu_seqlens_q.shape[0] < 1:  # [0]: batch 0, empty q/k/v (as dense batch 0)
        _fail("cu_seqlens_q", "needs batch + 1 >= 1 entries, got 0")
    batch = cu_seqlens_q.shape[0] - 1
    if paged:
        if cu_seqlens_k is not None:
            _fail("cu_seqlens_k", "must be None with a page_table (seqused_k gives the key counts)")
        if seqused_k is None:
            _fail("seqused_k", "is required with a page_table (the key count of each sequence)")
        check_page_table(page_table, k, batch, q.device)
    else:
        _check_index_tensor("cu_seqlens_k", cu_seqlens_k, q.device)
        if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
            _fail(
                "cu_seqlens_k",
                f"length {cu_seqlens_k.shape[0]} != cu_seqlens_q's {cu_seqlens_q.shape[0]}",
            )
    for name, t in (("seqused_k", seqused_k), ("seqused_q", seqused_q)):
        if t is not None:
            _check_per_sequence(name, t, batch, q.device)
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            _fail(
                name,
                f"expected an int >= 0, got {m!r}",
                TypeError if not isinstance(m, int) else ValueError,
            )
    if paged:
        capacity = page_table.shape[1] * k.shape[1]
        if max_seqlen_k > capacity:
            _fail(
                "max_seqlen_k",
                f"{max_seqlen_k} exceeds the page table's capacity "
                f"max_pages * page_size = {page_table.shape[1]} * {k.shape[1]} = {capacity}",
            )
        check_forward_only("page_table", "paged attention", q, k, v, learnable_sink)
    check_num_splits(num_splits)
    fp8_cache.check_fwd(
        q, k, v, descales or {}, batch, learnable_sink=learnable_sink, page_table=page_table,
        seqused_q=seqused_q, num_splits=num_splits,
    )  # fmt: skip
    check_sink(learnable_sink, q)
    return _check_options(q, **kw)


def check_kvcache(
    q, k_cache, v_cache, cache_seqlens, *, k_new, v_new, rotary_cos, rotary_sin,
    rotary_interleaved, cache_batch_idx, cache_leftpad, page_table, learnable_sink, num_splits,
    k_descale=None, v_descale=None, **kw,
) -> Options:  # fmt: skip
    """attention_with_kvcache's shape rules (FA3's flash_attn_with_kvcache; docs/inference.md)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, 4)
    _check_common(q, k_cache, v_cache, "(batch, seqlen, heads, headdim)", fp8_cache=True)
    b = q.shape[0]
    check_descales(k_descale, v_descale, q, k_cache)
    paged = page_table is not None
    if paged:
        check_page_table(page_table, k_cache, None if cache_batch_idx is not None else b, q.device)
    elif cache_batch_idx is None and k_cache.shape[0] != b:
        _fail("k_cache", f"batch {k_cache.shape[0]} differs from q's {b} (no cache_batch_idx)")
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        _fail(
            "cache_seqlens",
            f"expected an int or an int32 tensor (batch,), got {type(cache_seqlens).__name__}",
            TypeError,
        )
    if isinstance(cache_seqlens, int):
        if cache_seqlens < 0:
            _fail("cache_seqlens", f"must be >= 0, got {cache_seqlens}")
    else:
        _check_per_sequence("cache_seqlens", cache_seqlens, b, q.device)
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_per_sequence(name, t, b, q.device)
    s_new = _check_new_kv(q, k_cache, v_cache, k_new, v_new)
    capacity = cache_capacity(k_cache, page_table)
    if isinstance(cache_seqlens, int) and cache_seqlens + s_new > capacity:
        _fail(
            "cache_seqlens",
            f"cache_seqlens + s_new = {cache_seqlens} + {s_new} exceeds the cache's capacity "
            f"{capacity}",
        )
    opts = _check_options(q, **kw)
    _check_rotary(q, rotary_cos, rotary_sin, rotary_interleaved)
    if rotary_cos is not None and isinstance(cache_seqlens, int):
        needed = cache_seqlens + rotary_span(q, s_new, opts)
        if rotary_cos.shape[0] < needed:
            _fail(
                "rotary_cos",
                f"seqlen_ro = {rotary_cos.shape[0]} rows cover positions < {rotary_cos.shape[0]}, "
                f"but cache_seqlens + {needed - cache_seqlens} = {needed} are needed",
            )
    check_sink(learnable_sink, q)
    check_num_splits(num_splits)
    check_forward_only("q", "attention_with_kvcache", q, k_cache, v_cache, k_new, v_new,
                       learnable_sink)  # fmt: skip
    return opts


def rotate_q_per_row(opts: Options) -> bool:
    """FA3: q's row i sits at position cache_seqlens + i when causal or local (a window), else
    every row at cache_seqlens."""
    return window_bounded(opts.causal, opts.window_left, opts.window_right)


def rotary_span(q, s_new: int, opts: Options) -> int:
    """Rotary rows past cache_seqlens[b] that the append and q's rotation read."""
    return max(s_new, q.shape[1] if rotate_q_per_row(opts) else 1)


def cache_capacity(k_cache, page_table) -> int:
    """Keys a cache row can hold: s_cache, or max_pages * page_size."""
    return k_cache.shape[1] if page_table is None else page_table.shape[1] * k_cache.shape[1]


def _check_new_kv(q, k_cache, v_cache, k_new, v_new) -> int:
    """k_new/v_new (b, s_new, h_kv, d / d_v) like the cache; returns s_new (0 without)."""
    if (k_new is None) != (v_new is None):
        _fail("k_new" if k_new is None else "v_new", "k_new and v_new go together (both or none)")
    if k_new is None:
        return 0
    for name, t, cache in (("k_new", k_new, k_cache), ("v_new", v_new, v_cache)):
        _check_tensor(name, t, 4)
        if t.dtype != q.dtype:
            _fail(name, f"dtype {t.dtype} differs from q.dtype {q.dtype}", TypeError)
        if t.device != q.device:
            _fail(name, f"device {t.device} differs from q.device {q.device}")
        want = (q.shape[0], k_new.shape[1], cache.shape[2], cache.shape[3])
        if tuple(t.shape) != want:
            _fail(name, f"shape {tuple(t.shape)} must be (batch, s_new, h_kv, d) = {want}")
    return k_new.shape[1]


def _check_rotary(q, cos, sin, interleaved) -> None:
    if not isinstance(interleaved, bool):
        _fail("rotary_interleaved", f"expected bool, got {type(interleaved).__name__}", TypeError)
    if (cos is None) != (sin is None):
        _fail(
            "rotary_cos" if cos is None else "rotary_sin", "rotary_cos and rotary_sin go together"
        )
    if cos is None:
        return
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        _check_tensor(name, t, 2)
        if t.dtype != q.dtype:
            _fail(name, f"dtype {t.dtype} must equal q.dtype {q.dtype} (as FA3)", TypeError)
        if t.device != q.device:
            _fail(name, f"device {t.device} differs from q.device {q.device}")
        if not t.is_contiguous():
            _fail(name, "must be contiguous")
    if sin.shape != cos.shape:
        _fail(
            "rotary_sin", f"shape {tuple(sin.shape)} differs from rotary_cos's {tuple(cos.shape)}"
        )
    half = cos.shape[1]
    if half < 1 or 2 * half > q.shape[-1]:
        _fail(
            "rotary_cos",
            f"shape (seqlen_ro, rotary_dim / 2) needs 1 <= rotary_dim <= headdim {q.shape[-1]}, "
            f"got rotary_dim {2 * half}",
        )


def check_page_table(page_table, k, batch, device) -> None:
    """page_table: int32 (batch, max_pages), rows contiguous (stride(-1) == 1); k is a page pool
    (num_pages, page_size >= 1, h_kv, d). batch None: any row count (cache_batch_idx picks)."""
    if not isinstance(page_table, torch.Tensor):
        _fail("page_table", f"expected a torch.Tensor, got {type(page_table).__name__}", TypeError)
    if page_table.dtype != torch.int32:
        _fail("page_table", f"dtype must be torch.int32, got {page_table.dtype}", TypeError)
    if page_table.dim() != 2:
        _fail("page_table", f"expected 2 dims (batch, max_pages), got {tuple(page_table.shape)}")
    if batch is not None and page_table.shape[0] != batch:
        _fail("page_table", f"has {page_table.shape[0]} rows, expected batch = {batch}")
    if page_table.shape[1] and page_table.stride(1) != 1:
        _fail("page_table", f"rows must be contiguous (stride(-1) == 1), got {page_table.stride()}")
    if page_table.device != device:
        _fail("page_table", f"device {page_table.device} differs from q.device {device}")
    if k.shape[1] < 1:
        _fail("k", f"page_size (dim 1 of the page pool) must be >= 1, got {tuple(k.shape)}")


def check_sink(sink, q) -> None:
    """learnable_sink: float32 (h_q,) on q's device (float64 with float64 q, for gradcheck)."""
    if sink is None:
        return
    if not isinstance(sink, torch.Tensor):
        _fail("learnable_sink", f"expected a torch.Tensor, got {type(sink).__name__}", TypeError)
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    if sink.dtype not in allowed:
        _fail("learnable_sink", f"dtype must be torch.float32, got {sink.dtype}", TypeError)
    if tuple(sink.shape) != (q.shape[-2],):
        _fail("learnable_sink", f"shape must be (heads of q,) = ({q.shape[-2]},), got "
              f"{tuple(sink.shape)}")  # fmt: skip
    if not sink.is_contiguous():
        _fail("learnable_sink", "must be contiguous")
    if sink.device != q.device:
        _fail("learnable_sink", f"device {sink.device} differs from q.device {q.device}")


def check_num_splits(num_splits) -> None:
    if not isinstance(num_splits, int) or isinstance(num_splits, bool):
        _fail("num_splits", f"expected an int, got {type(num_splits).__name__}", TypeError)
    if not 0 <= num_splits < 2**31:
        _fail("num_splits", f"must be >= 0 (0 = heuristic, 1 = no split), got {num_splits}")


def check_forward_only(arg: str, what: str, *tensors) -> None:
    """Raises before any launch when autograd would record a forward that has no backward."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        _fail(
            arg,
            f"{what} is forward only (no backward): call it under torch.no_grad() or "
            f"torch.inference_mode(), or pass tensors that do not require grad",
        )


def _check_per_sequence(name, t, batch, device):
    _check_index_tensor(name, t, device)
    if t.shape[0] != batch:
        _fail(name, f"length {t.shape[0]} != batch {batch}")


def _check_index_tensor(name, t, device):
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dtype != torch.int32:
        _fail(name, f"dtype must be torch.int32, got {t.dtype}", TypeError)
    if t.dim() != 1 or not t.is_contiguous():
        _fail(name, f"must be a contiguous 1-D tensor, got shape {tuple(t.shape)}")
    if t.device != device:
        _fail(name, f"device {t.device} differs from q.device {device}")


_warned: set[str] = set()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel, called from warn_once, of the first frame outside fa4 (the
    user's call of fa4.attention and the like)."""
    frame, level = sys._getframe(2), 2  # warn_once's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def warn_once(msg: str, *, at_caller: bool = False) -> None:
    """Warns once per process per message. at_caller: the warning names the first frame outside
    fa4 (for checks run in the Python wrappers), else warn_once's caller's caller."""
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, stacklevel=_caller_stacklevel() if at_caller else 3)


def tma_incompatible(*tensors: torch.Tensor) -> str | None:
    """Why the kernels' TMA loads cannot address these tensors (None if they can): 16-byte
    aligned base and strides that are multiples of 16 bytes for every dimension of extent > 1
    (the rule api/fa4.h states and the C++ validate() enforces)."""
    for t in tensors:
        if t.data_ptr() % 16:
            return "a tensor's base address is not 16-byte aligned"
        step = 16 // t.element_size()
        if any(n > 1 and st % step for n, st in zip(t.shape[:-1], t.stride()[:-1], strict=True)):
            return f"strides {t.stride()} are not multiples of {step} elements (TMA: 16 bytes)"
    return None


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    """A device's compute capability, asked once: torch.cuda.get_device_capability reads the
    properties on every call, a host cost each forward and backward paid (Note [eager autograd
    path])."""
    return torch.cuda.get_device_capability(index)


def kernel_for(
    q: torch.Tensor, v: torch.Tensor, backend: str, direction: str, tensors=()
) -> str | None:
    """The compiled kernel family ('sm90'/'sm100') that runs this problem, or None for the
    reference. Explicit backends raise when they cannot run it; 'auto' falls back with a warning,
    except for the FP8 forward (e4m3 q), which needs an e4m3 instance and raises NO_FP8_KERNEL.
    tensors: every tensor the kernel will address with TMA (checked for alignment)."""
    if backend == "reference":
        return None
    fp8 = q.dtype == FP8_KV_DTYPE
    hdims = (q.shape[-1], v.shape[-1])
    cc = _capability(q.device.index)
    wanted = [backend] if backend != "auto" else [b for b, a in _ARCH_OF_BACKEND.items() if a == cc]
    for arch in wanted:
        why = (
            build_info.missing_instance(arch, direction, hdims, "e4m3")
            if fp8
            else build_info.missing_kernel(arch, direction, hdims)
        )
        if why is None and _ARCH_OF_BACKEND[arch] != cc:
            why = f"the device has compute capability {cc[0]}.{cc[1]}"
        if why is None and q.dtype not in KERNEL_DTYPES and not fp8:
            why = f"kernels take float16/bfloat16, got {q.dtype}"
        if why is None and any(t.dtype == FP8_KV_DTYPE for t in tensors):
            if hdims[0] % 16 or hdims[1] % 16:
                why = f"an FP8 cache needs head dims that are multiples of 16, got {hdims}"
        if why is None:
            why = tma_incompatible(*tensors)
        if why is None:
            _warn_unverified(arch, direction + " e4m3" if fp8 else direction)
            return arch
        if fp8:
            _fail("q", f"{NO_FP8_KERNEL} ({arch}: {why})", RuntimeError)
        if backend != "auto":
            _fail("backend", f"{arch!r} cannot run this {direction}: {why}", RuntimeError)
        warn_once(
            f"fa4: no {arch} {direction} kernel for this problem ({why}); running the reference"
        )
        return None
    if fp8:
        _fail("q", f"{NO_FP8_KERNEL} (compute capability {cc[0]}.{cc[1]})", RuntimeError)
    warn_once(f"fa4: no kernels for compute capability {cc[0]}.{cc[1]}; running the fp32 reference")
    return None


def _warn_unverified(arch: str, kind: str) -> None:
    if (arch, kind) not in UNVERIFIED:
        return
    warn_once(f"fa4: the {arch} {kind} kernel is compiled but was never executed by its authors "
              f"(no such GPU available to them); verify it on this machine with `pytest -m {arch} "
              "tests` before trusting results")  # fmt: skip


# The knobs' lookups: os.environ.get of an unset variable raises and catches a KeyError inside
# (0.8 us each on the 2-core CI machine, 3.6 us for runtime_knobs' five); the mapping behind
# os.environ (its _data, which setenv and monkeypatch write through) answers in ~0.1 us.
_ENV_DATA = getattr(os.environ, "_data", None)


def _getenv(name: str, default: str | None = None) -> str | None:
    if _ENV_DATA is None:
        return os.environ.get(name, default)
    value = _ENV_DATA.get(os.environ.encodekey(name))
    return default if value is None else os.environ.decodevalue(value)


def runtime_knobs(direction: str) -> tuple[int, int, str]:
    """The environment's settings of the op fa4::_{direction}_kernel, its last three arguments,
    read at each call so that tests may change them between calls (the compiled ops read no
    environment variable; Note [stream tile counter], Note [tile order options]): (num_sms,
    tile_schedule, tile order text). FA4_NUM_SMS: SMs the persistent grids may use (unset or
    empty: 0, every SM). tile_schedule: 1 with FA4_STATIC_SCHEDULE=1 (static tiles), else 2 with
    FA4_FRESH_TILE_COUNTER=1 (a zeroed counter per call), else 0 (the stream's counter).
    FA4_TILE_ORDER, or FA4_BWD_TILE_ORDER for "bwd": its text, which the C++ API judges (naming
    the variable), and "" when unset, the built-in order (None would be the library's process
    default, the variable as the process's first call saw it)."""
    env = _getenv
    sms = env("FA4_NUM_SMS", "")
    try:
        num_sms = int(sms or 0)
    except ValueError:
        num_sms = -1
    if not 0 <= num_sms < 2**31:
        _fail("FA4_NUM_SMS", f"expected an integer in [0, 2^31) (0 = every SM), got {sms!r}")
    if env("FA4_STATIC_SCHEDULE") == "1":
        schedule = 1
    else:
        schedule = 2 if env("FA4_FRESH_TILE_COUNTER") == "1" else 0
    order = env("FA4_BWD_TILE_ORDER" if direction == "bwd" else "FA4_TILE_ORDER", "")
    return num_sms, schedule, order
