"""CPU tests of bench/bench.py's FP8 rows: --dtype e4m3 (arguments, impl selection, the derived
columns, the FP8 GEMM ceiling's formula, the CSV and fp8_meta.json through main() with stand-ins
for the GPU parts) and the decode sweep's fa4-fp8cache (the byte count, tokens/s over the bf16
cache, the e4m3 cache, pools and reference, the worker with stand-ins)."""

import contextlib
import csv
import json
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench.py"
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))

bu = load_script(BENCH.parent / "bench_util.py", "bench_util")
bd = load_script(BENCH.parent / "bench_decode.py", "bench_decode")
bench = load_script(BENCH, "bench_main")
run = load_script(BENCH.parent / "bench_decode_run.py", "bench_decode_run")
bi = load_script(BENCH.parent / "bench_impls.py", "bench_impls")

NOT_EXPOSED = f"cuDNN FP8 SDPA: not exposed by torch {torch.__version__} (stand-in)"


# ---- the FP8 forward: arguments and rows --------------------------------------------------------


def test_dtype_argument_and_impl_selection():
    args = bench.parse_args("--dirs fwd --dtype e4m3 --hdims 128,256 --seqlens 16k".split())
    pts, dirs, impls = bench.config_from(args)
    assert args.dtype == "e4m3" and dirs == ("fwd",)
    got = [(p.hdim, p.causal, p.seqlen) for p in pts]
    assert got == [(hd, c, 16384) for hd in (128, 256) for c in (False, True)]
    assert impls == bu.FP8_IMPLS == ("fa4", "fa4-bf16", "sdpa-cudnn-fp8")
    _, dirs, impls = bench.config_from(
        bench.parse_args(["--dtype", "e4m3", "--impls", "fa4,fa4-bf16", "--seqlens", "1k"])
    )
    assert dirs == ("fwd",), "the FP8 mode defaults to the forward"
    assert impls == ("fa4", "fa4-bf16")
    assert bench.parse_args([]).dtype == "bf16"
    assert bench.config_from(bench.parse_args(["--quick"]))[2] == bench.IMPLS, "bf16 unchanged"
    for bad in (["--dirs", "bwd"], ["--dirs", "fwd,fwd+bwd"], ["--impls", "sdpa-flash"],
                ["--impls", "fa4-det"]):  # fmt: skip
        with pytest.raises(ValueError):
            bench.config_from(bench.parse_args(["--dtype", "e4m3", *bad]))
    with pytest.raises(ValueError):  # the FP8 names are not bf16 impls
        bench.config_from(bench.parse_args(["--impls", "fa4-bf16"]))
    with pytest.raises(SystemExit):
        bench.parse_args(["--dtype", "fp16"])


def test_dtype_e4m3_is_refused_by_decode_and_sustained(capsys):
    assert bench.main(["--dtype", "e4m3", "--decode"]) == 2
    assert bench.main(["--dtype", "e4m3", "--sustained", "10"]) == 2
    assert "fa4-fp8cache" in capsys.readouterr().out


def test_fp8_gemm_ceiling_formula():
    # 2·8192³ FLOPs: 1.0995e12; in 1 ms that is 1099.5 TFLOP/s
    assert bu.CEILING_MNK == (8192, 8192, 8192)
    assert bu.gemm_tflops(1.0) == pytest.approx(2 * 8192**3 / 1e-3 / 1e12)
    assert bu.gemm_tflops(1.0) == pytest.approx(1099.51, abs=0.01)
    assert bu.gemm_tflops(2.0) == pytest.approx(bu.gemm_tflops(1.0) / 2)
    assert bu.gemm_tflops(0.5, 2, 3, 4) == pytest.approx(48 / 0.5e-3 / 1e12)


