"""The decode kernel (csrc/decode) as the build compiles it, for both archs it is built for:
sm_90a (run by tests/gpu/test_decode.py on H100 / H200) and sm_100a (compiled, not executed).
Each instance is the manifest's (sass_helpers.compile_instance); the SASS must show the design:
tensor-core MMAs from ldmatrix'd shared memory (HMMA, LDSM), 16-byte cp.async row chunks
(LDGSTS) completing an mbarrier, no spills, and registers within the occupancy that
decode/plan.h's ctas_per_sm promises (__launch_bounds__ enforces it; this pins it).
"""

import re

import pytest
from sass_helpers import compile_ahead, compile_instance, entries, functions

pytestmark = pytest.mark.build

CASES = [("128", "bf16", "90a"), ("256", "bf16", "90a"), ("128", "fp16", "100a"),
         ("256", "bf16", "100a"), ("64", "bf16", "90a")]  # fmt: skip
compile_ahead(__name__, [("decode", "fwd", h, t) for h, t, _ in CASES])

# 65536 registers per SM over ctas_per_sm CTAs of 160 threads (decode/plan.h): hd64 3 CTAs
# (its 16-row tile), hd128 2, hd256 1 (255, the ISA's cap).
REG_CAP = {"64": 136, "128": 204, "256": 255}


@pytest.mark.parametrize("hdim,dtype,arch", CASES)
def test_decode_sass(tmp_path_factory, hdim, dtype, arch):
    ptxas, sass = compile_instance(tmp_path_factory, "decode", "fwd", hdim, dtype, arch=arch)
    reports = {n: r for n, r in entries(ptxas, arch).items() if "decode_kernel" in n}
    assert len(reports) == 3, f"one kernel per tile shape (warps_n 4, 2, 1), got {list(reports)}"
    for name, r in reports.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)
        cap = REG_CAP[hdim] if "Li4EE" in name or hdim != "64" else 204
        assert r["registers"] <= cap, (name, r)
    kernels = {n: f for n, f in functions(sass).items() if "decode_kernel" in n}
    assert len(kernels) == 3
    for name, text in kernels.items():
        assert re.search(r"\bHMMA\.16816\.F32", text), f"{name}: no m16n8k16 tensor-core MMA"
        assert "LDSM" in text, f"{name}: no ldmatrix"
        assert "LDGSTS" in text, f"{name}: no cp.async (Note [row gather])"
        assert "SYNCS" in text, f"{name}: no mbarrier operation"
