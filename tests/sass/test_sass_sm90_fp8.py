"""The SM90 FP8 (e4m3) forward (csrc/sm90/fwd/kernel.cuh with an e4m3 element, Note [fp8
forward] and Note [fp8 P layout]) as the build compiles it for sm_90a: e4m3 wgmma for S (both
operands from shared memory) and for P·V (P from registers, Vᵀ K-major), P packed with
cvt.rn.satfinite.e4m3x2, a bf16 out, and the Vᵀ kernel beside it. Written and compiled; its GPU
tests are tests/gpu/test_fp8_fwd_gpu.py. Runs in CI (CPU machine) with nvcc and cuobjdump.
"""

import re

import pytest
from sass_helpers import compile_ahead, compile_instance, entries, functions

pytestmark = pytest.mark.build
HDIMS = ("64", "128", "256")
compile_ahead(__name__, [("sm90", "fwd", h, "e4m3") for h in HDIMS])


def compiled(tmp_path_factory, hdim):
    return compile_instance(tmp_path_factory, "sm90", "fwd", hdim, "e4m3", arch="90a")


@pytest.mark.parametrize("hdim", HDIMS)
def test_kernels(tmp_path_factory, hdim):
    """The attention kernel and the Vᵀ kernel (sm90/fwd/fp8_vt.cuh)."""
    names = list(entries(compiled(tmp_path_factory, hdim)[0], "90a"))
    assert len([n for n in names if "fwd_kernel" in n and "float_e4m3_t" in n]) == 1, names
    assert len([n for n in names if "fp8_transpose_v" in n]) == 1, names


@pytest.mark.parametrize("hdim", HDIMS)
def test_e4m3_wgmma_and_packing(tmp_path_factory, hdim):
    _, sass = compiled(tmp_path_factory, hdim)
    (body,) = [b for n, b in functions(sass).items() if "fwd_kernel" in n]
    gmma = set(re.findall(r"(\w+GMMA)\.64x\d+x32\.F32\.(\w+)\.(\w+) ", body))
    assert gmma == {("QGMMA", "E4M3", "E4M3")}, gmma
    # S: A and B from shared memory (one gdesc pair); P·V: A (P) from registers, Vᵀ by gdesc
    assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, gdesc\[UR\d+\]", body)
    assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc\[UR\d+\]", body)
    assert re.search(r"F2FP\.SATFINITE\.E4M3\.F32\.PACK_AB", body)
    assert re.search(r"F2FP\.BF16\.F32\.PACK_AB", body), "bf16 out"
    assert "HGMMA" not in body


@pytest.mark.parametrize("hdim", ["128", "256"])
def test_no_spill(tmp_path_factory, hdim):
    """hd 128 and 256 (two consumer warpgroups): no spill at all; hd 64's three consumers at
    160 registers spill 72 bytes (nvcc 13.0), not held here."""
    ptxas, _ = compiled(tmp_path_factory, hdim)
    (report,) = [e for n, e in entries(ptxas, "90a").items() if "fwd_kernel" in n]
    assert report["spill_stores"] <= (0 if hdim == "128" else 12), ptxas
