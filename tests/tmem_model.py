"""A CPU model of SM100 tensor memory for the data-flow replays of the SM100 kernels
(tests/test_sm100_bwd_dataflow.py, tests/test_sm100_fwd_dataflow.py): 128 lanes x 512 columns,
a column holding one fp32 value or two 16-bit values; writing one kind destroys the other (NaN),
so a plan that overwrites a value before its reader gives NaN or wrong results."""

import math

import torch

N_LANES = 128


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
