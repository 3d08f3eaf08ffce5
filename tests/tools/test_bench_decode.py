"""CPU tests of bench.py --decode (bench/bench_decode.py, bench/bench_decode_run.py): the cases,
the byte formula, the arguments, the CSV / table on fake timings, the reference, the paged pool,
the worker with stand-in implementations, and the supervisor replacing a crashed worker."""

import contextlib
import json
import math
import sys
import textwrap
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


def test_cases_are_the_decode_targets():
    cs = bd.cases()
    assert len(cs) == 12 + 3 + 4 and len({c.name for c in cs}) == len(cs)
    dec = [c for c in cs if c.kind == "decode"]
    assert {(c.batch, c.seqlen_k) for c in dec} == {(16, 8192), (64, 32768), (4, 131072)}
    assert {(c.hdim, c.heads_kv, c.heads_q) for c in dec} == {
        (d, h, 32) for d in (64, 128) for h in (8, 4)
    }
    assert all(c.seqlen_q == 1 and not c.page_size for c in dec)
    spec = [c for c in cs if c.kind == "spec"]
    assert sorted(c.seqlen_q for c in spec) == [2, 4, 8]
    assert all(c.causal and (c.batch, c.seqlen_k, c.hdim, c.group) == (16, 8192, 128, 4)
               for c in spec)  # fmt: skip
    paged = [c for c in cs if c.kind == "paged"]
    assert sorted((c.batch, c.page_size) for c in paged) == [(16, 16), (16, 256), (64, 16),
                                                             (64, 256)]  # fmt: skip
    for c in paged:
        assert (c.hdim, c.group, c.seqlen_q) == (128, 4, 1) and c.twin in cs
        assert c.twin.name == f"decode b{c.batch} kv{c.seqlen_k // 1024}k hd128 gqa4"
    # cases that share a cache are adjacent (one allocation per cache)
    keys = [c.kv_key for c in cs]
    assert len(set(keys)) == sum(1 for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k)
    assert max(c.memory_bytes() for c in cs) < 40e9
    assert [c.name for c in bd.cases(("paged",), (128,))] == [c.name for c in paged]
    assert all(c.hdim == 64 for c in bd.cases(hdims=(64,)))
    with pytest.raises(ValueError):
        bd.cases(("prefill",))


def test_byte_formula_and_gbps():
    # batch · seqlen_k · kv_heads · (d + d_v) · 2 bytes
    assert bd.kv_bytes(16, 8192, 8, 128) == 16 * 8192 * 8 * 256 * 2 == 2**29
    assert bd.kv_bytes(1, 1, 1, 192, 128) == 640
    c = bd.Case("decode", 64, 32768, 1, 8, 128)
    assert c.kv_bytes == 64 * 32768 * 8 * 256 * 2
    row = bd.make_row("fa4", c, ms=c.kv_bytes / 3e12 * 1e3, hbm_peak=3350.0)
    assert row["gbps"] == "3000.0" and row["peak_frac"] == "0.896"
    assert bd.hbm_peak_gbps("NVIDIA H100 80GB HBM3") == 3350
    assert bd.hbm_peak_gbps("NVIDIA H200") == 4800
    assert bd.hbm_peak_gbps("NVIDIA H100 PCIe") == 2000
    assert bd.hbm_peak_gbps("Tesla T4") is None


