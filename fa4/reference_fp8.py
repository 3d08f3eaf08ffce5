"""FP8 (e4m3) attention references: what the FP8 forward (fa4.attention / attention_varlen with
e4m3 q, k, v) computes, and the naive low-precision baseline of its tolerance rule
(docs/numerics.md, "FP8"). The reference backend of the FP8 forward runs attention_fp8_ref and
attention_fp8_varlen_ref.

Semantics (FA3's): the true value of a stored element is stored × descale, descales float32
(batch, kv heads) (varlen: (num sequences, kv heads)); q's heads use the descale of their kv head
(GQA groups whole heads). The reference is fp32 attention on the dequantized inputs. The baseline
(emulate_p=True) rounds P to e4m3 as the kernel's P·V does: P' = exp(S - rowmax) · 2^8, whose
largest entry is exactly 256 (P_SCALE), with the row sum l taken from the unrounded P.
"""

from __future__ import annotations

import math

import torch

from .reference import allowed_keys, attention_ref, attention_varlen_ref

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value
E4M3_UNIT_ROUNDOFF = 2.0**-4  # 3 mantissa bits, round to nearest
# The kernel's P scale (Note [fp8 P scale] in docs/numerics.md "FP8"): exp2(x - m + 8), a power
# of two (exact, and exactly removed from O / l and the LSE), each row's largest P' = 256 <= 448.
P_SCALE = 2.0**8


