"""The checks that read index values, before any kernel: check_varlen_data and
check_kvcache_data inside the op implementation (eager), check_cache_append_data before
attention_with_kvcache writes into the cache. They read the tensors in one host copy (a device
sync on GPU) and are skipped while a CUDA graph is captured, under torch.compile's tracing,
inside values_checked() and with FA4_SKIP_VALUE_CHECKS=1. The checks of shapes, dtypes and
options are fa4/dispatch.py's.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from .dispatch import _fail, _getenv, cache_capacity

_values = threading.local()  # .checked: this thread's value checks are done (values_checked)


@contextlib.contextmanager
def values_checked():
    """The calls inside (this thread) skip the value checks: the caller has made them already
    (attention_with_kvcache, before its append; the op would repeat them, one more device sync
    on GPU)."""
    before = getattr(_values, "checked", False)
    _values.checked = True
    try:
        yield
    finally:
        _values.checked = before


def _host(*tensors):
    """The index tensors on the host, in one copy (one device sync on GPU); None where the values
    are not read: while a CUDA graph is captured, under torch.compile's tracing, inside
    values_checked(), or with FA4_SKIP_VALUE_CHECKS=1 (for callers that guarantee the value
    rules themselves: on GPU the sync leaves the device idle between a call's launches)."""
    given = [t for t in tensors if t is not None]
    if getattr(_values, "checked", False) or _getenv("FA4_SKIP_VALUE_CHECKS") == "1":
        return None
    if torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in given):
        return None  # traced: fake tensors and other subclasses have no values to read
    if any(t.is_cuda for t in given):
        if torch.cuda.is_current_stream_capturing():
            return None
        flat = torch.cat([t.reshape(-1).to(torch.int64) for t in given]).cpu()
        parts = iter(flat.split([t.numel() for t in given]))
        given = [p.view(t.shape) for p, t in zip(parts, given, strict=True)]
    it = iter(given)
    return [None if t is None else next(it) for t in tensors]


def _check_pages(page_table, rows, starts, stops, num_pages, page_size):
    """Every page_table entry that keys [starts[i], stops[i]) of row rows[i] touch must lie in
    [0, num_pages) (host tensors; one vectorized pass, no loop over sequences). Note [page check
    fast path]: a table whose every entry lies in the pool passes without finding the touched
    entries, in one aminmax: 2-6 µs of host time per decode call against 45-434 µs for the
    touched mask (b 4 x 129 pages, b 64 x 2049; this machine's CPU)."""
    if page_table.numel():
        lo, hi = torch.aminmax(page_table)
        if int(lo) >= 0 and int(hi) < num_pages:
            return
    rows, starts, stops = rows.long(), starts.long(), stops.long()
    cols = torch.arange(page_table.shape[1])
    first, end = starts // page_size, (stops + page_size - 1) // page_size
    touched = (cols >= first[:, None]) & (cols < end[:, None]) & (stops > starts)[:, None]
    entries = page_table.long()[rows]  # (b, max_pages)
    bad = touched & ((entries < 0) | (entries >= num_pages))
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        r, lo, hi = int(rows[i]), int(starts[i]), int(stops[i])
        _fail(
            "page_table",
            f"entry [{r}, {j}] = {int(entries[i, j])} (used by keys [{lo}, {hi}) of sequence "
            f"{i}) must lie in [0, num_pages = {num_pages})",
        )


def check_varlen_data(
    cu_q, cu_k, seqused_k, total_q, total_k, max_q, max_k, *, seqused_q=None, page_table=None,
    page_shape=None,
) -> None:  # fmt: skip
    """Checks that read the index tensors (one device sync on GPU); skipped while a CUDA graph is
    being captured, where reading them is impossible. With a page_table, cu_k is None and
    page_shape is the pool's (num_pages, page_size)."""
    host = _host(cu_q, cu_k, seqused_k, seqused_q, page_table)
    if host is None:
        return
    cq, ck, used, used_q, pt = host
    for name, c in (("cu_seqlens_q", cq), ("cu_seqlens_k", ck)):
        if c is None:
            continue
        if c[0] != 0:
            _fail(name, f"must start at 0, got {int(c[0])}")
        if bool((c[1:] < c[:-1]).any()):
            _fail(name, f"must be non-decreasing, got {c.tolist()}")
    if int(cq[-1]) != total_q:
        _fail("cu_seqlens_q", f"last entry {int(cq[-1])} must equal q.shape[0] = {total_q}")
    if ck is not None and int(ck[-1]) > total_k:
        _fail("cu_seqlens_k", f"last entry {int(ck[-1])} exceeds k.shape[0] = {total_k}")
    len_q = cq.diff()
    if pt is not None:
        num_pages, page_size = page_shape
        capacity = pt.shape[1] * page_size
        if bool((used < 0).any() | (used > capacity).any()):
            _fail(
                "seqused_k",
                f"entries must lie in [0, max_pages * page_size = {capacity}] with a page_table, "
                f"got {used.tolist()}",
            )
        rows = torch.arange(len(used))
        _check_pages(pt, rows, torch.zeros_like(used), used, num_pages, page_size)
        len_k = used
    else:
        len_k = ck.diff()
        if used is not None:
            if bool((used < 0).any() | (used > len_k).any()):
                _fail(
                    "seqused_k",
                    f"entries must lie in [0, length of key sequence i], got {used.tolist()}",
                )
            len_k = used
    if used_q is not None and bool((used_q < 0).any() | (used_q > len_q).any()):
        _fail(
            "seqused_q",
            f"entries must lie in [0, length of query sequence i], got {used_q.tolist()}",
        )
    if not len_q.numel():
        return  # batch 0: no sequence to bound
    if int(len_q.max()) > max_q:
        _fail("max_seqlen_q", f"{max_q} is less than the longest query sequence {int(len_q.max())}")
    if int(len_k.max()) > max_k:
        _fail("max_seqlen_k", f"{max_k} is less than the longest key sequence {int(len_k.max())}")


