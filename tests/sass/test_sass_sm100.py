"""The SM100 forward (csrc/sm100/fwd/kernel.cuh) as the build compiles it for sm_100a: its
instructions and ptxas budget.

Compiled, not executed: no Blackwell GPU is available to this project. These tests hold the
kernel's SASS to its design (docs/sm100.md): both tcgen05.mma operand forms, TMEM
loads and stores, TMEM allocation, tcgen05.commit, TMA, setmaxnreg with the source's register
table, and the exp2 split between MUFU.EX2 and the polynomial.

Each instance is the manifest's (sass_helpers.compile_instance: its generated translation unit,
the build's flags): bf16 at every head dim, fp16 at hd 128. Runs in CI (CPU machine) with nvcc,
cuobjdump and nvdisasm.
"""

import re
from pathlib import Path

import pytest
from sass_helpers import (
    compile_ahead,
    compile_instance,
    entries,
    functions,
    hdim_names,
    threshold,
)

from fa4 import manifest

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "csrc/sm100/fwd/kernel.cuh"
pytestmark = pytest.mark.build

HDIMS = hdim_names("sm100", "fwd")
INSTANCES = [(h, "bf16") for h in HDIMS] + [("128", "fp16")]
ELEMENT = {"bf16": "bfloat16", "fp16": "half"}  # in the mangled names (cutlass::bfloat16_t, ...)
compile_ahead(
    __name__,
    [("sm100", "fwd", h, t) for h, t in INSTANCES] + [("sm100", "fwd", "128", "bf16", "90a")],
)


def compiled(tmp_path_factory, hdim="128", dtype="bf16"):
    return compile_instance(tmp_path_factory, "sm100", "fwd", hdim, dtype)


def traits(name):
    """((d, d_v), element) of a forward kernel's mangled name (FwdTraits or FwdTraits2)."""
    m = re.search(r"FwdTraits2?ILi(\d+)ELi(\d+)EN7cutlass\d+(\w+?)_tE", name)
    assert m, name
    return (int(m.group(1)), int(m.group(2))), m.group(3)


def one_cta(names):
    """The 1-CTA kernel's entry among an instance's (hd 192 and 256 also have the 2-CTA one)."""
    (name,) = [n for n in names if re.search(r"fwd_kernelI", n)]
    return name


def kernel(tmp_path_factory, hdim, dtype="bf16"):
    """SASS of the instance's 1-CTA kernel."""
    sass = functions(compiled(tmp_path_factory, hdim, dtype)[1])
    return sass[one_cta(sass)]


@pytest.fixture(scope="module")
def hd128(tmp_path_factory):
    return kernel(tmp_path_factory, "128")


@pytest.mark.parametrize("hdim, dtype", INSTANCES)
def test_kernels_per_instance(tmp_path_factory, hdim, dtype):
    """One 1-CTA kernel per instance, and at d = d_v = 192 and 256 the 2-CTA kernel too
    (sm100/fwd/instance.cuh dispatches between them)."""
    ptxas, sass = compiled(tmp_path_factory, hdim, dtype)
    names = list(entries(ptxas, "100a"))
    pair = manifest.HEAD_DIMS[hdim] in ((192, 192), (256, 256))
    assert len(names) == (2 if pair else 1), names
    assert len([n for n in names if "fwd_kernel_2cta" in n]) == (1 if pair else 0), names
    for name in names:
        assert traits(name) == (manifest.HEAD_DIMS[hdim], ELEMENT[dtype]), name
    assert sorted(functions(sass)) == sorted(names)


@pytest.mark.parametrize("hdim", HDIMS)
def test_no_warp_collective_in_lone_lane_roles(tmp_path_factory, hdim):
    """Note [single-thread MMA issue]: the MMA, load and epilogue roles run on lane 0 of their
    warp alone. CuTe's MMA atoms issue under elect.sync over the full warp, which ptxas lowers to
    WARPSYNC.COLLECTIVE with mask 0xffffffff where it cannot prove the warp converged: from a lone
    lane it waits for 31 lanes that never come. 96 such sites per kernel before the kernel issued
    tcgen05.mma itself (umma_ss / umma_ts)."""
    assert "WARPSYNC.COLLECTIVE" not in kernel(tmp_path_factory, hdim)
    # the 2-CTA kernel's MMA role is run by its whole warp (test_sass_sm100_fwd_2cta.py)


def _source_int(name):
    m = re.search(rf"constexpr int {name} = (\d+);", KERNEL.read_text())
    assert m, name
    return int(m.group(1))


@pytest.mark.parametrize("hdim, dtype", INSTANCES)
def test_spills_bounded(tmp_path_factory, hdim, dtype):
    """At most sm100_fwd_spill_bytes_max bytes of spill stores per 1-CTA kernel
    (tests/sass_helpers.py's THRESHOLDS): 0 / 40 / 44 / 28 / 40 / 32 at hd 64 / 96 / 128 / 192 /
    (192, 128) / 256, nvcc 13.0. All of them scalars, none of the S/P/O element arrays and none in
    a per-block loop (test_sass_sm100_spills.py, docs/sm100.md "Spills")."""
    ptxas, _ = compiled(tmp_path_factory, hdim, dtype)
    report = entries(ptxas, "100a")[one_cta(entries(ptxas, "100a"))]
    assert report["spill_stores"] <= threshold("sm100_fwd_spill_bytes_max"), ptxas


