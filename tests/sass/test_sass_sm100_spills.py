"""Where the SM100 kernels spill: no local-memory instruction (STL / LDL) inside a role's
per-block loop, the code that runs once per KV block (forward) or Q block (backward).

tools/spill_sites.py reads `nvdisasm -gi` of the manifest's instances (sass_helpers: the
build's flags, -lineinfo among them): the natural loops of the SASS control flow, each
classified by the source line of its back edge; a per-block loop is a `for` carrying the
FA4_SM100_DEBUG_BLOCK marker. Spills outside those loops run once per tile or per kernel;
docs/sm100.md ("Spills") gives each group its reason. Compiled, not executed.
"""

import re

import pytest
from helpers import ROOT, load_script
from sass_helpers import compile_ahead, hdim_names, instance_line_sass

pytestmark = pytest.mark.build
spill_sites = load_script(ROOT / "tools" / "spill_sites.py", "spill_sites")

FWD = [("fwd", h, "bf16") for h in hdim_names("sm100", "fwd")] + [("fwd", "128", "fp16")]
BWD_2CTA = [("bwd", "128", t) for t in ("bf16", "fp16")]
compile_ahead(__name__, [("sm100", d, h, t) for d, h, t in FWD + BWD_2CTA])

# The per-block loops each kernel must have in its SASS (as the source functions that hold
# them): without this a failed loop classification would pass as "no spills in loops".
FWD_LOOPS = {"load_role", "mma_role", "softmax_role", "correction_role"}
FWD_LOOPS_ONE_TILE = {"load_role", "mma_role_one_tile", "softmax_role", "correction_role"}
FWD_LOOPS_PAIR = {
    "load_role_pair", "relay_role_pair", "mma_role_pair", "softmax_role", "correction_role"
}  # fmt: skip
PAIR_HDIMS = ("192", "256")  # the 2-CTA forward's (sm100/fwd/instance.cuh)
BWD_2CTA_LOOPS = {"load_role", "mma_role", "compute_role", "reduce_role"}


def sites(tmp_path_factory, direction, hdim, dtype, kernel_name):
    text = instance_line_sass(tmp_path_factory, "sm100", direction, hdim, dtype)
    (code,) = [c for n, c in spill_sites.functions(text).items() if re.search(kernel_name, n)]
    found, block_of, _ = spill_sites.loops(code)
    srcs = spill_sites.source_loops(ROOT)
    matched = {
        src.function
        for lp in found
        for src in srcs
        if spill_sites._in(code[lp.latch].chain, src, ROOT)
    }
    return spill_sites.spill_sites(code, ROOT), matched


def check(s, matched, expected_loops):
    assert expected_loops <= matched, f"per-block loops not found in the SASS: {expected_loops}"
    where = {
        f"{src}": [f"{i.addr:05x} {i.op} {spill_sites.where(i, ROOT)}" for i in v]
        for src, v in s.in_loops.items()
    }
    assert not where, where


@pytest.mark.parametrize("direction, hdim, dtype", FWD)
def test_forward_per_block_loops_spill_free(tmp_path_factory, direction, hdim, dtype):
    s, matched = sites(tmp_path_factory, direction, hdim, dtype, r"fwd_kernelI")
    loops = FWD_LOOPS_ONE_TILE if hdim == "256" else FWD_LOOPS
    check(s, matched, loops)


@pytest.mark.parametrize("direction, hdim, dtype", BWD_2CTA)
def test_2cta_backward_per_block_loops_spill_free(tmp_path_factory, direction, hdim, dtype):
    s, matched = sites(tmp_path_factory, direction, hdim, dtype, "bwd_kernel_2cta")
    check(s, matched, BWD_2CTA_LOOPS)


@pytest.mark.parametrize("hdim", PAIR_HDIMS)
def test_2cta_forward_per_block_loops_spill_free(tmp_path_factory, hdim):
    s, matched = sites(tmp_path_factory, "fwd", hdim, "bf16", r"fwd_kernel_2ctaI")
    check(s, matched, FWD_LOOPS_PAIR)
