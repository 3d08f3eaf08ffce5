"""CPU tests of the standard sweep's model points (bench.py --model-points): the arguments, the
GQA inputs, the CSV columns heads_kv and label, the tables and env_sweep keyed by label."""

import csv
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from helpers import BenchStubImpl, load_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench.py"
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))

bu = load_script(BENCH.parent / "bench_util.py", "bench_util")
bench = load_script(BENCH, "bench_main")
bs = load_script(BENCH.parent / "bench_sustained.py", "bench_sustained")
bi = load_script(BENCH.parent / "bench_impls.py", "bench_impls")
es = load_script(BENCH.parent / "env_sweep.py", "env_sweep")

LABELS = [p.label for p in bu.MODEL_POINTS]
LLAMA = bu.model_points("llama3-8b-8k")[0]
MHA_8K = bu.make_point(128, True, 8192)  # the standard point of LLAMA's hdim, causal, seqlen


def _points(*argv):
    return bench.config_from(bench.parse_args(list(argv)))[0]


def _ms_for(p, tf, d="fwd"):
    return bu.point_flops(d, p) / (tf * 1e12) * 1e3


def _row(impl, p, tf=None, d="fwd", mib=None, **kw):
    r = bu.make_row(impl, d, p, ms=_ms_for(p, tf, d) if tf else None, peak_extra_mib=mib, **kw)
    return {k: str(v) for k, v in r.items()}  # as read back from the CSV


# ---- arguments ----------------------------------------------------------------------------------


def test_model_points_in_the_standard_sweep():
    assert [p.label for p in _points("--model-points", "all")] == LABELS, "alone: only them"
    pts = _points("--model-points", "gpt-oss-8k,llama3-8b-8k", "--hdims", "128",
                  "--seqlens", "8k", "--causal", "yes")  # fmt: skip
    assert [p.name for p in pts] == ["hd128 causal 8k", "gpt-oss-8k", "llama3-8b-8k"]
    assert [(p.heads, p.kv_heads) for p in pts] == [(16, 16), (64, 8), (32, 8)]
    quick = _points("--quick", "--model-points", "qwen2.5-7b-8k")
    assert len(quick) == 13 and quick[-1].label == "qwen2.5-7b-8k"
    assert [p.label for p in quick[:12]] == [""] * 12
    only_seqlens = _points("--seqlens", "16k", "--model-points", "all")
    assert len(only_seqlens) == 6 + len(LABELS), "--seqlens asks for the standard points"
    # without the option the sweep is as before: MHA only
    plain = _points()
    assert len(plain) == 36 and all(p.heads_kv == 0 and not p.label for p in plain)
    fp8 = bench.config_from(bench.parse_args(["--dtype", "e4m3", "--model-points", "all"]))
    assert [p.label for p in fp8[0]] == LABELS and fp8[1] == ("fwd",)


def test_unknown_model_point_is_a_clear_error():
    with pytest.raises(SystemExit, match=r"--model-points llama-70b: unknown model points "
                       r"\['llama-70b'\]: choose from all, llama3-8b-8k"):  # fmt: skip
        _points("--model-points", "llama-70b")
    with pytest.raises(SystemExit, match=r"\['nope'\]"):
        _points("--model-points", "all,nope", "--quick")
    with pytest.raises(ValueError, match="unknown model points"):
        bu.model_points("all,nope")


def test_all_in_the_shared_parser_and_the_sustained_mode():
    assert bu.model_points("all") == bu.model_points(None) == list(bu.MODEL_POINTS)
    assert bu.model_points("gpt-oss-8k, all") == list(bu.MODEL_POINTS)
    assert [p.label for p in bu.model_points("gpt-oss-8k,qwen2.5-7b-8k")] == [
        "gpt-oss-8k", "qwen2.5-7b-8k"]  # fmt: skip
    args = bench.parse_args(["--sustained", "10", "--model-points", "all"])
    cfg = bs.config_from(args, bench.IMPLS + bench.EXTRA_IMPLS, bench.IMPLS)
    assert [p.label for p in cfg.points] == LABELS


