"""fa4.perfmodel: hand-computed cases of the per-tile arithmetic, monotonicity, the scheduler
simulation, the emulation table, and the documented tables (docs/perfmodel.md) regenerated from
the model, so the docs cannot drift from it. CPU only, standard library only."""

import importlib.util
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fa4 import perfmodel as pm

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "bench" / "results" / "2026-11-29-fa4-fwd-sm90.csv"
DOC = (ROOT / "docs" / "perfmodel.md").read_text()

H200_PEAK = replace(pm.H200, mma_eff=1.0)
B200_PEAK = replace(pm.B200, mma_eff=1.0)


def test_mma_cycles_of_one_tile_by_hand():
    # 128 x 128 x 128: two GEMMs of 2·128³ FLOP each at 4096 (SM90) / 8192 (SM100) FLOP/clk
    assert pm.mma_cycles(pm.sm90_config(128, arch=H200_PEAK)) == 2 * 2 * 128**3 / 4096 == 2048
    assert pm.mma_cycles(pm.sm100_config(128, arch=B200_PEAK)) == 1024
    # at the measured GEMM ceiling: 2048 / (790 / 989.4)
    assert pm.mma_cycles(pm.sm90_config(128)) == pytest.approx(2048 * 989.4 / 790)
    # hd256 on SM90 uses kBlockN 64: half the keys per block, the same MMA cycles
    assert pm.mma_cycles(pm.sm90_config(256, arch=H200_PEAK)) == 2048


def test_mufu_cycles_by_hand():
    assert pm.mufu_cycles(pm.sm90_config(128)) == 128 * 128 / 16 == 1024
    assert pm.mufu_cycles(pm.sm90_config(128, emu=0.25)) == 768
    assert pm.mufu_cycles(pm.sm90_config(256)) == 512  # 128 x 64


def test_sm90_issue_cycles_from_the_sass_counts():
    # per thread per block at hd128: 64 S elements x 4.5 + 64 O elements x 1 + 200 fixed = 552
    # (the SASS count); 256 threads -> 141312 thread-instructions / 128 per clock
    u = pm.tile_units(pm.sm90_config(128))
    assert u["issue"] == (16384 * 4.5 + 16384 * 1 + 256 * 200) / 128 == 1104
    assert u["smem"] == (32768 + 2 * 65536 + 65536) / 128 == 1792  # Q + 2 x (K, V) + TMA writes


def test_emulation_balance_by_hand():
    # SM100 FA4, hd128: MUFU 1024 (1 - e); issue = 128 (3.55 + 8 e) + 40 + 0.1 · 0.56 · 128
    # (conditional rescale of 10 % of the blocks) = 501.568 + 1024 e, above the ALU
    # (384 + 1280 e) and FP32 (268.8 + 896 e) lines there: the crossing is at e = 522.432 / 2048
    e = pm.emu_balance(pm.sm100_config(128, emu=0.0))
    assert e == pytest.approx(522.432 / 2048, abs=1e-6)
    # SM90: the issue slots (1104) already exceed MUFU (1024) with no emulation: balance at 0
    assert pm.emu_balance(pm.sm90_config(128)) == 0.0


@pytest.mark.parametrize("cfg", [pm.sm90_config(128), pm.sm100_config(64), pm.sm100_config(256)])
def test_more_emulation_moves_work_from_mufu_to_the_fma_side(cfg):
    prev = None
    for k in range(17):
        u = pm.tile_units(replace(cfg, emu=k / 16))
        if prev:
            assert u["mufu"] < prev["mufu"]
            for unit in ("fp32", "alu", "issue"):
                assert u[unit] > prev[unit]
            assert u["mma"] == prev["mma"] and u["smem"] == prev["smem"]
        prev = u


