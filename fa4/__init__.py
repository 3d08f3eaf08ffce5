"""fa4: FlashAttention-4 kernels (SM90 Hopper, SM100 Blackwell) with a thin PyTorch layer.

out = fa4.attention(q, k, v, causal=True)            # q, k, v: (batch, seqlen, heads, d)
out = fa4.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)   # q: (total_q, heads, d)
"""

from __future__ import annotations

from pathlib import Path

__version__ = (Path(__file__).with_name("VERSION")).read_text().strip()

from . import _ops, dispatch  # noqa: E402

__all__ = ["attention", "attention_varlen", "__version__"]


def attention(
    q,
    k,
    v,
    *,
    causal=False,
    softmax_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    return_lse=False,
    deterministic=False,
    backend="auto",
):
    """Scaled dot-product attention, differentiable in q, k, v.

    q (b, s_q, h, d), k (b, s_k, h_kv, d), v (b, s_k, h_kv, d_v) with h % h_kv == 0 (GQA/MQA).
    causal and window_size=(left, right) are aligned to the bottom-right corner when
    s_q != s_k; softcap > 0 applies softcap·tanh(s/softcap) to the scaled scores.
    Returns out (b, s_q, h, d_v) in q's dtype, and with return_lse the natural-log LSE, fp32
    (b, h, s_q); rows that see no key get out 0 and lse -inf.
    backend: "auto" (the kernel for the device, else the reference with a warning),
    "reference", "sm90", "sm100" (these two raise when they cannot run the problem).
    """
    opts = dispatch.check_dense(
        q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
        softcap=softcap, deterministic=deterministic, backend=backend,
    )  # fmt: skip
    out, lse = _ops.call_fwd(q, k, v, opts)
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
    seqused_k=None,
    causal=False,
    softmax_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    return_lse=False,
    deterministic=False,
    backend="auto",
):
    """Attention over packed sequences: q (total_q, h, d), k/v (total_k, h_kv, ·).

    cu_seqlens_q/k: int32 (batch + 1,), starting at 0, non-decreasing; cu_seqlens_q[-1] must
    equal total_q. seqused_k (int32, (batch,)) optionally uses only the first seqused_k[i] keys
    of sequence i. Zero-length sequences are allowed. LSE is (h, total_q).
    """
    opts = dispatch.check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
        causal=causal, softmax_scale=softmax_scale, window_size=window_size,
        softcap=softcap, deterministic=deterministic, backend=backend,
    )  # fmt: skip
    out, lse = _ops.call_fwd(
        q, k, v, opts, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k
    )
    return (out, lse) if return_lse else out
