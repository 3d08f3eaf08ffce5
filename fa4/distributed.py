"""Context parallelism: attention over a sequence sharded across the ranks of a process group.

    q, k, v = (shard_sequence(x, layout="zigzag") for x in (q_full, k_full, v_full))
    out = ring_attention(q, k, v, causal=True, layout="zigzag")   # this rank's rows of out
    out_full = gather_sequence(out, layout="zigzag")

Every rank holds its shard (dim 1) of q, k and v, (b, s_local, h, d). K/V shards travel around
the ring (rank r sends to r + 1, receives from r - 1) with torch.distributed.batch_isend_irecv;
each step attends the local queries to the K/V shard in hand with fa4.attention, and the
partial results are merged by their LSE (merge_partials). The math, the layouts and what is and
is not supported are in docs/distributed.md; the two Notes below are the core of it.

Note [ring mask translation]: the global mask is the single-process one of fa4.attention on the
gathered sequence (s_q == s_k, offset 0): row i sees key j iff j >= i - left and j <= i + right
(left or right = -1: that side unbounded; causal sets right = 0). A block pairs global rows
[r0, r0 + m) with global keys [c0, c0 + n); fa4.attention aligns a call's mask bottom-right,
local row i' seeing local key j' iff j' >= i' + (n - m) - left' and j' <= i' + (n - m) + right'.
With i = r0 + i', j = c0 + j' the two agree when
    left'  = left  + (n - m) - (r0 - c0)
    right' = right - (n - m) + (r0 - c0).
block_mask computes this and three decisions around it:
  * a block where no row sees any key is skipped: no compute, its partial has lse = -inf
    (this is what the zigzag layout balances under causal masks);
  * a side whose constraint holds for every pair of the block is passed unbounded (None), so a
    fully visible block runs unmasked;
  * -1 is the unbounded value of fa4's windows, so a translated entry equal to -1 that does bind
    cannot be passed. The block then gets one dummy query row appended (m + 1 rows): n - m drops
    by one, left' becomes -2 and right' grows by one (or right' becomes 0 and left' shrinks by
    one), neither of which can be -1 again because a non-empty band has left' + right' >= 0.
    The dummy row's output is dropped; in the backward it has dO = 0 and lse = -inf, so P = 0
    and dS = 0 there: it adds nothing to dK and dV.
Unbounded sides are passed as None, never as -1 next to a negative entry: flash-attn's rules
(which fa4.attention follows) read two negative integers as "no window".

Note [ring backward]: the merged forward is O_i = sum_j P_ij V_j with P_ij = exp(S_ij - LSE_i),
LSE the global (merged) log-sum-exp. Its gradient is the single-process one,
    dV_j = sum_i P_ij dO_i,  dP_ij = dO_i . V_j,  dS_ij = P_ij (dP_ij - D_i),
    D_i = rowsum(dO_i o O_i) - dLSE_i,  dQ_i = scale sum_j dS_ij K_j,  dK_j = scale sum_i dS_ij Q_i
(times the softcap derivative when softcap > 0), and every term of it is local to one
(row block, key block) pair once LSE_i and D_i are the global ones. So each block runs fa4's
backward op (fa4._ops.bwd, the op fa4.attention's autograd calls) with the block's q, k, v and
the GLOBAL out, lse and dlse of its rows: P is recomputed from the global LSE and D from the
final output, which is exactly the block's share of the single-process gradient. (Running
autograd through each block's own forward instead would differentiate the per-block softmax,
whose normalizer is the block's partial LSE, and need the merge's chain rule on top.) dQ is
summed locally over the steps; dK and dV are summed into an accumulator that travels around
the ring with its K/V shard and reaches the shard's owner after a full turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

import fa4

from . import _ops, dispatch

__all__ = [
    "ring_attention", "ulysses_attention", "merge_partials", "shard_sequence", "gather_sequence",
    "block_mask",
]  # fmt: skip

LAYOUTS = ("zigzag", "contiguous")


# ---------------------------------------------------------------------------------------------
# Merging partial results


def merge_partials(out_a, lse_a, out_b, lse_b):
    """Merges two partial attention results over disjoint key sets by their LSE.

    out_*: (b, s, h, d_v) partial outputs (each normalized over its own keys); lse_*:
    (b, h, s) their natural-log LSE. Returns (out, lse) of the attention over the union of the
    keys: lse = log(exp(lse_a) + exp(lse_b)), out = exp(lse_a - lse) out_a + exp(lse_b - lse)
    out_b. Computed in the LSE's dtype (fp32, fp64 for fp64), with out in the wider of that and
    the inputs' dtypes. Numerically stable (shifted by max(lse_a, lse_b)). A row with lse = -inf
    on one side (it saw no key there) gives that side weight 0; -inf on both sides gives out 0
    and lse -inf; no NaN appears in the values or the gradients. Differentiable in all four
    inputs."""
    work = torch.promote_types(lse_a.dtype, lse_b.dtype)
    out_dtype = torch.promote_types(torch.promote_types(out_a.dtype, out_b.dtype), work)
    lse_a, lse_b = lse_a.to(work), lse_b.to(work)
    # The shift cancels exactly in the math; detached, it adds no gradient path of its own.
    m = torch.maximum(lse_a, lse_b).detach()
    empty = m == -math.inf  # both sides saw no key
    m = torch.where(empty, torch.zeros_like(m), m)
    total = torch.exp(lse_a - m) + torch.exp(lse_b - m)
    # total is 0 on empty rows: log(1) there keeps log's gradient finite, and where() picks -inf.
    lse = m + torch.log(total.masked_fill(empty, 1))
    lse = torch.where(empty, torch.full_like(m, -math.inf), lse)
    ref = torch.where(empty, torch.zeros_like(lse), lse)  # exp(-inf - 0) = 0: weights 0, no NaN
    w_a = torch.exp(lse_a - ref).transpose(1, 2).unsqueeze(-1)  # (b, s, h, 1)
    w_b = torch.exp(lse_b - ref).transpose(1, 2).unsqueeze(-1)
    out = w_a * out_a.to(out_dtype) + w_b * out_b.to(out_dtype)
    return out, lse


# ---------------------------------------------------------------------------------------------
# Mask translation (Note [ring mask translation])


@dataclass(frozen=True)
class BlockMask:
    """How to run one (q block, k block) pair with fa4.attention: window (left, right) in the
    ops' form (-1 = unbounded, every other entry literal and never -1) and whether one dummy
    query row is appended (pad_row)."""

    window: tuple[int, int]
    pad_row: bool

    def call_kwargs(self) -> dict:
        """causal / window_size for fa4.attention: None for an unbounded side (never -1 beside
        a negative entry), and causal=True for the plain causal band (same mask; lets a kernel
        take its causal path)."""
        left, right = self.window
        if left == -1 and right == 0:
            return {"causal": True, "window_size": (None, None)}
        as_fa = tuple(None if w == -1 else w for w in self.window)
        return {"causal": False, "window_size": as_fa}


def block_mask(r0, m, c0, n, left, right):
    """The local mask of global rows [r0, r0 + m) against global keys [c0, c0 + n) under the
    global rule "row i sees key j iff j >= i - left and j <= i + right" (-1: unbounded), as a
    BlockMask, or None when no row of the block sees any key. Note [ring mask translation]."""
    if not _block_has_pair(r0, m, c0, n, left, right):
        return None
    # A side is unbounded in this block when every (row, key) pair satisfies it.
    left_free = left == -1 or (r0 + m - 1) - left <= c0
    right_free = right == -1 or r0 + right >= c0 + n - 1
    shift = (n - m) - (r0 - c0)
    wl = -1 if left_free else left + shift
    wr = -1 if right_free else right - shift
    if (not left_free and wl == -1) or (not right_free and wr == -1):
        # One more query row: n - m drops by one, so left' - 1 and right' + 1 (see the Note).
        wl = -1 if left_free else wl - 1
        wr = -1 if right_free else wr + 1
        return BlockMask((wl, wr), True)
    return BlockMask((wl, wr), False)


def _block_has_pair(r0, m, c0, n, left, right):
    """Whether some row i in [r0, r0 + m) sees some key j in [c0, c0 + n): row i's keys are
    [max(c0, i - left), min(c0 + n - 1, i + right)], non-empty for some i iff the band is
    non-empty (left + right >= 0) and the rows that reach the block overlap [r0, r0 + m)."""
    if m <= 0 or n <= 0:
        return False
    lo, hi = r0, r0 + m - 1
    if left != -1:
        hi = min(hi, c0 + n - 1 + left)  # i - left <= last key
    if right != -1:
        lo = max(lo, c0 - right)  # i + right >= first key
    if left != -1 and right != -1 and left + right < 0:
        return False
    return lo <= hi


# ---------------------------------------------------------------------------------------------
# Layouts


def _chunks(layout, rank, world, s_local):
    """This rank's pieces of the global sequence: [(global start, local start, length)]."""
    if layout == "contiguous":
        return [(rank * s_local, 0, s_local)]
    half = s_local // 2  # zigzag: chunks rank and 2 * world - 1 - rank of 2 * world
    return [(rank * half, 0, half), ((2 * world - 1 - rank) * half, half, half)]


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"fa4.distributed: layout must be one of {LAYOUTS}, got {layout!r}")