def test_causal_halves_the_flops_and_the_blocks():
    assert pm.fwd_flops(2, 3, 1024, 128, True) == pm.fwd_flops(2, 3, 1024, 128, False) / 2
    for hdim in (128, 256):  # kBlockN 128 and 64
        cfg = pm.sm90_config(hdim, causal=True, seqlen=2048)
        n_m = 2048 // 128
        visited = [sum(pm.blocks_of_tile(cfg, m)) for m in range(n_m)]
        per_tile = 128 // cfg.n
        assert visited == [(m + 1) * per_tile for m in range(n_m)]
        assert [pm.blocks_of_tile(cfg, m)[1] for m in range(n_m)] == [per_tile] * n_m
        full = sum(pm.blocks_of_tile(replace(cfg, causal=False), m)[0] for m in range(n_m))
        assert sum(visited) / full == pytest.approx((n_m + 1) / (2 * n_m))


def test_schedule_order_matches_tile_scheduler():
    cfg = pm.sm90_config(128, causal=True, seqlen=384, batch=1, heads=2)
    # K, V of 384 tokens (192 KB per pair) fit the L2 many times: one section of both pairs,
    # m_block descending, the pair fastest (common/tile_scheduler.cuh, Note [LPT order])
    assert pm.schedule_order(cfg, 3) == [2, 2, 1, 1, 0, 0]
    assert pm.schedule_order(replace(cfg, causal=False), 3) == [0, 1, 2, 0, 1, 2]
    assert pm.lpt_section_heads(50 << 20, 16384, 256, 256, 2) == 1  # the hd256 16k case


def test_noncausal_makespan_is_whole_waves():
    cfg = pm.sm90_config(128, seqlen=1024)  # 16 x 16 heads x 8 tiles = 2048 tiles on 132 SMs
    span, balanced = pm.makespan_us(cfg)
    cost = pm.tile_costs_us(cfg)[0]
    assert span == pytest.approx(math.ceil(2048 / 132) * cost)
    assert balanced == pytest.approx(2048 / 132 * cost)


def test_policies_are_ordered():
    for cfg in (pm.sm90_config(64), pm.sm90_config(256, causal=True), pm.sm100_config(128)):
        tf = {p: pm.steady_tflops(replace(cfg, policy=p)) for p in pm.POLICIES}
        assert tf["serial"] <= tf["partial"] <= tf["overlapped"]
        assert tf["pingpong"] <= tf["overlapped"]


def test_emulation_table_is_the_models_choice():
    assert pm.EMU_SIXTEENTHS == pm.computed_emu_table()
    assert all(k == 0 for (arch, _), k in pm.EMU_SIXTEENTHS.items() if arch == "sm90")
    assert 2 <= pm.EMU_SIXTEENTHS[("sm100", 128)] <= 5  # the FA4 paper's ~10-30 %


def test_sm90_emulation_only_costs_as_measured():
    # docs/decisions.md: 0, 3/16, 6/16 -> 595, 547, 500 at hd128 16k; the serial policy (the
    # kernel as measured) predicts the same direction, the overlapped one (wrongly) no change
    tf = [pm.predict(pm.sm90_config(128, emu=k / 16)).tflops for k in (0, 3, 6)]
    assert tf[0] > tf[1] > tf[2]
    assert 0.90 < tf[1] / tf[0] < 0.95
    ovl = [pm.predict(pm.sm90_config(128, emu=k / 16, policy="overlapped")).tflops for k in (0, 6)]
    assert ovl[1] / ovl[0] > 0.99


def test_validation_runs_on_the_committed_csv():
    checks = pm.validate(CSV)
    assert len(checks) == 12
    for c in checks:
        assert all(math.isfinite(x) and x > 0 for x in (c.measured, c.serial, c.overlapped))
        assert math.isfinite(c.hidden())
    summary = pm.validation_summary(CSV)
    assert summary.startswith("12 points")
    print(summary)  # the max error, for the test log


def test_peers_stay_under_the_overlapped_bound():
    assert pm.read_measured(CSV, "flash-attn-4")
    for line in pm.peer_table(CSV).splitlines()[2:]:
        assert float(line.split("|")[-2]) < 1.0, line


