"""fa4: FlashAttention-4 kernels (SM90 Hopper, SM100 Blackwell) with a thin PyTorch layer.

out = fa4.attention(q, k, v, causal=True)            # q, k, v: (batch, seqlen, heads, d)
out = fa4.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)   # q: (total_q, heads, d)
out = fa4.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k_new=k, v_new=v)  # decode
out = fa4.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)  # FP8 (e4m3), bf16 out
"""

from __future__ import annotations

from pathlib import Path

__version__ = (Path(__file__).with_name("VERSION")).read_text().strip()

import torch  # noqa: E402

from . import _ops, dispatch, value_checks  # noqa: E402

__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "__version__"]


def attention(
    q,
    k,
    v,
    *,
    causal=False,
    softmax_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_lse=False,
    deterministic=False,
    backend="auto",
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """Scaled dot-product attention, differentiable in q, k, v (and learnable_sink).

    q (b, s_q, h, d), k (b, s_k, h_kv, d), v (b, s_k, h_kv, d_v) with h % h_kv == 0 (GQA/MQA).
    causal and window_size=(left, right) are aligned to the bottom-right corner when
    s_q != s_k; softcap > 0 applies softcap·tanh(s/softcap) to the scaled scores.
    learnable_sink: float32 (h,), one logit per q head (in the units of the scaled, softcapped
    scores) that joins every row's softmax denominator and has no value (gpt-oss); the LSE
    includes it. Differentiable (docs/inference.md).
    Returns out (b, s_q, h, d_v) in q's dtype, and with return_lse the natural-log LSE, fp32
    (b, h, s_q); rows that see no key get out 0 and lse -inf (lse = sink with a sink).
    backend: "auto" (the kernel for the device, else the reference with a warning),
    "reference", "sm90", "sm100" (these two raise when they cannot run the problem).
    FP8 forward: q, k, v all float8_e4m3fn, q_descale / k_descale / v_descale float32
    (b, h_kv) or None (1), FA3's meaning: true value = stored x descale[b, kv head] (a q head
    uses its kv head's q_descale; positive and finite: their values are not checked). out is
    bf16. Forward only; no learnable_sink; head dims
    multiples of 16; on CUDA it needs an e4m3 kernel in the build (else it raises: use
    backend="reference"). docs/numerics.md, "FP8".
    """
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    opts = dispatch.check_dense(
        q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
        softcap=softcap, deterministic=deterministic, backend=backend,
        learnable_sink=learnable_sink, descales=descales,
    )  # fmt: skip
    serving = _ops.Serving(learnable_sink=learnable_sink, **_contiguous(descales))
    out, lse = _ops.call_fwd(q, k, v, opts, serving=serving)
    return (out, lse) if return_lse else out


def attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    seqused_q=None,
    seqused_k=None,
    page_table=None,
    learnable_sink=None,
    num_splits=0,
    causal=False,
    softmax_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    return_lse=False,
    deterministic=False,
    backend="auto",
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """Attention over packed sequences: q (total_q, h, d), k/v (total_k, h_kv, ·).

    cu_seqlens_q/k: int32 (batch + 1,), starting at 0, non-decreasing; cu_seqlens_q[-1] must
    equal total_q. seqused_k (int32, (batch,)) optionally uses only the first seqused_k[i] keys
    of sequence i; seqused_q likewise its first query rows (the others get out 0, lse -inf and
    zero gradients). Zero-length sequences are allowed. LSE is (h, total_q).
    page_table (int32 (batch, max_pages)): k/v are a page pool (num_pages, page_size, h_kv, ·),
    key j of sequence i is row j % page_size of page page_table[i, j // page_size];
    cu_seqlens_k must be None and seqused_k gives the key counts. Forward only.
    learnable_sink: as in attention. num_splits: int >= 0 (0 = heuristic, 1 = no split, n = split
    the keys into up to n parts); it changes only the summation order. docs/inference.md.
    FP8 forward: as in attention, descales (batch, h_kv) with batch = the number of sequences;
    no page_table, seqused_q, learnable_sink or num_splits > 1 with it.
    """
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    opts = dispatch.check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
        seqused_q=seqused_q, page_table=page_table, learnable_sink=learnable_sink,
        num_splits=num_splits, causal=causal, softmax_scale=softmax_scale,
        window_size=window_size, softcap=softcap, deterministic=deterministic, backend=backend,
        descales=descales,
    )  # fmt: skip
    serving = _ops.Serving(
        seqused_q=seqused_q, page_table=page_table, learnable_sink=learnable_sink,
        num_splits=num_splits, **_contiguous(descales),
    )  # fmt: skip
    out, lse = _ops.call_fwd(
        q, k, v, opts, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, serving
    )
    return (out, lse) if return_lse else out