def test_help_documents_both_modes(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    at = text.index("--model-points LABELS ")
    sustained = text.index("sustained mode (bench_sustained.py):")
    assert at < sustained, "documented with the sweep's options, not only the sustained mode's"
    entry = text[at:sustained]
    assert all(label in entry for label in LABELS) and "or all" in entry
    assert "only them when none of --hdims, --seqlens, --quick" in entry
    assert "--sustained likewise, but all by default" in entry


# ---- inputs -------------------------------------------------------------------------------------


def test_make_inputs_gqa_shapes():
    q, k, v, dout = bi.make_inputs(2, 16, 8, 32, 5, True, heads_kv=2, device="cpu")
    assert (q.shape, dout.shape) == ((2, 16, 8, 32), (2, 16, 8, 32))
    assert (k.shape, v.shape) == ((2, 16, 2, 32), (2, 16, 2, 32))
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v, dout))
    assert q.requires_grad and k.requires_grad and v.requires_grad and not dout.requires_grad
    assert not torch.equal(k, v)


def test_make_inputs_mha_unchanged_for_a_seed():
    """The draw before heads_kv: four (b, s, h, d) tensors from one generator, in order."""
    g = torch.Generator().manual_seed(11)
    old = [torch.randn((2, 8, 4, 16), generator=g, dtype=torch.bfloat16) for _ in range(4)]
    for kw in ({}, {"heads_kv": None}, {"heads_kv": 4}):
        new = bi.make_inputs(2, 8, 4, 16, 11, False, device="cpu", **kw)
        assert all(torch.equal(a, b) for a, b in zip(old, new, strict=True)), kw
    gqa = bi.make_inputs(2, 8, 4, 16, 11, False, heads_kv=2, device="cpu")
    assert torch.equal(gqa[0], old[0]), "q is drawn first"


def test_make_fp8_inputs_passes_heads_kv(monkeypatch):
    pytest.importorskip("fa4.reference_fp8")
    real = bi.make_inputs
    monkeypatch.setattr(bi, "make_inputs", lambda *a, **kw: real(*a, **kw, device="cpu"))
    q8, k8, v8, sc = bi.make_fp8_inputs(1, 16, 8, 32, 0, heads_kv=2)
    assert (q8.shape, k8.shape, v8.shape) == ((1, 16, 8, 32), (1, 16, 2, 32), (1, 16, 2, 32))
    assert sc.q.shape == sc.k.shape == sc.v.shape == (1, 2), "per (batch, kv head)"
    deq = bi.dequantize_inputs((q8, k8, v8, sc))
    assert [t.shape[2] for t in deq] == [8, 2, 2, 8]


