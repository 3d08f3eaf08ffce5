"""The KV-cache append with rotary of FA3's flash_attn_with_kvcache, before the attention runs.

append_rotary writes k_new (rotated) and v_new into the cache in place and returns q rotated.
On CUDA it is one launch of the compiled op fa4::_kv_append_kernel (csrc/api/kv_append.cu) when
the build has it and the layout suits its vectors; otherwise (CPU, fp32, odd layouts, a build
without the op) a torch path of the same arithmetic (Note [rotary rounding] in kv_append.cu), so
the two agree bit for bit. Neither syncs with the host or allocates by data, so both can be
captured in a CUDA graph; on CPU tensors the data-dependent rules are checked too.

Semantics (FA3, hopper/flash_attn_interface.py and hopper/test_flash_attn.py):
- k_new[b, t] and v_new[b, t] go to cache position cache_seqlens[b] + t of cache batch
  cache_batch_idx[b] (or b); paged, to row pos % page_size of page
  page_table[cache_batch_idx[b] (or b), pos // page_size].
- Rotary position of k_new[b, t]: cache_seqlens[b] + t. Of q[b, i]: cache_seqlens[b] + i when
  rotate_q_per_row (causal or local attention), else cache_seqlens[b] for every row.
  cache_leftpad does not move either: FA3's seqlen_rotary is (seqused_k - leftpad) + leftpad
  (hopper/seqlen.h SeqlenInfoQKNewK), so it is validated here and otherwise unused.
- Only the first rotary_dim = 2 * rotary_cos.shape[1] dims rotate; interleaved pairs (2i, 2i+1),
  else GPT-NeoX pairs (i, i + rotary_dim / 2). fp32 math on the dtype's values, rounded once.

Out-of-range data (a position past the cache, the page table or the cos/sin table; a page or
cache batch index outside its tensor; leftpad outside [0, cache_seqlens]) is an error. On CPU it
raises ValueError here. On CUDA nothing checks it without a host sync: the kernel drops the write
of such a row and gives NaN in the rotated dims of a position past the cos/sin table, touching no
memory outside the tensors; the CUDA torch path fails a device-side index assert.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import build_info
from .fp8_cache import FP8_KV_DTYPE

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
# fp32 runs the torch path only (the tests' and CPU users' dtype).
DTYPES = KERNEL_DTYPES + (torch.float32,)


def _fail(arg: str, rule: str, exc=ValueError):
    raise exc(f"fa4: {arg}: {rule}")


@functools.cache
def kernel_available() -> bool:
    """Whether the installed extension registers fa4::_kv_append_kernel."""
    if not build_info.CONFIG.get("built"):
        return False
    try:
        torch.ops.fa4._kv_append_kernel  # noqa: B018  (resolves the op or raises)
    except (AttributeError, RuntimeError):
        return False
    return True


if kernel_available():

    @torch.library.register_fake("fa4::_kv_append_kernel")
    def _kv_append_fake(*args) -> None:
        """In-place only: the caches and q_out are mutated, nothing is returned."""


def append_rotary(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_new: Tensor | None,
    v_new: Tensor | None,
    cache_seqlens: Tensor,
    *,
    rotary_cos: Tensor | None = None,
    rotary_sin: Tensor | None = None,
    rotary_interleaved: bool = False,
    cache_batch_idx: Tensor | None = None,
    cache_leftpad: Tensor | None = None,
    page_table: Tensor | None = None,
    rotate_q_per_row: bool = False,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
) -> Tensor:
    """Appends k_new/v_new to the cache in place (k_new rotated) and returns q rotated.

    q (b, s_q, h, d); k_cache/v_cache (b_cache, s_cache, h_kv, d / d_v), or pages
    (num_pages, page_size, h_kv, d / d_v) with page_table int32 (rows, max_pages);
    k_new/v_new (b, s_new, h_kv, d / d_v) or both None (then only q rotates); cache_seqlens
    int32 (b,) on q's device; rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2) in q's dtype;
    cache_batch_idx, cache_leftpad int32 (b,). Returns a new tensor when rotary is given, else q.
    An FP8 (e4m3) cache takes k_new / v_new in q's dtype, quantized with the descales
    (float32 (b, h_kv), None = 1) by the torch path (quantize_for_cache).
    """
    rotary = rotary_cos is not None or rotary_sin is not None
    _check_shapes(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, page_table)
    _check_options(q, rotary_cos, rotary_sin, rotary_interleaved, rotate_q_per_row)
    _check_index("cache_leftpad", cache_leftpad, q)
    if q.device.type == "cpu":
        _check_values(
            q, k_cache, k_new, cache_seqlens, rotary_cos, cache_batch_idx, cache_leftpad,
            page_table, rotate_q_per_row,
        )  # fmt: skip
    if k_new is None and not rotary:
        return q
    if rotary:
        rotary_cos, rotary_sin = rotary_cos.contiguous(), rotary_sin.contiguous()
    if _kernel_fits(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, rotary_interleaved):
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if rotary else None
        torch.ops.fa4._kv_append_kernel(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens, rotary_cos, rotary_sin, q_out,
            rotary_interleaved, cache_batch_idx, page_table, rotate_q_per_row,
        )  # fmt: skip
        return q_out if rotary else q
    return append_rotary_torch(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens, rotary_cos, rotary_sin,
        rotary_interleaved, cache_batch_idx, page_table, rotate_q_per_row, k_descale, v_descale,
    )  # fmt: skip


def quantize_for_cache(x: Tensor, descale: Tensor | None, cache_dtype) -> Tensor:
    """x (b, s, h_kv, d) as an FP8 cache stores it: x / descale[b, h] in fp32, saturated to the
    format's largest finite value (an overflow would otherwise become NaN), rounded to nearest."""
    y = x.float()
    if descale is not None:
        y = y / descale[:, None, :, None]
    top = torch.finfo(cache_dtype).max
    return y.clamp(-top, top).to(cache_dtype)


