"""fa4.distributed (context parallelism) on CPU: ring attention in spawned gloo worlds of 2 and 4
ranks against single-process fa4.attention (ring_cases.py: the cases and the tolerance), and
single-process tests of the mask translation and of merge_partials."""

from __future__ import annotations

import json
import math
import socket

import pytest
import ring_cases
import torch
import torch.multiprocessing as mp

import fa4
from fa4 import dispatch
from fa4 import distributed as fd
from fa4.reference import allowed_keys

WORLDS = (2, 4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_RESULTS: dict[int, dict[str, str]] = {}


def _world_results(world, tmp_dir) -> dict[str, str]:
    """Runs every case of ring_cases in one spawned gloo world of this size (once per session)."""
    if world not in _RESULTS:
        out = tmp_dir / f"ring_{world}.json"
        init = f"tcp://127.0.0.1:{_free_port()}"
        mp.spawn(ring_cases.worker, args=(world, init, str(out)), nprocs=world, join=True)
        _RESULTS[world] = json.loads(out.read_text())
    return _RESULTS[world]


@pytest.mark.parametrize(
    "world, case", [(w, n) for w in WORLDS for n in ring_cases.names(w)], ids=lambda x: str(x)
)
def test_ring_world(world, case, tmp_path_factory):
    results = _world_results(world, tmp_path_factory.mktemp("ring"))
    assert set(results) == set(ring_cases.names(world)), "the world ran other cases"
    assert results[case] == "ok", results[case]


def test_world_size_one_without_process_group():
    """No torch.distributed init: ring_attention is fa4.attention (world of one)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 32, 2, 64, generator=g, dtype=torch.float64) for _ in range(3))
    for layout in fd.LAYOUTS:
        got = fd.ring_attention(q, k, v, causal=True, layout=layout, backend="reference")
        want = fa4.attention(q, k, v, causal=True, backend="reference")
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Mask translation against the global mask (single process)

WINDOWS = [
    (-1, -1), (16, 0), (20, 5), (0, 0), (3, -2), (-2, 5), (31, 31), (5, -5), (-4, 8),
    (None, -3), (-3, None), (7, None), (-5, 2),
]  # fmt: skip


def test_block_mask_matches_global_mask():
    """For many block offsets and sizes, the block's fa4.attention call (its causal /
    window_size through fa4's own window rules, the dummy row included) sees exactly the
    global mask's keys; a skipped block has none. Also checks that every path is taken."""
    s = 40
    seen = {"skipped": 0, "dummy_row": 0, "plain": 0, "unmasked": 0}
    for causal in (False, True):
        for win in WINDOWS:
            left, right = dispatch.window_entries(win, causal)
            full = allowed_keys(torch.arange(s), s, s, causal, win)
            for r0 in range(0, s, 3):
                for m in (1, 2, 5, 8):
                    for c0 in range(0, s, 3):
                        for n in (1, 3, 8):
                            if r0 + m > s or c0 + n > s:
                                continue
                            want = full[r0 : r0 + m, c0 : c0 + n]
                            bm = fd.block_mask(r0, m, c0, n, left, right)
                            where = f"causal={causal} window={win} rows {r0}+{m} keys {c0}+{n}"
                            if bm is None:
                                assert not want.any(), f"skipped a block with keys: {where}"
                                seen["skipped"] += 1
                                continue
                            kw = bm.call_kwargs()
                            entries = dispatch.window_entries(kw["window_size"], kw["causal"])
                            rows = m + bm.pad_row
                            got = allowed_keys(torch.arange(rows), rows, n, False, entries)[:m]
                            assert torch.equal(got, want), f"{where}: {bm}"
                            seen["dummy_row" if bm.pad_row else "plain"] += 1
                            seen["unmasked"] += entries == (-1, -1)
    assert all(seen.values()), seen


@pytest.mark.parametrize("s_local, world", [(32, 2), (8, 4), (16, 4)])
def test_zigzag_skips_balance_causal_work(s_local, world):
    """Zigzag: under causal every rank computes the same number of (q chunk, k chunk) pairs
    summed over the ring; contiguous: rank world-1 computes world times rank 0's."""

    def pairs(layout, rank):
        cfg = fd._Config(None, rank, world, layout, -1, 0, None, 0.0, False, "reference")
        return sum(1 for src in range(world) for _ in fd._block_pairs(cfg, s_local, src))

    zig = [pairs("zigzag", r) for r in range(world)]
    assert len(set(zig)) == 1, zig
    contig = [pairs("contiguous", r) for r in range(world)]
    assert contig == list(range(1, world + 1)), contig


# ---------------------------------------------------------------------------------------------
# merge_partials


def _attn(q, k, v, **kw):
    return fa4.attention(q, k, v, return_lse=True, backend="reference", **kw)


def test_merge_partials_equals_attention_over_union():
    """Two key halves merged = attention over all keys, values and gradients (through the
    differentiable LSE of each half)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 24, 2, 16, generator=g, dtype=torch.float64) for _ in range(3))
    dout = torch.randn(2, 24, 2, 16, generator=g, dtype=torch.float64)
    grads = []
    for split in (True, False):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        if split:
            a = _attn(qq, kk[:, :10], vv[:, :10])
            b = _attn(qq, kk[:, 10:], vv[:, 10:])
            out, lse = fd.merge_partials(*a, *b)
        else:
            out, lse = _attn(qq, kk, vv)
        (out * dout).sum().add(lse.sum()).backward()
        grads.append((out.detach(), lse.detach(), qq.grad, kk.grad, vv.grad))
    for x, y in zip(*grads, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_merge_partials_empty_rows():
    """lse -inf on one side: the other side exactly, weight 0; on both: out 0, lse -inf. No NaN
    in values or gradients, and the gradient of an empty side is 0."""
    g = torch.Generator().manual_seed(1)
    out_a = torch.randn(1, 4, 2, 8, generator=g, dtype=torch.float64)
    out_b = torch.randn(1, 4, 2, 8, generator=g, dtype=torch.float64)
    lse_a = torch.randn(1, 2, 4, generator=g, dtype=torch.float64)
    lse_b = torch.randn(1, 2, 4, generator=g, dtype=torch.float64)
    ninf = -math.inf
    lse_a[0, :, 1] = ninf  # row 1: only b
    lse_b[0, :, 2] = ninf  # row 2: only a
    lse_a[0, :, 3] = lse_b[0, :, 3] = ninf  # row 3: neither
    out_a[0, 1] = out_b[0, 2] = 0.0
    out_a[0, 3] = out_b[0, 3] = 0.0  # as fa4 writes rows that see no key
    inputs = [t.clone().requires_grad_() for t in (out_a, lse_a, out_b, lse_b)]
    out, lse = fd.merge_partials(*inputs)
    assert torch.equal(out[0, 1], out_b[0, 1]) and torch.equal(lse[0, :, 1], lse_b[0, :, 1])
    assert torch.equal(out[0, 2], out_a[0, 2]) and torch.equal(lse[0, :, 2], lse_a[0, :, 2])
    assert torch.equal(out[0, 3], torch.zeros_like(out[0, 3]))
    assert (lse[0, :, 3] == ninf).all()
    want = torch.logaddexp(lse_a[0, :, 0], lse_b[0, :, 0])
    torch.testing.assert_close(lse[0, :, 0], want, rtol=1e-14, atol=0)
    (out.sum() + lse.masked_fill(torch.isinf(lse), 0).sum()).backward()
    for t in inputs:
        assert torch.isfinite(t.grad).all()
    assert (inputs[0].grad[0, 1] == 0).all() and (inputs[2].grad[0, 2] == 0).all()
    assert (inputs[1].grad[0, :, 3] == 0).all() and (inputs[3].grad[0, :, 3] == 0).all()


def test_merge_partials_gradcheck_and_stability():
    """gradcheck on finite rows; large LSE (1e4) apart and together stays finite and exact."""
    g = torch.Generator().manual_seed(2)
    args = [
        torch.randn(1, 3, 2, 4, generator=g, dtype=torch.float64),
        torch.randn(1, 2, 3, generator=g, dtype=torch.float64),
        torch.randn(1, 3, 2, 4, generator=g, dtype=torch.float64),
        torch.randn(1, 2, 3, generator=g, dtype=torch.float64),
    ]
    args = [t.requires_grad_() for t in args]
    assert torch.autograd.gradcheck(fd.merge_partials, args)
    big = torch.full((1, 2, 3), 1e4, dtype=torch.float64)
    out, lse = fd.merge_partials(args[0].detach(), big, args[2].detach(), big)
    torch.testing.assert_close(lse, big + math.log(2))
    torch.testing.assert_close(out, (args[0] + args[2]).detach() / 2)


def test_merge_partials_bf16_out_fp32_lse():
    """out in bf16, lse fp32: the merge runs in fp32 and returns fp32 out."""
    out_a = torch.randn(1, 2, 1, 8).bfloat16()
    lse = torch.zeros(1, 1, 2)
    out, merged = fd.merge_partials(out_a, lse, out_a, lse)
    assert out.dtype == torch.float32 and merged.dtype == torch.float32
    torch.testing.assert_close(out, out_a.float())


def test_ring_attention_rejects_bad_layout():
    q = torch.randn(1, 8, 2, 64, dtype=torch.float64)
    with pytest.raises(ValueError, match="layout"):
        fd.ring_attention(q, q, q, layout="striped", backend="reference")