def test_fp8_guard_adds_the_p_rounding_bound():
    """The e4m3 rows' check: the bf16 guard + (2^-4 + n·2^-10/256)·max|v| (docs/numerics.md
    "FP8"); the bf16 guard alone would fail a correct FP8 forward at a causal point."""
    assert bu.fp8_bound(0.5, 4.0, 0) == pytest.approx(0.02 + 0.25)
    assert bu.fp8_bound(3.7, 4.0, 16384) == pytest.approx(0.074 + (2**-4 + 2**-4) * 4.0)
    assert bu.agrees_fp8(0.07, 3.7, 4.5, 1024) and not bu.agrees(0.08, 3.7)
    assert not bu.agrees_fp8(0.6, 3.7, 4.5, 1024) and not bu.agrees_fp8(float("nan"), 1, 1, 1)


def test_fp8_guard_holds_for_the_e4m3_p_baseline():
    """On the CPU, the e4m3-P baseline (reference_fp8 emulate_p: the kernel's rounding of P) is
    within the FP8 guard of the fp32 reference at a causal point where the bf16 guard is tight."""
    from fa4.reference_fp8 import attention_fp8_ref

    _, (q8, k8, v8, sc) = _fp8_inputs(b=1, s=256, h=4, d=64)
    args = (q8, k8, v8, sc.q, sc.k, sc.v)
    ref, _ = attention_fp8_ref(*args, causal=True, out_dtype=torch.float32)
    emu, _ = attention_fp8_ref(*args, causal=True, emulate_p=True, out_dtype=torch.float32)
    diff, ref_max = (emu - ref).abs().max().item(), ref.abs().max().item()
    v_max = bi.fp8_v_max((q8, k8, v8, sc))
    assert v_max == pytest.approx(bi.dequantize(v8, sc.v).float().abs().max().item(), rel=1e-2)
    assert 0 < diff and bu.agrees_fp8(diff, ref_max, v_max, 256)


def _ms_for(p, tf):
    return bu.point_flops("fwd", p) / (tf * 1e12) * 1e3


def test_fp8_columns_ratio_and_ceiling_fraction(tmp_path):
    p = bu.make_point(128, True, 16384)
    # FLOPs as for bf16: 4·b·h·s²·d halved for causal
    assert bu.point_flops("fwd", p) == 4 * 1 * 16 * 16384**2 * 128 / 2
    rows = [
        bu.make_row("fa4", "fwd", p, ms=_ms_for(p, 900), dtype="e4m3"),
        bu.make_row("fa4-bf16", "fwd", p, ms=_ms_for(p, 600)),
        bu.make_row("sdpa-cudnn-fp8", "fwd", p, status="skipped: not exposed", dtype="e4m3"),
    ]
    assert all(r[k] == "" for r in rows for k in bu.FP8_COLUMNS), "blank until filled"
    bu.fill_fp8_columns(rows, 1200.0)
    fa4, bf16, cudnn = rows
    assert (fa4["dtype"], bf16["dtype"]) == ("e4m3", "bf16")
    assert (fa4["ratio_fa4_bf16"], fa4["frac_fp8_ceiling"]) == ("1.500", "0.750")
    assert (bf16["ratio_fa4_bf16"], bf16["frac_fp8_ceiling"]) == ("1.000", "0.500")
    assert cudnn["ratio_fa4_bf16"] == cudnn["frac_fp8_ceiling"] == ""
    assert {r["fp8_gemm_ceiling_tflops"] for r in rows} == {"1200.0"}
    # no fa4-bf16 row (not selected, or failed) and no ceiling: blank, not an error
    alone = bu.fill_fp8_columns([bu.make_row("fa4", "fwd", p, ms=1.0, dtype="e4m3")], None)
    assert all(alone[0][k] == "" for k in bu.FP8_COLUMNS)
    # the CSV: the new columns last, read back as written
    log = bu.CsvLog(tmp_path / "results.csv")
    for r in rows:
        log.write(r)
    log.close()
    back = bu.read_csv(tmp_path / "results.csv")
    assert list(back[0]) == bu.CSV_FIELDS and bu.CSV_FIELDS[-6:-2] == [
        "dtype", "ratio_fa4_bf16", "fp8_gemm_ceiling_tflops", "frac_fp8_ceiling"]  # fmt: skip
    assert back[0]["ratio_fa4_bf16"] == "1.500" and bu.is_fp8_rows(back)
    line = bu.fp8_table(back, "fwd").splitlines()[-1]
    assert line == "| 128 | yes | 16k | 900 | 600 | skipped | 1.500 | 75.0 |"


