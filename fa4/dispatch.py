"""Validation and backend choice: every bad input fails here, before any work is launched.

Two stages. check_dense / check_varlen run in the Python wrappers on shapes, dtypes, devices and
options only, so they trace cleanly under torch.compile. check_varlen_data reads cu_seqlens
values and therefore runs inside the op implementation (eager), still before any kernel.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from dataclasses import dataclass

import torch

from . import build_info

SUPPORTED_HDIMS = ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128))
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
# fp32/fp64 inputs are accepted by the reference backend only (fp64 is what gradcheck needs).
REFERENCE_DTYPES = KERNEL_DTYPES + (torch.float32, torch.float64)
BACKENDS = ("auto", "reference", "sm90", "sm100")
_ARCH_OF_BACKEND = {"sm90": (9, 0), "sm100": (10, 0)}
# Kernels in the build that have not run on their hardware yet (README's support matrix):
# dispatch uses them, with one warning per process.
UNVERIFIED = {("sm100", "fwd"), ("sm100", "bwd")}


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


def _check_tensor(name: str, t, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dim() != ndim:
        _fail(name, f"expected {ndim} dims, got shape {tuple(t.shape)}")
    if t.dim() and t.stride(-1) != 1:
        _fail(name, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")


def _check_common(q, k, v, layout: str) -> None:
    """q/k/v agree in dtype and device; heads and head dims are supported. Dim -2 is heads."""
    if q.dtype not in REFERENCE_DTYPES:
        _fail("q", f"dtype {q.dtype} not supported: float16 or bfloat16", TypeError)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
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
    if (q.shape[-1], v.shape[-1]) not in SUPPORTED_HDIMS:
        pairs = ", ".join(f"{a}" if a == b else f"({a}, d_v={b})" for a, b in SUPPORTED_HDIMS)
        _fail("q", f"head dim {q.shape[-1]} with d_v {v.shape[-1]} not supported: {pairs}")


def _check_options(q, causal, softmax_scale, window_size, softcap, deterministic, backend):
    if not isinstance(causal, bool):
        _fail("causal", f"expected bool, got {type(causal).__name__}", TypeError)
    if not isinstance(deterministic, bool):
        _fail("deterministic", f"expected bool, got {type(deterministic).__name__}", TypeError)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    elif not isinstance(softmax_scale, (int, float)) or isinstance(softmax_scale, bool):
        _fail(
            "softmax_scale",
            f"expected float or None, got {type(softmax_scale).__name__}",
            TypeError,
        )
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        _fail("softmax_scale", f"must be finite and > 0, got {softmax_scale}")
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        _fail("window_size", f"expected a pair (left, right), got {window_size!r}", TypeError)
    left, right = window_size
    if not all(isinstance(w, int) and not isinstance(w, bool) for w in (left, right)):
        _fail("window_size", f"entries must be int, got {window_size!r}", TypeError)
    if left < -1 or right < -1:
        _fail("window_size", f"entries must be >= -1 (-1 = unbounded), got {window_size!r}")
    if causal:
        if right not in (-1, 0):
            _fail("window_size", f"causal=True requires right in (-1, 0), got {right}")
        right = 0
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool):
        _fail("softcap", f"expected float, got {type(softcap).__name__}", TypeError)
    if not (math.isfinite(softcap) and softcap >= 0):
        _fail("softcap", f"must be finite and >= 0 (0 = off), got {softcap}")
    backend = resolve_backend(q, backend)
    return Options(
        causal, float(softmax_scale), left, right, float(softcap), deterministic, backend
    )


def resolve_backend(q: torch.Tensor, backend: str) -> str:
    """The backend name the ops run: 'reference', 'sm90' or 'sm100' ('auto' may still become
    'reference' inside the CUDA op when no kernel covers the problem; see kernel_for)."""
    if backend not in BACKENDS:
        _fail("backend", f"must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "reference" if q.device.type != "cuda" else "auto"
    if backend == "reference":
        return backend
    if q.device.type != "cuda":
        _fail("backend", f"{backend!r} needs CUDA tensors, got device {q.device}")
    if q.dtype not in KERNEL_DTYPES:
        _fail(
            "q",
            f"dtype {q.dtype} not supported by backend {backend!r}: float16 or bfloat16",
            TypeError,
        )
    return backend


def check_dense(q, k, v, **kw) -> Options:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 4)
    _check_common(q, k, v, "(batch, seqlen, heads, headdim)")
    if k.shape[0] != q.shape[0]:
        _fail("k", f"batch {k.shape[0]} differs from q's {q.shape[0]}")
    return _check_options(q, **kw)


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, **kw):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 3)
    _check_common(q, k, v, "(total_tokens, heads, headdim)")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_index_tensor(name, t, q.device)
        if t.shape[0] < 2:
            _fail(name, f"needs batch + 1 >= 2 entries, got {t.shape[0]}")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        _fail(
            "cu_seqlens_k",
            f"length {cu_seqlens_k.shape[0]} != cu_seqlens_q's {cu_seqlens_q.shape[0]}",
        )
    if seqused_k is not None:
        _check_index_tensor("seqused_k", seqused_k, q.device)
        if seqused_k.shape[0] != cu_seqlens_q.shape[0] - 1:
            _fail("seqused_k", f"length {seqused_k.shape[0]} != batch {cu_seqlens_q.shape[0] - 1}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            _fail(
                name,
                f"expected an int >= 0, got {m!r}",
                TypeError if not isinstance(m, int) else ValueError,
            )
    return _check_options(q, **kw)


def _check_index_tensor(name, t, device):
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dtype != torch.int32:
        _fail(name, f"dtype must be torch.int32, got {t.dtype}", TypeError)
    if t.dim() != 1 or not t.is_contiguous():
        _fail(name, f"must be a contiguous 1-D tensor, got shape {tuple(t.shape)}")
    if t.device != device:
        _fail(name, f"device {t.device} differs from q.device {device}")


def check_varlen_data(cu_q, cu_k, seqused_k, total_q, total_k, max_q, max_k) -> None:
    """Checks that read the index tensors (one device sync on GPU); skipped while a CUDA graph is
    being captured, where reading them is impossible."""
    if cu_q.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    cq, ck = cu_q.cpu(), cu_k.cpu()
    for name, c in (("cu_seqlens_q", cq), ("cu_seqlens_k", ck)):
        if c[0] != 0:
            _fail(name, f"must start at 0, got {int(c[0])}")
        if bool((c[1:] < c[:-1]).any()):
            _fail(name, f"must be non-decreasing, got {c.tolist()}")
    if int(cq[-1]) != total_q:
        _fail("cu_seqlens_q", f"last entry {int(cq[-1])} must equal q.shape[0] = {total_q}")
    if int(ck[-1]) > total_k:
        _fail("cu_seqlens_k", f"last entry {int(ck[-1])} exceeds k.shape[0] = {total_k}")
    len_q, len_k = cq.diff(), ck.diff()
    if seqused_k is not None:
        used = seqused_k.cpu()
        if bool((used < 0).any() | (used > len_k).any()):
            _fail(
                "seqused_k",
                f"entries must lie in [0, length of key sequence i], got {used.tolist()}",
            )
        len_k = used
    if int(len_q.max()) > max_q:
        _fail("max_seqlen_q", f"{max_q} is less than the longest query sequence {int(len_q.max())}")
    if int(len_k.max()) > max_k:
        _fail("max_seqlen_k", f"{max_k} is less than the longest key sequence {int(len_k.max())}")


_warned: set[str] = set()


def warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, stacklevel=3)


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
    reference. Explicit backends raise when they cannot run it; 'auto' falls back with a warning.
    tensors: every tensor the kernel will address with TMA (checked for alignment)."""
    if backend == "reference":
        return None
    hdims = (q.shape[-1], v.shape[-1])
    cc = _capability(q.device.index)
    wanted = [backend] if backend != "auto" else [b for b, a in _ARCH_OF_BACKEND.items() if a == cc]
    for arch in wanted:
        why = build_info.missing_kernel(arch, direction, hdims)
        if why is None and _ARCH_OF_BACKEND[arch] != cc:
            why = f"the device has compute capability {cc[0]}.{cc[1]}"
        if why is None and q.dtype not in KERNEL_DTYPES:
            why = f"kernels take float16/bfloat16, got {q.dtype}"
        if why is None:
            why = tma_incompatible(*tensors)
        if why is None:
            if (arch, direction) in UNVERIFIED:
                warn_once(
                    f"fa4: the {arch} {direction} kernel is compiled but was never executed by its "
                    f"authors (no such GPU available to them); verify it on this machine with "
                    f"`pytest -m {arch} tests` before trusting results"
                )
            return arch
        if backend != "auto":
            _fail("backend", f"{arch!r} cannot run this {direction}: {why}", RuntimeError)
        warn_once(
            f"fa4: no {arch} {direction} kernel for this problem ({why}); running the reference"
        )
        return None
    warn_once(f"fa4: no kernels for compute capability {cc[0]}.{cc[1]}; running the fp32 reference")
    return None


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
