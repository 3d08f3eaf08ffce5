"""The cases test_ring_attention.py runs inside spawned gloo worlds (one world per world size,
every case in it: spawning costs seconds, a case milliseconds).

Each case builds the full q, k, v from a fixed seed (the same on every rank), runs
single-process fa4.attention on them (backend "reference") and fa4.distributed.ring_attention on
this rank's shards, gathers the ring's out, LSE and dq, dk, dv, and compares. Rank 0 writes
{case name: "ok" or the failure} to a JSON file that the tests read.

Tolerance: the inputs are float64 (one case float32) and both sides run the same exact
reference math; the ring only changes the order of the sums (partials merged by their LSE,
dK/dV summed over blocks), so the differences are rounding at the input dtype's precision
(~1e-15 in fp64). A tight allclose therefore stands in for the DESIGN rule, whose
low-precision baseline (the naive bf16 computation) does not exist for fp64 inputs; -inf LSE
entries (rows that see no key) must match exactly.
"""

from __future__ import annotations

import json
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import fa4
from fa4 import distributed as fd

TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=2e-5, atol=2e-5)}


def _case(name, *, s=64, b=2, h=4, h_kv=4, d=64, d_v=None, dtype=torch.float64, **kw):
    return dict(name=name, s=s, b=b, h=h, h_kv=h_kv, d=d, d_v=d_v or d, dtype=dtype, kw=kw)


def cases(world):
    """(name -> case) for a world of this size; names say what each case covers."""
    out = []
    for layout in ("zigzag", "contiguous"):
        out += [
            _case(f"{layout}-full", layout=layout),
            _case(f"{layout}-causal", layout=layout, causal=True),
            _case(f"{layout}-causal-gqa", layout=layout, causal=True, h=4, h_kv=2),
            _case(f"{layout}-window16-0", layout=layout, window_size=(16, 0)),
            _case(f"{layout}-window20-5", layout=layout, window_size=(20, 5), h_kv=2),
            _case(f"{layout}-causal-window12", layout=layout, causal=True, window_size=(12, 12)),
            _case(f"{layout}-softcap", layout=layout, causal=True, softcap=5.0, softmax_scale=0.3),
            # shifted window: the last rows see no key (lse -inf) and some blocks translate to
            # a literal -1 entry (Note [ring mask translation])
            _case(f"{layout}-shifted-4-8", layout=layout, window_size=(-4, 8)),
            _case(f"{layout}-shifted-3-None", layout=layout, window_size=(-3, None)),
        ]
    # contiguous, s = 64: blocks [32, 64) x [0, 32) on 2 ranks translate (31, 31) to a binding
    # left' = -1 and [0, 32) x [32, 64) to right' = -1: the dummy-row path
    out += [
        _case("contiguous-window31-31", layout="contiguous", window_size=(31, 31)),
        _case("zigzag-window15-15", layout="zigzag", window_size=(15, 15)),
        _case("zigzag-fp32-causal", layout="zigzag", causal=True, dtype=torch.float32),
        _case("zigzag-packed-qkv-views", layout="zigzag", causal=True, packed=True),
        _case("zigzag-dv32-s128", layout="zigzag", causal=True, s=128, d_v=32, h_kv=1),
    ]
    return {c["name"]: c for c in out}


def _inputs(c, seed):
    g = torch.Generator().manual_seed(seed)
    b, s, h, h_kv = c["b"], c["s"], c["h"], c["h_kv"]

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(c["dtype"])

    q, k, v = rnd(b, s, h, c["d"]), rnd(b, s, h_kv, c["d"]), rnd(b, s, h_kv, c["d_v"])
    return q, k, v, rnd(b, s, h, c["d_v"]), rnd(b, h, s)  # dout, dlse


def _single(q, k, v, dout, dlse, kw):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = fa4.attention(q, k, v, return_lse=True, backend="reference", **kw)
    dlse = dlse.masked_fill(torch.isinf(lse), 0)
    torch.autograd.backward([out, lse], [dout, dlse])
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _ring(q, k, v, dout, dlse, kw, layout, group, packed=False, impl=None):
    def shard(x, dim=1):
        return fd.shard_sequence(x, group=group, layout=layout, dim=dim)

    def gather(x, dim=1):
        return fd.gather_sequence(x, group=group, layout=layout, dim=dim)

    if packed:  # q, k, v as strided views of one (b, s_local, 3, h, d) leaf, like a qkv proj
        qkv = torch.stack([shard(t) for t in (q, k, v)], 2).requires_grad_()
        ql, kl, vl = qkv.unbind(2)
    else:
        ql, kl, vl = (shard(t).requires_grad_() for t in (q, k, v))
    out, lse = (impl or fd.ring_attention)(
        ql, kl, vl, group=group, layout=layout, return_lse=True, backend="reference", **kw
    )
    dl = shard(dlse, 2).masked_fill(torch.isinf(lse), 0)
    torch.autograd.backward([out, lse], [shard(dout), dl])
    grads = qkv.grad.unbind(2) if packed else (ql.grad, kl.grad, vl.grad)
    return (
        gather(out.detach()), gather(lse.detach(), 2), *(gather(g) for g in grads),
    )  # fmt: skip


def compare(got, want, dtype):
    """None when every pair matches (infinite entries exactly), else the first mismatch."""
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want, strict=True):
        try:
            torch.testing.assert_close(a, b, **TOL[dtype])
        except AssertionError as e:
            return f"{name}: {e}"
    return None


