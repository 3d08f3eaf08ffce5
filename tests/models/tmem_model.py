"""A CPU model of SM100 tensor memory for the data-flow replays of the SM100 kernels
(tests/models/test_sm100_bwd_dataflow.py, test_sm100_fwd_dataflow.py,
test_sm100_fwd2_dataflow.py): 128 lanes x 512 columns, a column holding one fp32 value or two
16-bit values; writing one kind destroys the other (NaN), so a plan that overwrites a value
before its reader gives NaN or wrong results. Also the TMEM column plans of the C++ headers
(FwdTmemPlan, the 2-CTA forward's included, and BwdTmemPlan), printed by the host harnesses
tests/cpp/tmem_plan_harness.cpp and bwd_tmem_plan_harness.cpp, which those replays and
test_tmem_plan.py read. Imported as models.tmem_model (pyproject.toml: pythonpath = ["tests"])."""

import math
import subprocess

import torch
from helpers import ROOT, build_gxx

N_LANES = 128
FWD_KEYS = "d_v block_n q_tiles s0 s1 o0 o1 p_cols end alloc".split()
BWD_KEYS = "d hdv block_m slice_d slice_dv s dp dq dk dv end alloc".split()
_PRINTED: dict[str, str] = {}  # harness -> its output, once per pytest run


def _harness_output(tmp_path_factory, harness: str) -> str:
    if harness not in _PRINTED:
        exe = build_gxx(ROOT / "tests/cpp" / harness, tmp_path_factory.mktemp("tmem_plan") / "p")
        run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
        _PRINTED[harness] = run.stdout
    return _PRINTED[harness]


def fwd_plans(tmp_path_factory) -> list[dict[str, int]]:
    """The forward's plan per head dim (FWD_KEYS), in the harness's order (d_v ascending)."""
    out = _harness_output(tmp_path_factory, "tmem_plan_harness.cpp")
    return [dict(zip(FWD_KEYS, map(int, line.split()), strict=True))
            for line in out.splitlines() if not line.startswith("pair ")]  # fmt: skip


def fwd_pair_plans(tmp_path_factory) -> list[dict[str, int]]:
    """The 2-CTA forward's plan of each CTA (FwdTraits2::Plan = FwdTmemPlan<d_v, 128>), per
    d_v (192, 256), FWD_KEYS."""
    out = _harness_output(tmp_path_factory, "tmem_plan_harness.cpp")
    return [dict(zip(FWD_KEYS, map(int, line.split()[1:]), strict=True))
            for line in out.splitlines() if line.startswith("pair ")]  # fmt: skip


def parse_bwd_plans(out: str) -> list[dict]:
    """bwd_tmem_plan_harness's lines: BWD_KEYS, then the P / dS slice column of each 16-row K
    slice ("slices")."""
    plans = []
    for line in out.splitlines():
        v = list(map(int, line.split()))
        n = len(BWD_KEYS)
        plans.append({**dict(zip(BWD_KEYS, v[:n], strict=True)), "slices": v[n:]})
    return plans


def bwd_plans(tmp_path_factory) -> list[dict]:
    """The backward's plan per head-dim pair, in the harness's order."""
    return parse_bwd_plans(_harness_output(tmp_path_factory, "bwd_tmem_plan_harness.cpp"))


class Tmem:
    """fp32 columns, or two 16-bit halves per column (which destroy the fp32 value)."""

    def __init__(self):
        self.f32 = torch.full((N_LANES, 512), math.nan, dtype=torch.float64)
        self.lo = torch.full((N_LANES, 512), math.nan, dtype=torch.float64)
        self.hi = torch.full((N_LANES, 512), math.nan, dtype=torch.float64)

    def write32(self, col, x):  # x: (128, n) fp32 values into columns [col, col + n)
        n = x.shape[1]
        self.f32[:, col : col + n] = x
        self.lo[:, col : col + n] = math.nan
        self.hi[:, col : col + n] = math.nan

    def read32(self, col, n):
        return self.f32[:, col : col + n].clone()

    def write32_lanes(self, col, x, lanes):  # x: (len(lanes), n) into those lanes only
        n = x.shape[1]
        self.f32[lanes, col : col + n] = x
        self.lo[lanes, col : col + n] = math.nan
        self.hi[lanes, col : col + n] = math.nan

    def write16(self, col, x):  # x: (128, 2n) 16-bit values into columns [col, col + n)
        n = x.shape[1] // 2
        self.lo[:, col : col + n] = x[:, 0::2]
        self.hi[:, col : col + n] = x[:, 1::2]
        self.f32[:, col : col + n] = math.nan

    def read16(self, col, n_elems):
        n = n_elems // 2
        out = torch.empty(N_LANES, n_elems, dtype=torch.float64)
        out[:, 0::2], out[:, 1::2] = self.lo[:, col : col + n], self.hi[:, col : col + n]
        return out
