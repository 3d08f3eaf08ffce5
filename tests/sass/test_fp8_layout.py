"""Note [fp8 P layout] (csrc/sm90/fwd/fp8_vt.cuh) held to CuTe's layouts on the CPU: the FP8
forward's consumer copies its S accumulator into the A fragment of the e4m3 P·V wgmma by a
register renaming (fp8_a_source), and its Vᵀ permutes each 32-key chunk (fp8_key_of) so that
every A element meets the key its value belongs to. tests/cpp/fp8_layout_harness.cu checks every
element of every thread of a warpgroup for the block shapes the FP8 instances use; the harness
is a host program (nvcc), so this runs without a GPU.
"""

import pytest
from helpers import ROOT
from sass_helpers import run_host_harness

pytestmark = pytest.mark.build


def test_fp8_p_layout_matches_cute(tmp_path):
    out = run_host_harness(tmp_path, "fp8_layout_harness.cu")
    lines = out.split("\n")
    assert [line.split(" elements")[0] for line in lines if line] == [
        "ok kBlockN=128 d_v=128",
        "ok kBlockN=192 d_v=128",
        "ok kBlockN=128 d_v=64",
        "ok kBlockN=96 d_v=256",
        "ok kBlockN=64 d_v=256",
        "ok varlen Vt layout",
    ]


def test_vt_permutation_is_a_bijection_per_chunk():
    key_of = [
        16 * (k // 16) + 2 * ((k % 16) // 4) + (k % 2) + 8 * ((k % 4) // 2) for k in range(32)
    ]
    assert sorted(key_of) == list(range(32))
    src = (ROOT / "csrc/sm90/fwd/fp8_vt.cuh").read_text()
    assert "return 16 * (k / 16) + 2 * ((k % 16) / 4) + (k % 2) + 8 * ((k % 4) / 2);" in src
