"""SM100 forward kernel against the fp32 reference (tolerance rule of DESIGN.md §5), on a B200.

Compiled, not executed: no Blackwell GPU is available to this project, so these tests skip here
with the reason (conftest, marker sm100); they run the SM90 forward's cases (gpu_helpers'
*_case functions) through backend="sm100", unchanged, on a CC 10.0 device.
"""

import pytest
import torch
from gpu_helpers import (
    FWD_CASES,
    compiled_hdims,
    fwd_dense_case,
    fwd_varlen_case,
    repeatable_case,
    seqused_k_case,
    strided_many_tiles_case,
)

from fa4 import build_info, manifest

pytestmark = [pytest.mark.gpu, pytest.mark.sm100]

HDIMS = manifest.head_dims_of("sm100", "fwd")


def _sm100_hdims():
    return compiled_hdims("fwd", "sm100")


@pytest.fixture(autouse=True)
def _needs_sm100_kernel():  # the device check is conftest's (marker sm100)
    if torch.cuda.get_device_capability() != (10, 0):
        pytest.skip("the SM100 forward is dispatched on CC 10.0 only")
    if not _sm100_hdims():
        pytest.skip(f"no SM100 forward kernel in this build: {build_info.CONFIG.get('reason')}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(FWD_CASES)))
@pytest.mark.parametrize("hdims", HDIMS, ids=lambda p: f"d{p[0]}x{p[1]}")
def test_dense(hdims, case, dtype):
    if hdims not in _sm100_hdims():
        pytest.skip(f"head dims {hdims} not compiled (FA4_HDIMS)")
    fwd_dense_case("sm100", hdims, case, dtype)


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (50, 10)}])
def test_varlen(kw):
    fwd_varlen_case("sm100", _sm100_hdims()[0], kw)


def test_varlen_seqused_k():
    seqused_k_case("sm100", _sm100_hdims()[0])


def test_non_contiguous_heads_and_large_batch_heads():
    strided_many_tiles_case("sm100", _sm100_hdims()[0][0])


def test_repeatable():
    repeatable_case("sm100", _sm100_hdims()[0])
