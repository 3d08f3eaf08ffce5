"""The SM100 FP8 (e4m3) forward (csrc/sm100/fwd/kernel.cuh with an e4m3 element, Note [fp8
forward] in common/fp8.cuh) as the build compiles it for sm_100a: kind::f8f6f4 MMAs only, P
packed to e4m3 and stored four per TMEM column, a bf16 out, no spill in a per-block loop.

Compiled, not executed: no Blackwell GPU is available to this project. The instances are the
manifest's e4m3 ones (sass_helpers.compile_instance), which hold the 1-CTA kernel only (the 2-CTA
forward is 16-bit). Runs in CI (CPU machine) with nvcc, cuobjdump and nvdisasm.
"""

import re

import pytest
from helpers import ROOT, load_script
from sass_helpers import compile_ahead, compile_instance, entries, functions, instance_line_sass

pytestmark = pytest.mark.build
spill_sites = load_script(ROOT / "tools" / "spill_sites.py", "spill_sites")
HDIMS = ("64", "128", "256")
compile_ahead(__name__, [("sm100", "fwd", h, "e4m3") for h in HDIMS])


def kernel(tmp_path_factory, hdim):
    ptxas, sass = compile_instance(tmp_path_factory, "sm100", "fwd", hdim, "e4m3")
    names = list(entries(ptxas, "100a"))
    assert len(names) == 1 and "float_e4m3_t" in names[0], names
    return functions(sass)[names[0]]


@pytest.mark.parametrize("hdim", HDIMS)
def test_f8f6f4_mmas_only(tmp_path_factory, hdim):
    """S and P·V as kind::f8f6f4 (UTCQMMA), both forms (SS and TS), no kind::f16 MMA."""
    sass = kernel(tmp_path_factory, hdim)
    assert re.search(r"UTCQMMA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", sass)
    assert re.search(r"UTCQMMA tmem\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", sass)
    assert "UTCHMMA" not in sass


@pytest.mark.parametrize("hdim", HDIMS)
def test_p_in_e4m3_and_out_in_bf16(tmp_path_factory, hdim):
    """P: two cvt.rn.satfinite.e4m3x2 per four scores, stored with tcgen05.st x8 (32 e4m3 in
    8 columns); every exponential on MUFU (kEmuSixteenths 0 for FP8); O packed to bf16."""
    sass = kernel(tmp_path_factory, hdim)
    assert re.search(r"F2FP\.SATFINITE\.E4M3\.F32\.PACK_AB", sass)
    assert re.search(r"STTM\.x8\b", sass)
    assert not re.search(r"STTM\.x16\b", sass), "16-bit P stores"
    assert re.search(r"F2FP\.BF16\.F32\.PACK_AB", sass)
    assert not re.search(r"FADD2?\.FTZ\.RM R\d+, R\d+\S*, 12582912", sass), "exp2 polynomial"


@pytest.mark.parametrize("hdim", HDIMS)
def test_per_block_loops_spill_free(tmp_path_factory, hdim):
    text = instance_line_sass(tmp_path_factory, "sm100", "fwd", hdim, "e4m3")
    (code,) = [c for n, c in spill_sites.functions(text).items() if "fwd_kernel" in n]
    found, _, _ = spill_sites.loops(code)
    srcs = spill_sites.source_loops(ROOT)
    matched = {
        s.function for lp in found for s in srcs if spill_sites._in(code[lp.latch].chain, s, ROOT)
    }
    mma = "mma_role_one_tile" if hdim == "256" else "mma_role"
    assert {"load_role", mma, "softmax_role", "correction_role"} <= matched, matched
    s = spill_sites.spill_sites(code, ROOT)
    assert not s.in_loops, {f"{src}": len(v) for src, v in s.in_loops.items()}
