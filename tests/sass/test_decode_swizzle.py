"""Note [tma blocks] (csrc/decode/plan.h, copy.cuh) held to the hardware's swizzle on the CPU: the
decode TMA producer's consumers and row gather address a stage through swizzled<Layout, bytes>,
which must put each 16-byte chunk where TMA's 128-byte swizzle writes it, cover the tile once,
and give ldmatrix's 8 rows 8 distinct bank groups (tests/cpp/decode_swizzle_harness.cu, a host
program built with nvcc). Its first version applied the swizzle to element offsets and was wrong
for 16-bit caches (GMMA's atoms swizzle byte addresses); this is the test that caught it."""

import pytest
from sass_helpers import run_host_harness

pytestmark = pytest.mark.build


def test_decode_swizzle_matches_tma(tmp_path):
    out = run_host_harness(tmp_path, "decode_swizzle_harness.cu")
    names = [line.removeprefix("ok ") for line in out.splitlines()]
    assert names == ["bf16 d64", "bf16 d96", "bf16 d128", "bf16 d192", "bf16 d256", "e4m3 d64",
                     "e4m3 d96", "e4m3 d128", "e4m3 d192", "e4m3 d256"]  # fmt: skip


def test_decode_fp8_fragments(tmp_path):
    """Note [fp8 fragments]: the FP8 cache's K and V fragments, converted in registers from the
    stage's e4m3 bytes, give Q Kᵀ (with the query tile in fp8_q_order) and P V (with O's columns
    as fp8_o_column and the epilogue take them), lane by lane as ldmatrix and mma.sync
    distribute them (tests/cpp/decode_fp8_fragment_harness.cu)."""
    out = run_host_harness(tmp_path, "decode_fp8_fragment_harness.cu")
    assert out.split() == ["ok", "S", "ok", "O"]
