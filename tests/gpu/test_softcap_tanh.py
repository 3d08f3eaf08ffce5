"""Note [softcap tanh] on the GPU: the error of the kernels' softcap_tanh (tanh.approx.f32,
csrc/common/softmax.cuh) that the Note and docs/numerics.md state, measured through
tests/cpp/softcap_tanh_harness.cu built with the kernels' --use_fast_math. Its SASS (one
MUFU.TANH, with and without fast math): tests/sass/test_sass_softcap_tanh.py.
"""

import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import need_tool

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests/cpp/softcap_tanh_harness.cu"


def _inputs():
    rng = np.random.default_rng(0)
    dense = np.linspace(-12.0, 12.0, 200001, dtype=np.float32)
    small = np.float32(10.0) ** rng.uniform(-8, 0, 20000).astype(np.float32)
    return np.concatenate([dense, small, -small, np.float32([0.0, 40.0, -40.0, 1e30, -1e30])])


@pytest.mark.gpu
@pytest.mark.build
def test_device_softcap_tanh_error(tmp_path):
    """The error Note [softcap tanh] states, on the GPU: at most 2^-10.9 absolute (PTX's bound
    for tanh.approx.f32 is 2^-10.987), ±1 at the ends, and the same as fast-math tanhf."""
    exe = tmp_path / "softcap_tanh"
    nvcc = need_tool("nvcc", "build the softcap_tanh harness")
    cmd = [nvcc, "-x", "cu", "-std=c++17", "-O3", "--use_fast_math", "-arch=native",
           f"-I{ROOT / 'csrc'}"]  # fmt: skip
    res = subprocess.run([*cmd, "-o", str(exe), str(HARNESS)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    x = _inputs()
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    run = subprocess.run([str(exe), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")])
    assert run.returncode == 0
    y = np.frombuffer((tmp_path / "y.bin").read_bytes(), dtype=np.float32).reshape(2, -1)
    err = np.abs(y[0].astype(np.float64) - np.tanh(x.astype(np.float64)))
    print(f"max abs error {err.max():.3e} = 2^{np.log2(err.max()):.2f}")
    assert err.max() <= 2.0**-10.9, err.max()
    assert np.array_equal(y[0], y[1]), "fast-math tanhf is the same instruction"
    assert float(y[0][-4]) == 1.0 and float(y[0][-3]) == -1.0
    assert float(y[0][-2]) == 1.0 and float(y[0][-1]) == -1.0