def test_asymmetric_scaling_picture():
    b128, b192 = pm.asymmetry_row(pm.B200, 128), pm.asymmetry_row(pm.B200, 192)
    h128 = pm.asymmetry_row(pm.H200, 128)
    # B200: exp + the rest of the softmax exceed the MMA by 25-60 % at the common head dims
    assert 0.25 <= b192["sum"] / b192["mma"] - 1 <= 0.65
    assert 0.25 <= b128["sum"] / b128["mma"] - 1 <= 0.65
    # H100/H200: the same work fits under the MMA at hd128
    assert h128["sum"] <= h128["mma"]
    assert pm.asymmetry_row(pm.H100, 128) == h128  # per tile, H100 and H200 are one SM


@pytest.mark.parametrize(
    "table",
    [
        lambda: pm.validation_table(CSV),
        lambda: pm.validation_summary(CSV),
        lambda: pm.peer_table(CSV),
        pm.history_table,
        pm.emu_ab_table,
        pm.sm100_table,
        pm.sm100_sensitivity,
        pm.asymmetry_table,
        pm.emu_table_text,
        pm.unit_rate_table,
    ],
)
def test_documented_tables_match_the_model(table):
    text = table()
    assert text in DOC, f"docs/perfmodel.md is stale; regenerate this table:\n{text}"


def test_cli_prints_the_breakdown(capsys):
    pm.main(["--arch", "sm90", "--hdim", "128", "--seqlen", "16384", "--emu", "0.25"])
    out = capsys.readouterr().out
    assert "bound: mma+softmax" in out and "mufu" in out and "by policy" in out
    pm.main(["--arch", "sm100", "--hdim", "64", "--causal", "--two-cta", "--block-n", "64"])
    assert "2-CTA" in capsys.readouterr().out


