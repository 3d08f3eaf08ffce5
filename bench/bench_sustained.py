"""Sustained mode (`bench.py --sustained SECONDS`): the throughput a training job gets.

  python3 bench/bench.py --sustained 10 --rounds 3 --out /tmp/sustained
  python3 bench/bench.py --sustained 10 --model-points llama3-8b-8k,gpt-oss-8k --dirs fwd

Why: the H100 runs capped at 700 W, and the standard sweep's short timings sample whatever
power state the previous point left (points moved 7-12 % between runs). Here each
implementation runs a realistic loop back to back: forward + backward of a training step
(direction fwd+bwd, the default) or forward only (--dirs fwd), for SECONDS (>= 10) after a
warm-up that reaches the steady power state (--sustained-warmup-s, default 3), then the GPU
idles --cooldown-s (default 2) before the next implementation.

Points: the model-shaped GQA points (bench_util.MODEL_POINTS; --model-points picks some), plus
the standard sweep's points when --hdims, --seqlens or --quick name them. Implementations take
turns: round r starts at the r-th (bench_util.rotated); --rounds N repeats.

Per (point, implementation, round):
- TFLOP/s = iterations x FLOPs / elapsed, elapsed between two CUDA events recorded at the
  window's ends. The host synchronizes only there, never per iteration: it runs ahead of the
  GPU (bounded by the launch queue) and the end event closes after the last iteration.
- SM clock, mean and minimum: NVML, sampled every 0.2 s by a background thread.
- power: NVML's total-energy counter (mJ) differenced over the window, over the window's wall
  time; J/PFLOP: that energy over iterations x FLOPs / 1e15.
NVML comes from pynvml, else ctypes on libnvidia-ml.so.1; without either (or without a reading),
the columns say n/a: no number is made up. Inputs are not L2-flushed (a training loop is not).
Before timing, each implementation's forward output is compared with SDPA-flash's (the standard
sweep's guard, bench_util.agrees); gradients are not compared here.

Outputs under --out: results_sustained.csv (each round's row flushed as measured, then a median
row per (point, implementation, direction): the medians over rounds, the TFLOP/s spread as
(max - min) / median, iterations and seconds summed), and the printed tables.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import bench_util as bu

MIN_SECONDS = 10.0  # a shorter window is the short-timing problem this mode exists to avoid
DEFAULT_SECONDS = 10.0
DEFAULT_WARMUP_S = 3.0  # the H100's clock settles under the cap within ~1-2 s of full load
DEFAULT_COOLDOWN_S = 2.0
SAMPLE_PERIOD_S = 0.2
DIRECTIONS = ("fwd+bwd", "fwd")  # bwd alone is no loop a job runs
PEER = "flash-attn-4"  # the ratio and energy columns compare fa4 with it by name
NA = "n/a"
NVML_CLOCK_SM = 1  # nvmlClockType_t: GRAPHICS 0, SM 1, MEM 2, VIDEO 3
CSV_NAME = "results_sustained.csv"
CSV_FIELDS = (
    "point impl direction hdim causal seqlen batch heads heads_kv round iters window_s tflops "
    "tflops_spread_pct sm_mhz_mean sm_mhz_min power_w j_per_pflop nvml status"
).split()


# ---- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    seconds: float
    warmup_s: float
    cooldown_s: float
    rounds: int
    points: tuple
    dirs: tuple
    impls: tuple
    seed: int = 0


def config_from(args, impls_allowed: tuple[str, ...], impls_default: tuple[str, ...]) -> Config:
    """The sustained run bench.py's arguments ask for; SystemExit with the reason if invalid."""
    s = args.sustained
    if s < MIN_SECONDS and not args.allow_short:
        raise SystemExit(
            f"--sustained {s:g}: at least {MIN_SECONDS:g} s (a shorter window samples whatever "
            "power state the GPU is in, which this mode exists to avoid); --allow-short is for "
            "tests"
        )
    if s <= 0:
        raise SystemExit(f"--sustained {s:g}: must be > 0")
    for flag, v in (("--sustained-warmup-s", args.sustained_warmup_s),
                    ("--cooldown-s", args.cooldown_s)):  # fmt: skip
        if v < 0:
            raise SystemExit(f"{flag} {v:g}: must be >= 0")
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: at least 1")
    try:
        dirs = bu.parse_names(args.dirs, DIRECTIONS) if args.dirs else DIRECTIONS[:1]
        impls = bu.parse_names(args.impls, impls_allowed) if args.impls else impls_default
        points = bu.model_points(args.model_points)
    except ValueError as e:
        raise SystemExit(f"--sustained: {e}") from None
    if args.hdims or args.seqlens or args.quick:  # the standard points only when asked for
        causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
        seqs = bu.QUICK_SEQLENS if args.quick else bu.SEQLENS
        points += bu.sweep(
            bu.parse_ints(args.hdims, bu.HDIMS), bu.parse_ints(args.seqlens, seqs), causals
        )
    return Config(s, args.sustained_warmup_s, args.cooldown_s, args.rounds, tuple(points), dirs,
                  tuple(impls), args.seed)  # fmt: skip