def dequantize(x8: torch.Tensor, descale: torch.Tensor | None, heads_kv: int) -> torch.Tensor:
    """x8 (b, s, h, d) e4m3 -> float32 x8 · descale[b, head // (h / heads_kv)]; None: 1."""
    x = x8.float()
    if descale is None:
        return x
    b, _, h, _ = x.shape
    if tuple(descale.shape) != (b, heads_kv) or descale.dtype != torch.float32:
        raise ValueError(f"descale must be float32 ({b}, {heads_kv}), got {descale.dtype} "
                         f"{tuple(descale.shape)}")  # fmt: skip
    per_head = descale.repeat_interleave(h // heads_kv, dim=1)  # (b, h)
    return x * per_head[:, None, :, None]


def dequantize_varlen(x8: torch.Tensor, descale, cu_seqlens: torch.Tensor, heads_kv: int):
    """x8 (total, h, d) e4m3, packed sequences cu_seqlens (n + 1,) -> float32 x8 · descale[i,
    head // (h / heads_kv)] for the rows of sequence i (rows past cu_seqlens[-1]: 1); None: 1."""
    x = x8.float()
    if descale is None:
        return x
    n, h = cu_seqlens.shape[0] - 1, x.shape[1]
    if tuple(descale.shape) != (n, heads_kv) or descale.dtype != torch.float32:
        raise ValueError(f"descale must be float32 ({n}, {heads_kv}), got {descale.dtype} "
                         f"{tuple(descale.shape)}")  # fmt: skip
    rows = torch.arange(x.shape[0], device=x.device)
    seq = torch.searchsorted(cu_seqlens[1:].long(), rows, right=True)  # n past the last row
    per_head = descale.repeat_interleave(h // heads_kv, dim=1)  # (n, h)
    per_row = torch.cat([per_head, per_head.new_ones(1, h)])[seq]  # (total, h)
    return x * per_row[:, :, None]


def quantize(x: torch.Tensor, heads_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (b, s, h, d) -> (e4m3 tensor, descale float32 (b, heads_kv)): each (batch, kv head)'s
    largest |value| maps to E4M3_MAX (a group's q heads share their kv head's descale)."""
    b, s, h, _ = x.shape
    if s == 0:  # an empty sequence: nothing to scale
        return x.to(E4M3), torch.ones(b, heads_kv, device=x.device)
    amax = x.abs().float().reshape(b, s, heads_kv, h // heads_kv, x.shape[-1])
    amax = amax.amax(dim=(1, 3, 4)).clamp_min(1e-12)  # (b, heads_kv)
    descale = (amax / E4M3_MAX).float()
    per_head = descale.repeat_interleave(h // heads_kv, dim=1)[:, None, :, None]
    return (x.float() / per_head).to(E4M3), descale


def attention_fp8_ref(
    q8, k8, v8, q_descale=None, k_descale=None, v_descale=None, *, causal=False,
    softmax_scale=None, window_size=(-1, -1), softcap=0.0, out_dtype=torch.bfloat16,
    emulate_p=False,
):  # fmt: skip
    """(out in out_dtype, lse float32 (b, h, s_q)) of attention on the dequantized inputs.
    emulate_p=False: the fp32 reference. emulate_p=True: the baseline with P rounded to e4m3 per
    row (scaled by P_SCALE / 1 = 2^8 / the row's largest P) before P·V."""
    h_kv = k8.shape[2]
    q, k, v = (dequantize(x, s, h_kv) for x, s in ((q8, q_descale), (k8, k_descale),
                                                    (v8, v_descale)))  # fmt: skip
    kw = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)
    if not emulate_p:
        out, lse = attention_ref(q, k, v, **kw)
        return out.to(out_dtype), lse
    return _emulated(q, k, v, **kw, out_dtype=out_dtype)


def attention_fp8_varlen_ref(
    q8, k8, v8, cu_seqlens_q, cu_seqlens_k, q_descale=None, k_descale=None, v_descale=None, *,
    seqused_k=None, out_dtype=torch.bfloat16, **kw,
):  # fmt: skip
    """The varlen reference: (out (total_q, h, d_v) in out_dtype, lse float32 (h, total_q)) of
    fp32 attention on the dequantized packed inputs (descales (num sequences, kv heads)). kw:
    causal, softmax_scale, window_size, softcap."""
    h_kv = k8.shape[1]
    q = dequantize_varlen(q8, q_descale, cu_seqlens_q, h_kv)
    k = dequantize_varlen(k8, k_descale, cu_seqlens_k, h_kv)
    v = dequantize_varlen(v8, v_descale, cu_seqlens_k, h_kv)
    out, lse = attention_varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=seqused_k, **kw)
    return out.to(out_dtype), lse.float()


def _emulated(q, k, v, *, causal, softmax_scale, window_size, softcap, out_dtype):
    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    kh = k.repeat_interleave(h // h_kv, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(h // h_kv, dim=2).transpose(1, 2)
    s = torch.matmul(q.transpose(1, 2), kh.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = allowed_keys(torch.arange(s_q, device=q.device), s_q, s_k, causal, window_size)
    s = s.masked_fill(~keep, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows with no key
    p = torch.exp(s - m_safe)  # in [0, 1], the row's largest is 1
    l_sum = p.sum(dim=-1, keepdim=True)
    p8 = (p * P_SCALE).to(E4M3).float() / P_SCALE  # both products exact (a power of two)
    out = torch.matmul(p8, vh) / l_sum.clamp_min(torch.finfo(torch.float32).tiny)
    lse = (m_safe + torch.log(l_sum)).squeeze(-1)
    lse = torch.where(l_sum.squeeze(-1) > 0, lse, torch.full_like(lse, -math.inf))
    return out.transpose(1, 2).to(out_dtype), lse


def p_rounding_bound(v8: torch.Tensor, v_descale, n_keys: int) -> float:
    """docs/numerics.md "FP8": |out_emulated - out_ref| <= (u + n_keys · 2^-10 / P_SCALE) ·
    max|v| with u = E4M3_UNIT_ROUNDOFF. Each scaled P' = P · 2^8 rounds with relative error <= u
    in e4m3's normal range (P' >= 2^-6) and absolute error <= half the subnormal spacing 2^-9
    below it; out is sum_j P8_j v_j / l with l >= 1 (the row's largest P is 1)."""
    vmax = dequantize(v8, v_descale, v8.shape[2]).abs().max().item()
    return (E4M3_UNIT_ROUNDOFF + n_keys * 2.0**-10 / P_SCALE) * vmax