def test_old_csv_without_the_new_columns_still_reads(tmp_path, capsys):
    """Columns were appended, none renamed: a CSV written before them replots as before."""
    p = bu.make_point(64, False, 1024)
    old = bu.CSV_FIELDS[: bu.CSV_FIELDS.index("dtype")]
    assert old[-1] == "ms_rounds"
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old, extrasaction="ignore")
        w.writeheader()
        w.writerow(bu.make_row("fa4", "fwd", p, ms=1.0))
        w.writerow(bu.make_row("sdpa-cudnn", "fwd", p, ms=2.0))
    rows = bu.read_csv(path)
    assert not bu.is_fp8_rows(rows)
    assert bench.main(["--replot", str(path)]) == 0
    assert "| 64 | no | 1k |" in capsys.readouterr().out


class _Impl:
    jit = False

    def __init__(self, name, tflops=None, reason=None):
        self.name, self.tflops, self.reason = name, tflops, reason
        self.prepared = None

    def skip_reason(self, d, hdim):
        return self.reason

    def context(self):
        return contextlib.nullcontext()

    def prepare(self, *inputs):
        self.prepared = inputs
        return inputs

    def fwd(self, q, k, v, causal):
        return torch.zeros(2, 3)

    def to_bshd(self, x):
        return x