def test_arguments():
    a = bench.parse_args(["--decode"])
    assert a.decode and a.budget_s == bd.DEFAULT_BUDGET_S and a.stop_s == bd.DEFAULT_STOP_S
    cfg = bd.config(a)
    assert len(cfg["cases"]) == 19 and cfg["impls"] == bd.IMPLS and cfg["splits"] == (0,)
    a = bench.parse_args(
        "--decode --decode-cases spec,paged --impls fa4,flash-attn-4 --decode-splits 0,4,16 "
        "--hdims 128 --stop-s 60 --hbm-gbps 3000".split()
    )
    cfg = bd.config(a)
    assert {c.kind for c in cfg["cases"]} == {"spec", "paged"} and len(cfg["cases"]) == 7
    assert cfg["impls"] == ("fa4", "flash-attn-4") and cfg["splits"] == (0, 4, 16)
    assert (a.stop_s, a.budget_s, a.hbm_gbps) == (60, bd.DEFAULT_BUDGET_S, 3000)
    assert bd.splits_names((0, 4)) == [("fa4", 0), ("fa4-splits4", 4)]
    assert bd.splits_names((0, 2), bd.FP8_CACHE) == [
        ("fa4-fp8cache", 0),
        ("fa4-fp8cache-splits2", 2),
    ]
    assert bd.is_fp8_cache("fa4-fp8cache-splits2") and bd.is_ours("fa4-fp8cache-splits2")
    assert not bd.is_fp8_cache("fa4-splits2") and not bd.is_fp8_cache("flash-attn-4")
    assert math.isinf(bench.parse_args([]).budget_s), "the standard sweep keeps no default"
    for bad in (["--impls", "xformers"], ["--decode-cases", "prefill"], ["--hdims", "256"],
                ["--decode-splits", "-1"], ["--decode-splits", "2,2"]):  # fmt: skip
        with pytest.raises(ValueError):
            bd.config(bench.parse_args(["--decode", *bad]))
    argv = ["--decode", "--out", "x", "--decode-worker", "s.json"]
    assert bd.worker_argv(argv) == ["--decode", "--out", "x"]


def _rows(gbps_by_impl: dict, case, peak=3350.0, status="ok"):
    rows = []
    for impl, g in gbps_by_impl.items():
        if g is None:
            rows.append(bd.make_row(impl, case, status="skipped: not importable"))
        else:
            ms = case.kv_bytes / (g * 1e9) * 1e3
            rows.append(bd.make_row(impl, case, ms=ms, hbm_peak=peak, status=status,
                                    max_abs_diff=1e-3, ref_max=0.1))  # fmt: skip
    return rows


def test_csv_table_and_targets_on_fake_timings(tmp_path):
    dec = bd.Case("decode", 16, 8192, 1, 8, 128)
    big = bd.Case("decode", 4, 131072, 1, 8, 128)
    spec = bd.Case("spec", 16, 8192, 2, 8, 128, causal=True)
    pg = bd.Case("paged", 16, 8192, 1, 8, 128, page_size=16)
    rows = (
        _rows({"fa4": 3100, "flash-attn-4": 2900, "sdpa-cudnn": 2920, "sdpa-flash": 2800}, dec)
        + _rows({"fa4": 3150, "flash-attn-4": 1674, "sdpa-cudnn": 3200, "sdpa-flash": None}, big)
        + _rows({"fa4": 3000, "flash-attn-4": 2900, "sdpa-cudnn": 3100}, spec)
        + _rows({"fa4": 2700, "flash-attn-4": 2800}, pg)
    )
    path = tmp_path / "results.csv"
    bd.write_csv(path, [])
    bd.append_rows(path, rows)
    back = bd.read_csv(path)
    assert bd.is_decode_csv(path) and list(back[0]) == bd.CSV_FIELDS and len(back) == 13
    bd.finalize(back)
    by = {(r["impl"], r["case"]): r for r in back}
    r = by[("fa4", dec.name)]
    assert (r["best_peer"], r["best_peer_gbps"], r["ratio_best_peer"]) == (
        "sdpa-cudnn", "2920.0", "1.062")  # fmt: skip
    assert r["target"] == "met" and r["peak_frac"] == "0.925"
    assert r["kv_bytes"] == str(2**29) and r["rel_diff"] == "1.00e-02"
    # 1.05 × 3200 = 3360 > 3350: the target is 93 % of the peak (3115.5 GB/s)
    assert by[("fa4", big.name)]["target"] == "met (93 % of peak)"
    # spec-decode: against flash-attn-4 only (1.034 < 1.05), though cuDNN is the best peer
    assert by[("fa4", spec.name)]["target"] == "missed"
    assert by[("fa4", spec.name)]["best_peer"] == "sdpa-cudnn"
    # paged: GB/s over the same impl's unpaged row (2700 / 3100 = 0.871 < 0.90)
    assert by[("fa4", pg.name)]["vs_unpaged"] == "0.871"
    assert by[("flash-attn-4", pg.name)]["vs_unpaged"] == "0.966"
    assert by[("fa4", pg.name)]["target"] == "missed"
    assert by[("sdpa-flash", big.name)]["gbps"] == "" and by[("flash-attn-4", dec.name)][
        "ratio_best_peer"] == ""  # fmt: skip
    lines = bd.table(back).splitlines()
    assert lines[0].startswith("| case | fa4 | flash-attn-4 | sdpa-cudnn | sdpa-flash | best peer")
    assert lines[2] == (
        f"| {dec.name} | 3100 | 2900 | 2920 | 2800 | 2920 (sdpa-cudnn) | 1.062 | 92.5 |  | met |"
    )
    assert "| skipped |" in lines[3]
    assert lines[5].endswith("| 0.871 | missed |")
    summary = bd.target_summary(back)
    assert summary[0] == "fa4 decode: target met at 2 of 2 points"
    assert summary[1] == f"fa4 spec: target met at 0 of 1 points; not at: {spec.name}"
    # a failed fa4 row is no ratio and no target
    back[0]["status"] = "failed: max_abs_diff 1"
    assert bd.finalize(back)[0]["target"] == ""