def _contiguous(descales: dict) -> dict:
    """The descales as the kernels read them (dense (rows, h_kv) fp32)."""
    return {n: None if t is None else t.contiguous() for n, t in descales.items()}


def attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    *,
    k_new=None,
    v_new=None,
    rotary_cos=None,
    rotary_sin=None,
    rotary_interleaved=False,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    causal=False,
    softmax_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    num_splits=0,
    return_lse=False,
    backend="auto",
    k_descale=None,
    v_descale=None,
):
    """Decode / prefill against a KV cache, FA3's flash_attn_with_kvcache (docs/inference.md).

    q (b, s_q, h, d). k_cache/v_cache (b_cache, s_cache, h_kv, d / d_v), or page pools
    (num_pages, page_size, h_kv, ·) with page_table int32 (b, max_pages) (b_cache rows when
    cache_batch_idx picks them). cache_seqlens: int or int32 (b,). Sequence b uses cache row
    cache_batch_idx[b] (or b), whose keys [cache_leftpad[b] (or 0), cache_seqlens[b]) are valid.
    k_new/v_new (b, s_new, h_kv, ·) are written into the cache in place at positions
    cache_seqlens[b] + t, rotated first when rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2)
    are given (positions in cache coordinates: cache_leftpad does not shift them); q is rotated
    at cache_seqlens[b] + i when causal or windowed, else at cache_seqlens[b].
    rotary_interleaved=False pairs dims i and i + rotary_dim / 2 (GPT-NeoX; FA3 defaults to
    True). The attention then sees cache_seqlens[b] + s_new keys, masks aligned to the
    bottom-right corner of [cache_leftpad[b], cache_seqlens[b] + s_new). Forward only.
    An FP8 cache: k_cache/v_cache float8_e4m3fn with fp16/bf16 q (head dims multiples of 16 on
    the kernels); k_descale/v_descale float32 (b, h_kv) or None (1): the true value of sequence
    b's element is stored x descale[b, kv head]; k_new/v_new (q's dtype) are divided by the
    descale, saturated to +-448 and rounded to e4m3 on their way into the cache.
    Returns out (b, s_q, h, d_v) [, lse (b, h, s_q)].
    """
    opts = dispatch.check_kvcache(
        q, k_cache, v_cache, cache_seqlens, k_new=k_new, v_new=v_new, rotary_cos=rotary_cos,
        rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, page_table=page_table,
        learnable_sink=learnable_sink, num_splits=num_splits, causal=causal,
        softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
        deterministic=False, backend=backend, k_descale=k_descale, v_descale=v_descale,
    )  # fmt: skip
    if k_descale is not None:
        k_descale = k_descale.contiguous()
    if v_descale is not None:
        v_descale = v_descale.contiguous()
    s_new = 0 if k_new is None else k_new.shape[1]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    value_checks.check_cache_append_data(
        cache_seqlens, s_new, cache_leftpad, cache_batch_idx, page_table, k_cache, rotary_cos,
        dispatch.rotary_span(q, s_new, opts),
    )  # fmt: skip
    if k_new is not None or rotary_cos is not None:
        from . import kvcache  # helper module of the append (imported where it is needed)

        q = kvcache.append_rotary(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens, rotary_cos=rotary_cos,
            rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
            cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, page_table=page_table,
            rotate_q_per_row=dispatch.rotate_q_per_row(opts), k_descale=k_descale,
            v_descale=v_descale,
        )  # fmt: skip
    seqused_k = cache_seqlens + s_new if s_new else cache_seqlens
    serving = _ops.Serving(
        page_table=page_table, cache_batch_idx=cache_batch_idx, leftpad_k=cache_leftpad,
        learnable_sink=learnable_sink, num_splits=num_splits, k_descale=k_descale,
        v_descale=v_descale,
    )  # fmt: skip
    capacity = dispatch.cache_capacity(k_cache, page_table)
    with value_checks.values_checked():  # check_cache_append_data covered the op's value rules
        out, lse = _ops.call_fwd(
            q, k_cache, v_cache, opts, None, None, seqused_k, q.shape[1], capacity, serving
        )
    return (out, lse) if return_lse else out