def test_s_is_shared_memory_by_shared_memory(hd128):
    """S = Q·Kᵀ: both operands from shared-memory descriptors (the SS form). SASS:
    "UTCHMMA gdesc[UR16], gdesc[UR12], tmem[UR5], tmem[UR14], idesc[UR15], !UPT"
    (A desc, B desc, D in TMEM, ..., instruction descriptor; !UPT on the first K slice: the
    accumulator is overwritten)."""
    ss = re.findall(r"UTCHMMA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", hd128)
    # 2 Q tiles × d / 16 K slices, in the prologue and in the loop (at least once each)
    assert len(ss) >= 2 * 2 * 128 // 16, len(ss)


def test_pv_reads_p_from_tmem(hd128):
    """O += P·V: A (P, 16-bit) from TMEM, B (V) from a shared-memory descriptor (the TS form):
    "UTCHMMA tmem[UR5], gdesc[UR12], tmem[UR4], tmem[UR10], idesc[UR11], UP1"."""
    ts = re.findall(r"UTCHMMA tmem\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", hd128)
    assert len(ts) >= 2 * 128 // 16, len(ts)  # 2 Q tiles × kBlockN / 16 K slices


@pytest.mark.parametrize(
    "op, why",
    [
        (r"LDTM\.x32", "tcgen05.ld of S rows (softmax) and O chunks (correction, epilogue)"),
        (r"STTM\.x16", "tcgen05.st of a 32-element 16-bit P chunk over S"),
        (r"STTM\.x32", "tcgen05.st of a rescaled O chunk (correction)"),
        (r"UTCATOMSWS\.FIND_AND_SET", "tcgen05.alloc"),
        (r"UTCATOMSWS\.AND", "tcgen05.dealloc"),
        (r"UTCBAR \[UR\d+\]", "tcgen05.commit arriving on an mbarrier"),
        (r"UTMALDG\.4D", "Q, K, V loaded by TMA"),
        (r"UTMASTG\.4D", "O stored by TMA from the staging buffer (the epilogue warp)"),
        (r"SYNCS\.PHASECHK", "mbarrier waits"),
        (r"ATOMG\.E\.ADD\.64", "the load thread claims work tiles (Note [dynamic tiles])"),
        (
            r"ATOMG\.E\.EXCH\.64",
            "the last CTA resets the tile counter (Note [self-resetting tile counter])",
        ),
    ],
)
def test_sass_has(hd128, op, why):
    assert re.search(op, hd128), f"{op} missing: {why}"


def test_setmaxnreg_follows_the_register_table(hd128):
    """The three budgets of the source's table: the MMA/load/idle and correction warpgroups
    give registers back, the softmax warpgroups take them."""
    got = set(re.findall(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP\d+, )?(0x[0-9a-f]+)", hd128))
    want = {
        ("DEALLOC", hex(_source_int("kRegsOther"))),
        ("DEALLOC", hex(_source_int("kRegsCorrection"))),
        ("TRY_ALLOC", hex(_source_int("kRegsSoftmax"))),
    }
    assert got == want, got


def test_exp2_split_between_mufu_and_polynomial(hd128):
    """Note [exp2 column split] with kEmuSixteenths = 4 at hd 128: per KV block a softmax row
    of 128 scores sends 32 through exp2_poly<3> and 96 through MUFU.EX2, plus one MUFU.EX2 for
    the rescale factor 2^(m - m_blk). Note [packed exp2]: the 32 go as 16 pairs, each floor one
    FADD2.RM with 1.5·2^23 and the Horner steps FFMA2 with the degree-3 coefficients; the
    argument x · scale - m of all 128 is 64 FFMA2."""
    floors = re.findall(r"FADD2\.FTZ\.RM R\d+, R\d+\.F32x2\.HI_LO, 12582912", hd128)
    assert len(floors) == 128 * 4 // 16 // 2, len(floors)
    assert not re.search(r"FADD\.FTZ\.RM R\d+, R\d+(?:\.reuse)?, 12582912", hd128)
    for coeff in ("0.22764499", "0.69511675"):
        assert re.search(rf"FFMA2\.FTZ R\d+, R\d+\.F32x2\.HI_LO, \S+, {coeff}", hd128), coeff
    args = re.findall(r"FFMA2\.FTZ R\d+, R\d+\.F32x2\.HI_LO, UR\d+\.F32, R\d+", hd128)
    assert len(args) >= 128 // 2, len(args)
    assert len(re.findall(r"MUFU\.EX2", hd128)) == 128 * 12 // 16 + 1


def test_hd256_runs_one_q_tile_with_double_buffered_s(tmp_path_factory):
    """hd 256 (Note [one-tile order]): one Q tile per CTA, kBlockN 64, S double-buffered in TMEM,
    an instance of the manifest; both tcgen05.mma forms, and no exp2 polynomial (kEmuSixteenths 0
    at hd 256, EMU_SIXTEENTHS)."""
    assert (256, 256) in manifest.head_dims_of("sm100", "fwd")
    hd256 = kernel(tmp_path_factory, "256")
    assert re.search(r"UTCHMMA tmem\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", hd256)
    assert re.search(r"UTCHMMA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", hd256)
    assert not re.search(r"FADD2?\.FTZ\.RM R\d+, R\d+\S*, 12582912", hd256)


def test_sm90a_pass_compiles_an_empty_body(tmp_path_factory):
    """The default build (90a and 100a) also compiles each SM100 instance for sm_90a: the kernel
    body is guarded by __CUDA_ARCH_FEAT_SM100_ALL, so that pass has the entry point and no
    tcgen05 code."""
    ptxas, sass = compile_instance(tmp_path_factory, "sm100", "fwd", "128", "bf16", arch="90a")
    assert len(entries(ptxas, "90a")) == 1, ptxas
    assert "UTCHMMA" not in sass and "LDTM" not in sass