def _group_info(group):
    """(rank, world size) in the group; a process that never initialized torch.distributed
    runs as a world of one (group must then be None)."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise ValueError(
                "fa4.distributed: a group was given but torch.distributed is not initialized"
            )
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _divisor(layout, world):
    return world if layout == "contiguous" else 2 * world


def shard_sequence(x, *, group=None, layout="zigzag", dim=1):
    """This rank's shard of x (the full sequence, the same on every rank) along dim: block rank
    of world equal blocks ("contiguous"), or chunks rank and 2·world-1-rank of 2·world equal
    chunks, concatenated ("zigzag"). Raises ValueError when the length does not divide."""
    _check_layout(layout)
    rank, world = _group_info(group)
    size, parts = x.shape[dim], _divisor(layout, world)
    if size % parts:
        raise ValueError(
            f"fa4.distributed: sequence length {size} (dim {dim}) must be a multiple of "
            f"{parts} for layout {layout!r} on {world} ranks"
        )
    s_local = size // world
    pieces = [x.narrow(dim, g, length) for g, _, length in _chunks(layout, rank, world, s_local)]
    return torch.cat(pieces, dim) if len(pieces) > 1 else pieces[0].contiguous()


def gather_sequence(x, *, group=None, layout="zigzag", dim=1):
    """The full sequence from every rank's shard x (all the same size) along dim, on every rank:
    the inverse of shard_sequence. An all_gather; not differentiable (for results and tests)."""
    _check_layout(layout)
    rank, world = _group_info(group)
    if world == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    s_local = x.shape[dim]
    if layout == "contiguous":
        return torch.cat(parts, dim)
    pieces = [None] * (2 * world)
    for r, part in enumerate(parts):
        for g, local, length in _chunks(layout, r, world, s_local):
            pieces[g // length] = part.narrow(dim, local, length)
    return torch.cat(pieces, dim)


# ---------------------------------------------------------------------------------------------
# Ring transport


def _peers(group, rank, world):
    """Global ranks of the next and previous rank in the ring (P2POp takes global ranks)."""

    def glob(r):
        return r if group is None else dist.get_global_rank(group, r)

    return glob((rank + 1) % world), glob((rank - 1) % world)


def _exchange(send, recv_like, group, peers, tag0=0):
    """Posts the sends of `send` to the next rank and receives of same-shaped tensors from the
    previous one; returns (received tensors, pending requests). One tag per tensor keeps the
    pairs apart where the backend matches messages by tag (gloo); NCCL ignores tags and
    matches by order, which is the same on both sides. tag0: the first tag (exchanges that are
    in flight together take different ones)."""
    nxt, prv = peers
    recv = [torch.empty_like(t) for t in recv_like]
    ops = []
    for tag, (s, r) in enumerate(zip(send, recv, strict=True), start=tag0):
        ops.append(dist.P2POp(dist.isend, s, nxt, group, tag))
        ops.append(dist.P2POp(dist.irecv, r, prv, group, tag))
    return recv, dist.batch_isend_irecv(ops)


def _wait(reqs):
    # On CUDA, ProcessGroupNCCL runs the transfers on its own streams (ordered after the work
    # queued before the call) and wait() makes the current stream wait for them: the block
    # computed between post and wait overlaps the transfer without a side stream of ours.
    for req in reqs:
        req.wait()


# ---------------------------------------------------------------------------------------------
# Ring attention


@dataclass(frozen=True)
class _Config:
    group: object
    rank: int
    world: int
    layout: str
    left: int
    right: int
    softmax_scale: float | None
    softcap: float
    deterministic: bool
    backend: str


def _pad(x, dim, value=0.0):
    """x with one more row along dim, filled with value (the dummy query row)."""
    shape = list(x.shape)
    shape[dim] = 1
    return torch.cat([x, x.new_full(shape, value)], dim)


def _block_pairs(cfg, s_local, src):
    """The (q slice, k slice, BlockMask) pairs of this rank's queries against rank src's keys,
    fully masked pairs left out."""
    q_chunks = _chunks(cfg.layout, cfg.rank, cfg.world, s_local)
    k_chunks = _chunks(cfg.layout, src, cfg.world, s_local)
    for qi, (r0, q_loc, m) in enumerate(q_chunks):
        for c0, k_loc, n in k_chunks:
            bm = block_mask(r0, m, c0, n, cfg.left, cfg.right)
            if bm is not None:
                yield qi, slice(q_loc, q_loc + m), slice(k_loc, k_loc + n), bm


def _block_fwd(q, k, v, bm, cfg):
    """out, lse of one block with fa4.attention (the dummy row dropped again)."""
    if bm.pad_row:
        q = _pad(q, 1)
    out, lse = fa4.attention(
        q, k, v, softmax_scale=cfg.softmax_scale, softcap=cfg.softcap, return_lse=True,
        deterministic=cfg.deterministic, backend=cfg.backend, **bm.call_kwargs(),
    )  # fmt: skip
    if bm.pad_row:
        out, lse = out[:, :-1], lse[..., :-1]
    return out, lse


def _ring_forward(q, k, v, cfg):
    """(out in q's dtype, lse) of this rank's rows; Note [ring mask translation]."""
    s_local = q.shape[1]
    q_chunks = _chunks(cfg.layout, cfg.rank, cfg.world, s_local)
    acc = [None] * len(q_chunks)  # per q chunk: merged (out, lse), in the LSE's dtype
    peers = _peers(cfg.group, cfg.rank, cfg.world)
    kv = (k.contiguous(), v.contiguous())  # P2P sends need dense tensors (k may be a qkv view)
    for step in range(cfg.world):
        # Post the next exchange before computing this block: the transfer overlaps it.
        pending = _exchange(kv, kv, cfg.group, peers) if step < cfg.world - 1 else None
        src = (cfg.rank - step) % cfg.world
        for qi, qs, ks, bm in _block_pairs(cfg, s_local, src):
            part = _block_fwd(q[:, qs], kv[0][:, ks], kv[1][:, ks], bm, cfg)
            acc[qi] = part if acc[qi] is None else merge_partials(*acc[qi], *part)
        if pending is not None:
            kv, reqs = pending
            _wait(reqs)
    outs, lses = [], []
    for (_, _, m), a in zip(q_chunks, acc, strict=True):
        if a is None:  # no key anywhere for this chunk: out 0, lse -inf (Note [empty rows])
            b, _, h, _ = q.shape
            a = (q.new_zeros(b, m, h, v.shape[-1]), _empty_lse(q, b, h, m))
        outs.append(a[0].to(q.dtype))
        lses.append(a[1].to(_lse_dtype(q)))
    return torch.cat(outs, 1), torch.cat(lses, 2).contiguous()


def _lse_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _empty_lse(q, b, h, m):
    return torch.full((b, h, m), -math.inf, dtype=_lse_dtype(q), device=q.device)


def _block_bwd(dout, q, k, v, out, lse, dlse, bm, cfg):
    """(dq, dk, dv) of one block from the GLOBAL out, lse, dlse of its rows (Note [ring
    backward]), through the op fa4.attention's own backward runs."""
    if bm.pad_row:  # dummy row: dO = 0, O = 0, lse = -inf -> P = 0, dS = 0
        q, dout, out = _pad(q, 1), _pad(dout, 1), _pad(out, 1)
        lse = _pad(lse, 2, -math.inf)
        dlse = None if dlse is None else _pad(dlse, 2)
    kw = bm.call_kwargs()
    opts = dispatch.check_dense(
        q, k, v, causal=kw["causal"], softmax_scale=cfg.softmax_scale,
        window_size=kw["window_size"], softcap=cfg.softcap, deterministic=cfg.deterministic,
        backend=cfg.backend,
    )  # fmt: skip
    dq, dk, dv = _ops.bwd(
        dout.contiguous(), q, k, v, out.contiguous(), lse.contiguous(),
        None if dlse is None else dlse.contiguous(), None, None, None, 0, 0,
        opts.causal, opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap,
        opts.deterministic, opts.backend,
    )  # fmt: skip
    return (dq[:, :-1] if bm.pad_row else dq), dk, dv


def _ring_backward(dout, dlse, q, k, v, out, lse, cfg):
    """(dq, dk, dv) of this rank's shards; dK/dV accumulators travel with their K/V shard."""
    s_local = q.shape[1]
    acc_dtype = _lse_dtype(q)  # partial gradients are summed in fp32 (fp64 for fp64)
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    peers = _peers(cfg.group, cfg.rank, cfg.world)
    kv, dkv = (k.contiguous(), v.contiguous()), None
    for step in range(cfg.world):
        # Post this step's transfers first: the next K/V shard, and the accumulator of the shard
        # in hand (filled by the previous ranks) while this rank computes its own share of it.
        pending_kv = _exchange(kv, kv, cfg.group, peers) if step < cfg.world - 1 else None
        pending_acc = _exchange(dkv, dkv, cfg.group, peers, 2) if dkv is not None else None
        src = (cfg.rank - step) % cfg.world
        dk_src = torch.zeros(k.shape, dtype=acc_dtype, device=k.device)
        dv_src = torch.zeros(v.shape, dtype=acc_dtype, device=v.device)
        for _, qs, ks, bm in _block_pairs(cfg, s_local, src):
            dl = None if dlse is None else dlse[..., qs]
            g = _block_bwd(
                dout[:, qs], q[:, qs], kv[0][:, ks], kv[1][:, ks], out[:, qs], lse[..., qs],
                dl, bm, cfg,
            )  # fmt: skip
            dq[:, qs] += g[0]
            dk_src[:, ks] += g[1]
            dv_src[:, ks] += g[2]
        if pending_acc is not None:
            incoming, reqs = pending_acc
            _wait(reqs)
            dk_src, dv_src = dk_src + incoming[0], dv_src + incoming[1]
        dkv = (dk_src, dv_src)
        if pending_kv is not None:
            kv, reqs = pending_kv
            _wait(reqs)
    if cfg.world > 1:  # the last accumulator belongs to the next rank; ours comes from prev
        dkv, reqs = _exchange(dkv, dkv, cfg.group, peers, 2)
        _wait(reqs)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cfg):
        out, lse = _ring_forward(q, k, v, cfg)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)  # an unused lse's gradient stays None
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None and dlse is None:
            return None, None, None, None
        if dout is None:  # a loss on the LSE alone
            dout = torch.zeros_like(out)
        dq, dk, dv = _ring_backward(dout, dlse, q, k, v, out, lse, ctx.cfg)
        return dq, dk, dv, None


