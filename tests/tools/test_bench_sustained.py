"""CPU tests of bench.py --sustained (bench/bench_sustained.py) with stand-ins: fake
implementations on a virtual clock in place of CUDA events, and a fake NVML. They check the
rotation, the TFLOP/s and J/PFLOP arithmetic, the medians, the CSV, n/a without NVML, the
arguments, and the model-shaped points' FLOPs."""

import contextlib
import sys
import time
import types
from pathlib import Path

import pytest
from helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench.py"
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))

bu = load_script(BENCH.parent / "bench_util.py", "bench_util")
bs = load_script(BENCH.parent / "bench_sustained.py", "bench_sustained")
bench = load_script(BENCH, "bench_main")

LLAMA = bu.model_points("llama3-8b-8k")[0]
DT = 1 / 64  # a binary fraction: the virtual clock adds it without rounding


class FakeSampler:
    def __init__(self, clocks, powers):
        self.clocks, self.powers = clocks, powers

    def start(self):
        pass

    def stop(self):
        return list(self.clocks), list(self.powers)


class FakeHw:
    """The timing layer on a virtual clock: an event is the clock's time, sleep advances it."""

    def __init__(self, clocks=(1800, 1700, 1750), powers=(690.0,)):
        self.t = 0.0
        self.syncs = 0
        self.clocks, self.powers = clocks, powers

    def now(self):
        return self.t

    def sleep(self, s):
        self.t += s

    def sync(self):
        self.syncs += 1

    def event(self):
        return self.t

    def elapsed_s(self, a, b):
        return b - a

    def sampler(self, nvml):
        return FakeSampler(self.clocks if nvml else (), self.powers if nvml else ())


def fake_nvml(hw, watts=700.0, energy=True):
    """A board drawing `watts`: its energy counter (mJ) follows the virtual clock."""

    def energy_mj():
        if not energy:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 5e6 + watts * 1e3 * hw.t

    return bs.Nvml("fake", lambda: 1755, lambda: watts, energy_mj)


def cfg(rounds=1, seconds=10.0, warmup_s=1.0, cooldown_s=2.0):
    return bs.Config(seconds, warmup_s, cooldown_s, rounds, (LLAMA,), ("fwd+bwd",), ())


def contestant(name, hw, order, dt=DT):
    """A fake implementation: each step advances the clock by dt and notes in `order` the first
    step of each of its windows."""

    def step():
        if order[-1:] != [name]:
            order.append(name)
        hw.t += dt

    return bs.Contestant(name, step)


def test_rotation_order_round_r_starts_at_impl_r(tmp_path):
    hw, order = FakeHw(), []
    cs = [contestant(n, hw, order) for n in ("fa4", "flash-attn-4", "sdpa-cudnn")]
    log = bs.CsvLog(tmp_path / bs.CSV_NAME)
    bs.run_point(LLAMA, "fwd+bwd", cs, cfg(rounds=3, seconds=0.5, warmup_s=0.1), hw, None, log)
    assert order == ["fa4", "flash-attn-4", "sdpa-cudnn",
                     "flash-attn-4", "sdpa-cudnn", "fa4",
                     "sdpa-cudnn", "fa4", "flash-attn-4"]  # fmt: skip
    # one sync after each warm-up and one at each window's end: never one per iteration
    assert hw.syncs == 2 * 9
    # a cool-down of 2 s after each of the 9 windows: 9 x (0.1 + 0.5 + 2) s of virtual time
    assert hw.t == pytest.approx(9 * 2.6, abs=9 * 2 * DT)


def test_window_tflops_and_energy_arithmetic():
    hw = FakeHw()
    nv = fake_nvml(hw, watts=700.0)
    w = bs.run_window(lambda: setattr(hw, "t", hw.t + DT), 10.0, 1.0, hw, nv)
    assert w.iters == 640 and w.gpu_s == 10.0 and w.wall_s == 10.0  # 10 s / (1/64 s)
    assert w.energy_j == pytest.approx(7000.0)  # 700 W x 10 s, from the counter's difference
    r = bs.reading(w, bu.point_flops("fwd+bwd", LLAMA))
    # llama3-8b 8k causal fwd+bwd: 3.5 x 2^39 FLOPs = 1.924e12; 640 of them in 10 s
    assert r.tflops == pytest.approx(640 * 3.5 * 2**39 / 10 / 1e12)
    assert r.tflops == pytest.approx(123.145, abs=1e-3)
    # 7000 J over 640 x 1.924e12 = 1.2315 PFLOP: 5684.3 J/PFLOP
    assert r.j_per_pflop == pytest.approx(7000 / (640 * 3.5 * 2**39 / 1e15))
    assert r.j_per_pflop == pytest.approx(5684.3, abs=0.1)
    assert r.power_w == pytest.approx(700.0)  # the counter's, not the samples' 690
    assert (r.sm_mean, r.sm_min) == (1750.0, 1700.0)


