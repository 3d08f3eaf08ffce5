"""Exact attention in fp32 (or fp64) on any device: the ground truth of every fa4 test.

Layout as the public API: q (b, s_q, h, d), k (b, s_k, h_kv, d), v (b, s_k, h_kv, d_v);
varlen packs sequences along dim 0: q (total_q, h, d). LSE is natural-log, fp32, (b, h, s_q)
dense and (h, total_q) varlen.

Note [mask alignment]: query row i may see key column j iff
    j <= i + (s_k - s_q) + right      (right = 0 when causal; unbounded when -1)
    j >= i + (s_k - s_q) - left       (unbounded when left == -1)
i.e. masks are aligned to the bottom-right corner when s_q != s_k, as in flash-attn.

Note [empty rows]: a query row that sees no key (possible with s_q > s_k under causal, with a
sliding window, or with a zero-length key sequence) gets out = 0 and lse = -inf, the log of an
empty sum (so merging partial results by their LSE gives such a part weight 0). Internally the
row's LSE is taken as +inf so that P = exp(S - lse) is exactly 0 there, forward and backward.

Note [learnable sink]: learnable_sink (h,) adds one logit per query head, in the units of the
scaled (and softcapped) scores, to every row's softmax denominator; it has no value row:
    lse_i = log(sum_j exp(s_ij) + exp(sink_h)),   out_i = sum_j exp(s_ij - lse_i) v_j.
The returned LSE includes the sink, so a row that sees no key gets out 0 and lse = sink_h. The
backward of q, k, v is unchanged given that LSE: dS = P o (dP - D) still holds, with
D = rowsum(dO o O) - dLSE. The sink's own gradient is d_sink[h] = -sum over rows of
exp(sink_h - lse_i) * D_i (learnable_sink_grad).

Note [paged KV]: with a page_table (int32 (batch, max_pages)), k/v are a pool of pages
(num_pages, page_size, h_kv, d) and key j of sequence b is row j % page_size of page
page_table[b, j // page_size]. The key count comes from seqused_k.

Note [kv cache keys] (attention_kvcache_ref, FA3's flash_attn_with_kvcache): sequence b reads
cache row r = cache_batch_idx[b] (or b; with a page_table, r picks the page_table row) and
sees its keys [leftpad_k[b] (or 0), seqused_k[b]) in cache coordinates. Masks align to the
bottom-right corner of that range, i.e. the key count is seqused_k[b] - leftpad_k[b]; keys
below leftpad_k are never read.

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
    """Bool (len(rows), s_k): which keys each query row sees (Note [mask alignment]). window as
    the ops take it (Note [window entries]): -1 (or None) leaves a side unbounded, any other entry
    is literal, a negative one shifting that edge past the diagonal; causal sets right to 0.
    fa4.attention maps flash-attn's spellings onto this first (dispatch.window_entries)."""
    left, right = (-1 if w is None else int(w) for w in window)
    if causal:
        right = 0
    cols = torch.arange(s_k, device=rows.device)
    diag = (rows + (s_k - s_q)).unsqueeze(1)
    keep = torch.ones(len(rows), s_k, dtype=torch.bool, device=rows.device)
    if right != -1:
        keep &= cols <= diag + right
    if left != -1:
        keep &= cols >= diag - left
    return keep


def _compute_dtype(dtype: torch.dtype, upcast: bool) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    return torch.float32 if upcast else dtype


