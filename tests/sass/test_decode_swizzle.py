"""Note [tma blocks] (csrc/decode/kernel.cuh) held to the hardware's swizzle on the CPU: the
decode TMA producer's consumers and row gather address a stage through swizzled<Layout, bytes>,
which must put each 16-byte chunk where TMA's 128-byte swizzle writes it, cover the tile once,
and give ldmatrix's 8 rows 8 distinct bank groups (tests/cpp/decode_swizzle_harness.cu, a host
program built with nvcc). Its first version applied the swizzle to element offsets and was wrong
for 16-bit caches (GMMA's atoms swizzle byte addresses); this is the test that caught it."""

import subprocess

import pytest
from helpers import ROOT, find_tool
from sass_helpers import cutlass_include

pytestmark = pytest.mark.build


def test_decode_swizzle_matches_tma(tmp_path):
    nvcc = find_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the harness needs CuTe's layouts compiled")
    exe = tmp_path / "decode_swizzle"
    subprocess.run(
        [nvcc, "-std=c++20", "-arch=sm_90a", f"-I{ROOT / 'csrc'}", f"-I{cutlass_include()}",
         str(ROOT / "tests/cpp/decode_swizzle_harness.cu"), "-o", str(exe)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    names = [line.removeprefix("ok ") for line in run.stdout.splitlines()]
    assert names == ["bf16 d64", "bf16 d96", "bf16 d128", "bf16 d192", "bf16 d256", "e4m3 d64",
                     "e4m3 d128", "e4m3 d256"]  # fmt: skip