def test_medians_and_spread_over_rounds(tmp_path):
    rs = [bs.Reading(1, 1.0, tf, 1700 + tf, tf, None, 2 * tf) for tf in (100.0, 130.0, 120.0)]
    med, spread = bs.combine(rs)
    assert (med.tflops, med.sm_mean, med.sm_min, med.j_per_pflop) == (120.0, 1820.0, 120.0, 240)
    assert med.power_w is None and spread == pytest.approx(25.0)  # (130 - 100) / 120
    # through run_point: three rounds at 1/64, 1/32 and 1/128 s an iteration
    hw = FakeHw()
    c = bs.Contestant("fa4", _per_round(hw, [DT, 2 * DT, DT / 2]))
    log = bs.CsvLog(tmp_path / bs.CSV_NAME)
    meds = bs.run_point(LLAMA, "fwd", [c], cfg(rounds=3), hw, fake_nvml(hw), log)
    one = bu.point_flops("fwd", LLAMA) / 1e12
    tfs = sorted(float(r["tflops"]) for r in log.rows if r["round"] != "median")
    assert tfs == pytest.approx([32 * one, 64 * one, 128 * one], abs=0.06)  # iterations / s
    assert float(meds[0]["tflops"]) == pytest.approx(64 * one, abs=0.06)
    assert float(meds[0]["tflops_spread_pct"]) == pytest.approx(150.0, abs=0.3)  # 96 / 64
    assert meds[0]["iters"] == 640 + 320 + 1280 and meds[0]["round"] == "median"