def _lse_for_exp(lse: torch.Tensor) -> torch.Tensor:
    """Note [empty rows]: -inf (no key) becomes +inf so that exp(S - lse) is 0, not NaN."""
    return lse.masked_fill(lse == -math.inf, math.inf)


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
    learnable_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse). upcast=True: fp32 math (fp64 inputs stay fp64), out in that dtype.
    upcast=False: every step rounded to the input dtype, the naive low-precision baseline of
    the tolerance rule (DESIGN.md §5). learnable_sink: Note [learnable sink]."""
    b, s_q, h, d = q.shape
    s_k = k.shape[1]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    cdt = _compute_dtype(q.dtype, upcast)
    qh = q.transpose(1, 2).to(cdt)
    kh, vh = _expand_kv(k, h).to(cdt), _expand_kv(v, h).to(cdt)
    out = torch.empty(b, h, s_q, v.shape[-1], dtype=cdt, device=q.device)
    lse = torch.empty(b, h, s_q, dtype=_lse_dtype(cdt), device=q.device)
    sink = None if learnable_sink is None else learnable_sink.to(lse.dtype).view(1, h, 1)
    step = _block_rows(b, h, s_k)
    for r0 in range(0, s_q, step):
        rows = torch.arange(r0, min(s_q, r0 + step), device=q.device)
        keep = allowed_keys(rows, s_q, s_k, causal, window_size)
        s, _ = _scores(qh[:, :, rows], kh, scale, softcap, keep)
        blk_lse = torch.logsumexp(s.to(lse.dtype), dim=-1)
        if sink is not None:
            blk_lse = torch.logaddexp(blk_lse, sink)
        p = torch.exp(s - _lse_for_exp(blk_lse).to(cdt).unsqueeze(-1))
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
    lse_c = _lse_for_exp(lse).to(cdt)
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


def paged_rows(page_table_row: torch.Tensor, start: int, stop: int, page_size: int) -> torch.Tensor:
    """Note [paged KV]: flat row indices, into k.flatten(0, 1), of keys [start, stop) of the
    sequence whose page_table row this is."""
    j = torch.arange(start, stop, device=page_table_row.device)
    return page_table_row.long()[j // page_size] * page_size + j % page_size


def _kv_keys(k, v, row, start, stop, page_table):
    """Keys and values [start, stop) of cache row `row`: k/v dense (rows, s, h_kv, ·), or a page
    pool with page_table (Note [paged KV]). Returns (s, h_kv, ·) tensors."""
    if page_table is None:
        return k[row, start:stop], v[row, start:stop]
    idx = paged_rows(page_table[row], start, stop, k.shape[1])
    return k.flatten(0, 1)[idx], v.flatten(0, 1)[idx]


def _segments(cu_q, cu_k, seqused_k, seqused_q=None):
    """Per sequence: (query rows that are computed, key slice or key count)."""
    cu_q = cu_q.tolist()
    cu_k = cu_k.tolist() if cu_k is not None else None
    used = seqused_k.tolist() if seqused_k is not None else None
    used_q = seqused_q.tolist() if seqused_q is not None else None
    for i in range(len(cu_q) - 1):
        q_len = cu_q[i + 1] - cu_q[i] if used_q is None else used_q[i]
        k_start = cu_k[i] if cu_k is not None else 0
        k_len = cu_k[i + 1] - cu_k[i] if used is None else used[i]
        yield slice(cu_q[i], cu_q[i] + q_len), slice(k_start, k_start + k_len)


def _varlen_kv(k, v, i, ks, page_table):
    """Keys and values of sequence i: packed rows ks, or pages (ks then counts from 0)."""
    if page_table is None:
        return k[ks], v[ks]
    return _kv_keys(k, v, i, ks.start, ks.stop, page_table)


def _empty_lse(lse, learnable_sink):
    """Note [empty rows], Note [learnable sink]: the LSE of a row that sees no key."""
    if learnable_sink is None:
        return lse.new_full(lse.shape, -math.inf)
    return learnable_sink.to(lse.dtype).view(-1, *([1] * (lse.dim() - 1))).expand_as(lse)


def attention_varlen_ref(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    *,
    seqused_k=None,
    seqused_q=None,
    page_table=None,
    learnable_sink=None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen: q (total_q, h, d), k/v (total_k, h_kv, ·); lse (h, total_q). Rows of q past
    cu_seqlens_q[-1] do not exist by contract (dispatch checks cu_seqlens_q[-1] == total_q).

    seqused_q: sequence i computes only its first seqused_q[i] query rows, masks aligned on them
    (as FA3); the rest get out 0 and lse -inf. page_table: k/v are a page pool (Note [paged
    KV]), cu_seqlens_k is None and seqused_k gives the key counts. learnable_sink: Note
    [learnable sink]."""
    cdt = _compute_dtype(q.dtype, kw.get("upcast", True))
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=cdt)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=_lse_dtype(cdt), device=q.device)
    segments = _segments(cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
    for i, (qs, ks) in enumerate(segments):
        if qs.stop == qs.start:
            continue
        if ks.stop == ks.start:  # Note [empty rows]: out 0, lse -inf (or the sink)
            lse[:, qs] = _empty_lse(lse[:, qs], learnable_sink)
            continue
        kk, vv = _varlen_kv(k, v, i, ks, page_table)
        seg_out, seg_lse = attention_ref(
            q[None, qs], kk[None], vv[None], learnable_sink=learnable_sink, **kw
        )
        out[qs], lse[:, qs] = seg_out[0], seg_lse[0]
    return out, lse


def attention_varlen_ref_bwd(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    *,
    seqused_k=None,
    seqused_q=None,
    dlse=None,
    **kw,
):
    """Backward of attention_varlen_ref; keys past seqused_k and query rows past seqused_q get
    zero gradient. With a learnable sink, pass the forward's LSE (it includes the sink) and get
    the sink's gradient from learnable_sink_grad."""
    cdt = _compute_dtype(q.dtype, kw.get("upcast", True))
    dq = q.new_zeros(q.shape, dtype=cdt)
    dk, dv = k.new_zeros(k.shape, dtype=cdt), v.new_zeros(v.shape, dtype=cdt)
    for qs, ks in _segments(cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q):
        if qs.stop == qs.start or ks.stop == ks.start:
            continue
        seg_dlse = None if dlse is None else dlse[None, :, qs]
        g = attention_ref_bwd(
            dout[None, qs], q[None, qs], k[None, ks], v[None, ks], out[None, qs],
            lse[None, :, qs], dlse=seg_dlse, **kw,
        )  # fmt: skip
        dq[qs], dk[ks], dv[ks] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def learnable_sink_grad(dout, out, lse, learnable_sink, *, dlse=None) -> torch.Tensor:
    """Note [learnable sink]: d_sink (h,) in the sink's dtype, from the forward's out and LSE.

    Dense: out/dout (b, s_q, h, d_v), lse (b, h, s_q); varlen: (total_q, h, d_v), (h, total_q).
    Rows whose LSE is -inf (never computed: seqused_q) or +inf (the backward's marker for
    them) contribute 0. fp32 math (fp64 for fp64 inputs); device ops only, no host sync."""
    cdt = torch.float64 if lse.dtype == torch.float64 else torch.float32
    big_d = (dout.to(cdt) * out.to(cdt)).sum(-1)  # (b, s_q, h) or (total_q, h)
    big_d = big_d.transpose(-1, -2)  # lse's layout
    if dlse is not None:
        big_d = big_d - dlse.to(cdt)
    dense = lse.dim() == 3
    sink = learnable_sink.to(cdt).view((1, -1, 1) if dense else (-1, 1))
    p_sink = torch.exp(sink - _lse_for_exp(lse.to(cdt)))
    return -(p_sink * big_d).sum((0, 2) if dense else 1).to(learnable_sink.dtype)


def attention_kvcache_ref(
    q,
    k_cache,
    v_cache,
    seqused_k=None,
    *,
    cache_batch_idx=None,
    leftpad_k=None,
    page_table=None,
    learnable_sink=None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense q (b, s_q, h, d) against a KV cache, Note [kv cache keys]: k_cache/v_cache
    (b_cache, s_cache, h_kv, ·), or page pools (num_pages, page_size, h_kv, ·) with page_table
    (b_cache rows, max_pages). seqused_k (b,) is the end of each sequence's keys in cache
    coordinates (None: s_cache; required with a page_table), leftpad_k (b,) their start.
    Returns out (b, s_q, h, d_v) and lse (b, h, s_q) as attention_ref."""
    b, s_q, h, _ = q.shape
    cdt = _compute_dtype(q.dtype, kw.get("upcast", True))
    out = q.new_zeros(b, s_q, h, v_cache.shape[-1], dtype=cdt)
    lse = torch.full((b, h, s_q), -math.inf, dtype=_lse_dtype(cdt), device=q.device)
    rows = cache_batch_idx.tolist() if cache_batch_idx is not None else list(range(b))
    stops = seqused_k.tolist() if seqused_k is not None else [k_cache.shape[1]] * b
    starts = leftpad_k.tolist() if leftpad_k is not None else [0] * b
    for i in range(b):
        if s_q == 0:
            break
        if stops[i] <= starts[i]:  # Note [empty rows]
            lse[i] = _empty_lse(lse[i], learnable_sink)
            continue
        kk, vv = _kv_keys(k_cache, v_cache, rows[i], starts[i], stops[i], page_table)
        seg_out, seg_lse = attention_ref(
            q[i : i + 1], kk[None], vv[None], learnable_sink=learnable_sink, **kw
        )
        out[i], lse[i] = seg_out[0], seg_lse[0]
    return out, lse


# ------------------------------------------------------------------------------------------------
# Tile-level model of the FA4 forward.
#
# attention_fa4_model does, in torch on any device, what the forward kernels do numerically:
# 128×128 tiles, KV tiles visited in order and skipped where the mask empties them, the online
# softmax in log2 units with conditional rescaling, exp2 split between MUFU and the polynomial,
# P rounded to the input dtype before P·V. It is the oracle that the kernels' own quirks
# (stale maxima, emulated exp2) are checked against, and its statistics say how often the
# correction warpgroup can skip its work.
#
# Note [conditional rescale]: per row, in log2 units, a running max m (-inf before any key),
# a running sum l and an fp32 accumulator O. For each visited KV tile, m_blk = the row's max
# over its visible columns of the tile (-inf if none), and exactly one of:
#   - m == -inf and m_blk finite ("rows_first_block"): m = m_blk. O and l are 0, nothing to
#     rescale.
#   - m_blk > m + tau (fp32 add, strict) ("rescaled"): m_new = m_blk, O and l *= 2^(m - m_new).
#   - otherwise ("skipped"): m stays stale and O, l are untouched. Then
#     P = 2^(s - m) <= 2^(m_blk - m) <= 2^tau: with tau = 8, P <= 256, which fp32 O and l and
#     16-bit P (fp16 max 65504) hold easily, so the rescale can wait.
#   - m_blk = -inf (no visible key of this row in the tile): nothing happens, nothing counted.
# out = O / l and lse = m + log2(l) do not depend on which m was used (its 2^-m factor
# cancels); a stale m only moves P up by <= tau binades, where 16-bit floats round with the
# same relative error, so it costs no accuracy. tau = 0 is the classic online softmax
# (rescale whenever the max grows). While m is -inf the exp2 offset is 0, so
# exp2(-inf - (-inf)) = NaN is never formed and masked entries give P = 0.
# Warp granularity: on SM100 each warp owns 32 rows of the tile; the correction warpgroup skips
# a warp's O rescale (a TMEM load/multiply/store round trip) only when no row of its 32 needs
# one. The rows of a rescaling warp that did not need it multiply by exactly 1, so numerics
# stay per row; only the statistics are kept per warp.
#
# Tile skipping: a (Q tile, KV tile) pair is visited iff some row of the Q tile may see some key
# of the KV tile. The mask is a band (Note [mask alignment]), so these tiles form one
# contiguous range per Q tile, the kernels' [n_block_min, n_block_max).
# ------------------------------------------------------------------------------------------------

EMU_PERIOD = 16  # Note [exp2 column split]


def emu_columns(block_n: int, fraction: float) -> torch.Tensor:
    """Bool (block_n,): the columns of a KV tile whose exp2 goes through exp2_poly.

    Note [exp2 column split]: column c of a KV tile (counted from the tile's first column) is
    emulated iff c % 16 < round(fraction · 16), rounded half up; so the fraction is quantized to
    sixteenths (0.25 -> columns 0..3 of every 16; 0.1 -> 2/16). A softmax thread owns one row
    and converts its columns in chunks of 16, so a per-chunk split costs no index math in the
    kernel and gives every chunk the same MUFU / FMA balance.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"emu_fraction must be in [0, 1], got {fraction}")
    n_emu = math.floor(fraction * EMU_PERIOD + 0.5)
    return torch.arange(block_n) % EMU_PERIOD < n_emu


def _ex2_mufu(x: torch.Tensor) -> torch.Tensor:
    """MUFU.EX2 as the kernels use it (ex2.approx.ftz.f32): denormal results flush to +0."""
    return torch.exp2(x).masked_fill(x < -126.0, 0.0)


def _exp2_split(x: torch.Tensor, emu: torch.Tensor, degree: int) -> torch.Tensor:
    """2^x, the columns marked in emu (Note [exp2 column split]) by the software exp2."""
    from ._exp2 import exp2_poly  # local: exact attention above does not need the emulation

    p = _ex2_mufu(x)
    if emu.any():
        p[..., emu] = exp2_poly(x[..., emu].contiguous(), degree)
    return p


def _tile_masks(s_q, s_k, causal, window, block_m, block_n, device):
    """keep (n_m, block_m, n_n, block_n): Note [mask alignment] on the padded tile grid (padding
    rows and columns see nothing); active (n_m, n_n): the tiles that are visited."""
    n_m, n_n = -(-s_q // block_m), -(-s_k // block_n)
    keep = torch.zeros(n_m * block_m, n_n * block_n, dtype=torch.bool, device=device)
    rows = torch.arange(s_q, device=device)
    keep[:s_q, :s_k] = allowed_keys(rows, s_q, s_k, causal, window)
    keep = keep.view(n_m, block_m, n_n, block_n)
    return keep, keep.any(3).any(1)


def _pad_seq(x: torch.Tensor, n: int) -> torch.Tensor:
    """(b, h, s, d) fp32 zero-padded along s to n (padding is masked, zeros keep P·V finite)."""
    return torch.nn.functional.pad(x.float(), (0, 0, 0, n - x.shape[2]))


_COUNTS = (
    "rescaled", "skipped", "rows_first_block", "warp_groups_skipped", "warp_groups_total", "tiles",
)  # fmt: skip


class _RowState:
    """Online-softmax state of every row of every Q tile (Note [conditional rescale]) plus the
    decision counts."""

    def __init__(self, b, h, n_m, block_m, d_v, device):
        self.m = torch.full((b, h, n_m, block_m), -math.inf, device=device)
        self.rowsum = torch.zeros(b, h, n_m, block_m, device=device)
        self.o = torch.zeros(b, h, n_m, block_m, d_v, device=device)
        self.counts = dict.fromkeys(_COUNTS, 0)

    def count(self, first, resc, later):
        """first / resc / later: bool (b, h, n_sel, block_m) decisions of one KV tile."""
        c = self.counts
        c["rows_first_block"] += int(first.sum())
        c["rescaled"] += int(resc.sum())
        c["skipped"] += int((later & ~resc).sum())
        warp_decides = later.unflatten(-1, (-1, 32)).any(-1)
        warp_rescales = resc.unflatten(-1, (-1, 32)).any(-1)
        c["warp_groups_total"] += int(warp_decides.sum())
        c["warp_groups_skipped"] += int((warp_decides & ~warp_rescales).sum())

    def stats(self) -> dict:
        c = dict(self.counts)
        decided = c["rescaled"] + c["skipped"]
        c["fraction_skipped"] = c["skipped"] / decided if decided else math.nan
        return c


def _online_step(st, sel, s, vt, *, tau, emu, degree, p_dtype):
    """One KV tile for the Q tiles sel: s (b, h, n_sel, block_m, block_n) masked log2 scores,
    vt (b, h, block_n, d_v). Note [conditional rescale]."""
    m = st.m[:, :, sel]
    m_blk = s.amax(-1)
    seen = m_blk > -math.inf
    first = seen & (m == -math.inf)
    later = seen & ~first
    resc = later & (m_blk > m + tau)
    st.count(first, resc, later)
    m_new = torch.where(first | resc, m_blk, m)
    alpha = torch.where(resc, torch.exp2(m - m_new), 1.0)  # exactly 1 where not rescaled
    offset = m_new.masked_fill(m_new == -math.inf, 0.0)  # no -inf - -inf (NaN) while unseen
    p = _exp2_split(s - offset.unsqueeze(-1), emu, degree)
    # l sums the fp32 P, before P is rounded for the MMA
    st.rowsum[:, :, sel] = st.rowsum[:, :, sel] * alpha + p.sum(-1)
    pv = torch.matmul(p.to(p_dtype).float(), vt.unsqueeze(2))  # 16-bit P, fp32 accumulation
    st.o[:, :, sel] = st.o[:, :, sel] * alpha.unsqueeze(-1) + pv
    st.m[:, :, sel] = m_new


def _finish(st: _RowState, s_q: int):
    """out = O / l (0 where no key), lse = (m + log2 l)·ln 2 (-inf where no key)."""
    m, rowsum, o = (x.flatten(2, 3)[:, :, :s_q] for x in (st.m, st.rowsum, st.o))
    seen = m > -math.inf
    out = torch.where(seen.unsqueeze(-1), o / rowsum.unsqueeze(-1), 0.0)
    lse = torch.where(seen, (m + torch.log2(rowsum)) * math.log(2.0), -math.inf)
    return out.transpose(1, 2), lse


def _check_model_args(q, k, v, block_m, block_n):
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"heads of q ({q.shape[2]}) must be a multiple of k's ({k.shape[2]})")
    if block_m % 32 != 0 or block_n <= 0:
        raise ValueError(f"block_m must be a multiple of 32 (warps), got {block_m}, {block_n}")


def attention_fa4_model(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    tau: float = 8.0,
    emu_fraction: float = 0.0,
    emu_degree: int = 3,
    block_m: int = 128,
    block_n: int = 128,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The FA4 forward tile by tile (see the section comment). Returns (out, lse, stats):
    out fp32 (b, s_q, h, d_v), lse natural-log fp32 (b, h, s_q), stats a dict of counts:
    rescaled / skipped over (row, visible tile after the row's first) pairs, rows_first_block,
    warp_groups_skipped / warp_groups_total (the same decisions per 32-row warp, counted where
    any of its rows decides), tiles (visited Q×KV tile pairs, over batch and heads) and
    fraction_skipped = skipped / (rescaled + skipped).

    Vectorized over batch, heads and Q tiles; the loop runs over KV tiles only."""
    _check_model_args(q, k, v, block_m, block_n)
    b, s_q, h, d = q.shape
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    keep, active = _tile_masks(s_q, k.shape[1], causal, window_size, block_m, block_n, q.device)
    n_m, n_n = active.shape
    qt = _pad_seq(q.transpose(1, 2), n_m * block_m).unflatten(2, (n_m, block_m))
    kh = _pad_seq(_expand_kv(k, h), n_n * block_n)
    vh = _pad_seq(_expand_kv(v, h), n_n * block_n)
    st = _RowState(b, h, n_m, block_m, v.shape[-1], q.device)
    emu = emu_columns(block_n, emu_fraction).to(q.device)
    step = dict(tau=tau, emu=emu, degree=emu_degree, p_dtype=q.dtype)
    for j in range(n_n):
        sel = active[:, j].nonzero().squeeze(1)
        if sel.numel() == 0:
            continue
        st.counts["tiles"] += b * h * sel.numel()
        cols = slice(j * block_n, (j + 1) * block_n)
        s, _ = _scores(qt[:, :, sel], kh[:, :, None, cols], scale, softcap, keep[sel, :, j])
        _online_step(st, sel, s * (1.0 / math.log(2.0)), vh[:, :, cols], **step)
    out, lse = _finish(st, s_q)
    return out, lse, st.stats()
