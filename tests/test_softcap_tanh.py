"""Note [softcap tanh]: the kernels' tanh for softcap is tanh.approx.f32, on purpose and measured.

softcap_tanh (csrc/common/softmax.cuh) is the PTX instruction itself, so the kernels' numerics do not
hang on --use_fast_math (under which tanhf compiles to the same MUFU.TANH, and without which it
is a ~20-instruction sequence). The build test (CI) holds a probe's SASS to that without fast
math; the GPU test measures the error the Note and docs/numerics.md state.
"""

import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_exp2_poly import _nvcc
from test_sass_sm90 import _compile

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests/cpp/softcap_tanh_harness.cu"


@pytest.mark.build
@pytest.mark.parametrize("arch", ["90a", "100a"])
def test_softcap_tanh_is_one_mufu_tanh(tmp_path_factory, arch):
    """Compiled as the kernels are (_compile adds --use_fast_math): softcap_tanh and the probe's
    own tanhf are one MUFU.TANH each."""
    _, sass = _compile(tmp_path_factory, "tests/cpp/softcap_tanh_harness.cu", arch=arch)
    assert sass.count("MUFU.TANH") == 2, sass.count("MUFU.TANH")


@pytest.mark.build
def test_softcap_tanh_does_not_need_fast_math(tmp_path_factory):
    """Without --use_fast_math the probe's tanhf is the IEEE sequence and softcap_tanh still the
    one MUFU.TANH."""
    _, sass = _compile(tmp_path_factory, "tests/cpp/softcap_tanh_harness.cu", fast_math=False)
    assert sass.count("MUFU.TANH") == 1


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
    cmd = [_nvcc(), "-x", "cu", "-std=c++17", "-O3", "--use_fast_math", "-arch=native", f"-I{ROOT / 'csrc'}"]
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
