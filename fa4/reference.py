"""Exact attention in fp32 (or fp64) on any device: the ground truth of every fa4 test.

Layout as the public API: q (b, s_q, h, d), k (b, s_k, h_kv, d), v (b, s_k, h_kv, d_v);
varlen packs sequences along dim 0: q (total_q, h, d). LSE is natural-log, fp32, (b, h, s_q)
dense and (h, total_q) varlen.

Note [mask alignment]: query row i may see key column j iff
    j <= i + (s_k - s_q) + right      (right = 0 when causal; unbounded when -1)
    j >= i + (s_k - s_q) - left       (unbounded when left == -1)
i.e. masks are aligned to the bottom-right corner when s_q != s_k, as in flash-attn.

Note [empty rows]: a query row that sees no key (possible with s_q > s_k under causal, with a
sliding window, or with a zero-length key sequence) gets out = 0 and lse = +inf, so that the
backward's P = exp(S - lse) is exactly 0 on that row.

Memory is bounded by processing query blocks: a block holds b·h·block_q·s_k scores, and
block_q is chosen so that this stays under SCORE_BUDGET elements; seqlen 16k runs on a CPU.
"""

from __future__ import annotations

import math

import torch

SCORE_BUDGET = 1 << 25  # fp32 scores per query block (128 MiB)


def allowed_keys(
    rows: torch.Tensor, s_q: int, s_k: int, causal: bool, window: tuple[int, int]
) -> torch.Tensor:
    """Bool (len(rows), s_k): which keys each query row sees (Note [mask alignment])."""
    left, right = window
    if causal:
        right = 0
    cols = torch.arange(s_k, device=rows.device)
    diag = (rows + (s_k - s_q)).unsqueeze(1)
    keep = torch.ones(len(rows), s_k, dtype=torch.bool, device=rows.device)
    if right >= 0:
        keep &= cols <= diag + right
    if left >= 0:
        keep &= cols >= diag - left
    return keep


def _compute_dtype(dtype: torch.dtype, upcast: bool) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    return torch.float32 if upcast else dtype


def _lse_dtype(cdt: torch.dtype) -> torch.dtype:
    return torch.float64 if cdt == torch.float64 else torch.float32