def _check_shapes(q, k, v, cfg, cu_seqlens):
    """Dense (b, s_local, h, d) shards, the same shapes on every rank (one small all_gather),
    and a local length the layout can split."""
    if cu_seqlens is not None:
        raise NotImplementedError(
            "fa4.distributed.ring_attention: packed variable-length batches (cu_seqlens) are not "
            "supported across ranks; pass dense (b, s_local, h, d) shards (docs/distributed.md)"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"fa4.distributed: {name} must be a (b, s_local, h, d) tensor")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(
            "fa4.distributed: q, k and v shards must have the same length (self-attention over "
            f"one sharded sequence), got {q.shape[1]}, {k.shape[1]}, {v.shape[1]}"
        )
    shape = (*q.shape, *k.shape, *v.shape)
    if cfg.world > 1:
        mine = torch.tensor(shape, dtype=torch.int64, device=q.device)
        every = [torch.empty_like(mine) for _ in range(cfg.world)]
        dist.all_gather(every, mine, group=cfg.group)
        shapes = [tuple(t.tolist()) for t in every]
        if any(s != shapes[0] for s in shapes):
            lengths = [s[1] for s in shapes]
            raise ValueError(
                "fa4.distributed: every rank must hold a shard of the same shape (uneven shards "
                f"are not supported); q shard lengths per rank: {lengths}"
            )
    if cfg.layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(
            f"fa4.distributed: layout 'zigzag' needs an even shard length, got {q.shape[1]}"
        )


def ring_attention(
    q,
    k,
    v,
    *,
    group=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    softmax_scale=None,
    layout="zigzag",
    return_lse=False,
    deterministic=False,
    backend="auto",
    cu_seqlens=None,
):
    """Attention of one sequence sharded along dim 1 across the ranks of group (default: the
    world), equal to fa4.attention on the gathered q, k, v with the same arguments.

    q (b, s_local, h, d), k (b, s_local, h_kv, d), v (b, s_local, h_kv, d_v): this rank's
    shard as shard_sequence(layout) cuts it ("zigzag": chunks rank and 2·world-1-rank of
    2·world, balancing causal work; "contiguous": block rank of world). Every rank must call
    it with the same shapes and arguments. causal, window_size, softcap, softmax_scale,
    deterministic and backend are fa4.attention's, applied to global positions. Returns out
    (b, s_local, h, d_v) in q's dtype and, with return_lse, the LSE (b, h, s_local) in the same
    local row order; both are differentiable. cu_seqlens (packed batches) raises
    NotImplementedError. docs/distributed.md."""
    _check_layout(layout)
    rank, world = _group_info(group)
    left, right = dispatch.window_entries(window_size, causal)
    cfg = _Config(
        group, rank, world, layout, left, right, softmax_scale, softcap, deterministic, backend
    )
    _check_shapes(q, k, v, cfg, cu_seqlens)
    out, lse = _RingAttention.apply(q, k, v, cfg)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# Ulysses: all-to-all over heads


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 (one slot per rank): rank r's slot w goes to rank w's slot
    r. The map is its own adjoint, so the backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x.contiguous(), group=group)
        return y

    @staticmethod
    def backward(ctx, g):
        return _AllToAll.apply(g.contiguous(), ctx.group), None


def _zigzag_order(x, world, to_global):
    """Reorders dim 1 between the ranks' shards concatenated (rank 0's two chunks, rank 1's,
    ...) and global order (to_global=True), or back."""
    size = x.shape[1] // (2 * world)
    held = [c for r in range(world) for c in (r, 2 * world - 1 - r)]  # chunk ids, shard order
    pos = {c: i for i, c in enumerate(held)}
    order = [pos[c] for c in range(2 * world)] if to_global else held
    return torch.cat([x.narrow(1, i * size, size) for i in order], 1)


def _seq_to_heads(x, cfg):
    """(b, s_local, h, ·) sequence shards -> (b, s, h / world, ·): the full sequence in global
    order for this rank's group of heads."""
    b, s_l, h, d = x.shape
    w = cfg.world
    t = x.reshape(b, s_l, w, h // w, d).permute(2, 0, 1, 3, 4).contiguous()
    t = _AllToAll.apply(t, cfg.group)  # slot r: rank r's rows, this rank's heads
    t = t.permute(1, 0, 2, 3, 4).reshape(b, w * s_l, h // w, d)
    return _zigzag_order(t, w, True) if cfg.layout == "zigzag" else t


def _heads_to_seq(x, cfg):
    """The inverse of _seq_to_heads: (b, s, h / world, ·) -> (b, s_local, h, ·)."""
    b, s, hw, d = x.shape
    w = cfg.world
    if cfg.layout == "zigzag":
        x = _zigzag_order(x, w, False)
    t = x.reshape(b, w, s // w, hw, d).permute(1, 0, 2, 3, 4).contiguous()
    t = _AllToAll.apply(t, cfg.group)  # slot r: this rank's rows, rank r's heads
    return t.permute(1, 2, 0, 3, 4).reshape(b, s // w, w * hw, d)


def ulysses_attention(
    q,
    k,
    v,
    *,
    group=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    softmax_scale=None,
    layout="zigzag",
    return_lse=False,
    deterministic=False,
    backend="auto",
):
    """ring_attention's contract (same shards, arguments and results) computed by head
    parallelism instead (DeepSpeed-Ulysses): an all-to-all turns the sequence shards into the
    full sequence for h / world query heads (and h_kv / world kv heads), one fa4.attention call
    runs the global masks as they are, and an all-to-all turns the output back into sequence
    shards. Needs h and h_kv divisible by the world size (ValueError otherwise); moves q, k, v
    and out once each instead of K/V world - 1 times, but holds the full sequence of its heads.
    Differentiable (the all-to-all's backward is the reverse all-to-all)."""
    _check_layout(layout)
    rank, world = _group_info(group)
    cfg = _Config(
        group, rank, world, layout, -1, -1, softmax_scale, softcap, deterministic, backend
    )
    _check_shapes(q, k, v, cfg, None)
    kw = dict(
        causal=causal, window_size=window_size, softcap=softcap, softmax_scale=softmax_scale,
        deterministic=deterministic, backend=backend, return_lse=True,
    )  # fmt: skip
    if world == 1:
        out, lse = fa4.attention(q, k, v, **kw)
        return (out, lse) if return_lse else out
    if q.shape[2] % world or k.shape[2] % world:
        raise ValueError(
            f"fa4.distributed: ulysses_attention needs q heads ({q.shape[2]}) and kv heads "
            f"({k.shape[2]}) divisible by the world size {world}; use ring_attention"
        )
    qh, kh, vh = (_seq_to_heads(t, cfg) for t in (q, k, v))
    out, lse = fa4.attention(qh, kh, vh, **kw)
    out = _heads_to_seq(out, cfg)
    lse = _heads_to_seq(lse.transpose(1, 2).unsqueeze(-1), cfg).squeeze(-1).transpose(1, 2)
    return (out, lse.contiguous()) if return_lse else out
