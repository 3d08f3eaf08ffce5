"""flash-attn 2's Python functions on top of fa4: change one import.

    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from fa4.flash_attn_interface import (  # the same names, signatures and return values
        flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache)

The signatures (positional order and defaults) and return conventions are those of flash-attn 2's
`flash_attn/flash_attn_interface.py` (Dao-AILab/flash-attention, read at commit 00530025):
- `flash_attn_func` / `flash_attn_varlen_func` return `out`, or with `return_attn_probs=True`
  `(out, softmax_lse, S_dmask)`. flash-attn computes S_dmask only when `dropout_p > 0`
  (`return_softmax=return_attn_probs and dropout_p > 0`) and otherwise returns an empty tensor
  `(0,)` of q's dtype; fa4 has no dropout, so S_dmask is always that empty tensor, exactly what
  flash-attn returns for `dropout_p=0`. The attention probabilities themselves are never
  available (fa4 does not materialize them).
- `flash_attn_with_kvcache` returns `out`, or `(out, softmax_lse)` with `return_softmax_lse`.
- softmax_lse: fp32, (batch, nheads, seqlen_q) dense, (nheads, total_q) varlen, natural log.

How each argument maps onto fa4.attention / attention_varlen / attention_with_kvcache:
- q, k, v, cu_seqlens_q/k, max_seqlen_q/k, softmax_scale, causal, deterministic: passed as is
  (deterministic makes fa4's backward bitwise reproducible; the forward always is).
- window_size: an entry >= seqlen_k becomes None (unbounded), as flash-attn's C++ sets it to -1
  (which decides, e.g., whether the kvcache path rotates q per row); then fa4.attention follows
  flash-attn's rules (dispatch.window_entries):
  None and -1 mean unbounded, two negative entries mean no window, any other negative entry
  shifts that edge past the diagonal (flash-attn-4's meaning; flash-attn 2 would read it as
  unbounded), and causal=True sets the right entry to 0 (`if (is_causal) window_size_right = 0`).
- softcap: > 0 softcaps; flash-attn treats any value <= 0 as off, so a negative softcap is 0.
- block_table (varlen): k/v are page pools (num_blocks, page_block_size, nheads_k, headdim),
  cu_seqlens_k gives each sequence's key count; fa4 gets page_table=block_table,
  cu_seqlens_k=None and seqused_k = diff(cu_seqlens_k). Any page size works (flash-attn needs a
  multiple of 256). Forward only, as in flash-attn.
- flash_attn_with_kvcache: k/v -> k_new/v_new (appended in place at cache_seqlens),
  block_table -> page_table, return_softmax_lse -> return_lse, rotary_interleaved keeps
  flash-attn's default True (fa4's own default is False), cache_seqlens=None means the whole
  cache (flash-attn's meaning; it then requires k=v=None), num_splits, cache_batch_idx and
  cache_leftpad are passed as is. Forward only.
- The backend is fa4's "auto": the compiled kernel for the device, else the CPU reference.

What raises NotImplementedError (fa4 lacks it; none is ignored silently):
- dropout_p != 0 (fa4 has no dropout).
- alibi_slopes not None (fa4 has no ALiBi bias).

Differences that remain: a query row that sees no key has lse = -inf (flash-attn 2 writes +inf);
fa4's head dims are multiples of 8 up to 256 (flash-attn 2: any up to 256), and its
kernels take fp16/bf16 (the CPU reference also fp32/fp64); fa4's softmax_lse is differentiable.
FA3 (`hopper/flash_attn_interface.py`) differs from flash-attn 2: no dropout_p argument (so
softmax_scale is its 4th positional argument), extra arguments (qv, descales, attention_chunk,
num_splits, pack_gqa, sm_margin) and `(out, softmax_lse)` with return_attn_probs; code written
for FA3 should call fa4.attention / attention_varlen directly (FA3's FP8 forward too: e4m3 q, k,
v with q_descale / k_descale / v_descale are keywords of those, not of flash-attn 2's functions).
flash-attn-4 (`flash_attn/cute/interface.py`) spells unbounded windows None and takes
learnable_sink: use fa4.attention(..., learnable_sink=...) for those.
"""

from __future__ import annotations

import numbers

import torch

from . import attention, attention_varlen, attention_with_kvcache

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]


def _unsupported(name, value, why):
    raise NotImplementedError(f"fa4.flash_attn_interface: {name}={value!r} is not supported: {why}")


def _common(dropout_p, alibi_slopes, softcap):
    if alibi_slopes is not None:
        _unsupported("alibi_slopes", "<tensor>", "fa4 has no ALiBi bias")
    if not (isinstance(dropout_p, numbers.Real) and not isinstance(dropout_p, bool)):
        raise TypeError(f"fa4.flash_attn_interface: dropout_p: expected float, got {dropout_p!r}")
    if dropout_p != 0:
        _unsupported("dropout_p", dropout_p, "fa4 has no dropout (pass 0.0)")
    if isinstance(softcap, numbers.Real) and not isinstance(softcap, bool) and softcap < 0:
        return 0.0  # flash-attn: anything <= 0 deactivates softcapping
    return softcap  # fa4 checks the rest (type, finiteness)


def _window(window_size, seqlen_k):
    """Entries >= seqlen_k unbounded (None, so that the other entry keeps its meaning); fa4
    checks the rest and raises its own errors naming window_size."""
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        return window_size
    big = [isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= seqlen_k
           for w in window_size]  # fmt: skip
    return tuple(None if b else w for w, b in zip(window_size, big, strict=True))


def _empty_probs(q):
    return torch.empty((0,), dtype=q.dtype, device=q.device)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2's flash_attn_func on fa4.attention (module docstring: the mapping).

    q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim); causal and
    window masks aligned to the bottom-right corner. Returns out (batch, seqlen_q, nheads,
    headdim_v), or with return_attn_probs (out, softmax_lse (batch, nheads, seqlen_q),
    S_dmask): S_dmask is the empty (0,) tensor flash-attn returns when dropout_p == 0.
    Raises NotImplementedError for dropout_p != 0 and alibi_slopes.
    """
    softcap = _common(dropout_p, alibi_slopes, softcap)
    out, lse = attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale,
        window_size=_window(window_size, k.shape[1]),
        softcap=softcap, return_lse=True, deterministic=deterministic,
    )  # fmt: skip
    return (out, lse, _empty_probs(q)) if return_attn_probs else out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """flash-attn 2's flash_attn_varlen_func on fa4.attention_varlen.

    q (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim), cu_seqlens_q/k int32
    (batch + 1,). With block_table int32 (batch, max_num_blocks), k/v are page pools
    (num_blocks, page_block_size, nheads_k, headdim) and cu_seqlens_k gives the key counts
    (forward only). Returns out (total_q, nheads, headdim_v), or with return_attn_probs
    (out, softmax_lse (nheads, total_q), S_dmask), S_dmask the empty (0,) tensor of dropout_p 0.
    Raises NotImplementedError for dropout_p != 0 and alibi_slopes.
    """
    softcap = _common(dropout_p, alibi_slopes, softcap)
    seqused_k = None
    if block_table is not None:
        if not isinstance(cu_seqlens_k, torch.Tensor):
            raise TypeError(
                "fa4.flash_attn_interface: cu_seqlens_k: with block_table, an int32 tensor "
                "(batch + 1,) giving the key counts"
            )
        seqused_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
        cu_seqlens_k = None
    out, lse = attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
        page_table=block_table, causal=causal, softmax_scale=softmax_scale,
        window_size=_window(window_size, max_seqlen_k),
        softcap=softcap, return_lse=True, deterministic=deterministic,
    )  # fmt: skip
    return (out, lse, _empty_probs(q)) if return_attn_probs else out


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """flash-attn 2's flash_attn_with_kvcache on fa4.attention_with_kvcache (forward only).

    k/v (batch, seqlen_new, nheads_k, headdim) are written into k_cache/v_cache in place at
    cache_seqlens (rotated first by rotary_cos/rotary_sin; rotary_interleaved defaults to True
    as in flash-attn). cache_seqlens: int, int32 (batch,), or None for the whole cache (then k
    and v must be None, as flash-attn requires). block_table: the page table of paged caches.
    Returns out (batch, seqlen_q, nheads, headdim_v) [, softmax_lse (batch, nheads, seqlen_q)].
    Raises NotImplementedError for alibi_slopes.
    """
    softcap = _common(0.0, alibi_slopes, softcap)
    capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])
    if cache_seqlens is None:
        if k is not None or v is not None:
            raise ValueError(
                "fa4.flash_attn_interface: cache_seqlens: required when k/v are given "
                "(flash-attn: 'If key is supplied, seqlens_k must also be passed in')"
            )
        cache_seqlens = capacity  # flash-attn: no cache_seqlens = every row of the cache
    return attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens, k_new=k, v_new=v, rotary_cos=rotary_cos,
        rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, page_table=block_table,
        causal=causal, softmax_scale=softmax_scale, window_size=_window(window_size, capacity),
        softcap=softcap, num_splits=num_splits, return_lse=return_softmax_lse,
    )  # fmt: skip