def test_reference_and_guard_compare_gqa_gradients(tmp_path, monkeypatch):
    """On CPU: SDPA-flash's reference at a GQA point has dk, dv of kv heads; the guard passes an
    implementation that expands k, v per q-head group, and fails one that maps heads wrongly."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    p = bu.Point(32, True, 64, 1, 8, 2, "tiny-gqa")
    inputs = bi.make_inputs(p.batch, p.seqlen, p.heads, p.hdim, 1, True, p.kv_heads, "cpu")
    ref = bench.reference(bi, torch, p, inputs, True)
    assert [g.shape[2] for g in ref[1]] == [8, 2, 2]

    class Expanded(bi.Impl):
        def __init__(self, name, expand):
            self.name, self.expand = name, expand

        def fwd(self, q, k, v, causal):
            k, v = (self.expand(t, p.heads // p.kv_heads, 2) for t in (k, v))
            return torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal
            ).transpose(1, 2)

    st = bench.State(bench.parse_args(["--out", str(tmp_path)]), tmp_path)
    todo = ["fwd", "bwd"]
    good = Expanded("grouped", torch.repeat_interleave)
    diff, ok, left = bench._check(bi, torch, good, p, inputs, todo, ref, st, None)
    assert left == todo and ok == {"fwd": True, "bwd": True, "fwd+bwd": True}
    assert diff["bwd"] < 0.05
    wrong = Expanded("tiled", lambda t, n, dim: t.repeat(1, 1, n, 1))
    diff, ok, _ = bench._check(bi, torch, wrong, p, inputs, todo, ref, st, None)
    assert not ok["fwd"] and not ok["bwd"] and diff["bwd"] > 0.1
    st.csv.close()


# ---- rows, tables, plot -------------------------------------------------------------------------


def test_make_row_heads_kv_and_label(tmp_path):
    assert bu.CSV_FIELDS[-2:] == ["heads_kv", "label"], "appended: older CSVs still parse"
    mha = bu.make_row("fa4", "fwd", MHA_8K, ms=1.0)
    gqa = bu.make_row("fa4", "fwd", LLAMA, ms=1.0)
    assert (mha["heads"], mha["heads_kv"], mha["label"]) == (16, 16, "")
    assert (gqa["heads"], gqa["heads_kv"], gqa["label"]) == (32, 8, "llama3-8b-8k")
    # FLOPs count the q heads: llama 8k is 2^39 forward, so 549.8 TFLOP/s in 1 ms
    assert gqa["tflops"] == f"{2**39 / 1e-3 / 1e12:.1f}" == "549.8"
    log = bu.CsvLog(tmp_path / "results.csv")
    log.write(mha)
    log.write(gqa)
    log.close()
    back = bu.read_csv(tmp_path / "results.csv")
    assert list(back[1]) == bu.CSV_FIELDS
    assert [(r["heads_kv"], r["label"]) for r in back] == [("16", ""), ("8", "llama3-8b-8k")]


def test_tables_keep_a_labelled_gqa_point_apart():
    gpt = bu.model_points("gpt-oss-8k")[0]
    rows = [_row("fa4", gpt, 300, mib=5), _row("sdpa-cudnn", gpt, 200, mib=6),
            _row("fa4", LLAMA, 500, mib=1), _row("sdpa-cudnn", LLAMA, 400, mib=2),
            _row("fa4", MHA_8K, 600, mib=3), _row("sdpa-cudnn", MHA_8K, 450, mib=4)]  # fmt: skip
    lines = bu.ratio_table(rows, "fwd").splitlines()
    assert lines[0] == "| hd | causal | seqlen | fa4 | sdpa-cudnn | best peer | fa4 / best |"
    # the standard point first, then the model points in MODEL_POINTS order
    assert lines[2:] == [
        "| 128 | yes | 8k | 600 | 450 | 450 (sdpa-cudnn) | 1.33 |",
        "| llama3-8b-8k | yes | 8k | 500 | 400 | 400 (sdpa-cudnn) | 1.25 |",
        "| gpt-oss-8k | yes | 8k | 300 | 200 | 200 (sdpa-cudnn) | 1.50 |",
    ]
    assert bu.memory_table(rows, "fwd").splitlines()[2:] == [
        "| 128 | yes | 8k | 3.0 | 4.0 |",
        "| llama3-8b-8k | yes | 8k | 1.0 | 2.0 |",
        "| gpt-oss-8k | yes | 8k | 5.0 | 6.0 |",
    ]
    fp8 = [_row("fa4", LLAMA, 900, dtype="e4m3"), _row("fa4", MHA_8K, 800, dtype="e4m3")]
    assert [line.split(" | ")[0] for line in bu.fp8_table(fp8, "fwd").splitlines()[2:]] == [
        "| 128", "| llama3-8b-8k"]  # fmt: skip


def test_sweep_gaps_not_filled_by_a_model_point():
    rows = [_row("fa4", p, 100) for p in bu.sweep() if p.key != MHA_8K.key]
    rows.append(_row("fa4", LLAMA, 500))
    assert bu.sweep_gaps(rows, "fwd").endswith(": hd128 causal 8k")
    rows.append(_row("fa4", MHA_8K, 500))
    assert bu.sweep_gaps(rows, "fwd") == ""


def test_plot_leaves_model_points_out(tmp_path, monkeypatch):
    import bench_plot

    plt = mock.MagicMock()
    ax = mock.MagicMock()
    plt.subplots.side_effect = lambda n, m, **kw: (mock.MagicMock(), [[ax] * m for _ in range(n)])
    mpl = types.ModuleType("matplotlib")
    mpl.use, mpl.pyplot = lambda *a: None, plt
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)
    gpt = bu.model_points("gpt-oss-8k")[0]
    assert (
        bench_plot.plot([_row("fa4", gpt, 300), _row("fa4", LLAMA, 500)], "fwd", tmp_path / "a.png")
        is None
    )
    rows = [_row("fa4", gpt, 300), _row("fa4", LLAMA, 500), _row("fa4", MHA_8K, 600)]
    assert bench_plot.plot(rows, "fwd", tmp_path / "b.png") == tmp_path / "b.png"
    assert plt.subplots.call_args.args[:2] == (1, 2), "one hdim: 128 (gpt-oss's hd64 left out)"
    plotted = [c.args for c in ax.plot.call_args_list]
    assert plotted == [((8192,), (600.0,))], "the MHA point only"


def _write_csv(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def test_replot_of_a_csv_with_and_without_the_new_columns(tmp_path, capsys):
    old = bu.CSV_FIELDS[: bu.CSV_FIELDS.index("heads_kv")]
    path = tmp_path / "old.csv"
    _write_csv(path, old, [_row("fa4", MHA_8K, 600), _row("sdpa-cudnn", MHA_8K, 450)])
    assert "label" not in bu.read_csv(path)[0]
    assert bench.main(["--replot", str(path)]) == 0
    assert "| 128 | yes | 8k | 600 | 450 | 450 (sdpa-cudnn) | 1.33 |" in capsys.readouterr().out
    path = tmp_path / "new.csv"
    _write_csv(path, bu.CSV_FIELDS, [_row("fa4", LLAMA, 500), _row("fa4", MHA_8K, 600)])
    assert bench.main(["--replot", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.index("| 128 | yes | 8k | 600 |") < out.index("| llama3-8b-8k | yes | 8k | 500 |")


# ---- the sweep through main(), with stand-ins for the GPU parts ---------------------------------


def test_main_runs_the_model_points_after_the_standard_ones(tmp_path, monkeypatch, capsys):
    made = []

    def make_inputs(b, s, h, d, seed, grad, heads_kv=None):
        made.append((s, h, heads_kv, seed))
        return tuple(torch.zeros(2, 3) for _ in range(4))

    fake = types.SimpleNamespace(
        environment=lambda: [],
        make_impls=lambda ns: [BenchStubImpl(n) for n in ns],
        make_inputs=make_inputs,
        max_abs_diff=lambda impl, got, ref: (0.0, 1.0),
        peak_extra_mib=lambda fn: (fn(), 10.0)[1],
        host_us=lambda fn: (fn(), 7.0)[1],
        time_ms=lambda fn, **kw: (fn(), 2.0)[1],
        clocked=lambda fn: (fn(), "", ""),
        set_flush=lambda mode: None,
    )
    monkeypatch.setitem(sys.modules, "bench_impls", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "stand-in")
    out = tmp_path / "out"
    argv = ["--dirs", "fwd", "--hdims", "128", "--seqlens", "8k", "--causal", "yes", "--impls",
            "fa4", "--model-points", "llama3-8b-8k,qwen2.5-7b-8k", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    base = bu.point_seed(MHA_8K)  # the three share hdim, causal and seqlen
    assert made == [(8192, 16, 16, base), (8192, 32, 8, base + 8), (8192, 28, 4, base + 4)]
    rows = bu.read_csv(out / "results.csv")
    assert [(r["label"], r["heads"], r["heads_kv"]) for r in rows] == [
        ("", "16", "16"), ("llama3-8b-8k", "32", "8"), ("qwen2.5-7b-8k", "28", "4")]  # fmt: skip
    text = capsys.readouterr().out
    assert "fa4          fwd     llama3-8b-8k hd128 causal=1 s=8192 b=1 h=32:8:" in text
    assert "| llama3-8b-8k | yes | 8k | 275 |" in text  # 2^39 FLOPs in 2 ms
    assert "| qwen2.5-7b-8k | yes | 8k |" in text and "| 128 | yes | 8k |" in text


# ---- env_sweep ----------------------------------------------------------------------------------


def test_env_sweep_table_keys_by_label():
    def row(variant, tflops, label=""):
        point = {"direction": "bwd", "hdim": "128", "causal": "1", "seqlen": "8192"}
        return {"impl": "fa4", "variant": variant, **point, "tflops": str(tflops),
                "status": "ok", "label": label}  # fmt: skip

    rows = [row("-", 300.0, "qwen2.5-7b-8k"), row("-", 400.0, "llama3-8b-8k"), row("-", 500.0),
            row("X=1", 330.0, "qwen2.5-7b-8k"), row("X=1", 440.0, "llama3-8b-8k"),
            row("X=1", 550.0)]  # fmt: skip
    assert es.table(rows, ["-", "X=1"]).splitlines()[2:] == [
        "| bwd | 128 | 1 | 8192 | 500.0 | 550.0 (1.100) |",
        "| bwd | qwen2.5-7b-8k | 1 | 8192 | 300.0 | 330.0 (1.100) |",
        "| bwd | llama3-8b-8k | 1 | 8192 | 400.0 | 440.0 (1.100) |",
    ]
    for r in rows:  # rows of a bench.py before the label column: one standard point
        del r["label"]
    assert len(es.table(rows, ["-", "X=1"]).splitlines()) == 3


FAKE_BENCH = """
import argparse, csv, os
ap = argparse.ArgumentParser()
ap.add_argument("--impls")
ap.add_argument("--out")
ap.add_argument("--dirs")
ap.add_argument("--model-points")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
fields = ["impl", "direction", "hdim", "causal", "seqlen", "tflops", "status", "heads_kv", "label"]
with open(os.path.join(a.out, "results.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fields)
    w.writeheader()
    for impl in a.impls.split(","):
        for label, kv in (("llama3-8b-8k", 8), ("qwen2.5-7b-8k", 4)):
            tf = float(os.environ.get("FA4_BWD_TILE_ORDER") == "plain" and 100 or 200) + kv
            w.writerow({"impl": impl, "direction": a.dirs, "hdim": 128, "causal": 1,
                        "seqlen": 8192, "tflops": tf, "status": "ok", "heads_kv": kv,
                        "label": label if a.model_points == "all" else ""})
"""


def test_env_sweep_end_to_end_with_model_points(tmp_path, monkeypatch):
    fake = tmp_path / "fake_bench.py"
    fake.write_text(FAKE_BENCH)
    monkeypatch.setattr(es, "BENCH", fake)
    out = tmp_path / "sweep"
    argv = ["--out", str(out), "--rounds", "1", "--peers", "", "--variants", "-",
            "FA4_BWD_TILE_ORDER=plain", "--", "--dirs", "bwd", "--model-points", "all",
            "--impls", "fa4"]  # fmt: skip
    assert es.main(argv) == 0
    assert (out / "table.md").read_text().splitlines()[2:] == [
        "| bwd | llama3-8b-8k | 1 | 8192 | 208.0 | 108.0 (0.519) |",
        "| bwd | qwen2.5-7b-8k | 1 | 8192 | 204.0 | 104.0 (0.510) |",
    ]
