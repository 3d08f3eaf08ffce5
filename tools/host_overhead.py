"""Host overhead against kernel time for short forward problems (docs/decisions.md, "the short
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

`--dir bwd` measures the bench's backward (autograd.grad of one retained forward graph) instead:
eager as above; instead of a graph replay, the GPU's side comes from a profiler timeline of the
same (flush, call) loop: per call, the kernels' busy time against their span from the flush's end
(idle inside the span is the host launching late). fa4's layers then are autograd.grad, the
torch.library op fa4::bwd and the C++ op fa4::_bwd_kernel.

Each configuration is measured `--repeats` times with fresh inputs, impls interleaved, so a
state that lasts a whole bench point (the bimodal short causal points) shows as a repeat apart.

    python3 tools/host_overhead.py --hdims 64,128,256 --seqlens 512,1k --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
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


@contextlib.contextmanager
def through_the_op(switch: str):
    """fa4._ops' path switch `switch` (direct_call_ok, eager_autograd_ok) off for the block: the
    calls in it go through the torch.library op."""
    from fa4 import _ops

    saved = getattr(_ops, switch)
    setattr(_ops, switch, lambda *ts: False)
    try:
        yield
    finally:
        setattr(_ops, switch, saved)


class Fa4Op(bi.Fa4):
    """fa4 with Note [inference fast path] off: every call through the torch.library op."""

    name = "fa4-op"

    def fwd(self, q, k, v, causal):
        with through_the_op("direct_call_ok"):
            return super().fwd(q, k, v, causal)


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
        "fa4::_fwd_kernel": host_us(
            partial(torch.ops.fa4._fwd_kernel, *kernel_args, *dispatch.runtime_knobs("fwd"))
        ),
    }


def timeline_us(fn, flush, iters=10) -> dict[str, float]:
    """Medians over iters of (flush, fn), from torch.profiler's CUDA kernel records: span (the
    flush's end to fn's last kernel end), busy (fn's kernels' summed durations), lead (the
    flush's end to fn's first kernel), kernels per call."""
    from torch.profiler import ProfilerActivity, profile

    def kernels(prof):
        cuda = torch.autograd.DeviceType.CUDA
        ev = [e for e in prof.events() if e.device_type == cuda]
        return sorted((e.time_range.start, e.time_range.end, e.name) for e in ev)

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush.zero_()
        torch.cuda.synchronize()
    flush_names = {k[2] for k in kernels(prof)}
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    return per_call_timeline(kernels(prof), flush_names)


def per_call_timeline(records, flush_names) -> dict[str, float]:
    """records: (start, end, name) of every kernel, sorted by start; a flush kernel opens a call,
    whose kernels are those up to the next flush. Medians over the calls with kernels."""
    calls = []  # (flush end, [(start, end) of fn's kernels])
    for start, end, name in records:
        if name in flush_names:
            calls.append((end, []))
        elif calls:
            calls[-1][1].append((start, end))
    rows = [
        dict(span=c[-1][1] - f, busy=sum(e - s for s, e in c), lead=c[0][0] - f, kernels=len(c))
        for f, c in calls
        if c
    ]
    return {k: statistics.median(r[k] for r in rows) for k in ("span", "busy", "lead", "kernels")}


def measure_bwd(impl, ins, causal, flush) -> tuple[float, dict[str, float]]:
    """(eager ms per backward, its profiler timeline in µs), the bench's bwd direction."""
    with impl.context():
        q, k, v, dout = impl.prepare(*ins)
        out = impl.fwd(q, k, v, causal)
        fn = partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True)
        eager = per_call_ms(
            _time_eager(lambda: (flush.zero_(), fn()), 20, 5),
            _time_eager(flush.zero_, 20, 5),
            20,
        )
        return eager, timeline_us(fn, flush)


def fa4_bwd_layers_us(q, k, v, dout, causal) -> dict[str, float]:
    """Host µs per call of each layer of fa4's backward (tiny inputs, q/k/v need grad): the
    recorded forward and the bench's autograd.grad through Note [eager autograd path] and through
    the op's registered autograd, the op fa4::bwd and its C++ op."""
    import fa4

    fwd = partial(fa4.attention, q, k, v, causal=causal, backend="sm90")
    out, fwd_us = fwd(), host_us(fwd)
    with through_the_op("eager_autograd_ok"):
        out_op, fwd_op_us = fwd(), host_us(fwd)
    with torch.no_grad():
        o2, lse = torch.ops.fa4._fwd_kernel(
            q, k, v, None, None, None, 0, 0, causal, q.shape[-1] ** -0.5, -1, -1, 0.0, False,
            *fa4.dispatch.runtime_knobs("fwd"),
        )  # fmt: skip
    args = (dout, q, k, v, o2, lse, None, None, None, None, 0, 0, causal, q.shape[-1] ** -0.5,
            -1, -1, 0.0, False)  # fmt: skip

    def grad_of(o):
        return partial(torch.autograd.grad, o, (q, k, v), dout, retain_graph=True)

    return {
        "fa4.attention (recorded)": fwd_us,
        "fa4.attention (recorded) through the op": fwd_op_us,
        "autograd.grad": host_us(grad_of(out)),
        "autograd.grad through the op": host_us(grad_of(out_op)),
        "fa4::bwd": host_us(partial(torch.ops.fa4.bwd, *args, "sm90")),
        "fa4::_bwd_kernel": host_us(
            partial(torch.ops.fa4._bwd_kernel, *args, *fa4.dispatch.runtime_knobs("bwd"))
        ),
    }


def main_bwd(args, impls, flush) -> list[dict]:
    rows = []
    for hd in bu.parse_ints(args.hdims, bu.HDIMS):
        for s in bu.parse_ints(args.seqlens, (512,)):
            for causal, rep in [(c, r) for c in (True, False) for r in range(args.repeats)]:
                p = bu.make_point(hd, causal, s)
                ins = bi.make_inputs(p.batch, p.seqlen, p.heads, p.hdim, rep, True)
                for impl in impls:
                    eager, tl = measure_bwd(impl, ins, causal, flush)
                    row = dict(impl=impl.name, hdim=hd, seqlen=s, causal=int(causal), rep=rep,
                               eager_ms=f"{eager:.4f}",
                               **{k if k == "kernels" else f"{k}_us": f"{x:.1f}"
                                  for k, x in tl.items()})  # fmt: skip
                    rows.append(row)
                    print(row, flush=True)
                del ins
    tiny = bi.make_inputs(1, 128, 1, 128, 0, True)
    if any(i.name == "fa4" for i in impls):
        for name, us in fa4_bwd_layers_us(*tiny, True).items():
            print(f"host fa4 bwd layer {name}: {us:.1f} us/call")
    return rows


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
    ap.add_argument("--dir", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--out", default="host_overhead.csv")
    args = ap.parse_args(argv)
    impls = make_impls(args.impls.split(","))
    flush = bi.flush_buffer()
    if args.dir == "bwd":
        rows = main_bwd(args, [i for i in impls if i.name != "fa4-op"], flush)
        return write_csv(args.out, rows)
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
    return write_csv(args.out, rows)


def write_csv(path, rows) -> int:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