def planned_s(cfg: Config) -> float:
    """Seconds of warm-up, window and cool-down the run will take (first calls and JIT aside)."""
    per = cfg.warmup_s + cfg.seconds + cfg.cooldown_s
    return len(cfg.points) * len(cfg.dirs) * len(cfg.impls) * cfg.rounds * per


# ---- NVML layer -------------------------------------------------------------------------------


class Nvml:
    """The three NVML readings of one device; read() gives None where NVML does not answer."""

    def __init__(self, source: str, sm_mhz, power_w, energy_mj):
        self.source = source
        self._fns = {"sm_mhz": sm_mhz, "power_w": power_w, "energy_mj": energy_mj}

    def read(self, what: str):
        try:
            return self._fns[what]()
        except Exception:  # noqa: BLE001 - a reading NVML does not give is n/a, not an error
            return None


def _pynvml(index: int) -> Nvml:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    return Nvml(
        "pynvml",
        lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,  # mW
        lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),  # mJ
    )


def _ctypes_nvml(index: int) -> Nvml:
    lib = ctypes.CDLL("libnvidia-ml.so.1")

    def check(rc, what):
        if rc != 0:
            raise OSError(f"{what}: NVML error {rc}")

    check(lib.nvmlInit_v2(), "nvmlInit_v2")
    h = ctypes.c_void_p()
    check(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)), "handle")

    def get(fn, *args, ctype=ctypes.c_uint):
        out = ctype()
        check(fn(h, *args, ctypes.byref(out)), fn.__name__)
        return out.value

    return Nvml(
        "ctypes libnvidia-ml.so.1",
        lambda: get(lib.nvmlDeviceGetClockInfo, ctypes.c_int(NVML_CLOCK_SM)),
        lambda: get(lib.nvmlDeviceGetPowerUsage) / 1e3,
        lambda: get(lib.nvmlDeviceGetTotalEnergyConsumption, ctype=ctypes.c_ulonglong),
    )


def nvml_index(cuda_index: int, visible: str | None) -> int:
    """NVML counts every GPU of the host; CUDA only CUDA_VISIBLE_DEVICES's, in its order.
    Only a list of indices is mapped (UUIDs are rare here and fall back to the CUDA index)."""
    if visible:
        toks = [t.strip() for t in visible.split(",")]
        if all(t.isdigit() for t in toks) and cuda_index < len(toks):
            return int(toks[cuda_index])
    return cuda_index


