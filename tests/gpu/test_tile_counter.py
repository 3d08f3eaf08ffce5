"""Note [stream tile counter] (csrc/api/bindings.cpp) and Note [self-resetting tile counter]
(csrc/common/tile_ring.cuh): every forward and backward run leaves its stream's tile counter at
zero, so one counter per stream serves every call without a memset; streams that run at the same
time and CUDA-graph replays do not share one. Each check compares the run-time schedule with the
static stride (FA4_STATIC_SCHEDULE=1), which must give the same bits: a counter left non-zero
would make the next run skip tiles and leave its output unwritten."""

import pytest
import torch
from helpers import randn

import fa4
from fa4 import build_info

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)
        or build_info.missing_kernel("sm90", "fwd", (128, 128)) is not None,
        reason="needs an SM90 GPU and the hd128 sm90 forward in the build",
    ),
]  # fmt: skip


def qkv(seed, grad=False):
    """8 x 4 heads x 6 Q tiles of 700 rows: with 3 CTAs (FA4_NUM_SMS) each claims ~16 tiles."""
    g = torch.Generator().manual_seed(seed)
    ts = [randn(8, 700, 4, 128, dtype=torch.bfloat16, generator=g).cuda() for _ in range(3)]
    return [t.requires_grad_(grad) for t in ts]


def static_schedule(monkeypatch, fn):
    monkeypatch.setenv("FA4_STATIC_SCHEDULE", "1")
    try:
        return fn()
    finally:
        monkeypatch.delenv("FA4_STATIC_SCHEDULE")


def test_counter_is_zero_after_each_run(monkeypatch):
    monkeypatch.setenv("FA4_NUM_SMS", "3")
    q, k, v = qkv(1, grad=True)
    counter = torch.ops.fa4._stream_tile_counter(q)
    assert counter.dtype == torch.int64 and counter.shape == (2,)
    for causal in (False, True):
        out = fa4.attention(q, k, v, causal=causal)
        torch.cuda.synchronize()
        assert counter.tolist() == [0, 0], f"forward, causal={causal}"
        out.sum().backward()
        torch.cuda.synchronize()
        assert counter.tolist() == [0, 0], f"backward, causal={causal}"


def test_back_to_back_runs_match_the_static_schedule(monkeypatch):
    """Runs queued without a synchronization between them, fresh inputs each: each sees the
    counter its predecessor reset."""
    monkeypatch.setenv("FA4_NUM_SMS", "3")
    inputs = [qkv(10 + i) for i in range(6)]
    outs = [fa4.attention(*x, causal=i % 2 == 1) for i, x in enumerate(inputs)]
    want = static_schedule(
        monkeypatch, lambda: [fa4.attention(*x, causal=i % 2 == 1) for i, x in enumerate(inputs)]
    )
    for i, (a, b) in enumerate(zip(outs, want, strict=True)):
        assert torch.equal(a, b), f"run {i}"


def test_fresh_counter_per_call_matches(monkeypatch):
    """FA4_FRESH_TILE_COUNTER=1: the capture path (a zeroed counter per call) in eager calls."""
    monkeypatch.setenv("FA4_NUM_SMS", "3")
    x = qkv(40)
    monkeypatch.setenv("FA4_FRESH_TILE_COUNTER", "1")
    fresh = [fa4.attention(*x, causal=c) for c in (False, True)]
    monkeypatch.delenv("FA4_FRESH_TILE_COUNTER")
    want = static_schedule(
        monkeypatch, lambda: [fa4.attention(*x, causal=c) for c in (False, True)]
    )
    for a, b in zip(fresh, want, strict=True):
        assert torch.equal(a, b)


def test_concurrent_streams_have_their_own_counters(monkeypatch):
    monkeypatch.setenv("FA4_NUM_SMS", "3")
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [qkv(20 + i) for i in range(4)]
    torch.cuda.synchronize()
    outs = []
    for i, x in enumerate(inputs):
        with torch.cuda.stream(streams[i % 2]):
            outs.append(fa4.attention(*x, causal=True))
    torch.cuda.synchronize()
    counters = []
    for s in streams:
        with torch.cuda.stream(s):
            counters.append(torch.ops.fa4._stream_tile_counter(inputs[0][0]))
    assert counters[0].data_ptr() != counters[1].data_ptr()
    assert [c.tolist() for c in counters] == [[0, 0], [0, 0]]
    want = static_schedule(monkeypatch, lambda: [fa4.attention(*x, causal=True) for x in inputs])
    for i, (a, b) in enumerate(zip(outs, want, strict=True)):
        assert torch.equal(a, b), f"run {i}"


def test_graph_replays_beside_eager_runs(monkeypatch):
    """A captured forward owns a counter of its own: replays on a side stream overlap eager runs
    on the capturing stream, and both match the static schedule."""
    monkeypatch.setenv("FA4_NUM_SMS", "3")
    q, k, v = qkv(30)
    fa4.attention(q, k, v, causal=True)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fa4.attention(q, k, v, causal=True)
    eager_in = qkv(31)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    eager = []
    for _ in range(3):
        with torch.cuda.stream(side):
            graph.replay()
        eager.append(fa4.attention(*eager_in, causal=True))
    torch.cuda.synchronize()
    want_graph, want_eager = static_schedule(
        monkeypatch,
        lambda: (fa4.attention(q, k, v, causal=True), fa4.attention(*eager_in, causal=True)),
    )
    assert torch.equal(captured, want_graph)
    for i, e in enumerate(eager):
        assert torch.equal(e, want_eager), f"eager run {i}"