def test_import_needs_only_the_standard_library():
    code = (
        "import importlib.util, sys\n"
        f"pkg = {str(ROOT / 'fa4/perfmodel')!r}\n"
        "spec = importlib.util.spec_from_file_location(\n"
        "    'pm', pkg + '/__init__.py', submodule_search_locations=[pkg])\n"
        "m = sys.modules['pm'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "print(sorted({'numpy', 'matplotlib', 'torch'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert importlib.util.find_spec("fa4.perfmodel") is not None


def test_sm90_kernel_default_is_the_tables():
    # the SM90 traits compile with one kEmuSixteenths for every head dim (sm90/fwd/traits.cuh):
    # the kEmuSixteenths_ template parameter's default, which the kernels launch
    src = (ROOT / "csrc" / "sm90/fwd/traits.cuh").read_text()
    assert "static constexpr int kEmuSixteenths = kEmuSixteenths_;" in src
    (value,) = re.findall(r"int kEmuSixteenths_ = (\d+)>", src)
    assert {k for (arch, _), k in pm.EMU_SIXTEENTHS.items() if arch == "sm90"} == {int(value)}


# --- backward (fa4/perfmodel/backward.py), hand-computed --------------------------------------


def test_bwd_gemm_flops_and_units_hd128():
    from fa4.perfmodel import backward as bw
    from fa4.perfmodel.model import H200

    cfg = bw.BwdConfig(H200, 128)
    assert cfg.n == 128 and not cfg.split
    assert bw.gemm_flops(cfg) == {k: 2 * 128 * 64 * 128 for k in ("s", "dp", "dv", "dk", "dq")}
    u = bw.iteration_units(cfg)
    rate = 4096 * 790 / 989.4  # FLOP/clk at the measured GEMM efficiency
    assert u["s"] == pytest.approx(2 * 128 * 64 * 128 / rate)  # MMA-bound: smem 65536 B = 512 clk
    assert u["mufu"] == 128 * 64 / 16
    # five GEMMs + P hidden under dP (512 < 641) + dS issue (8192 * 3.5 / 128) + sync
    assert bw.period(cfg) == pytest.approx(5 * u["s"] + 224 + bw.SYNC_CLK)


def test_bwd_split_variant_for_large_head_dims():
    from fa4.perfmodel import backward as bw
    from fa4.perfmodel.model import H200

    cfg = bw.BwdConfig(H200, 192, hdim_v=128)
    assert cfg.split and cfg.n == 64 and cfg.dv == 128
    # Sᵀ: all of K (64 x 192) per warpgroup and half of Q each: (2·64·192 + 64·192)·2 bytes
    assert bw.gemm_smem_bytes(cfg)["s"] == (2 * 64 * 192 + 64 * 192) * 2


def test_bwd_causal_iterations_and_flops():
    from fa4.perfmodel import backward as bw
    from fa4.perfmodel.model import H200

    cfg = bw.BwdConfig(H200, 128, causal=True, seqlen=256, batch=1, heads=1)
    assert bw.cta_iterations(cfg) == [4, 2]  # Q blocks at or below each 128-row tile's diagonal
    assert bw.bwd_flops(1, 1, 256, 128, True) == 2.5 * 4 * 256 * 256 * 128 / 2


def test_bwd_validate_reads_only_fa4_backward_rows():
    from fa4.perfmodel import backward as bw

    rows = [
        {"impl": "fa4", "direction": "bwd", "hdim": "128", "causal": "0", "seqlen": "16384",
         "tflops": "500", "status": "ok"},
        {"impl": "fa4", "direction": "fwd", "hdim": "128", "causal": "0", "seqlen": "16384",
         "tflops": "600", "status": "ok"},
        {"impl": "sdpa-cudnn", "direction": "bwd", "hdim": "128", "causal": "0",
         "seqlen": "16384", "tflops": "530", "status": "ok"},
    ]  # fmt: skip
    (got,) = bw.validate(rows)
    assert got[:4] == (128, False, 16384, 500.0)
    assert got[5] == pytest.approx((got[4] - 500) / 500)


def test_roofline_places_every_configuration():
    """Operational intensity of the non-causal forward is s / 2 FLOP per byte (4·b·h·s²·d FLOP
    over 8·b·h·s·d bytes of Q, K, V, O); the datasheet roof is 132 × 4096 × 1.83 GHz on H200;
    every predicted point is under both its MMA and its softmax roof; on B200 the FA4 techniques
    lift the softmax roof above the FA3-style one."""
    from fa4.perfmodel.model import B200, H200
    from fa4.perfmodel.reports import roofline

    h = roofline(H200)
    assert abs(h["peak"] - 132 * 4096 * 1.83e-3) < 1e-6 and h["hbm_tbs"] == 4.3
    assert len(h["points"]) == 9 and {p.style for p in h["points"]} == {"fa4"}
    b = roofline(B200)
    assert len(b["points"]) == 18
    for r in (h, b):
        for p in r["points"]:
            assert p.intensity == p.seqlen / 2
            assert p.tflops <= min(r["achievable"], p.softmax_roof) * 1.0001, p
    roofs = {(p.hdim, p.style): p.softmax_roof for p in b["points"]}
    for d in (64, 128):
        assert roofs[(d, "fa4")] > roofs[(d, "fa3")], d


def test_sm100_kernel_default_is_the_table():
    # sm100/fwd/kernel.cuh: kEmuSixteenths = kHeadDim <= LIMIT && !kFp8 ? A : B, the model's
    # table for the 16-bit kernels (the FP8 forward takes B: every exponential on MUFU)
    src = (ROOT / "csrc" / "sm100/fwd/kernel.cuh").read_text()
    m = re.search(r"kEmuSixteenths = kHeadDim <= (\d+) && !kFp8 \? (\d+) : (\d+);", src)
    assert m, "kEmuSixteenths of the SM100 forward not found"
    limit, below, above = map(int, m.groups())
    for (arch, d), k in pm.EMU_SIXTEENTHS.items():
        if arch == "sm100":
            assert k == (below if d <= limit else above), (d, k)