def run_case(c, group, seed=0, impl=None):
    """impl: ring_attention (None) or ulysses_attention, with the same contract."""
    kw = dict(c["kw"])
    layout, packed = kw.pop("layout"), kw.pop("packed", False)
    q, k, v, dout, dlse = _inputs(c, seed)
    want = _single(q, k, v, dout, dlse, kw)
    got = _ring(q, k, v, dout, dlse, kw, layout, group, packed, impl)
    return compare(got, want, c["dtype"])


def _expect_raises(exc, fn):
    """None when fn raises exc, else the failure message."""
    try:
        fn()
    except exc:
        return None
    return f"expected {exc.__name__}"


def _ring_ref(q):
    return fd.ring_attention(q, q, q, backend="reference")


def special_cases(rank, world):
    """Name -> callable returning None (pass) or a failure message."""
    res = {}

    def uneven():
        q = torch.randn(1, 16 + 2 * rank, 2, 64, dtype=torch.float64)
        return _expect_raises(ValueError, lambda: _ring_ref(q))

    def odd_zigzag():
        q = torch.randn(1, 15, 2, 64, dtype=torch.float64)
        return _expect_raises(ValueError, lambda: _ring_ref(q))

    def shard_indivisible():
        x = torch.randn(1, 4 * world + 2, 2, 8)
        return _expect_raises(ValueError, lambda: fd.shard_sequence(x, layout="zigzag"))

    def varlen():
        q = torch.randn(1, 16, 2, 64, dtype=torch.float64)
        cu = torch.tensor([0, 16], dtype=torch.int32)
        fn = lambda: fd.ring_attention(q, q, q, cu_seqlens=cu, backend="reference")  # noqa: E731
        return _expect_raises(NotImplementedError, fn)

    def detects_wrong_mask():
        # the comparison can fail: a ring run without causal against a causal single process
        c = cases(world)["zigzag-full"]
        q, k, v, dout, dlse = _inputs(c, 0)
        want = _single(q, k, v, dout, dlse, dict(causal=True))
        got = _ring(q, k, v, dout, dlse, {}, "zigzag", None)
        return None if compare(got, want, c["dtype"]) else "a wrong mask went unnoticed"

    def roundtrip():
        x = torch.randn(2, 8 * world, 3, generator=torch.Generator().manual_seed(5))
        for layout in fd.LAYOUTS:
            y = fd.gather_sequence(fd.shard_sequence(x, layout=layout), layout=layout)
            if not torch.equal(x, y):
                return f"shard/gather round trip differs ({layout})"
        return None

    for fn in (uneven, odd_zigzag, shard_indivisible, varlen, detects_wrong_mask, roundtrip):
        res[fn.__name__] = fn
    return res


def ulysses_cases(world):
    """The ring cases whose head counts divide by the world size, run by ulysses_attention,
    and the ValueError for a kv head count that does not."""
    todo = {
        f"ulysses-{n}": (lambda c=c: run_case(c, None, impl=fd.ulysses_attention))
        for n, c in cases(world).items()
        if c["h"] % world == 0 and c["h_kv"] % world == 0
    }

    def ulysses_heads_indivisible():
        q = torch.randn(1, 8 * world, world, 64, dtype=torch.float64)
        k = torch.randn(1, 8 * world, 1, 64, dtype=torch.float64)
        fn = lambda: fd.ulysses_attention(q, k, k, backend="reference")  # noqa: E731
        return _expect_raises(ValueError, fn)

    todo["ulysses_heads_indivisible"] = ulysses_heads_indivisible
    return todo


SUBGROUP_PICKS = ["zigzag-causal-gqa", "contiguous-window31-31", "zigzag-shifted-4-8"]


def subgroup_names(world):
    groups = ["world1"] + (["pairs"] if world == 4 else [])
    return [f"{g}-{p}" for g in groups for p in SUBGROUP_PICKS]


def names(world):
    """Every case name a world of this size reports (the tests' parameters)."""
    return [
        *cases(world), *special_cases(0, world), *ulysses_cases(world), *subgroup_names(world)
    ]  # fmt: skip


def subgroup_cases(rank, world):
    """Cases on a subgroup: world size 1 (each rank alone) and, on 4 ranks, pairs {0, 1} and
    {2, 3} (group ranks differ from global ranks: the P2P peers must be translated)."""
    solo = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group
    groups = {"world1": solo}
    if world == 4:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        groups["pairs"] = pairs[rank // 2]
    picks = SUBGROUP_PICKS
    all_cases = cases(world)
    return {
        f"{gname}-{p}": (lambda c=all_cases[p], g=g: run_case(c, g, seed=1))
        for gname, g in groups.items()
        for p in picks
    }


def worker(rank, world, init_method, out_path):
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    torch.set_num_threads(1)
    results = {}
    todo = {n: (lambda c=c: run_case(c, None)) for n, c in cases(world).items()}
    todo.update(special_cases(rank, world))
    todo.update(ulysses_cases(world))
    todo.update(subgroup_cases(rank, world))
    for name, fn in todo.items():
        try:
            err = fn()
        except Exception:  # record and go on: every rank runs the same cases in the same order
            err = traceback.format_exc()
        if err is not None and rank != 0:
            err = f"rank {rank}: {err}"
        results[name] = err or "ok"
    every = [None] * world
    dist.all_gather_object(every, results)
    if rank == 0:
        merged = {n: next((r[n] for r in every if r[n] != "ok"), "ok") for n in results}
        with open(out_path, "w") as f:
            json.dump(merged, f)
    dist.barrier()
    dist.destroy_process_group()