def open_nvml(cuda_index: int, openers=(_pynvml, _ctypes_nvml)) -> tuple[Nvml | None, str]:
    """(the first NVML binding that opens, its name) or (None, why none did)."""
    index = nvml_index(cuda_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    why = []
    for opener in openers:
        try:
            nv = opener(index)
            return nv, f"NVML via {nv.source}, device {index}"
        except Exception as e:  # noqa: BLE001
            why.append(f"{opener.__name__}: {type(e).__name__}: {str(e)[:100]}")
    return None, "NVML unavailable (" + "; ".join(why) + "): clock, power and energy are n/a"


class Sampler:
    """SM clock and board power read every `period` s on a background thread, start() to
    stop(); without NVML it samples nothing."""

    def __init__(self, nvml: Nvml | None, period: float = SAMPLE_PERIOD_S):
        self.nvml, self.period = nvml, period
        self.clocks: list[float] = []
        self.powers: list[float] = []
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        if self.nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            for what, into in (("sm_mhz", self.clocks), ("power_w", self.powers)):
                v = self.nvml.read(what)
                if v is not None:
                    into.append(float(v))
            if self._stop.wait(self.period):
                return

    def stop(self) -> tuple[list[float], list[float]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.clocks, self.powers


# ---- timing layer -----------------------------------------------------------------------------


class CudaHw:
    """Host clock, sleep, synchronize and CUDA events of the current stream; the CPU tests put a
    virtual clock in its place."""

    now = staticmethod(time.perf_counter)
    sleep = staticmethod(time.sleep)

    def __init__(self, torch):
        self.torch = torch

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def event(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def elapsed_s(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3

    def sampler(self, nvml):
        return Sampler(nvml)


@dataclass
class Window:
    """One measured window: iterations, GPU seconds (events), wall seconds (host, from the
    first energy read to the second), energy in J (None without the counter), samples."""

    iters: int
    gpu_s: float
    wall_s: float
    energy_j: float | None
    clocks: list = field(default_factory=list)
    powers: list = field(default_factory=list)


def _loop(step, seconds: float, hw) -> int:
    n, t0 = 0, hw.now()
    while hw.now() - t0 < seconds:
        step()
        n += 1
    return n


def run_window(step, seconds: float, warmup_s: float, hw, nvml: Nvml | None) -> Window:
    """Warm-up, then `seconds` of step() back to back between two CUDA events."""
    _loop(step, warmup_s, hw)
    # One sync after the warm-up: the window opens on a drained queue, so the energy read and
    # the start event mark the same moment (the GPU idles only for the next launch, ~µs).
    hw.sync()
    sampler = hw.sampler(nvml)
    sampler.start()
    e0 = nvml.read("energy_mj") if nvml else None
    t0, start = hw.now(), hw.event()
    n = _loop(step, seconds, hw)
    end = hw.event()
    hw.sync()
    t1 = hw.now()
    e1 = nvml.read("energy_mj") if nvml else None
    clocks, powers = sampler.stop()
    energy = (e1 - e0) / 1e3 if e0 is not None and e1 is not None else None
    return Window(n, hw.elapsed_s(start, end), t1 - t0, energy, clocks, powers)


# ---- arithmetic -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """What one window gives; None where NVML did not answer."""

    iters: int
    window_s: float
    tflops: float
    sm_mean: float | None
    sm_min: float | None
    power_w: float | None
    j_per_pflop: float | None


def reading(w: Window, flops_per_iter: float) -> Reading:
    work = w.iters * flops_per_iter
    # Power from the energy counter (exact over the window); the sampled power only where the
    # board has no counter. J/PFLOP needs the counter: it is never estimated from samples.
    power = w.energy_j / w.wall_s if w.energy_j is not None and w.wall_s > 0 else None
    if power is None and w.powers:
        power = statistics.fmean(w.powers)
    return Reading(
        iters=w.iters,
        window_s=w.gpu_s,
        tflops=work / w.gpu_s / 1e12,
        sm_mean=statistics.fmean(w.clocks) if w.clocks else None,
        sm_min=min(w.clocks) if w.clocks else None,
        power_w=power,
        j_per_pflop=w.energy_j / (work / 1e15) if w.energy_j is not None and work else None,
    )


def _median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def combine(rs: list[Reading]) -> tuple[Reading, float]:
    """The median of each column over rounds (min SM clock: the median of the minima), and the
    TFLOP/s spread, (max - min) / median in %."""
    tf = [r.tflops for r in rs]
    med = Reading(
        iters=sum(r.iters for r in rs),
        window_s=sum(r.window_s for r in rs),
        tflops=statistics.median(tf),
        sm_mean=_median(r.sm_mean for r in rs),
        sm_min=_median(r.sm_min for r in rs),
        power_w=_median(r.power_w for r in rs),
        j_per_pflop=_median(r.j_per_pflop for r in rs),
    )
    return med, (max(tf) - min(tf)) / med.tflops * 100 if med.tflops else 0.0


def _f(x, spec) -> str:
    return NA if x is None else format(x, spec)


def make_row(p, impl, d, rnd, r: Reading | None = None, spread=None, nvml="", status="ok"):
    """A CSV row; a row that was not measured (skipped / failed / error) has blank numbers."""
    row = dict(point=p.name, impl=impl, direction=d, hdim=p.hdim, causal=int(p.causal),
               seqlen=p.seqlen, batch=p.batch, heads=p.heads, heads_kv=p.kv_heads, round=rnd,
               nvml=nvml, status=status)  # fmt: skip
    row.update({k: "" for k in CSV_FIELDS if k not in row})
    if r is not None:
        row.update(
            iters=r.iters, window_s=f"{r.window_s:.3f}", tflops=f"{r.tflops:.1f}",
            tflops_spread_pct="" if spread is None else f"{spread:.1f}",
            sm_mhz_mean=_f(r.sm_mean, ".0f"), sm_mhz_min=_f(r.sm_min, ".0f"),
            power_w=_f(r.power_w, ".1f"), j_per_pflop=_f(r.j_per_pflop, ".1f"),
        )  # fmt: skip
    return row


class CsvLog:
    """results_sustained.csv, each row flushed as written."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=CSV_FIELDS)
        self._w.writeheader()
        self._f.flush()
        self.rows: list[dict] = []

    def write(self, row: dict) -> None:
        self.rows.append(row)
        self._w.writerow(row)
        self._f.flush()

    def close(self) -> None:
        self._f.close()


# ---- one point --------------------------------------------------------------------------------


@dataclass
class Contestant:
    """One implementation ready to loop at a point: step() is one iteration, context() wraps
    the whole window (an SDPA backend selection, entered once, not per iteration)."""

    name: str
    step: object
    context: object = contextlib.nullcontext


def run_point(p, d: str, contestants: list[Contestant], cfg: Config, hw, nvml, log) -> list:
    """cfg.rounds rounds at one point and direction, round r in the order that starts at the
    r-th contestant, a cool-down after each window. Each reading's row is logged as measured;
    returns the median rows (also logged)."""
    tag = nvml.source if nvml else NA
    flops = bu.point_flops(d, p)
    got: dict[str, list[Reading]] = {c.name: [] for c in contestants}
    failed: dict[str, str] = {}
    for r in range(cfg.rounds):
        for c in bu.rotated(contestants, r):
            if c.name in failed:
                continue
            try:
                with c.context():
                    w = run_window(c.step, cfg.seconds, cfg.warmup_s, hw, nvml)
            except Exception as e:  # noqa: BLE001 - one contestant's failure ends its rounds
                failed[c.name] = f"error: {type(e).__name__}: {str(e)[:160]}"
                log.write(make_row(p, c.name, d, r, nvml=tag, status=failed[c.name]))
                continue
            got[c.name].append(reading(w, flops))
            log.write(make_row(p, c.name, d, r, got[c.name][-1], nvml=tag))
            _print(p, c.name, d, r, got[c.name][-1])
            hw.sleep(cfg.cooldown_s)  # idle: the next contestant starts from the same state
    medians = []
    for c in contestants:
        if got[c.name]:
            med, spread = combine(got[c.name])
            status = "ok" if c.name not in failed else f"ok ({len(got[c.name])} rounds)"
            medians.append(make_row(p, c.name, d, "median", med, spread, tag, status))
            log.write(medians[-1])
    return medians


def _print(p, impl, d, r, rd: Reading) -> None:
    print(
        f"  {p.name} {d} {impl:<12} round {r}: {rd.iters} iters in {rd.window_s:.2f} s, "
        f"{rd.tflops:.1f} TFLOP/s, SM {_f(rd.sm_mean, '.0f')} (min {_f(rd.sm_min, '.0f')}) MHz, "
        f"{_f(rd.power_w, '.0f')} W, {_f(rd.j_per_pflop, '.1f')} J/PFLOP",
        flush=True,
    )


# ---- tables -----------------------------------------------------------------------------------


def _num(row, col):
    return float(row[col]) if row and row[col] not in ("", NA) else None


def _ratio(a, b) -> str:
    return f"{a / b:.3f}" if a is not None and b else NA


def summary_table(rows: list[dict], d: str) -> str:
    """Per point: median TFLOP/s (± spread) per impl, fa4 / flash-attn-4, fa4 / best peer, and
    J/PFLOP of fa4 and flash-attn-4."""
    med = [r for r in rows if r["round"] == "median" and r["direction"] == d]
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["direction"] == d))
    peers = [i for i in impls if i != bu.OURS and not i.startswith(bu.OURS + "-")]
    by: dict[str, dict] = {}
    for r in rows:
        if r["direction"] == d:
            by.setdefault(r["point"], {})
    for r in med:
        by[r["point"]][r["impl"]] = r
    head = ["point", *impls, f"{bu.OURS} / {PEER}", f"{bu.OURS} / best peer",
            f"J/PFLOP {bu.OURS}", f"J/PFLOP {PEER}"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for point, cells in by.items():
        vals = [f"{cells[i]['tflops']} ±{cells[i]['tflops_spread_pct']}%" if i in cells else "-"
                for i in impls]  # fmt: skip
        ours = _num(cells.get(bu.OURS), "tflops")
        best = max((_num(cells[i], "tflops") for i in peers if i in cells), default=None)
        energy = [cells[i]["j_per_pflop"] if i in cells else "-" for i in (bu.OURS, PEER)]
        row = [point, *vals, _ratio(ours, _num(cells.get(PEER), "tflops")), _ratio(ours, best),
               *energy]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def detail_table(rows: list[dict], d: str) -> str:
    """Per (point, impl): the medians of every column, or the status of a row not measured."""
    head = ["point", "impl", "TFLOP/s", "spread %", "SM MHz mean", "SM MHz min", "W", "J/PFLOP",
            "status"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["direction"] != d or (r["round"] != "median" and r["status"].startswith("ok")):
            continue
        cols = ("tflops", "tflops_spread_pct", "sm_mhz_mean", "sm_mhz_min", "power_w",
                "j_per_pflop", "status")  # fmt: skip
        lines.append("| " + " | ".join([r["point"], r["impl"], *(r[c] for c in cols)]) + " |")
    return "\n".join(lines)


def report(rows: list[dict], dirs) -> None:
    for d in dirs:
        if any(r["direction"] == d for r in rows):
            print(f"\n### sustained {d}: median TFLOP/s over rounds (± spread, max - min)\n")
            print(summary_table(rows, d))
            print(f"\n### sustained {d}: per implementation (medians over rounds)\n")
            print(detail_table(rows, d))


# ---- the GPU side -----------------------------------------------------------------------------


def make_inputs(torch, p, seed: int, grad: bool):
    """q, dout (b, s, h, d) and k, v (b, s, h_kv, d): bf16, standard normal."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    heads = (p.heads, p.kv_heads, p.kv_heads, p.heads)
    ts = [torch.randn((p.batch, p.seqlen, h, p.hdim), generator=g, device="cuda",
                      dtype=torch.bfloat16) for h in heads]  # fmt: skip
    for t in ts[:3]:
        t.requires_grad_(grad)
    return ts


def _step(bi, torch, impl, p, d, a):
    q, k, v, _ = a
    if d == "fwd":

        def fwd():
            with torch.no_grad():
                impl.fwd(q, k, v, p.causal)

        return fwd
    return lambda: bi.fwd_bwd(impl, a, p.causal)


def contestants_at(bi, torch, impls, p, d, inputs, ref, log, tag) -> list[Contestant]:
    """The implementations that can run at p: each skip, failed check or error is a row. The
    first calls (forward, and the backward for fwd+bwd) are here, outside any window: they
    carry any JIT compile."""
    out = []
    for impl in impls:
        why = impl.skip_reason(d, p.hdim)
        if why:
            log.write(make_row(p, impl.name, d, "", nvml=tag, status=f"skipped: {why}"))
            continue
        try:
            with impl.context():
                a = impl.prepare(*inputs)
                with torch.no_grad():
                    got = impl.fwd(*a[:3], p.causal)
                status = "ok"
                if ref is not None:
                    diff, scale = bi.max_abs_diff(impl, [got], [ref])
                    if not bu.agrees(diff, scale):
                        status = f"failed: forward max_abs_diff {diff:.3g} vs sdpa-flash"
                del got
                if d != "fwd":
                    bi.fwd_bwd(impl, a, p.causal)
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            torch.cuda.empty_cache()
        if status != "ok":
            log.write(make_row(p, impl.name, d, "", nvml=tag, status=status))
            continue
        out.append(Contestant(impl.name, _step(bi, torch, impl, p, d, a), impl.context))
    return out


def _reference(bi, torch, p, inputs):
    """SDPA-flash's forward output (bshd), or None if it cannot run here."""
    ref = bi.make_impls(["sdpa-flash"])[0]
    try:
        with ref.context(), torch.no_grad():
            return ref.to_bshd(ref.fwd(*ref.prepare(*inputs)[:3], p.causal))
    except Exception as e:  # noqa: BLE001
        print(f"  reference (sdpa-flash) failed at {p.name}: {type(e).__name__}: {e}")
        return None


def main(args, impls_allowed, impls_default) -> int:
    cfg = config_from(args, impls_allowed, impls_default)
    import torch

    if not torch.cuda.is_available():
        print("bench --sustained: needs a CUDA device")
        return 2
    import bench_impls as bi

    out = Path(args.out)
    print("\n".join(bi.environment()))
    nvml, how = open_nvml(torch.cuda.current_device())
    print(how)
    print(f"sustained: {len(cfg.points)} points x {len(cfg.dirs)} dirs x {len(cfg.impls)} impls "
          f"x {cfg.rounds} rounds, about {planned_s(cfg):.0f} s plus first calls")  # fmt: skip
    tag = nvml.source if nvml else NA
    hw, log = CudaHw(torch), CsvLog(out / CSV_NAME)
    impls = bi.make_impls(cfg.impls)
    try:
        for p in cfg.points:
            grad = any(d != "fwd" for d in cfg.dirs)
            inputs = make_inputs(torch, p, cfg.seed + bu.point_seed(p) + p.kv_heads, grad)
            ref = _reference(bi, torch, p, inputs)
            for d in cfg.dirs:
                print(f"{p.name} ({p.heads}:{p.kv_heads} heads, b{p.batch}) {d}", flush=True)
                cs = contestants_at(bi, torch, impls, p, d, inputs, ref, log, tag)
                run_point(p, d, cs, cfg, hw, nvml, log)
            del inputs, ref
    except KeyboardInterrupt:
        print("interrupted: reporting the rows measured so far")
    finally:
        log.close()
        report(log.rows, cfg.dirs)
        print(f"\n{len(log.rows)} rows in {log.path}")
    return 0
