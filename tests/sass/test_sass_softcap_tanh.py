"""Note [softcap tanh]: the kernels' tanh for softcap is tanh.approx.f32, on purpose and measured.

softcap_tanh (csrc/common/softmax.cuh) is the PTX instruction itself, so the kernels' numerics do
not hang on --use_fast_math (under which tanhf compiles to the same MUFU.TANH, and without which
it is a ~20-instruction sequence). These build tests (CI) hold a probe's SASS to that, with the
build's flags and without fast math; tests/gpu/test_softcap_tanh.py measures the error the Note
and docs/numerics.md state.
"""

import pytest
from sass_helpers import compile_ahead, compile_cubin

pytestmark = pytest.mark.build
PROBE = "tests/cpp/softcap_tanh_harness.cu"
compile_ahead(__name__, cubins=[(PROBE, "90a"), (PROBE, "100a"), (PROBE, "90a", False)])


@pytest.mark.parametrize("arch", ["90a", "100a"])
def test_softcap_tanh_is_one_mufu_tanh(tmp_path_factory, arch):
    """Compiled as the kernels are (the build's flags, --use_fast_math among them): softcap_tanh
    and the probe's own tanhf are one MUFU.TANH each."""
    _, sass = compile_cubin(tmp_path_factory, PROBE, arch=arch)
    assert sass.count("MUFU.TANH") == 2, sass.count("MUFU.TANH")


def test_softcap_tanh_does_not_need_fast_math(tmp_path_factory):
    """Without --use_fast_math the probe's tanhf is the IEEE sequence and softcap_tanh still the
    one MUFU.TANH."""
    _, sass = compile_cubin(tmp_path_factory, PROBE, arch="90a", fast_math=False)
    assert sass.count("MUFU.TANH") == 1