def test_main_fp8_mode_with_stand_ins(tmp_path, monkeypatch, capsys):
    """--dtype e4m3 through main(): the cuDNN line and the ceiling printed once at the start and
    kept in fp8_meta.json, the FP8 inputs made (the reference on their dequantized values),
    every row with its dtype, ratio to fa4-bf16, ceiling and fraction of it; sdpa-cudnn-fp8
    skipped; --replot prints the FP8 table and the two lines from the metadata."""
    p = bu.make_point(128, False, 16384)
    fp8 = {"fa4": 900.0, "fa4-bf16": 600.0}
    seen = {"fp8_inputs": 0, "dequantized": 0, "ceiling_rounds": None}
    current = []

    def make_fp8_impls(names):
        out = []
        for n in names:
            why = "cuDNN FP8 SDPA not exposed by this torch" if n == "sdpa-cudnn-fp8" else None
            out.append(_Impl(n, fp8.get(n), why))
        return out

    class Ref(_Impl):
        def prepare(self, *inputs):
            assert inputs[0] == "dequantized q", "the reference runs on the dequantized values"
            return super().prepare(*inputs)

    def make_fp8_inputs(b, s, h, d, seed, heads_kv=None):
        seen["fp8_inputs"] += 1
        return ("q8", "k8", "v8", "scales")

    def dequantize_inputs(inputs):
        assert inputs == ("q8", "k8", "v8", "scales")
        seen["dequantized"] += 1
        return ("dequantized q", "k", "v", "q")

    def fp8_gemm_ceiling(rounds, warmup_ms, rep_ms):
        seen["ceiling_rounds"] = rounds
        return 1.0, [1.1, 1.0, 0.9][:rounds], "torch._scaled_mm(stand-in)"

    def bf16_gemm_ceiling(rounds, warmup_ms, rep_ms):
        return 1.6, [1.6] * rounds, "torch.matmul(stand-in)"

    def time_ms(fn, **kw):
        fn()
        return _ms_for(p, fp8[current[-1]])

    def clocked(fn):
        return fn(), "", ""

    def fwd_recorder(impl):
        def fwd(q, k, v, causal):
            current.append(impl.name)
            return torch.zeros(2, 3)

        return fwd

    def make_fp8_impls_recorded(names):
        impls = make_fp8_impls(names)
        for i in impls:
            i.fwd = fwd_recorder(i)
        return impls

    fake = types.SimpleNamespace(
        environment=lambda: [],
        make_impls=lambda ns: [Ref(n) for n in ns],
        make_fp8_impls=make_fp8_impls_recorded,
        make_fp8_inputs=make_fp8_inputs,
        dequantize_inputs=dequantize_inputs,
        cudnn_fp8_sdpa=lambda: (None, NOT_EXPOSED),
        fp8_v_max=lambda inputs: 4.0,
        CUDNN_FP8_API="stand-in",
        fp8_gemm_ceiling=fp8_gemm_ceiling,
        bf16_gemm_ceiling=bf16_gemm_ceiling,
        max_abs_diff=lambda impl, got, ref: (1e-3, 1.0),
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
    out = tmp_path / "out"
    argv = "--dirs fwd --dtype e4m3 --hdims 128 --seqlens 16k --causal no --rounds 3"
    assert bench.main([*argv.split(), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count(NOT_EXPOSED) == 1, "the cuDNN line once"
    assert text.count("fp8 GEMM ceiling 1099.5 TFLOP/s") == 1, "the ceiling once"
    assert seen == {"fp8_inputs": 1, "dequantized": 1, "ceiling_rounds": 3}
    rows = {r["impl"]: r for r in bu.read_csv(out / "results.csv")}
    assert list(rows) == ["sdpa-cudnn-fp8", "fa4", "fa4-bf16"]  # skipped rows come first
    fa4, bf16, cudnn = rows["fa4"], rows["fa4-bf16"], rows["sdpa-cudnn-fp8"]
    assert (fa4["status"], fa4["dtype"], fa4["tflops"]) == ("ok", "e4m3", "900.0")
    assert (bf16["dtype"], bf16["tflops"], bf16["ratio_fa4_bf16"]) == ("bf16", "600.0", "1.000")
    assert fa4["ratio_fa4_bf16"] == "1.500"
    assert fa4["fp8_gemm_ceiling_tflops"] == "1099.5"
    assert fa4["frac_fp8_ceiling"] == f"{900 / bu.gemm_tflops(1.0):.3f}" == "0.819"
    assert cudnn["status"].startswith("skipped: cuDNN FP8 SDPA not exposed")
    assert (cudnn["dtype"], cudnn["fp8_gemm_ceiling_tflops"]) == ("e4m3", "1099.5")
    assert len(fa4["ms_rounds"].split()) == 3
    meta = json.loads((out / "fp8_meta.json").read_text())
    assert meta["cudnn_fp8_sdpa"] == NOT_EXPOSED and meta["dtype"] == "e4m3"
    assert meta["fp8_gemm_ceiling_tflops"] == pytest.approx(bu.gemm_tflops(1.0))
    assert meta["fp8_gemm_ceiling_ms_rounds"] == [1.1, 1.0, 0.9]
    assert meta["fp8_gemm_ceiling_mnk"] == [8192, 8192, 8192]
    assert meta["bf16_gemm_ceiling_tflops"] == pytest.approx(bu.gemm_tflops(1.6))
    assert text.count("bf16 GEMM ceiling 687.2 TFLOP/s") == 1
    assert text.count("fp8 / bf16 GEMM ceilings 1.600") == 1
    assert "| 128 | no | 16k | skipped | 900 | 600 | 1.500 | 81.9 |" in text
    assert bench.main(["--replot", str(out / "results.csv")]) == 0
    text = capsys.readouterr().out
    assert "| 128 | no | 16k | skipped | 900 | 600 | 1.500 | 81.9 |" in text
    assert NOT_EXPOSED in text and "fp8 GEMM ceiling 1099.5 TFLOP/s" in text


def test_main_fp8_mode_survives_a_failed_ceiling(tmp_path, monkeypatch, capsys):
    def ceiling(*a):
        raise RuntimeError("_scaled_mm: not supported on this device")

    st = bench.State(bench.parse_args(["--dtype", "e4m3", "--out", str(tmp_path)]), tmp_path)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    fake = types.SimpleNamespace(cudnn_fp8_sdpa=lambda: (None, NOT_EXPOSED),
                                 fp8_gemm_ceiling=ceiling, CUDNN_FP8_API="x")  # fmt: skip
    meta = bench.fp8_setup(fake, torch, st.args, st)
    st.csv.close()
    assert st.ceiling is None and meta["fp8_gemm_ceiling_tflops"] is None
    assert "fp8 GEMM ceiling: failed: RuntimeError" in capsys.readouterr().out
    assert bench.fp8_notes(bench.read_fp8_meta(tmp_path / "results.csv"))[0].startswith(
        "fp8 GEMM ceiling: failed"
    )


# ---- the FP8 forward's implementations (bench_impls.py) on CPU tensors -------------------------


def _fp8_inputs(b=2, s=16, h=4, d=16):
    from fa4.reference_fp8 import quantize

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(b, s, h, d, generator=g).bfloat16() for _ in range(3)]
    qs = [quantize(x, h) for x in xs]
    return xs, (qs[0][0], qs[1][0], qs[2][0], bi.Fp8Scales(qs[0][1], qs[1][1], qs[2][1]))


def test_dequantized_inputs_are_the_true_values():
    xs, inputs = _fp8_inputs()
    deq = bi.dequantize_inputs(inputs)
    assert len(deq) == 4 and all(t.dtype == torch.bfloat16 for t in deq)
    for x, y in zip(xs, deq[:3], strict=True):
        # e4m3 keeps 3 mantissa bits: within 2^-4 relative of the largest entry
        assert (x.float() - y.float()).abs().max() <= 2**-4 * x.abs().max()
    assert torch.equal(deq[3], deq[0])


def test_fa4_fp8_impl_passes_the_descales(monkeypatch):
    seen = {}

    def attention(q, k, v, **kw):
        seen.update(kw, q=q)
        return torch.zeros(1)

    fake = types.SimpleNamespace(attention=attention)
    impl = bi.Fa4Fp8()
    impl._fa4 = fake
    _, inputs = _fp8_inputs()
    a = impl.prepare(*inputs)
    assert a[:3] == inputs[:3] and a[3] is None, "the e4m3 tensors as they are, no dout"
    impl.fwd(*a[:3], True)
    sc = inputs[3]
    assert seen["q"] is inputs[0] and seen["q_descale"] is sc.q
    assert seen["k_descale"] is sc.k and seen["v_descale"] is sc.v
    assert (seen["causal"], seen["backend"]) == (True, "sm90")
    base = bi.Fa4Bf16().prepare(*inputs)
    assert base[0].dtype == torch.bfloat16 and torch.equal(base[1], bi.dequantize_inputs(inputs)[1])
    impl.reason = None
    assert impl.skip_reason("bwd", 128) == "the FP8 forward is forward only"
    assert [type(i).__name__ for i in bi.make_fp8_impls(["fa4", "fa4-bf16"])] == [
        "Fa4Fp8", "Fa4Bf16"]  # fmt: skip


def test_cudnn_fp8_probe_says_not_exposed_here():
    """This torch (CPU, or 2.11-2.13 on the device) has no cuDNN FP8 SDPA: the probe's line."""
    call, why = bi.cudnn_fp8_sdpa()
    assert call is None
    assert why.startswith(f"cuDNN FP8 SDPA: not exposed by torch {torch.__version__} (")
    assert bi.SdpaCudnnFp8().skip_reason("fwd", 128).startswith("cuDNN FP8 SDPA not exposed")


# ---- the decode sweep's FP8 cache -------------------------------------------------------------


def test_fp8_cache_byte_count_and_gbps():
    c = bd.Case("decode", 16, 8192, 1, 8, 128)
    assert bd.kv_bytes(16, 8192, 8, 128, elem_bytes=1) == 16 * 8192 * 8 * 256 == 2**28
    assert bd.impl_kv_bytes("fa4", c) == c.kv_bytes == 2**29
    assert bd.impl_kv_bytes("fa4-fp8cache", c) == 2**28, "1 byte per element read"
    ms = 2**28 / 3e12 * 1e3  # 2^28 bytes at 3000 GB/s
    r8 = bd.make_row("fa4-fp8cache", c, ms=ms, hbm_peak=3350.0)
    assert (r8["kv_bytes"], r8["gbps"], r8["peak_frac"]) == (2**28, "3000.0", "0.896")
    assert r8["kv_dtype"] == "e4m3" and bd.make_row("fa4", c)["kv_dtype"] == "bf16"
    assert bd.CSV_FIELDS[-3:] == ["kv_dtype", "vs_bf16_cache", "flush"], "columns appended"
    skipped = bd.make_row("fa4-fp8cache", c, status="skipped: x")
    assert skipped["kv_bytes"] == 2**28 and skipped["gbps"] == ""


def test_fp8_cache_arguments():
    a = bench.parse_args(["--decode"])
    assert "fa4-fp8cache" not in bd.config(a)["impls"], "only when named"
    cfg = bd.config(bench.parse_args(["--decode", "--impls", "fa4,fa4-fp8cache", "--hdims", "128"]))
    assert cfg["impls"] == ("fa4", "fa4-fp8cache") and len(cfg["cases"]) == 13
    for c in bd.cases():
        assert c.memory_bytes(True) > c.memory_bytes() and c.memory_bytes(True) < bd.MEMORY_CAP
    impls = run.make_impls(("fa4", "fa4-fp8cache"), (0, 4))
    assert [(i.name, i.num_splits, i.fp8_cache) for i in impls] == [
        ("fa4", 0, False), ("fa4-splits4", 4, False), ("fa4-fp8cache", 0, True),
        ("fa4-fp8cache-splits4", 4, True)]  # fmt: skip


def test_fp8_cache_tokens_per_s_over_the_bf16_cache(tmp_path, capsys):
    dec = bd.Case("decode", 16, 8192, 1, 8, 128)
    pg = bd.Case("paged", 16, 8192, 1, 8, 128, page_size=16)
    spec = bd.Case("spec", 16, 8192, 2, 8, 128, causal=True)

    def row(impl, case, ms):
        return bd.make_row(impl, case, ms=ms, hbm_peak=3350.0, max_abs_diff=1e-3, ref_max=0.1)

    rows = [row("fa4", dec, 0.20), row("fa4-fp8cache", dec, 0.10), row("sdpa-cudnn", dec, 0.19),
            row("fa4", pg, 0.21), row("fa4-fp8cache", pg, 0.125),
            row("fa4-fp8cache", spec, 0.1)]  # fmt: skip
    path = tmp_path / "results.csv"
    bd.write_csv(path, rows)
    back = bd.finalize(bd.read_csv(path))
    by = {(r["impl"], r["case"]): r for r in back}
    r = by[("fa4-fp8cache", dec.name)]
    # the same tokens in half the time: 2x tokens/s; 2^28 bytes in 0.1 ms = 2684 GB/s read
    assert (r["vs_bf16_cache"], r["target"]) == ("2.000", "met (1.8x fa4)")
    assert r["gbps"] == f"{2**28 / 0.1e-3 / 1e9:.1f}" and r["kv_bytes"] == str(2**28)
    assert by[("fa4", dec.name)]["vs_bf16_cache"] == "" and by[("fa4", dec.name)]["target"]
    r = by[("fa4-fp8cache", pg.name)]
    assert (r["vs_bf16_cache"], r["target"]) == ("1.680", "missed (1.8x fa4)")
    assert r["vs_unpaged"] == "0.800", "paged over its own unpaged row"
    r = by[("fa4-fp8cache", spec.name)]
    assert r["vs_bf16_cache"] == "" and r["target"].startswith("n/a (no ok fa4")
    lines = bd.table(back).splitlines()
    assert "fa4-fp8cache tokens/s / fa4" in lines[0]
    assert lines[2].endswith("| 2.000 | met (1.8x fa4) |")
    summary = bd.target_summary(back)
    assert "fa4-fp8cache decode: target met at 1 of 1 points" in summary
    bd.report(back, None)
    assert "fa4-fp8cache: e4m3 cache, GB/s of the bytes it reads" in capsys.readouterr().out


def test_quantized_cache_pools_and_reference():
    from fa4.reference_fp8 import dequantize, quantize

    case = bd.Case("paged", 3, 64, 1, 2, 16, page_size=16, heads_q=8)
    k, v = run.dense_kv(case, 1, device="cpu")
    k8, kd = run.quantize_cache(k, 2, chunk_bytes=1)  # one batch row a chunk
    w8, wd = quantize(k, 2)
    assert k8.dtype == torch.float8_e4m3fn and kd.shape == (3, 2)
    assert torch.equal(k8.view(torch.uint8), w8.view(torch.uint8)) and torch.equal(kd, wd)
    v8, vd = run.quantize_cache(v, 2)
    t = run.case_inputs(case, k, v, 1, device="cpu")
    run.add_fp8_cache(case, t, (k8, v8, kd, vd), 1)
    assert t.k8_pool.dtype == torch.float8_e4m3fn
    for b in range(3):
        for j in (0, 17, 63):
            page, row = t.page_table[b, j // 16].item(), j % 16
            assert torch.equal(t.k8_pool[page, row].view(torch.uint8), k8[b, j].view(torch.uint8))
            assert torch.equal(t.v8_pool[page, row].view(torch.uint8), v8[b, j].view(torch.uint8))
    ref8 = run.reference(t.q, k8, v8, False, k_descale=kd, v_descale=vd)
    want = run.reference(t.q, dequantize(k8, kd, 2), dequantize(v8, vd, 2), False)
    assert (ref8 - want).abs().max().item() < 1e-6
    # The e4m3 cache's true values are not the bf16 cache's: here (64 keys) its output is off
    # the bf16 cache's reference by more than the decode check allows, which is why
    # fa4-fp8cache is checked against the reference on the dequantized cache.
    diff, ref_max = run.compare(ref8, run.reference(t.q, k, v, False))
    assert diff > 0


def test_fp8_cache_impl_calls_attention_with_kvcache(monkeypatch):
    seen = []

    def attention_with_kvcache(q, k, v, seqlens, **kw):
        seen.append((k, kw))
        return q.clone()

    monkeypatch.setitem(sys.modules, "fa4", types.SimpleNamespace(
        attention_with_kvcache=attention_with_kvcache, dispatch=None))  # fmt: skip
    for case in (bd.Case("decode", 2, 64, 1, 2, 16, heads_q=8),
                 bd.Case("paged", 2, 64, 1, 2, 16, page_size=16, heads_q=8)):  # fmt: skip
        k, v = run.dense_kv(case, 1, device="cpu")
        t = run.case_inputs(case, k, v, 1, device="cpu")
        run.add_fp8_cache(case, t, _fp8_tuple(k, v), 1)
        (var,) = run.Fa4("fa4-fp8cache", 0, fp8_cache=True).variants(case, t)
        var.fn()
        kc, kw = seen[-1]
        assert kc is (t.k8_pool if case.page_size else t.k8)
        assert kw["k_descale"] is t.k_descale and kw["v_descale"] is t.v_descale
        assert kw["num_splits"] == 0 and "e4m3 cache" in var.note
    (var,) = run.Fa4("fa4", 0).variants(case, t)
    var.fn()
    assert "k_descale" not in seen[-1][1] and seen[-1][0] is t.k_pool


def _fp8_tuple(k, v):
    k8, kd = run.quantize_cache(k, k.shape[2])
    v8, vd = run.quantize_cache(v, v.shape[2])
    return k8, v8, kd, vd


class _Stand(run.Impl):
    """A stand-in: the float32 reference on the bf16 cache, or on the e4m3 cache (fp8_cache)."""

    def __init__(self, name, fp8_cache=False):
        self.name, self.fp8_cache = name, fp8_cache

    def variants(self, case, t):
        def fn():
            if self.fp8_cache:
                return run.reference(t.q, t.k8, t.v8, case.causal, k_descale=t.k_descale,
                                     v_descale=t.v_descale).bfloat16()  # fmt: skip
            return run.reference(t.q, t.k, t.v, case.causal).bfloat16()

        yield run.Variant(fn, f"{self.name} note")


def test_worker_measures_the_fp8_cache(tmp_path, monkeypatch):
    times = {"fa4": 0.25, "fa4-fp8cache": 0.13}
    current = []

    def time_ms(fn, **kw):
        fn()
        return times[current[-1]]

    stands = [_Stand("fa4"), _Stand("fa4-fp8cache", fp8_cache=True)]
    for s in stands:
        gen = s.variants

        def variants(case, t, gen=gen, name=s.name):
            for var in gen(case, t):
                fn = var.fn

                def timed(fn=fn):
                    current.append(name)
                    return fn()

                var.fn = timed
                yield var

        s.variants = variants
    small = [bd.Case("decode", 2, 64, 1, 2, 16, heads_q=8),
             bd.Case("paged", 2, 64, 1, 2, 16, page_size=16, heads_q=8)]  # fmt: skip
    monkeypatch.setattr(run, "make_impls", lambda names, splits, checks: stands)
    real_dense, real_inputs = run.dense_kv, run.case_inputs
    monkeypatch.setattr(run, "dense_kv", lambda c, s: real_dense(c, s, device="cpu"))
    monkeypatch.setattr(run, "case_inputs", lambda c, k, v, s: real_inputs(c, k, v, s, "cpu"))
    for name, val in [
        ("is_available", lambda: True),
        ("synchronize", lambda: None),
        ("get_device_name", lambda: "NVIDIA H100 80GB HBM3"),
        ("reset_peak_memory_stats", lambda: None),
        ("max_memory_allocated", lambda: 0),
        ("empty_cache", lambda: None),
    ]:
        monkeypatch.setattr(torch.cuda, name, val)  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    bd.write_csv(out / "results.csv", [])
    state = out / "state.json"
    state.write_text(json.dumps({"start": 0, "exclude": [], "t0": time.time()}))
    args = bench.parse_args(["--decode", "--out", str(out), "--stop-s", "1e12"])
    cfg = {"cases": small, "impls": ("fa4", "fa4-fp8cache"), "splits": (0,)}
    fake_bi = types.SimpleNamespace(
        environment=lambda: [], clocked=lambda fn: (fn(), "", ""),
        peak_extra_mib=lambda fn: (fn(), 1.0)[1], time_ms=time_ms,
        host_us=lambda fn: (fn(), 5.0)[1], set_flush=lambda mode: None,
        flush_mode=lambda: "zero",
    )  # fmt: skip
    assert run.worker(args, cfg, state, bi=fake_bi) == 0
    rows = bd.finalize(bd.read_csv(out / "results.csv"))
    by = {(r["impl"], r["case"]): r for r in rows}
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    r = by[("fa4-fp8cache", small[0].name)]
    assert r["kv_bytes"] == str(small[0].kv_bytes // 2) and r["kv_dtype"] == "e4m3"
    assert r["vs_bf16_cache"] == f"{0.25 / 0.13:.3f}" and r["target"] == "met (1.8x fa4)"
    assert float(r["gbps"]) == pytest.approx(small[0].kv_bytes / 2 / 0.13e-3 / 1e9, abs=0.05)
    assert by[("fa4-fp8cache", small[1].name)]["vs_unpaged"] == "1.000"
