"""FP8 (e4m3) attention references: what an FP8 attention computes and the naive low-precision
baseline of its tolerance rule (docs/numerics.md, "FP8"). No public fa4 function takes FP8 yet;
these fix the semantics and the rule the kernels will be held to.

Semantics (FA3's): the true value of a stored element is stored × descale, descales float32
(batch, kv heads); q's heads use the descale of their kv head (GQA groups whole heads). The
reference is fp32 attention on the dequantized inputs. The baseline (emulate_p=True) quantizes
P = exp(S - rowmax) to e4m3 after scaling the row by E4M3_MAX, as an FP8 P·V does, with the row
sum l taken from the unquantized P.
"""

from __future__ import annotations

import math

import torch

from .reference import allowed_keys, attention_ref

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value
E4M3_UNIT_ROUNDOFF = 2.0**-4  # 3 mantissa bits, round to nearest


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


def quantize(x: torch.Tensor, heads_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (b, s, h, d) -> (e4m3 tensor, descale float32 (b, heads_kv)): each (batch, kv head)'s
    largest |value| maps to E4M3_MAX (a group's q heads share their kv head's descale)."""
    b, _, h, _ = x.shape
    amax = x.abs().float().reshape(b, -1, heads_kv, h // heads_kv, x.shape[-1])
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
    row (scaled by E4M3_MAX / 1 = the row's largest P) before P·V."""
    h_kv = k8.shape[2]
    q, k, v = (dequantize(x, s, h_kv) for x, s in ((q8, q_descale), (k8, k_descale),
                                                    (v8, v_descale)))  # fmt: skip
    kw = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)
    if not emulate_p:
        out, lse = attention_ref(q, k, v, **kw)
        return out.to(out_dtype), lse
    return _emulated(q, k, v, **kw, out_dtype=out_dtype)


def _emulated(q, k, v, *, causal, softmax_scale, window_size, softcap, out_dtype):
    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    kh = k.repeat_interleave(h // h_kv, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(h // h_kv, dim=2).transpose(1, 2)
    s = torch.matmul(q.transpose(1, 2), kh.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = allowed_keys(torch.arange(s_q), s_q, s_k, causal, window_size)
    s = s.masked_fill(~keep, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows with no key
    p = torch.exp(s - m_safe)  # in [0, 1], the row's largest is 1
    l_sum = p.sum(dim=-1, keepdim=True)
    p8 = (p * E4M3_MAX).to(E4M3).float() / E4M3_MAX
    out = torch.matmul(p8, vh) / l_sum.clamp_min(torch.finfo(torch.float32).tiny)
    lse = (m_safe + torch.log(l_sum)).squeeze(-1)
    lse = torch.where(l_sum.squeeze(-1) > 0, lse, torch.full_like(lse, -math.inf))
    return out.transpose(1, 2).to(out_dtype), lse


def p_rounding_bound(v8: torch.Tensor, v_descale, n_keys: int) -> float:
    """docs/numerics.md "FP8": |out_emulated - out_ref| <= (u + n_keys · 2^-10 / E4M3_MAX) ·
    max|v| with u = E4M3_UNIT_ROUNDOFF. Each scaled P rounds with relative error <= u in e4m3's
    normal range and absolute error <= half the subnormal spacing 2^-9 below it; out is
    sum_j P8_j v_j / l with l >= 1 (the row's largest P is 1)."""
    vmax = dequantize(v8, v_descale, v8.shape[2]).abs().max().item()
    return (E4M3_UNIT_ROUNDOFF + n_keys * 2.0**-10 / E4M3_MAX) * vmax