def append_rotary_torch(
    q, k_cache, v_cache, k_new, v_new, cache_seqlens, rotary_cos, rotary_sin,
    rotary_interleaved, cache_batch_idx, page_table, rotate_q_per_row, k_descale=None,
    v_descale=None,
) -> Tensor:  # fmt: skip
    """The torch path of append_rotary on validated inputs (any device; no host sync)."""
    b, s_q = q.shape[:2]
    start = cache_seqlens.long()[:, None]  # (b, 1)
    q_out = q
    if rotary_cos is not None:
        rows = torch.arange(s_q, device=q.device) * int(rotate_q_per_row)
        q_out = rotate(q, rotary_cos, rotary_sin, start + rows, rotary_interleaved)
    if k_new is None:
        return q_out
    pos = start + torch.arange(k_new.shape[1], device=q.device)  # (b, s_new)
    if rotary_cos is not None:
        k_new = rotate(k_new, rotary_cos, rotary_sin, pos, rotary_interleaved)
    seq = (
        cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(b, device=q.device)
    )
    if page_table is None:
        slot = (seq[:, None].expand_as(pos), pos)
    else:
        page_size = k_cache.shape[1]
        slot = (page_table.long()[seq[:, None], pos // page_size], pos % page_size)
    if k_cache.dtype != k_new.dtype:  # an FP8 cache
        k_new = quantize_for_cache(k_new, k_descale, k_cache.dtype)
        v_new = quantize_for_cache(v_new, v_descale, v_cache.dtype)
    k_cache.index_put_(slot, k_new)
    v_cache.index_put_(slot, v_new)
    return q_out


def rotate(x: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, interleaved: bool) -> Tensor:
    """x (b, s, h, d) rotated at positions pos (b, s): the first 2 * cos.shape[1] dims, in fp32
    on the dtype's values, each product rounded before the sum (Note [rotary rounding]); NaN in
    the rotated dims at a position outside the table, as the kernel gives."""
    half, n = cos.shape[1], cos.shape[0]
    inside = ((pos >= 0) & (pos < n))[..., None]
    idx = pos.clamp(0, n - 1)
    c = torch.where(inside, cos[idx].float(), float("nan"))[:, :, None, :]  # (b, s, 1, half)
    s = torch.where(inside, sin[idx].float(), float("nan"))[:, :, None, :]
    xr = x[..., : 2 * half].float()
    x1, x2 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., :half], xr[..., half:])
    o1 = x1 * c - x2 * s
    o2 = x1 * s + x2 * c
    rot = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), -1)
    return torch.cat((rot.to(x.dtype), x[..., 2 * half :]), dim=-1)


