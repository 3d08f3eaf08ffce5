"""The standard attention sweep of DESIGN.md §6: fa4 against its peers, same inputs, same run.

  python3 bench/bench.py --quick --out /tmp/bench          # seqlen 1k and 16k, every hdim
  python3 bench/bench.py --dirs fwd --hdims 128 --seqlens 2k,16k --impls sdpa-flash,fa4
  python3 bench/bench.py --dirs fwd,bwd --model-points all --out /tmp/gqa   # the GQA model points
  python3 bench/bench.py --dirs bwd --hdims 128 --seqlens 16k --model-points llama3-8b-8k
  python3 bench/bench.py --replot /tmp/bench/results.csv   # table + plots from a CSV, no GPU
  python3 bench/bench.py --decode --out /tmp/decode        # the decode sweep, GB/s
                                                           # (bench_decode.py says what it does)
  python3 bench/bench.py --sustained 10 --rounds 3 --out /tmp/sus   # steady-state TFLOP/s,
                                                           # clock, J/PFLOP (bench_sustained.py)
  python3 bench/bench.py --dirs fwd --dtype e4m3 --hdims 128,256 --seqlens 16k   # FP8 forward

Implementations: fa4 (ours; fa4.attention(backend="sm90"), skipped with the reason while the
build has no kernel for the point: the fp32 reference is never timed), torch SDPA with the
FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backends, and flash-attn-4 (flash_attn.cute, installed
by ../shared/tools/peer-wheels.sh) when importable. Before timing, every implementation's output
(and gradients) on the benchmark inputs is compared with SDPA-flash's; beyond 2e-2 max abs
(relative to max |ref| where that exceeds 1: bench_util.agrees) it is marked failed, not timed.
Timing: triton.testing.do_bench median (L2 flushed before each call; inputs of 16k tokens × 2048
× bf16 × 3 = 192 MiB, over the 60 MB L2). Outputs under --out: results.csv (rows flushed as
measured), tflops_<dir>.png, and the printed tables (ratio of fa4 to the best peer per point).
--rounds N times every implementation N times at each point, round r in the order that starts
at the (i + r)-th (with --rotate-impls), and reports the median: the SM clock under the power
cap moved single readings by 7-12 % between runs (docs/decisions.md, 2026-12-06), and a ratio
of two implementations timed moments apart carries that drift.

Model points (--model-points LABELS or all): the model-shaped GQA points of
bench_util.MODEL_POINTS (k and v with fewer heads than q; FLOPs count the q heads), run after the
points of --hdims / --seqlens / --causal, or alone when none of --hdims, --seqlens, --quick is
given. Their rows carry the label (CSV column label, with heads_kv) and the tables list them by
it, after the standard points; the plots leave them out.

FP8 forward (--dtype e4m3, forward only): the same points, q, k, v drawn as above and quantized
to e4m3 per (batch, kv head) by fa4.reference_fp8.quantize. Implementations: fa4 (the FP8
forward: fa4.attention with q/k/v_descale, bf16 out), fa4-bf16 (fa4's bf16 forward on the
dequantized values: the same-run baseline) and sdpa-cudnn-fp8 (cuDNN's FP8 SDPA, only where this
torch exposes one on the device: probed at run time, else its rows are skipped and the line
"cuDNN FP8 SDPA: not exposed by torch <version>" is printed once and kept in fp8_meta.json).
Every row is checked against SDPA-flash on the dequantized values; the e4m3 rows' guard adds
docs/numerics.md "FP8"'s bound on rounding P to e4m3, (2^-4 + n·2^-18)·max|v| for n keys
(bench_util.agrees_fp8). FLOPs as for bf16. The run
first times the FP8 GEMM ceiling, an 8192³ e4m3 torch._scaled_mm (bf16 out), as the attention
calls are timed (--rounds included): "fp8 GEMM ceiling X TFLOP/s" = 2·8192³ / t, printed once,
in fp8_meta.json and in every row's fp8_gemm_ceiling_tflops; then the bf16 GEMM ceiling (an
8192³ bf16 torch.matmul) and the ratio of the two, in fp8_meta.json. Rows add ratio_fa4_bf16
(TFLOP/s over fa4-bf16's at the point) and frac_fp8_ceiling (over the ceiling).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import operator
import signal
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:  # the bench_* helpers beside this file
    sys.path.insert(0, str(_HERE))
if str(_HERE.parent) not in sys.path:  # the repo's fa4, unless an installed one comes first
    sys.path.append(str(_HERE.parent))

import bench_decode  # noqa: E402
import bench_sustained  # noqa: E402
import bench_util as bu  # noqa: E402

IMPLS = ("fa4", "sdpa-flash", "sdpa-cudnn", "flash-attn-4")
EXTRA_IMPLS = ("fa4-det",)  # only when named in --impls
PNG_NAME = {"fwd": "tflops_fwd.png", "bwd": "tflops_bwd.png", "fwd+bwd": "tflops_fwd_bwd.png"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_out", help="folder for results.csv and the PNGs")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"seqlens {bu.QUICK_SEQLENS} only (still every hdim, causal, dir)",
    )
    ap.add_argument("--dirs", help=f"comma list of {', '.join(bu.DIRECTIONS)}")
    ap.add_argument("--hdims", help="comma list, e.g. 128,64")
    ap.add_argument("--seqlens", help="comma list, e.g. 1k,16k")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument(
        "--model-points",
        metavar="LABELS",
        help="comma list of the model-shaped GQA points (causal; bench_util.MODEL_POINTS: "
        + ", ".join(p.label for p in bu.MODEL_POINTS)
        + "), or all. The standard sweep runs them after the --hdims / --seqlens / --causal "
        "points, and only them when none of --hdims, --seqlens, --quick is given (default "
        "none); --sustained likewise, but all by default",
    )
    ap.add_argument(
        "--impls",
        help=f"comma list of {', '.join(IMPLS + EXTRA_IMPLS)}; with --dtype e4m3 of "
        f"{', '.join(bu.FP8_IMPLS)}",
    )
    ap.add_argument(
        "--dtype",
        choices=bu.DTYPES,
        default="bf16",
        help="e4m3: the FP8 forward (--dirs fwd only) against fa4's bf16 forward, with the FP8 "
        "GEMM ceiling measured in the same run",
    )
    ap.add_argument("--warmup-ms", type=float, default=25.0)
    ap.add_argument(
        "--flush",
        choices=("zero", "read"),
        default="zero",
        help="how the L2 is emptied before each timed call: zero (triton do_bench's zero_() of "
        "256 MiB, which leaves up to an L2 of dirty lines for the timed call to write back) or "
        "read (a sum over the same buffer: clean lines only); the CSV's flush column says which",
    )
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument(
        "--budget-s",
        type=float,
        help="after this many seconds, no new JIT compiles (flash-attn-4 configs "
        "not yet compiled are skipped; the others go on); default none, "
        f"{bench_decode.DEFAULT_BUDGET_S:g} with --decode",
    )
    ap.add_argument(
        "--stop-s",
        type=float,
        help="after this many seconds, measure nothing more; report what is done; default "
        f"none, {bench_decode.DEFAULT_STOP_S:g} with --decode (no new case after it)",
    )
    ap.add_argument(
        "--profile-kernels",
        action="store_true",
        help="list the CUDA kernels each impl launches at the first point "
        "(kernels.txt): shows any internal copy or transpose",
    )
    ap.add_argument(
        "--rotate-impls",
        action="store_true",
        help="start point i's implementations at the i-th (none is always timed first)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time each implementation this many times per point (rotated order) and report "
        "the median; memory and host time are read in the first round",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replot", metavar="CSV", help="only print tables and plot from a CSV")
    dec = ap.add_argument_group("decode sweep (bench_decode.py)")
    dec.add_argument(
        "--decode",
        action="store_true",
        help="the KV-cache decode sweep instead: GB/s of K and V read, fa4 against "
        "flash-attn-4 and SDPA (--impls from fa4, flash-attn-4, sdpa-cudnn, sdpa-flash, and "
        "fa4-fp8cache: fa4 on an e4m3 cache, only when named; --hdims from 128, 64)",
    )
    dec.add_argument("--decode-cases", help="comma list of decode, spec, paged (default all)")
    dec.add_argument(
        "--decode-splits",
        help="comma list of fa4 num_splits to time, each its own row (0 = heuristic, named "
        "fa4; n > 0 named fa4-splits<n>; fa4-fp8cache likewise); default 0",
    )
    dec.add_argument(
        "--hbm-gbps",
        type=float,
        help="the HBM peak in GB/s (default: from the device name, 3350 H100 SXM, 4800 H200)",
    )
    dec.add_argument(
        "--decode-step-timeout-s",
        type=float,
        default=120.0,
        help="a worker silent this long in one implementation is replaced (a hang)",
    )
    dec.add_argument(
        "--decode-value-checks",
        action="store_true",
        help="time fa4 with its value checks on (one host sync a call, as an eager user "
        "call); by default they run in the checked first call only, as under CUDA-graph capture",
    )
    dec.add_argument(
        "--decode-graphs",
        action="store_true",
        help="time each call as a CUDA-graph replay (captured after the checked first call), "
        "as serving engines run decode: the host's launch cost leaves the timing; a call "
        "that cannot be captured is an error row",
    )
    dec.add_argument("--decode-worker", metavar="STATE", help=argparse.SUPPRESS)
    sus = ap.add_argument_group("sustained mode (bench_sustained.py)")
    sus.add_argument(
        "--sustained",
        type=float,
        nargs="?",
        const=bench_sustained.DEFAULT_SECONDS,
        metavar="SECONDS",
        help="each implementation loops a training step (fwd+bwd; --dirs fwd: forward) back to "
        "back for SECONDS (>= 10, default 10) at the model-shaped GQA points: TFLOP/s, SM "
        "clock, power and J/PFLOP (results_sustained.csv); --rounds N rotates the order",
    )
    sus.add_argument(
        "--sustained-warmup-s",
        type=float,
        default=bench_sustained.DEFAULT_WARMUP_S,
        help="loop this long before each window (the steady power state)",
    )
    sus.add_argument(
        "--cooldown-s",
        type=float,
        default=bench_sustained.DEFAULT_COOLDOWN_S,
        help="idle this long after each window",
    )
    sus.add_argument(
        "--allow-short", action="store_true", help="accept --sustained below 10 s (tests only)"
    )
    args = ap.parse_args(argv)
    budget, stop = (
        (bench_decode.DEFAULT_BUDGET_S, bench_decode.DEFAULT_STOP_S)
        if args.decode
        else (math.inf, math.inf)
    )
    args.budget_s = budget if args.budget_s is None else args.budget_s
    args.stop_s = stop if args.stop_s is None else args.stop_s
    return args


def config_from(args):
    """(points, dirs, impls) of the standard sweep (the FP8 mode's with --dtype e4m3)."""
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: at least 1")
    seq_default = bu.QUICK_SEQLENS if args.quick else bu.SEQLENS
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    points = []
    # as bench_sustained.config_from: with --model-points, standard points only when asked for
    if not args.model_points or args.hdims or args.seqlens or args.quick:
        points = bu.sweep(
            bu.parse_ints(args.hdims, bu.HDIMS), bu.parse_ints(args.seqlens, seq_default), causals
        )
    if args.model_points:
        try:
            points += bu.model_points(args.model_points)
        except ValueError as e:
            raise SystemExit(f"--model-points {args.model_points}: {e}") from None
    if args.dtype == "e4m3":
        dirs = bu.parse_names(args.dirs or "fwd", bu.DIRECTIONS)
        if dirs != ("fwd",):
            raise ValueError(f"--dtype e4m3 --dirs {args.dirs}: the FP8 forward is fwd only")
        return points, dirs, bu.parse_names(args.impls, bu.FP8_IMPLS)
    dirs = bu.parse_names(args.dirs, bu.DIRECTIONS)
    impls = bu.parse_names(args.impls, IMPLS + EXTRA_IMPLS) if args.impls else IMPLS
    return points, dirs, impls


class State:
    def __init__(self, args, out: Path):
        self.args, self.out = args, out
        self.t0 = time.perf_counter()
        self.compiled: set[tuple] = set()  # _compile_key()s already JIT-compiled
        self.rows: list[dict] = []
        self.fp8 = getattr(args, "dtype", "bf16") == "e4m3"
        self.ceiling: float | None = None  # the FP8 GEMM ceiling, TFLOP/s (FP8 mode)
        self.v_max: float | None = None  # max |v| of the point's true values (FP8 mode)
        self.csv = bu.CsvLog(out / "results.csv")
        self.profile = out / "kernels.txt" if args.profile_kernels else None
        if self.profile is not None:
            self.profile.write_text("# CUDA kernels launched by one call, at the first point\n")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def dtype_of(self, impl: str) -> str:
        """The dtype column of impl's rows: e4m3 in the FP8 mode but for fa4-bf16."""
        return "e4m3" if self.fp8 and impl != bu.FP8_BASELINE else "bf16"

    def agrees(self, impl: str, p, diff: float, ref_max: float) -> bool:
        """The correctness guard of impl's row at p: the FP8 one (bu.agrees_fp8) for e4m3 rows."""
        if self.dtype_of(impl) == "e4m3":
            return bu.agrees_fp8(diff, ref_max, self.v_max, p.seqlen)
        return bu.agrees(diff, ref_max)

    def bound_text(self, impl: str) -> str:
        """The guard of impl's rows, as the failed status names it."""
        if self.dtype_of(impl) == "e4m3":
            return (f"{bu.TOLERANCE}·max(1, |ref|max) + (2^-4 + n·2^-18)·max|v| "
                    f"(max|v| {self.v_max:.3g}; the FP8 guard)")  # fmt: skip
        return f"{bu.TOLERANCE}·max(1, |ref|max)"

    def emit_point(self, rows: list[dict]) -> None:
        """Rows of one point (the FP8 mode's ratio and ceiling columns filled), then emitted."""
        if self.fp8:
            bu.fill_fp8_columns(rows, self.ceiling)
        for r in rows:
            self.emit(r)

    def emit(self, row: dict) -> None:
        self.rows.append(row)
        self.csv.write(row)
        tail = f"{row['ms']} ms {row['tflops']} TFLOP/s" if row["ms"] else ""
        if row.get("ratio_fa4_bf16"):
            tail += f" ({row['ratio_fa4_bf16']}x {bu.FP8_BASELINE})"
        if row.get("frac_fp8_ceiling"):
            tail += f" ({100 * float(row['frac_fp8_ceiling']):.1f} % of the fp8 GEMM ceiling)"
        mem = f"peak +{row['peak_extra_mib']} MiB" if row["peak_extra_mib"] else ""
        diff = f"diff {row['max_abs_diff']}" if row["max_abs_diff"] else ""
        heads = row["heads"]
        if row["heads_kv"] != heads:  # GQA: q heads : kv heads
            heads = f"{heads}:{row['heads_kv']}"
        label = f"{row['label']} " if row["label"] else ""
        print(
            f"[{self.elapsed():6.1f}s] {row['impl']:<12} {row['direction']:<7} {label}"
            f"hd{row['hdim']} causal={row['causal']} s={row['seqlen']} b={row['batch']} "
            f"h={heads}: {tail} {mem} {diff} {row['status']}",
            flush=True,
        )


class Timed:
    """One implementation and direction timed at a point: the first round's readings (memory,
    host time, check result), then each round's median ms and clocks."""

    def __init__(self, impl, d: str, a: tuple, diff, status: str, mem: float, host: float):
        self.impl, self.d, self.status = impl, d, status
        self.a = a  # the prepared inputs, kept for the later rounds
        self.diff, self.mem, self.host = diff, mem, host
        self.ms: list[float] = []
        self.mhz: list[str] = []
        self.why: list[str] = []

    def add(self, ms, mhz, why) -> None:
        self.ms.append(ms)
        self.mhz.append(mhz)
        self.why.append(why)

    def row(self, p, dtype: str = "bf16") -> dict:
        reasons = [int(w, 16) for w in self.why if w]
        return bu.make_row(
            self.impl.name, self.d, p, ms=statistics.median(self.ms), peak_extra_mib=self.mem,
            max_abs_diff=self.diff, status=self.status, sm_mhz=" ".join(m for m in self.mhz if m),
            clock_reasons=hex(functools.reduce(operator.or_, reasons)) if reasons else "",
            host_us=self.host, ms_rounds=self.ms, dtype=dtype,
        )  # fmt: skip


def _worst(*diffs):
    vals = [d for d in diffs if d is not None]
    if not vals:
        return None
    return math.nan if any(d != d for d in vals) else max(vals)


def reference(bi, torch, p, inputs, need_grad):
    """SDPA-flash's output (and gradients) in bshd: what every implementation is checked against."""
    ref = bi.make_impls(["sdpa-flash"])[0]
    with ref.context():
        a = ref.prepare(*inputs)
        if need_grad:
            out = ref.fwd(*a[:3], p.causal)
            grads = torch.autograd.grad(out, a[:3], a[3])
            return ref.to_bshd(out.detach()), [ref.to_bshd(g) for g in grads]
        with torch.no_grad():
            return ref.to_bshd(ref.fwd(*a[:3], p.causal)), None


def measure(bi, torch, impl, p, dirs, inputs, ref, st: State) -> list[Timed]:
    """Check, then time and measure memory for each direction of one impl at one point. Rows
    that were not timed are emitted here; the timed ones are returned for the caller's later
    rounds and emitted by it."""

    def emit(d, **kw):
        st.emit_point([bu.make_row(impl.name, d, p, dtype=st.dtype_of(impl.name), **kw)])

    todo = []
    for d in dirs:
        why = impl.skip_reason(d, p.hdim)
        key = _compile_key(impl, p, d != "fwd")
        if why is None and impl.jit and st.elapsed() > st.args.budget_s and key not in st.compiled:
            why = "time budget (--budget-s) spent before this config's JIT compile"
        if why:
            emit(d, status=f"skipped: {why}")
        else:
            todo.append(d)
    timed: list[Timed] = []
    if not todo:
        return timed
    with impl.context():
        a = impl.prepare(*inputs)
        diff, ok, todo = _check(bi, torch, impl, p, a, todo, ref, st, emit)
        for d in todo:
            if not ok.get(d, True):
                bound = st.bound_text(impl.name)
                emit(
                    d, max_abs_diff=diff[d], status=f"failed: max_abs_diff {diff[d]:.3g} > {bound}"
                )
                continue
            try:
                (mem, ms, host), mhz, why = bi.clocked(
                    lambda d=d: _time_direction(bi, torch, impl, p, d, a, st.args)
                )
                status = "ok" if ref is not None else "ok (unchecked: no reference)"
                timed.append(Timed(impl, d, a, diff.get(d), status, mem, host))
                timed[-1].add(ms, mhz, why)
            except Exception as e:  # noqa: BLE001
                emit(d, max_abs_diff=diff.get(d), status=f"error: {_err(e)}")
                torch.cuda.empty_cache()
        if st.profile is not None and todo:
            _profile(bi, torch, impl, p, a, any(d != "fwd" for d in todo), st.profile)
    return timed


def retime(bi, torch, t: Timed, p, args) -> None:
    """One more round of t's timing (the median ms only); a failure leaves its rounds as they
    are."""
    with t.impl.context():
        try:
            ms, mhz, why = bi.clocked(
                lambda: _time_direction(bi, torch, t.impl, p, t.d, t.a, args, only_ms=True)
            )
        except Exception as e:  # noqa: BLE001
            print(f"    {t.impl.name} {t.d}: a later round failed: {_err(e)}", flush=True)
            torch.cuda.empty_cache()
            return
    t.add(ms, mhz, why)


def _compile_key(impl, p, grad: bool) -> tuple:
    """What a JIT impl compiles one kernel for; the GQA group size included (a JIT peer
    specializes on it, so a model point after an MHA one can still compile)."""
    return (impl.name, p.hdim, p.causal, p.heads // p.kv_heads, grad)


def _err(e: Exception) -> str:
    msg = str(e).splitlines()[0][:160] if str(e) else ""
    return f"{type(e).__name__}: {msg}"


def _check(bi, torch, impl, p, a, todo, ref, st, emit):
    """The correctness guard, which is also the warm-up (any JIT compile; its time is printed).
    Returns (max abs diff per direction, pass per direction, the directions still to time)."""
    diff, scale = {}, {}  # max |impl - ref|, max |ref|
    grad_dirs = [d for d in todo if d != "fwd"]
    for grad in (False, True) if grad_dirs else (False,):
        t = time.perf_counter()
        try:
            if grad:
                out = impl.fwd(*a[:3], p.causal)
                got = list(torch.autograd.grad(out, a[:3], a[3]))
                del out
            else:
                with torch.no_grad():
                    got = [impl.fwd(*a[:3], p.causal)]
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            for d in grad_dirs if grad else todo:
                emit(d, status=f"error: {_err(e)}")
            torch.cuda.empty_cache()
            todo = [d for d in todo if d == "fwd"] if grad else []
            continue
        name = "bwd" if grad else "fwd"
        st.compiled.add(_compile_key(impl, p, grad))
        first = time.perf_counter() - t
        print(f"    {impl.name}: first {name} check call {first:.2f} s (incl. any JIT)", flush=True)
        if ref is not None:
            diff[name], scale[name] = bi.max_abs_diff(impl, got, ref[1] if grad else [ref[0]])
        del got
    ok = {d: st.agrees(impl.name, p, diff[d], scale[d]) for d in diff}
    if "fwd" in diff and "bwd" in diff:
        diff["fwd+bwd"] = _worst(diff["fwd"], diff["bwd"])
        ok["fwd+bwd"] = ok["fwd"] and ok["bwd"]
    return diff, ok, todo


def _time_direction(bi, torch, impl, p, d, a, args, only_ms=False):
    """(peak extra MiB, median ms, host µs per call), or the median ms alone. fwd runs under
    no_grad (inference); bwd times the backward of one retained forward graph; fwd+bwd times
    forward with graph + backward."""
    q, k, v, dout = a
    timing = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)

    def measured(fn):
        if only_ms:
            return bi.time_ms(fn, **timing)
        return bi.peak_extra_mib(fn), bi.time_ms(fn, **timing), bi.host_us(fn)

    if d == "fwd":
        with torch.no_grad():
            return measured(lambda: impl.fwd(q, k, v, p.causal))
    if d == "bwd":
        out = impl.fwd(q, k, v, p.causal)
        res = measured(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        del out
        return res
    return measured(lambda: bi.fwd_bwd(impl, a, p.causal))


def _profile(bi, torch, impl, p, a, grad, path):
    def fwd():
        with torch.no_grad():
            return impl.fwd(*a[:3], p.causal)

    calls = [("fwd", fwd)] + ([("fwd+bwd", lambda: bi.fwd_bwd(impl, a, p.causal))] if grad else [])
    with open(path, "a") as f:
        for name, fn in calls:
            f.write(f"## {impl.name} {name} hd{p.hdim} causal={int(p.causal)} s={p.seqlen}\n")
            try:
                for k, n in sorted(bi.kernel_names(fn).items()):
                    f.write(f"  {n} x {k}\n")
            except Exception as e:  # noqa: BLE001
                f.write(f"  profiler failed: {type(e).__name__}: {e}\n")


def report(rows, dirs, out: Path | None, title="", notes=()):
    fp8 = bu.is_fp8_rows(rows)
    for d in dirs:
        if not any(r["direction"] == d for r in rows):
            continue
        if fp8:
            print(f"\n### {d}: TFLOP/s (fa4 FP8 e4m3; ratio = fa4 / {bu.FP8_BASELINE})\n")
            print(bu.fp8_table(rows, d))
        else:
            print(f"\n### {d}: TFLOP/s (bf16; ratio = fa4 / best peer)\n")
            print(bu.ratio_table(rows, d))
            gaps = bu.sweep_gaps(rows, d)
            if gaps:
                print(f"\n{gaps}")
        print(f"\n### {d}: peak extra device memory, MiB\n")
        print(bu.memory_table(rows, d))
        if out is not None:
            try:
                from bench_plot import plot

                name = PNG_NAME[d].replace(".png", "_e4m3.png") if fp8 else PNG_NAME[d]
                png = plot(rows, d, out / name, title, "e4m3" if fp8 else "bf16")
                if png:
                    print(f"\nplot: {png}")
            except Exception as e:  # noqa: BLE001
                print(f"\nplot of {d} failed: {type(e).__name__}: {e}")
    skipped = {(r["impl"], r["status"]) for r in rows if r["status"].startswith("skipped")}
    for impl, status in sorted(skipped):
        print(f"{impl}: {status}")
    for line in notes:
        print(line)


FP8_META = "fp8_meta.json"


def fp8_notes(meta: dict) -> list[str]:
    """The FP8 run's once-per-run lines (the ceiling, cuDNN FP8 SDPA) from its metadata."""
    lines = []
    if meta.get("fp8_gemm_ceiling_tflops") is not None:
        lines.append(f"fp8 GEMM ceiling {meta['fp8_gemm_ceiling_tflops']:.1f} TFLOP/s "
                     f"({meta.get('fp8_gemm_ceiling_call', '')})")  # fmt: skip
    elif meta.get("fp8_gemm_ceiling_status"):
        lines.append(f"fp8 GEMM ceiling: {meta['fp8_gemm_ceiling_status']}")
    if meta.get("bf16_gemm_ceiling_tflops") is not None:
        line = f"bf16 GEMM ceiling {meta['bf16_gemm_ceiling_tflops']:.1f} TFLOP/s"
        if meta.get("fp8_gemm_ceiling_tflops"):
            ratio = meta["fp8_gemm_ceiling_tflops"] / meta["bf16_gemm_ceiling_tflops"]
            line += f"; fp8 / bf16 GEMM ceilings {ratio:.3f}"
        lines.append(line)
    if meta.get("cudnn_fp8_sdpa"):
        lines.append(meta["cudnn_fp8_sdpa"])
    return lines


def fp8_setup(bi, torch, args, st: State) -> dict:
    """The FP8 mode's once-per-run work before the points: whether torch exposes a cuDNN FP8
    SDPA (printed once), and the FP8 GEMM ceiling timed as the attention calls are (--rounds,
    --warmup-ms, --rep-ms); both in st and in fp8_meta.json beside results.csv."""
    _, why = bi.cudnn_fp8_sdpa()
    meta = {
        "dtype": "e4m3",
        "torch": torch.__version__,
        "cudnn_fp8_sdpa": why
        or f"cuDNN FP8 SDPA: exposed by torch {torch.__version__} "
        f"({bi.CUDNN_FP8_API}, per-tensor descales; row sdpa-cudnn-fp8)",
        "command": " ".join(sys.argv),
    }
    print(meta["cudnn_fp8_sdpa"], flush=True)
    for name in ("fp8", "bf16"):
        try:
            ms, times, call = getattr(bi, f"{name}_gemm_ceiling")(
                args.rounds, args.warmup_ms, args.rep_ms
            )
            tflops = bu.gemm_tflops(ms)
            meta.update({f"{name}_gemm_ceiling_tflops": tflops, f"{name}_gemm_ceiling_ms": ms,
                         f"{name}_gemm_ceiling_ms_rounds": times,
                         f"{name}_gemm_ceiling_call": call,
                         f"{name}_gemm_ceiling_mnk": list(bu.CEILING_MNK)})  # fmt: skip
            print(f"{name} GEMM ceiling {tflops:.1f} TFLOP/s ({ms:.4f} ms, median of "
                  f"{len(times)} round(s): {call})", flush=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            meta.update({f"{name}_gemm_ceiling_tflops": None,
                         f"{name}_gemm_ceiling_status": f"failed: {_err(e)}"})  # fmt: skip
            print(f"{name} GEMM ceiling: failed: {_err(e)}", flush=True)
            torch.cuda.empty_cache()
    st.ceiling = meta["fp8_gemm_ceiling_tflops"]
    ceilings = meta["fp8_gemm_ceiling_tflops"], meta["bf16_gemm_ceiling_tflops"]
    if all(ceilings):
        ratio = ceilings[0] / ceilings[1]
        print(f"fp8 / bf16 GEMM ceilings {ratio:.3f} (an FP8 forward as close to its GEMM "
              "ceiling as the bf16 one is to its own runs this ratio faster)",
              flush=True)  # fmt: skip
    (st.out / FP8_META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def read_fp8_meta(csv_path: Path) -> dict:
    try:
        return json.loads((Path(csv_path).parent / FP8_META).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.replot:
        if bench_decode.is_decode_csv(Path(args.replot)):
            rows = bench_decode.read_csv(Path(args.replot))
            gpu = next((r["gpu"] for r in rows if r["gpu"]), "")
            bench_decode.report(rows, Path(args.replot).parent, gpu)
            return 0
        rows = bu.read_csv(Path(args.replot))
        notes = fp8_notes(read_fp8_meta(Path(args.replot))) if bu.is_fp8_rows(rows) else ()
        report(rows, bu.DIRECTIONS, Path(args.replot).parent, notes=notes)
        return 0
    if args.dtype != "bf16" and (args.decode or args.sustained is not None):
        print(f"bench: --dtype {args.dtype} is the forward sweep's; the decode sweep's FP8 KV "
              "cache is --decode --impls fa4,fa4-fp8cache")  # fmt: skip
        return 2
    if args.decode:
        return bench_decode.main(args, argv)
    if args.sustained is not None:
        return bench_sustained.main(args, IMPLS + EXTRA_IMPLS, IMPLS)
    points, dirs, impl_names = config_from(args)
    import torch

    if not torch.cuda.is_available():
        print("bench: needs a CUDA device")
        return 2
    import bench_impls as bi

    bi.set_flush(args.flush)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("\n".join(bi.environment()))
    print("command:", " ".join(sys.argv))
    st = State(args, out)
    if st.fp8:
        fp8_setup(bi, torch, args, st)
    impls = bi.make_fp8_impls(impl_names) if st.fp8 else bi.make_impls(impl_names)
    signal.signal(signal.SIGTERM, _interrupt)  # a timeout's SIGTERM still gets the report
    try:
        for i, p in enumerate(points):
            if st.elapsed() > args.stop_s:
                print(f"--stop-s {args.stop_s:g} reached: {len(points) - i} points not run")
                break
            need_grad = any(d != "fwd" for d in dirs)
            # same inputs for a point whatever the filters; + heads_kv (0 for MHA, whose seeds
            # stay as they were) tells model points of one hdim, causal and seqlen apart
            seed = args.seed + bu.point_seed(p) + p.heads_kv
            if st.fp8:
                inputs = bi.make_fp8_inputs(
                    p.batch, p.seqlen, p.heads, p.hdim, seed, heads_kv=p.kv_heads
                )
                st.v_max = bi.fp8_v_max(inputs)
            else:
                inputs = bi.make_inputs(
                    p.batch, p.seqlen, p.heads, p.hdim, seed, need_grad, heads_kv=p.kv_heads
                )
            try:
                ref_in = bi.dequantize_inputs(inputs) if st.fp8 else inputs
                ref = reference(bi, torch, p, ref_in, need_grad)
                del ref_in
            except Exception as e:  # noqa: BLE001
                print(f"reference (sdpa-flash) failed at {p}: {type(e).__name__}: {e}")
                ref = None
            timed: list[Timed] = []
            try:
                for impl in bu.rotated(impls, i) if args.rotate_impls else impls:
                    if st.elapsed() > args.stop_s:
                        break
                    timed += measure(bi, torch, impl, p, dirs, inputs, ref, st)
                for r in range(1, args.rounds):
                    if st.elapsed() > args.stop_s:
                        break
                    for impl in bu.rotated(impls, i + r) if args.rotate_impls else impls:
                        for t in timed:
                            if t.impl is impl:
                                retime(bi, torch, t, p, args)
            finally:
                st.emit_point([t.row(p, st.dtype_of(t.impl.name)) for t in timed])
            del inputs, ref, timed
            st.profile = None  # kernel listing at the first point only
    except KeyboardInterrupt:
        print("interrupted: reporting the rows measured so far")
    finally:
        st.csv.close()
        title = f"H×d=2048, 16k tokens, {torch.cuda.get_device_name()}"
        report(st.rows, dirs, out, title)  # the FP8 lines were printed once, at the start
        print(f"\n{len(st.rows)} rows in {out / 'results.csv'} after {st.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