def check_kvcache_data(seqused_k, leftpad_k, cache_batch_idx, page_table, k, batch) -> None:
    """The op's KV-cache values for a dense q of `batch` sequences (Note [kv cache keys] in
    reference.py): rows in range, keys [leftpad_k, seqused_k) inside the cache, their pages in
    the pool."""
    if page_table is not None and seqused_k is None:
        _fail("seqused_k", "is required with a page_table (the key count of each sequence)")
    for name, t in (("seqused_k", seqused_k), ("leftpad_k", leftpad_k),
                    ("cache_batch_idx", cache_batch_idx)):  # fmt: skip
        if t is not None and tuple(t.shape) != (batch,):
            _fail(name, f"shape {tuple(t.shape)} must be (batch,) = ({batch},)")
    n_rows = k.shape[0] if page_table is None else page_table.shape[0]
    if cache_batch_idx is None and n_rows != batch:
        what = "page_table rows" if page_table is not None else "k's batch"
        _fail("cache_batch_idx", f"is required when {what} ({n_rows}) differ from q's ({batch})")
    host = _host(seqused_k, leftpad_k, cache_batch_idx, page_table)
    if host is None:
        return
    used, left, rows, pt = host
    capacity = cache_capacity(k, pt)
    b = batch
    rows = _check_rows("cache_batch_idx", rows, b, n_rows)
    used = torch.full((b,), capacity) if used is None else used
    if bool((used < 0).any() | (used > capacity).any()):
        _fail("seqused_k", f"entries must lie in [0, {capacity}] (the cache's capacity), got "
              f"{used.tolist()}")  # fmt: skip
    left = torch.zeros_like(used) if left is None else left
    if bool((left < 0).any() | (left > used).any()):
        _fail("leftpad_k", f"entries must lie in [0, seqused_k[i]], got {left.tolist()}")
    if pt is not None:
        _check_pages(pt, rows, left, used, k.shape[0], k.shape[1])


def _check_rows(name, rows, b, n_rows):
    """cache_batch_idx values in [0, n_rows); the identity when None."""
    if rows is None:
        return torch.arange(b)
    if bool((rows < 0).any() | (rows >= n_rows).any()):
        _fail(name, f"entries must lie in [0, {n_rows}) (the cache's rows), got {rows.tolist()}")
    return rows


def check_cache_append_data(
    cache_seqlens, s_new, cache_leftpad, cache_batch_idx, page_table, k_cache, rotary_cos, span
) -> None:
    """attention_with_kvcache's values, read before the append writes into the cache:
    cache_seqlens[b] + s_new within the capacity, cache_leftpad[b] <= cache_seqlens[b], rows in
    range, the pages of keys [cache_leftpad, cache_seqlens + s_new) in the pool, and rotary rows
    for positions cache_seqlens[b] + span - 1."""
    host = _host(cache_seqlens, cache_leftpad, cache_batch_idx, page_table)
    if host is None:
        return
    seqlens, left, rows, pt = host
    b = seqlens.shape[0]
    rows = _check_rows("cache_batch_idx", rows, b, k_cache.shape[0] if pt is None else pt.shape[0])
    capacity = cache_capacity(k_cache, pt)
    # One aminmax per tensor instead of two comparisons and an any (Note [page check fast path]).
    lo, hi = (int(x) for x in torch.aminmax(seqlens)) if b else (0, 0)
    if lo < 0 or hi + s_new > capacity:
        _fail(
            "cache_seqlens",
            f"entries + s_new ({s_new}) must lie in [0, {capacity}] (the cache's capacity), got "
            f"{seqlens.tolist()}",
        )
    if left is not None and bool((left < 0).any() | (left > seqlens).any()):
        _fail("cache_leftpad", f"entries must lie in [0, cache_seqlens[i]], got {left.tolist()}")
    if pt is not None:
        starts = torch.zeros_like(seqlens) if left is None else left
        _check_pages(pt, rows, starts, seqlens + s_new, k_cache.shape[0], k_cache.shape[1])
    if rotary_cos is not None and b and hi + span > rotary_cos.shape[0]:
        _fail(
            "rotary_cos",
            f"seqlen_ro = {rotary_cos.shape[0]} rows, but positions up to max(cache_seqlens) + "
            f"{span - 1} = {hi + span - 1} are rotated",
        )