def _block_rows(b: int, h: int, s_k: int) -> int:
    return max(1, SCORE_BUDGET // max(1, b * h * s_k))


def _expand_kv(x: torch.Tensor, h: int) -> torch.Tensor:
    """(b, s, h_kv, d) -> (b, h, s, d), repeating each kv head over its query-head group."""
    return x.transpose(1, 2).repeat_interleave(h // x.shape[2], dim=1)


def _scores(qb, kh, scale, softcap, keep):
    """Scores of one query block after scale, softcap and mask; also tanh for its gradient."""
    s = torch.matmul(qb, kh.transpose(-1, -2)) * scale
    t = None
    if softcap > 0:
        t = torch.tanh(s / softcap)
        s = t * softcap
    return s.masked_fill(~keep, float("-inf")), t


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse). upcast=True: fp32 math (fp64 inputs stay fp64), out in that dtype.
    upcast=False: every step rounded to the input dtype, the naive low-precision baseline of
    the tolerance rule (DESIGN.md §5)."""
    b, s_q, h, d = q.shape
    s_k = k.shape[1]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    cdt = _compute_dtype(q.dtype, upcast)
    qh = q.transpose(1, 2).to(cdt)
    kh, vh = _expand_kv(k, h).to(cdt), _expand_kv(v, h).to(cdt)
    out = torch.empty(b, h, s_q, v.shape[-1], dtype=cdt, device=q.device)
    lse = torch.empty(b, h, s_q, dtype=_lse_dtype(cdt), device=q.device)
    step = _block_rows(b, h, s_k)
    for r0 in range(0, s_q, step):
        rows = torch.arange(r0, min(s_q, r0 + step), device=q.device)
        keep = allowed_keys(rows, s_q, s_k, causal, window_size)
        s, _ = _scores(qh[:, :, rows], kh, scale, softcap, keep)
        blk_lse = torch.logsumexp(s.to(lse.dtype), dim=-1)
        blk_lse = blk_lse.masked_fill(blk_lse == -math.inf, math.inf)  # Note [empty rows]
        p = torch.exp(s - blk_lse.to(cdt).unsqueeze(-1))
        out[:, :, rows] = torch.matmul(p, vh)
        lse[:, :, rows] = blk_lse
    return out.transpose(1, 2), lse


def attention_ref_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    dlse: torch.Tensor | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blocked backward from the saved LSE (the kernels' algorithm, in exact arithmetic).

    dS = P ∘ (dP − D) with D = rowsum(dO ∘ O) − dLSE: the LSE's own gradient enters through D
    because ∂lse_i/∂S_ij = P_ij. Returns (dq, dk, dv) in the compute dtype; dk and dv are summed
    over each query-head group (GQA)."""
    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    cdt = _compute_dtype(q.dtype, upcast)
    qh, doh = q.transpose(1, 2).to(cdt), dout.transpose(1, 2).to(cdt)
    kh, vh = _expand_kv(k, h).to(cdt), _expand_kv(v, h).to(cdt)
    big_d = (doh * out.transpose(1, 2).to(cdt)).sum(-1)
    if dlse is not None:
        big_d = big_d - dlse.to(cdt)
    lse_c = lse.to(cdt)
    dq = torch.empty_like(qh)
    dk, dv = torch.zeros_like(kh), torch.zeros_like(vh)
    step = _block_rows(b, h, s_k)
    for r0 in range(0, s_q, step):
        rows = torch.arange(r0, min(s_q, r0 + step), device=q.device)
        keep = allowed_keys(rows, s_q, s_k, causal, window_size)
        s, t = _scores(qh[:, :, rows], kh, scale, softcap, keep)
        p = torch.exp(s - lse_c[:, :, rows].unsqueeze(-1))
        dv += torch.matmul(p.transpose(-1, -2), doh[:, :, rows])
        dp = torch.matmul(doh[:, :, rows], vh.transpose(-1, -2))
        ds = p * (dp - big_d[:, :, rows].unsqueeze(-1))
        if t is not None:
            ds = ds * (1 - t * t)
        ds = ds * scale
        dq[:, :, rows] = torch.matmul(ds, kh)
        dk += torch.matmul(ds.transpose(-1, -2), qh[:, :, rows])
    group = h // h_kv
    dk = dk.view(b, h_kv, group, s_k, d).sum(2)
    dv = dv.view(b, h_kv, group, s_k, v.shape[-1]).sum(2)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def _segments(cu_q, cu_k, seqused_k):
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    used = seqused_k.tolist() if seqused_k is not None else None
    for i in range(len(cu_q) - 1):
        k_len = cu_k[i + 1] - cu_k[i] if used is None else used[i]
        yield slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i] + k_len)


def attention_varlen_ref(
    q, k, v, cu_seqlens_q, cu_seqlens_k, *, seqused_k=None, **kw
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen: q (total_q, h, d), k/v (total_k, h_kv, ·); lse (h, total_q). Rows of q past
    cu_seqlens_q[-1] do not exist by contract (dispatch checks cu_seqlens_q[-1] == total_q)."""
    cdt = _compute_dtype(q.dtype, kw.get("upcast", True))
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=cdt)
    lse = torch.full((q.shape[1], q.shape[0]), math.inf, dtype=_lse_dtype(cdt), device=q.device)
    for qs, ks in _segments(cu_seqlens_q, cu_seqlens_k, seqused_k):
        if qs.stop == qs.start:
            continue
        if ks.stop == ks.start:
            continue  # Note [empty rows]: out 0, lse +inf, already there
        o, l = attention_ref(q[None, qs], k[None, ks], v[None, ks], **kw)
        out[qs], lse[:, qs] = o[0], l[0]
    return out, lse


def attention_varlen_ref_bwd(
    dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *, seqused_k=None, dlse=None, **kw
):
    """Backward of attention_varlen_ref; keys past seqused_k get zero gradient."""
    cdt = _compute_dtype(q.dtype, kw.get("upcast", True))
    dq = q.new_zeros(q.shape, dtype=cdt)
    dk, dv = k.new_zeros(k.shape, dtype=cdt), v.new_zeros(v.shape, dtype=cdt)
    for qs, ks in _segments(cu_seqlens_q, cu_seqlens_k, seqused_k):
        if qs.stop == qs.start or ks.stop == ks.start:
            continue
        seg_dlse = None if dlse is None else dlse[None, :, qs]
        g = attention_ref_bwd(
            dout[None, qs], q[None, qs], k[None, ks], v[None, ks], out[None, qs],
            lse[None, :, qs], dlse=seg_dlse, **kw,
        )  # fmt: skip
        dq[qs], dk[ks], dv[ks] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv
