"""CPU tests of the pure parts of bench/bench.py: FLOPs, the sweep, CSV rows, tables."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BenchStubImpl, load_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench.py"


bu = load_script(BENCH.parent / "bench_util.py", "bench_util")  # before bench.py, which imports it
bench = load_script(BENCH, "bench_main")


def test_flops_hand_computed():
    # fwd: 4·b·h·s_q·s_k·d = 4·1·1·2·2·3 = 48; causal halves; bwd 2.5×; fwd+bwd 3.5×.
    assert bu.flops("fwd", 1, 1, 2, 2, 3, False) == 48
    assert bu.flops("fwd", 1, 1, 2, 2, 3, True) == 24
    assert bu.flops("bwd", 1, 1, 2, 2, 3, False) == 120
    assert bu.flops("bwd", 1, 1, 2, 2, 3, True) == 60
    assert bu.flops("fwd+bwd", 1, 1, 2, 2, 3, False) == 168
    assert bu.flops("fwd", 2, 3, 5, 7, 11, False) == 4 * 2 * 3 * 5 * 7 * 11
    with pytest.raises(ValueError):
        bu.flops("backward", 1, 1, 1, 1, 1, False)


def test_flops_of_a_sweep_point_and_tflops():
    p = bu.make_point(128, False, 16384)  # b=1, h=16: 4·16·2^28·128 = 2^41
    assert (p.batch, p.heads) == (1, 16)
    assert bu.point_flops("fwd", p) == 2**41
    assert bu.point_flops("bwd", bu.make_point(128, True, 16384)) == 2.5 * 2**40
    assert bu.tflops("fwd", p, 1.0) == pytest.approx(2**41 / 1e9)  # 2199.0 TFLOP/s in 1 ms


def test_sweep_covers_design_6():
    pts = bu.sweep()
    assert len(pts) == 6 * 3 * 2
    assert {p.seqlen for p in pts} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {p.hdim for p in pts} == {64, 128, 256}
    assert {p.causal for p in pts} == {False, True}
    for p in pts:
        assert p.batch * p.seqlen == 16384
        assert p.heads * p.hdim == 2048
    assert len({p.key for p in pts}) == len(pts)
    with pytest.raises(ValueError):
        bu.make_point(100, False, 1024)
    # The kernels' other head dims run with the nearest hidden size below 2048.
    assert (bu.make_point(96, True, 1024).heads, bu.make_point(192, False, 512).heads) == (21, 10)
    with pytest.raises(ValueError):
        bu.make_point(128, False, 3000)


def test_cli_filters_and_quick():
    pts, dirs, impls = bench.config_from(bench.parse_args(["--quick"]))
    assert sorted({p.seqlen for p in pts}) == [1024, 16384]
    assert {p.hdim for p in pts} == {64, 128, 256} and len(pts) == 12
    assert dirs == ("fwd", "bwd", "fwd+bwd") and "fa4" in impls
    args = bench.parse_args(
        "--dirs bwd --hdims 64 --seqlens 2k,512 --causal yes --impls fa4,sdpa-cudnn".split()
    )
    pts, dirs, impls = bench.config_from(args)
    assert [(p.hdim, p.causal, p.seqlen) for p in pts] == [(64, True, 2048), (64, True, 512)]
    assert dirs == ("bwd",) and impls == ("fa4", "sdpa-cudnn")
    with pytest.raises(ValueError):
        bench.config_from(bench.parse_args(["--impls", "xformers"]))
    assert bu.parse_ints("1k,16K, 512", ()) == (1024, 16384, 512)


def test_csv_rows_written_and_read_back(tmp_path):
    p = bu.make_point(64, True, 1024)
    log = bu.CsvLog(tmp_path / "out" / "results.csv")
    log.write(bu.make_row("sdpa-flash", "fwd", p, ms=0.5, peak_extra_mib=12.0, max_abs_diff=0.0))
    log.write(bu.make_row("fa4", "fwd", p, status="skipped: no kernel"))
    # rows are on disk before close (a run killed at its time limit keeps them)
    assert len((tmp_path / "out" / "results.csv").read_text().splitlines()) == 3
    log.close()
    rows = bu.read_csv(tmp_path / "out" / "results.csv")
    assert list(rows[0]) == bu.CSV_FIELDS
    r = rows[0]
    assert (r["impl"], r["direction"], r["hdim"], r["causal"]) == ("sdpa-flash", "fwd", "64", "1")
    assert (r["seqlen"], r["batch"], r["heads"], r["status"]) == ("1024", "16", "32", "ok")
    # 4·16·32·1024²·64 / 2 = 2^36 FLOPs in 0.5 ms = 137.4 TFLOP/s
    assert float(r["tflops"]) == pytest.approx(2**36 / 0.5e-3 / 1e12, abs=0.05)
    assert rows[1]["ms"] == rows[1]["tflops"] == rows[1]["peak_extra_mib"] == ""
    assert rows[0]["sm_mhz"] == rows[0]["clock_reasons"] == "", "no clocks given: blank"
    assert rows[0]["host_us"] == "", "no host time given: blank"
    timed = bu.make_row("fa4", "bwd", p, ms=0.4, host_us=123.456, sm_mhz="1980/1965")
    assert (timed["host_us"], timed["sm_mhz"]) == ("123.5", "1980/1965")


def test_source_digest_follows_content(tmp_path):
    for rel in ("csrc/a.cu", "csrc/sub/b.cuh", "fa4/x.py", "setup.py", "docs/perf.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    first = bu.source_digest(tmp_path)
    assert len(first) == 16 and first == bu.source_digest(tmp_path)
    (tmp_path / "docs/perf.md").write_text("docs do not decide what runs")
    (tmp_path / "fa4/_build_config.py").write_text("CONFIG = {}")
    assert bu.source_digest(tmp_path) == first
    (tmp_path / "csrc/sub/b.cuh").write_text("changed")
    assert bu.source_digest(tmp_path) != first


def test_rotated_impl_order():
    names = ["fa4", "sdpa-cudnn", "flash-attn-4"]
    assert bu.rotated(names, 0) == names
    assert bu.rotated(names, 1) == ["sdpa-cudnn", "flash-attn-4", "fa4"]
    assert bu.rotated(names, 5) == ["flash-attn-4", "fa4", "sdpa-cudnn"]
    assert [bu.rotated(names, i)[0] for i in range(6)] == names + names
    assert bu.rotated([], 3) == []


def test_ratio_table_uses_best_ok_peer():
    p = bu.make_point(128, False, 16384)
    ms_for = lambda tf: bu.point_flops("fwd", p) / (tf * 1e12) * 1e3  # noqa: E731
    rows = [
        bu.make_row("fa4", "fwd", p, ms=ms_for(660)),
        bu.make_row("sdpa-flash", "fwd", p, ms=ms_for(350)),
        bu.make_row("sdpa-cudnn", "fwd", p, ms=ms_for(600)),
        bu.make_row("flash-attn-4", "fwd", p, ms=ms_for(700), status="failed: max_abs_diff 1"),
    ]
    rows = [{k: str(v) for k, v in r.items()} for r in rows]  # as read back from the CSV
    line = bu.ratio_table(rows, "fwd").splitlines()[-1]
    assert "600 (sdpa-cudnn)" in line and "| 1.10 |" in line and "failed" in line
    rows[0]["status"], rows[0]["tflops"] = "skipped: no sm90 fwd kernel", ""
    assert bu.ratio_table(rows, "fwd").splitlines()[-1].endswith("| n/a |")


def test_sweep_gaps_name_what_a_run_left_out():
    def row(p, impl="fa4", status="ok"):
        return {k: str(v) for k, v in bu.make_row(impl, "fwd", p, ms=1.0, status=status).items()}

    pts = [p for p in bu.sweep() if p.seqlen != 8192]
    rows = [row(p) for p in pts]
    assert bu.sweep_gaps(rows, "fwd") == (
        "fwd: standard-sweep points without an ok fa4 row: 8k (every hd, causal and not)"
    )
    rows += [row(p) for p in bu.sweep() if p.seqlen == 8192]
    assert bu.sweep_gaps(rows, "fwd") == ""
    rows[0]["status"], rows[0]["tflops"] = "failed: max_abs_diff 1", ""  # a failed row is a gap
    p0 = pts[0]
    want = f"hd{p0.hdim} {'causal ' if p0.causal else ''}{bu._k(p0.seqlen)}"
    assert bu.sweep_gaps(rows, "fwd").endswith(": " + want)
    assert "every hd" in bu.sweep_gaps([row(pts[0], impl="sdpa-cudnn")], "fwd")  # peers don't count
    assert bu.sweep_gaps(rows, "bwd").count("every hd") == len(bu.SEQLENS)


def test_import_needs_no_triton_or_cuda():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # any `import triton` would now fail
        f"import importlib.util as u; s = u.spec_from_file_location('b', {str(BENCH)!r})\n"
        "m = u.module_from_spec(s); s.loader.exec_module(m)\n"
        "assert 'bench_impls' not in sys.modules\n"
        "import torch; assert not torch.cuda.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_guard_and_seeds():
    assert bu.agrees(0.0, 0.5) and bu.agrees(0.02, 0.5) and not bu.agrees(0.021, 0.5)
    assert bu.agrees(0.0312, 4.0) and not bu.agrees(0.09, 4.0)  # 2 bf16 ulps at |g| ~ 3
    assert not bu.agrees(float("nan"), 1.0)
    pts = bu.sweep()
    assert len({bu.point_seed(p) for p in pts}) == len(pts)  # one seed per point, filter-free


def _load_sweep():
    return load_script(BENCH.parent / "env_sweep.py", "env_sweep")


def test_env_sweep_variants_and_rounds():
    es = _load_sweep()
    assert es.parse_variant("-") == {}
    assert es.parse_variant("FA4_TILE_ORDER=first,wave") == {"FA4_TILE_ORDER": "first,wave"}
    assert es.parse_variant("A=1+B_2=") == {"A": "1", "B_2": ""}
    for bad in ("A", "=1", "A=1+", "A-B=1"):
        with pytest.raises(ValueError):
            es.parse_variant(bad)
    assert [es.rotated(3, r) for r in range(3)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]


def test_env_sweep_table_means_and_ratios():
    es = _load_sweep()

    def row(impl, variant, tflops, status="ok", seqlen=512):
        point = {"direction": "fwd", "hdim": "128", "causal": "1", "seqlen": str(seqlen)}
        return {"impl": impl, "variant": variant, **point, "tflops": str(tflops), "status": status}

    rows = [
        row("fa4", "-", 280.0), row("fa4", "-", 290.0), row("fa4", "X=1", 306.0),
        row("fa4", "X=1", 310.0), row("fa4", "X=1", 999.0, status="failed: diff"),
        row("sdpa-cudnn", "-", 318.8), row("fa4", "-", 500.0, seqlen=1024),
    ]  # fmt: skip
    lines = es.table(rows, ["-", "X=1"]).splitlines()
    assert lines[0] == "| dir | hd | causal | seqlen | - | X=1 | sdpa-cudnn |"
    assert lines[2] == "| fwd | 128 | 1 | 512 | 285.0 | 308.0 (1.081) | 318.8 |"
    assert lines[3] == "| fwd | 128 | 1 | 1024 | 500.0 |  |  |"
    rows += [row("fa4-det", "-", 200.0), row("fa4-det", "X=1", 210.0)]
    lines = es.table(rows, ["-", "X=1"], ["fa4", "fa4-det"]).splitlines()
    assert lines[0] == (
        "| dir | hd | causal | seqlen | - | X=1 | - [fa4-det] | X=1 [fa4-det] | sdpa-cudnn |"
    )
    assert lines[2] == (
        "| fwd | 128 | 1 | 512 | 285.0 | 308.0 (1.081) | 200.0 | 210.0 (1.050) | 318.8 |"
    )


FAKE_BENCH = """
import argparse, csv, os, sys
ap = argparse.ArgumentParser()
ap.add_argument("--impls")
ap.add_argument("--out")
ap.add_argument("--dirs")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
with open(os.path.join(a.out, "results.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, ["impl", "direction", "hdim", "causal", "seqlen", "tflops", "status"])
    w.writeheader()
    for impl in a.impls.split(","):
        w.writerow({"impl": impl, "direction": a.dirs, "hdim": 128, "causal": 1, "seqlen": 512,
                    "tflops": os.environ.get("X", "100"), "status": "ok"})
sys.exit(int(os.environ.get("FAIL", "0")))
"""


def test_env_sweep_end_to_end_with_a_stand_in_bench(tmp_path, monkeypatch):
    """main() runs every variant in every round under its environment, the peers once, and
    keeps a failed run's rows: a stand-in for bench.py writes the value of X as TFLOP/s."""
    es = _load_sweep()
    fake = tmp_path / "fake_bench.py"
    fake.write_text(FAKE_BENCH)
    monkeypatch.setattr(es, "BENCH", fake)
    out = tmp_path / "sweep"
    variants = ["-", "X=150", "X=120+FAIL=1"]
    assert (
        es.main(
            ["--out", str(out), "--rounds", "2", "--variants", *variants, "--", "--dirs", "fwd"]
        )
        == 0
    )
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert len(rows) == 2 * 3 + 1
    assert sorted((r["variant"], r["round"]) for r in rows if r["impl"] == "fa4") == sorted(
        (v, str(r)) for v in variants for r in range(2)
    )
    table = (out / "table.md").read_text().splitlines()
    assert table[0] == "| dir | hd | causal | seqlen | - | X=150 | X=120+FAIL=1 | sdpa-cudnn |"
    assert table[2] == "| fwd | 128 | 1 | 512 | 100.0 | 150.0 (1.500) | 120.0 (1.200) | 100.0 |"


def test_rounds_report_the_median_in_rotated_order(tmp_path, monkeypatch, capsys):
    """--rounds 3 with --rotate-impls, through main() with stand-ins for the GPU parts: each timed
    row's ms is the median of its three rounds (listed in ms_rounds), memory and host time come
    from the first round, the clocks of every round are kept (reasons joined), and round r at
    point i starts with implementation i + r, so none is always timed first."""
    import types

    import torch

    names = ["fa4", "sdpa-cudnn", "flash-attn-4"]
    # each impl's readings in the order it is timed, three per point
    script = {"fa4": [5.0, 1.0, 3.0] * 2, "sdpa-cudnn": [2.0, 2.5, 9.0] * 2}
    script["flash-attn-4"] = [4.0] * 6
    calls, timed = [], []  # every fwd call's impl; the impl of every time_ms

    def time_ms(fn, **kw):
        fn()
        timed.append(calls[-1])
        return script[calls[-1]][sum(n == calls[-1] for n in timed) - 1]

    clocks = iter([("1980/1900", "0x4"), ("1800/1700", "0x1")] * 100)

    def clocked(fn):
        res = fn()
        mhz, why = next(clocks)
        return res, mhz, why

    fake = types.SimpleNamespace(
        environment=lambda: [],
        make_impls=lambda ns: [BenchStubImpl(n, calls) for n in ns],
        make_inputs=lambda b, s, h, d, seed, grad, heads_kv=None: tuple(
            torch.zeros(2, 3) for _ in range(4)
        ),
        max_abs_diff=lambda impl, got, ref: (0.0, 1.0),
        peak_extra_mib=lambda fn: (fn(), 10.0)[1],
        host_us=lambda fn: (fn(), 7.0)[1],
        time_ms=time_ms,
        clocked=clocked,
        set_flush=lambda mode: None,
    )
    monkeypatch.setitem(sys.modules, "bench_impls", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "stand-in")
    args = "--dirs fwd --hdims 64 --seqlens 512,1k --causal no --rotate-impls --rounds 3"
    out = tmp_path / "out"
    assert bench.main([*args.split(), "--impls", ",".join(names), "--out", str(out)]) == 0
    first = ["fa4", "sdpa-cudnn", "flash-attn-4"]
    second = ["sdpa-cudnn", "flash-attn-4", "fa4"]
    third = ["flash-attn-4", "fa4", "sdpa-cudnn"]
    assert timed[:9] == first + second + third, "point 0: rounds 0, 1, 2"
    assert timed[9:] == second + third + first, "point 1: rounds 1, 2, 3 of the rotation"
    rows = {(r["impl"], r["seqlen"]): r for r in bu.read_csv(out / "results.csv")}
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows.values())
    fa4, cudnn = rows[("fa4", "512")], rows[("sdpa-cudnn", "512")]
    assert (fa4["ms"], fa4["ms_rounds"]) == ("3.0000", "5.0000 1.0000 3.0000")
    assert (cudnn["ms"], cudnn["ms_rounds"]) == ("2.5000", "2.0000 2.5000 9.0000")
    assert (fa4["peak_extra_mib"], fa4["host_us"]) == ("10.0", "7.0")
    assert len(fa4["sm_mhz"].split()) == 3 and fa4["clock_reasons"] == "0x5"
    assert "| 64 | no | 512 |" in capsys.readouterr().out, "the ratio table is printed"
