"""SM100 backward kernel against the fp32 reference backward (tolerance rule of DESIGN.md §5), on a
B200.

Compiled, not executed: no Blackwell GPU is available to this project, so these tests skip here
with the reason (conftest, marker sm100); they run the SM90 backward's cases (gpu_helpers'
*_case functions) through backend="sm100", unchanged, on a CC 10.0 device.
"""

import pytest
import torch
from gpu_helpers import (
    BWD_CASES,
    bwd_dense_case,
    bwd_varlen_case,
    compiled_hdims,
    default_and_deterministic_case,
    deterministic_case,
    many_ctas_case,
    tiny_model_case,
)

from fa4 import build_info, manifest

pytestmark = [pytest.mark.gpu, pytest.mark.sm100]

# Every head-dim pair the manifest has for the SM100 backward: the 1-CTA kernel (64, 96), the
# 2-CTA kernel (128), the head-dim split (192, (192, 128), 256).
HDIMS = manifest.head_dims_of("sm100", "bwd")
_IDS = lambda p: f"d{p[0]}x{p[1]}"  # noqa: E731


def _sm100_hdims():
    return compiled_hdims("bwd", "sm100")


@pytest.fixture(autouse=True)
def _needs_sm100_bwd_kernel():  # the device check is conftest's (marker sm100)
    if torch.cuda.get_device_capability() != (10, 0):
        pytest.skip("the SM100 backward is dispatched on CC 10.0 only")
    if not _sm100_hdims():
        pytest.skip(f"no SM100 backward kernel in this build: {build_info.CONFIG.get('reason')}")


def _needs(dims):
    if dims not in _sm100_hdims():
        pytest.skip(f"head dims {dims} not compiled (FA4_HDIMS)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(BWD_CASES)))
@pytest.mark.parametrize("dims", HDIMS, ids=_IDS)
def test_dense(dims, case, dtype):
    _needs(dims)
    bwd_dense_case("sm100", dims, case, dtype)


# The cases below take one head dim (d == d_v): the square pairs ((192, 128) runs the same split
# kernel code as 192 with other slice widths, and test_dense's cases).
SQUARE = [p for p in HDIMS if p[0] == p[1]]


@pytest.mark.parametrize("dims", SQUARE, ids=_IDS)
def test_varlen(dims):
    _needs(dims)
    bwd_varlen_case("sm100", dims[0])


@pytest.mark.parametrize("dims", SQUARE, ids=_IDS)
def test_deterministic_is_bitwise_reproducible(dims):
    _needs(dims)
    deterministic_case("sm100", dims[0])


@pytest.mark.parametrize("dims", SQUARE, ids=_IDS)
def test_default_and_deterministic_modes_both_match_reference(dims):
    _needs(dims)
    default_and_deterministic_case("sm100", dims[0])


@pytest.mark.parametrize("dims", SQUARE, ids=_IDS)
def test_tiny_model_parameter_gradients(dims):
    _needs(dims)
    tiny_model_case("sm100", dims[0])


@pytest.mark.parametrize("dims", HDIMS, ids=_IDS)
def test_many_ctas_and_seqlen_4224(dims):
    _needs(dims)
    many_ctas_case("sm100", dims)