def _per_round(hw, dts):
    """A step whose iteration time changes with each window (a window = its warm-up's sync)."""
    start = hw.syncs

    def step():
        hw.t += dts[min((hw.syncs - start) // 2, len(dts) - 1)]

    return step


def test_csv_columns_rows_flushed_as_measured(tmp_path):
    hw, order = FakeHw(), []
    log = bs.CsvLog(tmp_path / "o" / bs.CSV_NAME)
    c = contestant("fa4", hw, order)
    seen = []
    real_sleep = hw.sleep

    def sleep(s):  # the cool-down after the first window: its row is on disk by then
        seen.append(len((tmp_path / "o" / bs.CSV_NAME).read_text().splitlines()))
        real_sleep(s)

    hw.sleep = sleep
    bs.run_point(LLAMA, "fwd+bwd", [c], cfg(rounds=2), hw, fake_nvml(hw), log)
    log.close()
    assert seen[0] == 2  # header + round 0
    rows = bu.read_csv(tmp_path / "o" / bs.CSV_NAME)
    assert list(rows[0]) == bs.CSV_FIELDS
    assert [r["round"] for r in rows] == ["0", "1", "median"]
    r = rows[-1]
    assert (r["point"], r["impl"], r["direction"], r["heads"], r["heads_kv"]) == (
        "llama3-8b-8k", "fa4", "fwd+bwd", "32", "8")  # fmt: skip
    assert (r["hdim"], r["causal"], r["seqlen"], r["batch"]) == ("128", "1", "8192", "1")
    assert (r["sm_mhz_mean"], r["sm_mhz_min"], r["power_w"]) == ("1750", "1700", "700.0")
    assert r["nvml"] == "fake" and r["status"] == "ok"


def test_unavailable_nvml_gives_na_not_zeros(tmp_path):
    def broken(index):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    nv, why = bs.open_nvml(0, openers=(broken, broken))
    assert nv is None and "unavailable" in why and "n/a" in why
    hw, order = FakeHw(), []
    log = bs.CsvLog(tmp_path / bs.CSV_NAME)
    bs.run_point(LLAMA, "fwd", [contestant("fa4", hw, order)], cfg(), hw, nv, log)
    for r in log.rows:
        for col in ("sm_mhz_mean", "sm_mhz_min", "power_w", "j_per_pflop", "nvml"):
            assert r[col] == "n/a", (col, r[col])
        assert float(r["tflops"]) > 0  # the events still time it
    # an NVML without the energy counter: power from the samples, J/PFLOP n/a (never estimated)
    hw = FakeHw()
    w = bs.run_window(lambda: setattr(hw, "t", hw.t + DT), 10.0, 0.0, hw,
                      fake_nvml(hw, energy=False))  # fmt: skip
    r = bs.make_row(LLAMA, "fa4", "fwd", 0, bs.reading(w, 1e12))
    assert (r["power_w"], r["j_per_pflop"]) == ("690.0", "n/a")


def test_real_sampler_thread_reads_every_period():
    calls = []
    nv = bs.Nvml("fake", lambda: calls.append(1) or 1980, lambda: 512.5,
                 lambda: 0)  # fmt: skip
    s = bs.Sampler(nv, period=0.01)
    s.start()
    time.sleep(0.15)
    clocks, powers = s.stop()
    assert 4 <= len(clocks) <= 40 and set(clocks) == {1980.0} and set(powers) == {512.5}
    assert not s._thread.is_alive()
    n = len(calls)
    time.sleep(0.03)
    assert len(calls) == n, "stopped: no more reads"
    assert bs.Sampler(None).stop() == ([], [])


def test_nvml_index_follows_cuda_visible_devices():
    assert bs.nvml_index(0, None) == 0
    assert bs.nvml_index(0, "3") == 3
    assert bs.nvml_index(1, "2,5") == 5
    assert bs.nvml_index(0, "GPU-1234abcd") == 0


def _args(*argv):
    return bench.parse_args(list(argv))


def _config(*argv):
    return bs.config_from(_args(*argv), bench.IMPLS + bench.EXTRA_IMPLS, bench.IMPLS)


def test_arguments_validated():
    with pytest.raises(SystemExit, match=r"--sustained 5: at least 10 s"):
        _config("--sustained", "5")
    c = _config("--sustained", "5", "--allow-short")
    assert c.seconds == 5.0
    c = _config("--sustained")
    assert (c.seconds, c.warmup_s, c.cooldown_s, c.rounds) == (10.0, 3.0, 2.0, 1)
    assert c.dirs == ("fwd+bwd",) and c.impls == bench.IMPLS
    assert [p.label for p in c.points] == [p.label for p in bu.MODEL_POINTS]
    assert _config("--sustained", "12", "--dirs", "fwd").dirs == ("fwd",)
    with pytest.raises(SystemExit, match="bwd"):
        _config("--sustained", "10", "--dirs", "bwd")
    with pytest.raises(SystemExit, match="--cooldown-s -1"):
        _config("--sustained", "10", "--cooldown-s", "-1")
    with pytest.raises(SystemExit, match="--rounds 0"):
        _config("--sustained", "10", "--rounds", "0")
    with pytest.raises(SystemExit, match="unknown model points"):
        _config("--sustained", "10", "--model-points", "llama-70b")
    c = _config("--sustained", "10", "--model-points", "gpt-oss-8k", "--hdims", "128",
                "--seqlens", "16k", "--causal", "yes", "--rounds", "3")  # fmt: skip
    assert [p.name for p in c.points] == ["gpt-oss-8k", "hd128 causal 16k"]
    assert bs.planned_s(c) == 2 * 1 * 4 * 3 * (3 + 10 + 2)
    # bench.py wires the flag: the check runs before any CUDA is asked for
    with pytest.raises(SystemExit, match="at least 10 s"):
        bench.main(["--sustained", "9.5"])


def test_model_points_flops():
    pts = {p.label: p for p in bu.MODEL_POINTS}
    assert set(pts) == {"llama3-8b-8k", "llama3-8b-4x4k", "qwen2.5-7b-8k", "qwen2.5-7b-4x4k",
                        "gpt-oss-8k"}  # fmt: skip
    shapes = {k: (p.heads, p.kv_heads, p.hdim, p.batch, p.seqlen, p.causal)
              for k, p in pts.items()}  # fmt: skip
    assert shapes["llama3-8b-8k"] == (32, 8, 128, 1, 8192, True)
    assert shapes["llama3-8b-4x4k"] == (32, 8, 128, 4, 4096, True)
    assert shapes["qwen2.5-7b-8k"][:3] == (28, 4, 128)
    assert shapes["gpt-oss-8k"] == (64, 8, 64, 1, 8192, True)
    # forward 4·b·h_q·s²·d halved for causal, by hand:
    # llama 8k: 4·1·32·2^26·128 / 2 = 2^39; 4 x 4k: 4·4·32·2^24·128 / 2 = 2^39 as well
    assert bu.point_flops("fwd", pts["llama3-8b-8k"]) == 2**39
    assert bu.point_flops("fwd", pts["llama3-8b-4x4k"]) == 2**39
    assert bu.point_flops("fwd", pts["qwen2.5-7b-8k"]) == 7 * 2**36  # 4·28·2^26·128 / 2
    assert bu.point_flops("fwd", pts["gpt-oss-8k"]) == 2**39  # 4·64·2^26·64 / 2
    assert bu.point_flops("fwd+bwd", pts["qwen2.5-7b-4x4k"]) == 3.5 * 7 * 2**36
    # causal halves: the same shape without the mask is twice the work; kv heads change nothing
    p = pts["llama3-8b-8k"]
    assert bu.flops("fwd", 1, 32, 8192, 8192, 128, False) == 2 * bu.point_flops("fwd", p)
    assert bu.point_flops("fwd", bu.Point(128, True, 8192, 1, 32)) == bu.point_flops("fwd", p)


def test_summary_table_ratios_and_energy(tmp_path):
    def med(impl, tf, j):
        r = bs.Reading(10, 10.0, tf, 1700.0, 1650.0, 690.0, j)
        return bs.make_row(LLAMA, impl, "fwd+bwd", "median", r, 2.0, "fake")

    rows = [med("fa4", 600.0, 1100.0), med("flash-attn-4", 500.0, 1300.0),
            med("sdpa-cudnn", 550.0, 1200.0),
            bs.make_row(LLAMA, "sdpa-flash", "fwd+bwd", "", status="error: no GQA")]  # fmt: skip
    table = bs.summary_table(rows, "fwd+bwd")
    line = table.splitlines()[2]
    assert "| llama3-8b-8k | 600.0 ±2.0% | 500.0 ±2.0% | 550.0 ±2.0% | - |" in line
    assert "| 1.200 | 1.091 | 1100.0 | 1300.0 |" in line  # 600/500, 600/550; J/PFLOP
    detail = bs.detail_table(rows, "fwd+bwd")
    assert "| llama3-8b-8k | sdpa-flash |" in detail and "error: no GQA" in detail


def test_contestants_skip_fail_and_error_rows(tmp_path):
    """The GPU side's setup with stand-ins for torch and bench_impls: a skip, a failed check and
    an error each become a row; the rest become contestants."""
    fake_torch = types.SimpleNamespace(
        no_grad=contextlib.nullcontext,
        cuda=types.SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: None),
    )

    class Impl:
        def __init__(self, name, out=0.0, skip=None, boom=False):
            self.name, self.out, self.skip, self.boom = name, out, skip, boom

        def skip_reason(self, d, hdim):
            return self.skip

        def context(self):
            return contextlib.nullcontext()

        def prepare(self, *a):
            return a

        def fwd(self, q, k, v, causal):
            if self.boom:
                raise RuntimeError("No available kernel")
            return self.out

    fake_bi = types.SimpleNamespace(
        max_abs_diff=lambda impl, got, ref: (abs(got[0] - ref[0]), 1.0),
        fwd_bwd=lambda impl, a, causal: None,
    )
    impls = [Impl("fa4"), Impl("flash-attn-4", skip="not importable"),
             Impl("sdpa-flash", out=0.5), Impl("sdpa-cudnn", boom=True)]  # fmt: skip
    log = bs.CsvLog(tmp_path / bs.CSV_NAME)
    cs = bs.contestants_at(fake_bi, fake_torch, impls, LLAMA, "fwd+bwd", (1, 2, 3, 4), 0.0,
                           log, "n/a")  # fmt: skip
    assert [c.name for c in cs] == ["fa4"]
    status = {r["impl"]: r["status"] for r in log.rows}
    assert status["flash-attn-4"] == "skipped: not importable"
    assert status["sdpa-flash"].startswith("failed: forward max_abs_diff 0.5")
    assert status["sdpa-cudnn"] == "error: RuntimeError: No available kernel"
    assert all(r["tflops"] == "" for r in log.rows)
