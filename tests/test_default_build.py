"""The default build (setup.py's FA4_CUDA_ARCHS "90a;100a", every head dim) compiles host code
for each kernel translation unit, which the SASS tests (device code only, `nvcc -cubin`) never
do. Until 2026-12-01 the SM100 files failed there: their templates call tcgen05 helpers that
tmem.cuh declared for the device pass only ("identifier tmem_wait_ld is undefined"), so a
default `pip install` with a CUDA toolkit could not build. `nvcc -cuda` runs the front end of
both passes (no ptxas), which is where that failed.

Runs in CI (CPU machine) with nvcc.
"""

import subprocess

import pytest
from test_sass_sm90 import ROOT, _cutlass_include, _tool

pytestmark = pytest.mark.build

ARCHS = ("90a", "100a")  # setup.py's default


@pytest.mark.parametrize("source", ["csrc/fwd_sm100.cu", "csrc/bwd_sm100.cu"])
def test_sm100_sources_compile_host_code(tmp_path, source):
    nvcc = _tool("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    cmd = [nvcc, "-cuda", str(ROOT / source), "-o", str(tmp_path / "out.ii"), "-std=c++17",
           "--expt-relaxed-constexpr", "-DNDEBUG", *gencode, f"-I{ROOT / 'csrc'}",
           f"-I{_cutlass_include()}", "-DFA4_HDIM_64", "-DFA4_HDIM_256"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