def test_replot_of_a_decode_csv(tmp_path, capsys):
    dec = bd.Case("decode", 16, 8192, 1, 8, 128)
    path = tmp_path / "results.csv"
    bd.write_csv(path, _rows({"fa4": 3100, "sdpa-cudnn": 2920}, dec))
    assert bench.main(["--replot", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| 1.062 |" in out and "fa4 decode: target met at 1 of 1 points" in out


def test_reference_matches_sdpa_math_with_gqa_and_bottom_right_causal():
    g = torch.Generator().manual_seed(0)
    b, s_q, s_k, h, h_kv, d = 3, 4, 37, 8, 2, 16
    q = torch.randn(b, s_q, h, d, generator=g).bfloat16()
    k = torch.randn(b, s_k, h_kv, d, generator=g).bfloat16()
    v = torch.randn(b, s_k, h_kv, d, generator=g).bfloat16()
    for causal in (False, True):
        # one batch row per chunk: the chunking must not change anything
        got = run.reference(q, k, v, causal, chunk_bytes=1)
        assert torch.equal(got, run.reference(q, k, v, causal))
        ke, ve = (x.float().repeat_interleave(h // h_kv, dim=2).transpose(1, 2) for x in (k, v))
        mask = None
        if causal:
            mask = torch.ones(s_q, s_k, dtype=torch.bool).tril(diagonal=s_k - s_q)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(1, 2), ke, ve, attn_mask=mask
        ).transpose(1, 2)
        assert (got - want).abs().max().item() < 1e-5
    # the last query sees every key, the first all but s_q - 1
    one = run.reference(q[:, :1], k, v, False)
    assert torch.allclose(
        run.reference(q, k, v, True)[:, -1:], run.reference(q[:, -1:], k, v, False)
    )
    assert one.shape == (b, 1, h, d)


def test_paged_pool_holds_the_dense_cache_in_shuffled_pages():
    k = torch.randn(3, 64, 2, 8).bfloat16()
    v = torch.randn(3, 64, 2, 8).bfloat16()
    table, kp, vp = run.paged(k, v, 16, seed=5)
    assert table.dtype == torch.int32 and table.shape == (3, 4) and table.is_contiguous()
    assert sorted(table.flatten().tolist()) == list(range(12))
    assert table.flatten().tolist() != list(range(12)), "shuffled"
    for b in range(3):
        for j in (0, 15, 16, 63):
            page, row = table[b, j // 16].item(), j % 16
            assert torch.equal(kp[page, row], k[b, j]) and torch.equal(vp[page, row], v[b, j])
    with pytest.raises(ValueError):
        run.paged(k, v, 48, seed=0)


def test_sdpa_variants_on_cpu_math_backend():
    """The SDPA impl's enable_gqa call and causal_lower_right mask give the reference (on CPU
    with the MATH backend), and the expansion fallback is the second variant."""
    from torch.nn.attention import SDPBackend

    case = bd.Case("spec", 2, 64, 4, 2, 16, causal=True, heads_q=8)
    k, v = run.dense_kv(case, 1, device="cpu")
    t = run.case_inputs(case, k, v, 1, device="cpu")
    ref = run.reference(t.q, k, v, True)
    impl = run.Sdpa("sdpa-math", SDPBackend.MATH)
    with impl.context():
        vs = list(impl.variants(case, t))
        assert [("enable_gqa" in x.note, "expanded x4" in x.note) for x in vs] == [
            (True, False), (False, True)]  # fmt: skip
        for var in vs:
            diff, ref_max = run.compare(var.to_bshd(var.fn()), ref)
            assert bd.agrees(diff, ref_max), var.note
    assert impl.skip_reason(bd.Case("paged", 2, 64, 1, 2, 16, page_size=16)).startswith("dense")


class _Stand(run.Impl):
    """A stand-in implementation: the reference in bf16, wrong (factor != 1), or raising."""

    def __init__(self, name, factor=1.0, exc=None, fallback=False, capture_exc=None,
                 replay_factor=1.0):  # fmt: skip
        self.name, self.factor, self.exc, self.fallback = name, factor, exc, fallback
        self.capture_exc, self.replay_factor = capture_exc, replay_factor  # for _FakeGraphs
        self.calls = 0

    def variants(self, case, t):
        def fn():
            self.calls += 1
            if self.exc:
                raise self.exc
            kc = t.k if not case.page_size else t.k  # the stand-in reads the dense cache
            return (run.reference(t.q, kc, t.v, case.causal) * self.factor).bfloat16()

        fn.stand = self  # what _FakeGraphs captures
        if self.fallback:
            yield run.Variant(lambda: (_ for _ in ()).throw(RuntimeError("No available kernel")),
                              "first try")  # fmt: skip
        yield run.Variant(fn, f"{self.name} note")


class _FakeGraphs:
    """A stand-in for bench_impls.graph_replay: "captures" a _Stand's fn (raising its
    capture_exc, if any) into a replay that calls fn (times its replay_factor)."""

    def __init__(self):
        self.captured = []  # the stand of each capture
        self.replays = []  # each replay object made

    def __call__(self, fn):
        stand = fn.stand
        self.captured.append(stand.name)
        if stand.capture_exc:
            raise stand.capture_exc
        replay = _FakeReplay(fn, stand)
        self.replays.append(replay)
        return replay


class _FakeReplay:
    def __init__(self, fn, stand):
        self.fn, self.stand, self.calls = fn, stand, 0

    def __call__(self):
        self.calls += 1
        return (self.fn().float() * self.stand.replay_factor).bfloat16()


def _fake_bi():
    def clocked(fn):
        return fn(), "1980/1970", "0x4"

    seen = {"peak": [], "time": [], "host": []}  # the callables each measure was given

    def measured(what, value):
        return lambda fn, **kw: (seen[what].append(fn), fn(), value)[2]

    flush = ["zero"]  # what set_flush was last given
    return types.SimpleNamespace(
        environment=lambda: ["stand-in environment"],
        set_flush=lambda mode: flush.__setitem__(0, mode),
        flush_mode=lambda: flush[0],
        clocked=clocked,
        peak_extra_mib=measured("peak", 5.0),
        time_ms=measured("time", 0.25),
        host_us=measured("host", 12.0),
        graph_replay=_FakeGraphs(),
        seen=seen,
    )


def _run_worker(tmp_path, monkeypatch, stands, cases, argv=(), bi=None):
    """The worker on CPU tensors with stand-in implementations: the finalized CSV rows."""
    monkeypatch.setattr(run, "make_impls", lambda names, splits, checks: stands)
    real_dense = run.dense_kv
    real_inputs = run.case_inputs
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
    args = bench.parse_args(["--decode", "--out", str(out), "--rounds", "2", "--stop-s", "1e12",
                             *argv])  # fmt: skip
    cfg = {"cases": cases, "impls": bd.IMPLS, "splits": (0,)}
    assert run.worker(args, cfg, state, bi=bi or _fake_bi()) == 0
    return bd.finalize(bd.read_csv(out / "results.csv"))


SMALL = [bd.Case("decode", 2, 64, 1, 2, 16, heads_q=8),
         bd.Case("spec", 2, 64, 2, 2, 16, causal=True, heads_q=8),
         bd.Case("paged", 2, 64, 1, 2, 16, page_size=16, heads_q=8)]  # fmt: skip


def test_worker_end_to_end_with_stand_ins(tmp_path, monkeypatch, capsys):
    """The worker on CPU tensors: check before timing (a wrong impl is failed, not timed), an
    exception is an error row, a fallback variant is used, every case's rows are written."""
    stands = [
        _Stand("fa4"),
        _Stand("flash-attn-4", factor=1.5),
        _Stand("sdpa-cudnn", exc=RuntimeError("No available kernel. Aborting execution.")),
        _Stand("sdpa-flash", fallback=True),
    ]
    small = SMALL
    bi = _fake_bi()
    rows = _run_worker(tmp_path, monkeypatch, stands, small, bi=bi)
    by = {(r["impl"], r["case"]): r for r in rows}
    assert len(rows) == 12
    r = by[("fa4", small[0].name)]
    assert r["status"] == "ok" and r["ms"] == "0.2500" and r["ms_rounds"] == "0.2500 0.2500"
    assert r["gpu"] == "NVIDIA H100 80GB HBM3" and r["hbm_peak_gbps"] == "3350"
    assert r["sm_mhz"] == "1980/1970 1980/1970" and r["clock_reasons"] == "0x4"
    assert (r["peak_extra_mib"], r["host_us"], r["note"]) == ("5.0", "12.0", "fa4 note")
    assert float(r["gbps"]) == pytest.approx(small[0].kv_bytes / 0.25e-3 / 1e9, abs=0.05)
    assert by[("flash-attn-4", small[0].name)]["status"].startswith("failed: max_abs_diff")
    assert by[("flash-attn-4", small[0].name)]["ms"] == ""
    assert by[("sdpa-cudnn", small[1].name)]["status"].startswith("error: [sdpa-cudnn note]")
    sf = by[("sdpa-flash", small[1].name)]
    assert sf["status"] == "ok" and sf["note"] == "sdpa-flash note"
    assert by[("fa4", small[2].name)]["vs_unpaged"] == "1.000"
    assert stands[1].calls == 3, "the failed impl is called once per case, never timed"
    assert "| decode b2 kv64 hd16 gqa4 |" in bd.table(rows)
    # without --decode-graphs: eager calls timed, nothing captured
    assert bi.graph_replay.captured == [] and bi.seen["time"]
    assert {r["flush"] for r in rows} == {"zero"}, "do_bench's flush by default"
    assert all(isinstance(f, types.FunctionType) for f in bi.seen["time"] + bi.seen["host"])
    assert "timing eager calls" in capsys.readouterr().out
    bd.report(rows, None)
    assert "CUDA-graph" not in capsys.readouterr().out


def test_read_flush_reaches_the_timing_and_the_rows(tmp_path, monkeypatch):
    """--flush read: the worker sets it before timing and every row's flush column says it."""
    bi = _fake_bi()
    rows = _run_worker(tmp_path, monkeypatch, [_Stand("fa4")], SMALL[:1], ["--flush", "read"], bi)
    assert bi.flush_mode() == "read"
    assert [r["flush"] for r in rows] == ["read"]


def test_time_ms_flush_modes(monkeypatch):
    """set_flush rejects unknown modes; "read" times through the event loop with a pure read of
    the flush buffer (sum), never a write."""
    import bench_impls as bi

    with pytest.raises(ValueError, match="choose from"):
        bi.set_flush("none")
    calls = []
    monkeypatch.setattr(bi, "_events_ms", lambda fn, w, r, flush: calls.append(flush) or 1.5)
    bi.set_flush("read")
    try:
        assert bi.time_ms(lambda: None) == 1.5
    finally:
        bi.set_flush("zero")
    buf = torch.arange(16, dtype=torch.int8)
    before = buf.clone()
    assert int(calls[0](buf)) == int(before.view(torch.int32).sum())
    assert torch.equal(buf, before), "the read flush leaves the buffer as it was"


def test_decode_graphs_argument():
    assert bench.parse_args(["--decode", "--decode-graphs"]).decode_graphs
    assert not bench.parse_args(["--decode"]).decode_graphs
    argv = ["--decode", "--decode-graphs", "--decode-worker", "s.json"]
    assert bd.worker_argv(argv) == ["--decode", "--decode-graphs"], "the worker gets the flag"
    assert bd.config(bench.parse_args(["--decode", "--decode-graphs"]))["cases"]
    with pytest.raises(ValueError, match="--decode-value-checks with --decode-graphs"):
        bd.config(bench.parse_args(["--decode", "--decode-graphs", "--decode-value-checks"]))


def test_worker_times_graph_replays_with_decode_graphs(tmp_path, monkeypatch, capsys):
    """--decode-graphs: after the checked first call each variant is captured (captured again
    each round), its first replay checked, and the replay is what time_ms and host_us get (the
    eager call only for the memory peak); a capture that raises is an error row naming the
    failure, a replay that disagrees a failed row; the notes and the report say how it was
    timed."""
    stands = [
        _Stand("fa4"),
        _Stand(
            "flash-attn-4",
            capture_exc=RuntimeError("operation not permitted when stream is capturing"),
        ),  # fmt: skip
        _Stand("sdpa-cudnn", replay_factor=1.5),
        _Stand("sdpa-flash"),
    ]
    bi = _fake_bi()
    rows = _run_worker(tmp_path, monkeypatch, stands, SMALL[:2], ["--decode-graphs"], bi)
    by = {(r["impl"], r["case"]): r for r in rows}
    assert len(rows) == 8
    for case in SMALL[:2]:
        for impl in ("fa4", "sdpa-flash"):
            r = by[(impl, case.name)]
            assert r["status"] == "ok" and r["ms_rounds"] == "0.2500 0.2500"
            assert r["note"] == f"{impl} note; timed as a CUDA-graph replay"
            assert (r["host_us"], r["peak_extra_mib"]) == ("12.0", "5.0")
        fail = by[("flash-attn-4", case.name)]
        assert fail["status"] == ("error: CUDA-graph capture failed: RuntimeError: operation "
                                  "not permitted when stream is capturing")  # fmt: skip
        assert fail["ms"] == "" and fail["max_abs_diff"] != "" and "replay" not in fail["note"]
        wrong = by[("sdpa-cudnn", case.name)]
        assert wrong["status"].startswith("failed: the CUDA-graph replay's max_abs_diff")
        assert wrong["ms"] == ""
    # per case: fa4 and sdpa-flash captured in each of 2 rounds, the others once
    assert sorted(bi.graph_replay.captured) == sorted(
        ["fa4"] * 4 + ["sdpa-flash"] * 4 + ["flash-attn-4"] * 2 + ["sdpa-cudnn"] * 2
    )
    good = [x for x in bi.graph_replay.replays if x.stand.name != "sdpa-cudnn"]
    assert len(bi.seen["time"]) == 8 and all(any(f is x for x in good) for f in bi.seen["time"])
    assert len(bi.seen["host"]) == 4 and all(isinstance(f, _FakeReplay) for f in bi.seen["host"])
    assert bi.seen["peak"] and not any(isinstance(f, _FakeReplay) for f in bi.seen["peak"])
    assert all(x.calls >= 1 for x in bi.graph_replay.replays), "each replay ran (checked, timed)"
    assert "timing CUDA-graph replays" in capsys.readouterr().out
    bd.report(rows, None)
    assert "timing: CUDA-graph replays (--decode-graphs; 4 of 4 timed rows)" in (
        capsys.readouterr().out)  # fmt: skip


def test_a_sticky_error_in_the_capture_replaces_the_worker(monkeypatch):
    """A CUDA error that loses the context, raised by the capture, is StickyCudaError (the
    worker exits and is replaced), not an error row."""
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    case = SMALL[0]
    k, v = run.dense_kv(case, 1, device="cpu")
    t = run.case_inputs(case, k, v, 1, device="cpu")
    ref = run.reference(t.q, k, v, case.causal)
    args = bench.parse_args(["--decode", "--decode-graphs"])
    sticky = _Stand("fa4", capture_exc=RuntimeError("CUDA error: an illegal memory access"))
    with pytest.raises(run.StickyCudaError, match="illegal memory access"):
        run.measure(_fake_bi(), sticky, case, t, ref, args, lambda: None)
    timed = run.measure(_fake_bi(), _Stand("fa4"), case, t, ref, args, lambda: None)
    assert isinstance(timed, run.Timed) and timed.var.note.endswith(bd.GRAPH_NOTE)


def test_sticky_cuda_errors_are_told_apart():
    assert run._is_sticky(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert run._is_sticky(RuntimeError("CUDA error: unspecified launch failure"))
    assert not run._is_sticky(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to ..."))
    assert not run._is_sticky(RuntimeError("No available kernel. Aborting execution."))


FAKE_WORKER = """
import json, os, sys, time
sys.path.insert(0, {bench!r})
import bench_decode as bd
args = sys.argv[1:]
state = json.load(open(args[args.index("--decode-worker") + 1]))
out = args[args.index("--out") + 1]
cases = bd.cases(("spec",))
excluded = {{(x["impl"], x["family"]): x for x in state["exclude"]}}
for idx in range(state["start"], len(cases)):
    rows = []
    for impl in ("fa4", "sdpa-cudnn"):
        with open(os.path.join(out, "decode_progress.json"), "w") as f:
            json.dump({{"case": idx, "impl": impl}}, f)
        ex = excluded.get((impl, cases[idx].family))
        if ex:
            if ex["case"] != idx:
                rows.append(bd.make_row(impl, cases[idx], status="skipped: excluded"))
            continue
        mode = os.environ.get("FAKE_MODE", "abort")
        if mode == "slow" or (impl == "fa4" and idx == 1 and mode == "hang"):
            time.sleep(60)
        if impl == "fa4" and idx == 1:
            os.abort()  # a crash inside fa4 at the second case
        rows.append(bd.make_row(impl, cases[idx], ms=0.2, hbm_peak=3350.0))
    bd.append_rows(os.path.join(out, "results.csv"), rows)
"""


def _supervise(tmp_path, monkeypatch, mode, *extra):
    fake = tmp_path / "fake_worker.py"
    fake.write_text(textwrap.dedent(FAKE_WORKER.format(bench=str(BENCH.parent))))
    monkeypatch.setenv("FAKE_MODE", mode)
    out = tmp_path / "out"
    argv = ["--decode", "--decode-cases", "spec", "--out", str(out), *extra]
    sup = bd.Supervisor(bench.parse_args(argv), argv, worker_cmd=[sys.executable, str(fake)])
    with contextlib.redirect_stderr(sys.stdout):
        assert sup.run() == 0
    return bd.read_csv(out / "results.csv")


def test_supervisor_replaces_a_crashed_worker(tmp_path, monkeypatch, capsys):
    rows = _supervise(tmp_path, monkeypatch, "abort")
    got = sorted((r["case"].split()[0], r["impl"], r["status"].split(":")[0]) for r in rows)
    assert got == [("spec2", "fa4", "ok"), ("spec2", "sdpa-cudnn", "ok"),
                   ("spec4", "fa4", "error"), ("spec4", "sdpa-cudnn", "ok"),
                   ("spec8", "fa4", "skipped"), ("spec8", "sdpa-cudnn", "ok")]  # fmt: skip
    err = next(r for r in rows if r["status"].startswith("error"))
    assert "died (signal SIGABRT)" in err["status"] and "in fa4 at spec4" in err["status"]
    assert "new worker from case 1" in capsys.readouterr().out
    assert len(rows) == 6, "the crashed case is measured once, by the second worker"


def test_supervisor_replaces_a_hung_worker(tmp_path, monkeypatch):
    t0 = time.time()
    rows = _supervise(tmp_path, monkeypatch, "hang", "--decode-step-timeout-s", "1")
    assert time.time() - t0 < 20
    err = [r for r in rows if r["status"].startswith("error")]
    assert len(err) == 1 and "hung (no progress for 1 s) in fa4 at spec4" in err[0]["status"]
    assert sum(r["status"] == "ok" for r in rows) == 4


def test_supervisor_stops_a_worker_past_the_hard_stop(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bd, "HARD_STOP_GRACE_S", 0.5)
    t0 = time.time()
    rows = _supervise(tmp_path, monkeypatch, "slow", "--stop-s", "0")
    assert time.time() - t0 < 20 and rows == []
    assert "was stopped" in capsys.readouterr().out


def test_fa4_impl_calls_attention_with_kvcache(monkeypatch):
    """fa4's call: the cache (or the pools and page table), cache_seqlens, causal, num_splits,
    backend sm90; the checked first call runs the value checks, the timed calls skip them
    (fa4.value_checks.values_checked), unless --decode-value-checks."""
    seen = []
    state = {"skip": False}

    @contextlib.contextmanager
    def values_checked():
        state["skip"] = True
        try:
            yield
        finally:
            state["skip"] = False

    def attention_with_kvcache(q, k, v, seqlens, **kw):
        seen.append((k, kw["page_table"], kw["causal"], kw["num_splits"], kw["backend"],
                     state["skip"]))  # fmt: skip
        return q.clone()

    checks = types.SimpleNamespace(values_checked=values_checked)
    fake = types.SimpleNamespace(attention_with_kvcache=attention_with_kvcache, value_checks=checks)
    monkeypatch.setitem(sys.modules, "fa4", fake)
    case = bd.Case("paged", 2, 64, 1, 2, 16, page_size=16, heads_q=8)
    k, v = run.dense_kv(case, 1, device="cpu")
    t = run.case_inputs(case, k, v, 1, device="cpu")
    (var,) = run.Fa4("fa4-splits4", 4).variants(case, t)
    var.check_fn()
    var.fn()
    assert [s[1:] for s in seen] == [(t.page_table, False, 4, "sm90", False),
                                     (t.page_table, False, 4, "sm90", True)]  # fmt: skip
    assert seen[0][0] is t.k_pool and "skipped while timed" in var.note
    seen.clear()
    (var,) = run.Fa4("fa4", 0, value_checks=True).variants(bd.Case("decode", 2, 64, 1, 2, 16), t)
    var.fn()
    assert seen[0][0] is t.k and seen[0][1] is None and seen[0][3:] == (0, "sm90", False)
    assert "value checks on while timed" in var.note
