"""Cases of fa4.kvcache.append_rotary and its independent naive reference, shared by
tests/api/test_kvcache_append.py (CPU) and tests/gpu/test_kvcache_append.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

F32 = np.float32


@dataclass
class Case:
    """One append problem: the arguments of append_rotary (cache_seqlens as a list)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_new: torch.Tensor | None
    v_new: torch.Tensor | None
    seqlens: list[int]
    kw: dict = field(default_factory=dict)

    def args(self, device=None):
        """(positional, keyword) arguments on `device` (default: where the tensors are), with
        fresh copies of the caches (the call mutates them)."""
        dev = device or self.q.device

        def to(t):
            return None if t is None else t.to(dev)

        seqlens = torch.tensor(self.seqlens, dtype=torch.int32, device=dev)
        caches = (to(self.k_cache).clone(), to(self.v_cache).clone())
        pos = (to(self.q), *caches, to(self.k_new), to(self.v_new), seqlens)
        return pos, {k: (to(v) if isinstance(v, torch.Tensor) else v) for k, v in self.kw.items()}


def make_case(
    *, dtype=torch.bfloat16, b=2, s_q=3, h=4, h_kv=2, d=16, d_v=8, s_new=5, s_cache=24,
    rotary_dim=8, seqlen_ro=None, interleaved=False, per_row=False, seqlens=None,
    batch_idx=False, leftpad=False, page_size=None, new_kv=True, seed=0,
) -> Case:  # fmt: skip
    """Random inputs; page_size pages the cache (max_pages = ceil(s_cache / page_size) per
    sequence, the pages shuffled); batch_idx gives a cache of 2b sequences and a random subset."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    if seqlens is None:
        seqlens = torch.randint(0, s_cache - s_new + 1, (b,), generator=g).tolist()
    b_cache = 2 * b if batch_idx else b
    kw = {"rotary_interleaved": interleaved, "rotate_q_per_row": per_row}
    if page_size is None:
        k_cache, v_cache = randn(b_cache, s_cache, h_kv, d), randn(b_cache, s_cache, h_kv, d_v)
    else:
        max_pages = -(-s_cache // page_size)
        num_pages = b_cache * max_pages + 3  # a few pages no sequence owns
        k_cache = randn(num_pages, page_size, h_kv, d)
        v_cache = randn(num_pages, page_size, h_kv, d_v)
        perm = torch.randperm(num_pages, generator=g)[: b_cache * max_pages]
        kw["page_table"] = perm.view(b_cache, max_pages).to(torch.int32)
    if batch_idx:
        kw["cache_batch_idx"] = torch.randperm(b_cache, generator=g)[:b].to(torch.int32)
    if leftpad:
        kw["cache_leftpad"] = torch.tensor(
            [int(torch.randint(0, n + 1, (1,), generator=g)) for n in seqlens], dtype=torch.int32
        )
    if rotary_dim:
        n = seqlen_ro or s_cache + s_q
        angle = torch.rand(n, rotary_dim // 2, generator=g) * 2 * torch.pi
        kw["rotary_cos"], kw["rotary_sin"] = angle.cos().to(dtype), angle.sin().to(dtype)
    k_new = randn(b, s_new, h_kv, d) if new_kv else None
    v_new = randn(b, s_new, h_kv, d_v) if new_kv else None
    return Case(randn(b, s_q, h, d), k_cache, v_cache, k_new, v_new, list(seqlens), kw)


def _rotated(row, j, pos, cos, sin, interleaved):
    """Element j of `row` (fp32 values) rotated at `pos`: fp32 products and sums (np.float32)."""
    half = len(cos[0]) if cos is not None else 0
    if j >= 2 * half:
        return row[j]
    if interleaved:
        i = j // 2
        x1, x2 = F32(row[2 * i]), F32(row[2 * i + 1])
        first = j % 2 == 0
    else:
        i = j % half
        x1, x2 = F32(row[i]), F32(row[i + half])
        first = j < half
    c, s = F32(cos[pos][i]), F32(sin[pos][i])
    return float(x1 * c - x2 * s) if first else float(x1 * s + x2 * c)


def naive(case: Case):
    """(q_used, k_cache, v_cache) after the append, element by element from FA3's rules: new row
    t of sequence b at cache position cache_seqlens[b] + t (of cache batch cache_batch_idx[b],
    paged through page_table[cache_batch_idx[b] or b]), rotated there; q row i rotated at
    cache_seqlens[b] + i (per row) or cache_seqlens[b]. cache_leftpad plays no part."""
    kw = case.kw
    dtype = case.q.dtype
    cos = kw["rotary_cos"].float().tolist() if "rotary_cos" in kw else None
    sin = kw["rotary_sin"].float().tolist() if "rotary_sin" in kw else None
    inter, per_row = kw.get("rotary_interleaved", False), kw.get("rotate_q_per_row", False)
    pt, bidx = kw.get("page_table"), kw.get("cache_batch_idx")
    k_out, v_out = case.k_cache.float().clone(), case.v_cache.float().clone()
    q = case.q.float().tolist()
    b, s_q, h, d = case.q.shape
    q_out = torch.tensor(q)
    if cos is not None:
        for bi in range(b):
            for i in range(s_q):
                pos = case.seqlens[bi] + (i if per_row else 0)
                for hi in range(h):
                    row = q[bi][i][hi]
                    for j in range(d):
                        q_out[bi, i, hi, j] = _rotated(row, j, pos, cos, sin, inter)
    if case.k_new is not None:
        kn, vn = case.k_new.float().tolist(), case.v_new.float().tolist()
        for bi in range(b):
            cb = int(bidx[bi]) if bidx is not None else bi
            for t in range(case.k_new.shape[1]):
                pos = case.seqlens[bi] + t
                if pt is None:
                    slot = (cb, pos)
                else:
                    ps = case.k_cache.shape[1]
                    slot = (int(pt[cb, pos // ps]), pos % ps)
                for hi in range(case.k_new.shape[2]):
                    row = kn[bi][t][hi]
                    for j in range(d):
                        k_out[slot[0], slot[1], hi, j] = _rotated(row, j, pos, cos, sin, inter)
                    v_out[slot[0], slot[1], hi] = torch.tensor(vn[bi][t][hi])
    q_used = q_out.to(dtype) if cos is not None else case.q
    return q_used, k_out.to(dtype), v_out.to(dtype)