def _kernel_fits(q, k_cache, v_cache, k_new, v_new, cos, sin, interleaved) -> bool:
    """The compiled op runs it: a CUDA fp16/bf16 problem whose rows all start 4-byte aligned
    and hold an even number of elements, as its vectors need (kv_append_vector_width >= 2).
    Alignment is read from storage offsets (the caching allocator's blocks are 512-byte
    aligned), which fake tensors have too; the op rechecks the pointers themselves."""
    if not q.is_cuda or q.dtype not in KERNEL_DTYPES or not kernel_available():
        return False
    if k_cache.dtype != q.dtype:  # an FP8 cache: quantize_for_cache, on the torch path
        return False
    tensors, dims = [], [q.shape[-1]]
    if cos is not None:
        tensors += [q, cos, sin]
        dims.append(cos.shape[1] * (2 if interleaved else 1))
    if k_new is not None:
        tensors += [k_new, v_new, k_cache, v_cache]
        dims.append(v_new.shape[-1])
    rows = [t for t in tensors if t.dim() == 4]
    return (
        all(n % 2 == 0 for n in dims)
        and all(t.storage_offset() % 2 == 0 for t in tensors)
        and all(s % 2 == 0 for t in rows for s in t.stride()[:3])
    )


def _check_rows(name: str, t, q: Tensor | None) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dim() != 4:
        _fail(name, f"expected 4 dims, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        _fail(name, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")
    if q is None:
        if t.dtype not in DTYPES:
            _fail(name, f"dtype {t.dtype} not supported: float16, bfloat16 or float32", TypeError)
        return
    fp8_cache = name in ("k_cache", "v_cache") and t.dtype == FP8_KV_DTYPE
    if t.dtype != q.dtype and not fp8_cache:
        _fail(name, f"dtype {t.dtype} differs from q.dtype {q.dtype}", TypeError)
    if t.device != q.device:
        _fail(name, f"device {t.device} differs from q.device {q.device}")


def _check_index(name: str, t, q: Tensor, ndim: int = 1) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dtype != torch.int32:
        _fail(name, f"dtype must be torch.int32, got {t.dtype}", TypeError)
    if t.device != q.device:
        _fail(name, f"device {t.device} differs from q.device {q.device}")
    if t.dim() != ndim or (t.numel() and t.stride(-1) != 1):
        what = "(b,)" if ndim == 1 else "(rows, max_pages) with contiguous rows"
        _fail(name, f"expected a contiguous {what} tensor, got shape {tuple(t.shape)}")
    if ndim == 1 and t.shape[0] != q.shape[0]:
        _fail(name, f"expected shape ({q.shape[0]},) (q's batch), got {tuple(t.shape)}")


def _check_shapes(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, page_table):
    _check_rows("q", q, None)
    _check_rows("k_cache", k_cache, q)
    _check_rows("v_cache", v_cache, q)
    b, _, _, d = q.shape
    if k_cache.shape[-1] != d:
        _fail("k_cache", f"head dim {k_cache.shape[-1]} must equal q's {d}")
    if v_cache.shape[:-1] != k_cache.shape[:-1]:
        _fail("v_cache", f"shape {tuple(v_cache.shape)} must match k_cache's except the last dim")
    if cache_seqlens is None:
        _fail("cache_seqlens", "required (convert an int with torch.full((b,), n, dtype=int32))")
    _check_index("cache_seqlens", cache_seqlens, q)
    _check_index("cache_batch_idx", cache_batch_idx, q)
    _check_index("page_table", page_table, q, ndim=2)
    if (k_new is None) != (v_new is None):
        _fail("v_new" if k_new is not None else "k_new", "k_new and v_new go together")
    if k_new is not None:
        _check_rows("k_new", k_new, q)
        _check_rows("v_new", v_new, q)
        s_new, h_kv = k_new.shape[1], k_cache.shape[2]
        for name, t, dim in (("k_new", k_new, d), ("v_new", v_new, v_cache.shape[-1])):
            if t.shape != (b, s_new, h_kv, dim):
                want = (b, s_new, h_kv, dim)
                _fail(name, f"expected shape {want} (b, s_new, h_kv, d), got {tuple(t.shape)}")
    if page_table is not None:
        if k_cache.shape[1] < 1:
            _fail("k_cache", "paged: page size (dim 1) must be >= 1")
        if cache_batch_idx is None and page_table.shape[0] != b:
            _fail("page_table", f"expected {b} rows (q's batch), got {page_table.shape[0]}")
    elif cache_batch_idx is None and k_cache.shape[0] != b:
        _fail("k_cache", f"batch {k_cache.shape[0]} must equal q's {b} without cache_batch_idx")


