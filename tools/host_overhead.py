"""Host overhead against kernel time for short forward problems (docs/perf-notes.md, "the short
points' two modes").

bench.py times each call with triton's do_bench: an L2 flush (a 256 MiB memset), then the call,
between two CUDA events. When the host needs longer to launch the call than the GPU needs for the
flush, the GPU idles inside the timed region and the gap is counted as kernel time. This tool
separates the two for the bench's shapes (16k tokens, heads = 2048 / hd):

- eager: events around `reps` of (flush, call) launched from Python, minus the same loop with
  the flushes alone, per call (what do_bench sees, host gaps included);
- graph: the same (flush, call) sequence captured once in a CUDA graph and replayed, minus a
  graph of the flushes alone, per call (the GPU's time, no host in the loop);
- host: the wall time per call of back-to-back calls on a tiny problem (b 1, s 128, one head),
  synchronized once at the end: the host's cost of one call, as the GPU work is negligible;
- for fa4 also the host cost of its layers: validation (dispatch.check_dense), the torch.library
  op (fa4::fwd), and the C++ op it calls (fa4::_fwd_kernel).

Each configuration is measured `--repeats` times with fresh inputs, impls interleaved, so a
state that lasts a whole bench point (the bimodal short causal points) shows as a repeat apart.

    python3 tools/host_overhead.py --hdims 64,128,256 --seqlens 512,1k --repeats 3
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_impls as bi  # noqa: E402
import bench_util as bu  # noqa: E402


def per_call_ms(events_ms: list[float], base_ms: list[float], reps: int) -> float:
    """Median loop time minus the median flush-only loop time, per call."""
    return (statistics.median(events_ms) - statistics.median(base_ms)) / reps


def _time_eager(body, reps: int, trials: int) -> list[float]:
    out = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            body()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def _time_graph(body, reps: int, trials: int) -> list[float]:
    body()  # warm-up outside capture (allocator, JIT, lazy init)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        for _ in range(reps):
            body()
    graph.replay()
    return _time_eager(graph.replay, 1, trials)


def kernel_times(fn, flush, reps=20, trials=5) -> tuple[float, float | str]:
    """(eager ms, graph ms) per call of fn, each with an L2 flush before the call."""

    def both():
        flush.zero_()
        fn()

    def alone():
        flush.zero_()

    eager = per_call_ms(_time_eager(both, reps, trials), _time_eager(alone, reps, trials), reps)
    try:
        graph_ms = per_call_ms(
            _time_graph(both, reps, trials), _time_graph(alone, reps, trials), reps
        )
    except Exception as e:  # noqa: BLE001 - an impl that cannot be captured is reported as such
        torch.cuda.synchronize()
        return eager, f"no graph ({type(e).__name__})"
    return eager, graph_ms


def host_us(fn, calls=300) -> float:
    """Wall time per call of back-to-back calls, in µs (synchronized once at the end)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


class Fa4Op(bi.Fa4):
    """fa4 with Note [inference fast path] off: every call through the torch.library op."""

    name = "fa4-op"

    def fwd(self, q, k, v, causal):
        from fa4 import _ops

        direct = _ops.direct_call_ok
        _ops.direct_call_ok = lambda *ts: False
        try:
            return super().fwd(q, k, v, causal)
        finally:
            _ops.direct_call_ok = direct


def make_impls(names: list[str]) -> list[bi.Impl]:
    impls = [Fa4Op() if n == "fa4-op" else bi.make_impls([n])[0] for n in names]
    return [i for i in impls if not i.skip_reason("fwd", 128)]


def fa4_layers_us(q, k, v, causal) -> dict[str, float]:
    """Host µs per call of each layer of fa4.attention (tiny inputs)."""
    import fa4
    from fa4 import dispatch

    kw = dict(causal=causal, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
              deterministic=False, backend="sm90")  # fmt: skip
    opts = dispatch.check_dense(q, k, v, **kw)
    kernel_args = (q, k, v, None, None, None, 0, 0, causal, opts.softmax_scale,
                   opts.window_left, opts.window_right, 0.0, False)  # fmt: skip
    return {
        "fa4.attention": host_us(partial(fa4.attention, q, k, v, causal=causal, backend="sm90")),
        "check_dense": host_us(partial(dispatch.check_dense, q, k, v, **kw)),
        "fa4::fwd": host_us(partial(torch.ops.fa4.fwd, *kernel_args, "sm90")),
        "fa4::_fwd_kernel": host_us(partial(torch.ops.fa4._fwd_kernel, *kernel_args)),
    }


def measure(impl, ins, causal, flush) -> tuple[float, float | str]:
    with impl.context(), torch.no_grad():
        q, k, v, _ = impl.prepare(*ins)
        return kernel_times(partial(impl.fwd, q, k, v, causal), flush)


def host_of(impl, ins) -> float:
    with impl.context(), torch.no_grad():
        q, k, v, _ = impl.prepare(*ins)
        return host_us(partial(impl.fwd, q, k, v, True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512")
    ap.add_argument("--impls", default="fa4,fa4-op,sdpa-cudnn,flash-attn-4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="host_overhead.csv")
    args = ap.parse_args(argv)
    impls = make_impls(args.impls.split(","))
    flush = bi.flush_buffer()
    rows = []
    for hd in bu.parse_ints(args.hdims, bu.HDIMS):
        for s in bu.parse_ints(args.seqlens, (512,)):
            for causal, rep in [(c, r) for c in (True, False) for r in range(args.repeats)]:
                p = bu.make_point(hd, causal, s)  # the bench's shape: 16k tokens, h·d = 2048
                ins = bi.make_inputs(p.batch, p.seqlen, p.heads, p.hdim, rep, False)
                for impl in impls:
                    eager, graph = measure(impl, ins, causal, flush)
                    graph = graph if isinstance(graph, str) else f"{graph:.4f}"
                    row = dict(impl=impl.name, hdim=hd, seqlen=s, causal=int(causal), rep=rep,
                               eager_ms=f"{eager:.4f}", graph_ms=graph)  # fmt: skip
                    rows.append(row)
                    print(row, flush=True)
                del ins
    tiny = bi.make_inputs(1, 128, 1, 128, 0, False)
    for impl in impls:
        print(f"host {impl.name}: {host_of(impl, tiny):.1f} us/call")
    if any(i.name == "fa4" for i in impls):
        with torch.no_grad():
            for name, us in fa4_layers_us(*tiny[:3], True).items():
                print(f"host fa4 layer {name}: {us:.1f} us/call")
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