def _check_options(q, rotary_cos, rotary_sin, interleaved, per_row):
    for name, flag in (("rotary_interleaved", interleaved), ("rotate_q_per_row", per_row)):
        if not isinstance(flag, bool):
            _fail(name, f"expected bool, got {type(flag).__name__}", TypeError)
    if (rotary_cos is None) != (rotary_sin is None):
        _fail("rotary_sin" if rotary_cos is not None else "rotary_cos", "cos and sin go together")
    if rotary_cos is None:
        return
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor):
            _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
        if t.dtype != q.dtype:
            _fail(name, f"dtype {t.dtype} differs from q.dtype {q.dtype} (FA3's rule)", TypeError)
        if t.device != q.device:
            _fail(name, f"device {t.device} differs from q.device {q.device}")
        if t.dim() != 2:
            _fail(name, f"expected (seqlen_ro, rotary_dim / 2), got shape {tuple(t.shape)}")
    if rotary_sin.shape != rotary_cos.shape:
        _fail("rotary_sin", f"shape {tuple(rotary_sin.shape)} must equal rotary_cos's")
    seqlen_ro, half = rotary_cos.shape
    if seqlen_ro < 1 or half < 1 or 2 * half > q.shape[-1]:
        _fail(
            "rotary_cos",
            f"shape {tuple(rotary_cos.shape)}: needs a row, and rotary_dim = 2 * {half} in "
            f"[2, head dim {q.shape[-1]}]",
        )


def _check_values(
    q, k_cache, k_new, cache_seqlens, rotary_cos, cache_batch_idx, cache_leftpad, page_table,
    per_row,
):  # fmt: skip
    """The data-dependent rules, on CPU tensors (reading them costs no device sync)."""
    start = cache_seqlens.long()
    if (start < 0).any():
        _fail("cache_seqlens", f"entries must be >= 0, got {start.min().item()}")
    if cache_leftpad is not None:
        pad = cache_leftpad.long()
        if ((pad < 0) | (pad > start)).any():
            _fail("cache_leftpad", "entries must be in [0, cache_seqlens[b]]")
    paged = page_table is not None
    seq = torch.arange(q.shape[0])
    if cache_batch_idx is not None:
        seq = cache_batch_idx.long()
        limit = page_table.shape[0] if paged else k_cache.shape[0]
        what = "page_table rows" if paged else "k_cache's batch"
        if ((seq < 0) | (seq >= limit)).any():
            _fail("cache_batch_idx", f"entries must be in [0, {limit}) ({what})")
    s_new = 0 if k_new is None else k_new.shape[1]
    if s_new:
        cap = page_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        if (start + s_new > cap).any():
            where = "max_pages * page_size" if paged else "the cache length"
            _fail("k_new", f"cache_seqlens[b] + s_new must be <= {cap} ({where})")
        if paged:
            pos = start[:, None] + torch.arange(s_new)
            pages = page_table.long()[seq[:, None], pos // k_cache.shape[1]]
            if ((pages < 0) | (pages >= k_cache.shape[0])).any():
                _fail("page_table", f"pages the append writes must be in [0, {k_cache.shape[0]})")
    if rotary_cos is not None and start.numel():
        rows = max(s_new, q.shape[1] if per_row else min(q.shape[1], 1))
        last = start.max().item() + rows - 1
        if rows and last >= rotary_cos.shape[0]:
            _fail(
                "rotary_cos",
                f"rotary position {last} is past the table (seqlen_ro {rotary_cos.shape[0]})",
            )
