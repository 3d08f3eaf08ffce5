"""The SM100 backward (csrc/bwd_sm100.cu) as compiled for sm_100a: its instructions and budget.

Compiled, not executed: no Blackwell GPU is available to this project. These tests hold the
1-CTA kernel's SASS (hd 64 and 96) to its design (docs/sm100.md, "Backward"): the
five MMAs in their operand forms (S, dP, dQ from shared-memory descriptors; dV, dK with P / dS
from TMEM), TMEM loads and stores, TMEM allocation, tcgen05.commit, TMA loads, bulk copies of the
row statistics, the dQ TMA reduce-adds, setmaxnreg with the source's register table. hd 128 runs
the 2-CTA kernel: tests/test_sass_sm100_bwd_2cta.py.

Runs in CI (CPU machine) with nvcc and cuobjdump, like tests/test_sass_sm100.py.
"""

import re
from pathlib import Path

import pytest
from test_sass_sm90 import _compile

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "csrc/sm100/bwd/kernel.cuh"
pytestmark = pytest.mark.build

HEAD_DIMS = (64, 96)  # the 1-CTA kernel's (hd 128: the 2-CTA kernel)
DEFINES = tuple(f"-DFA4_HDIM_{d}" for d in HEAD_DIMS)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _compile(tmp_path_factory, "csrc/bwd_sm100.cu", *DEFINES, arch="100a")


def kernels_by_dims(sass):
    """SASS text of each 1-CTA main kernel, keyed by (d, d_v, dtype) from the mangled name."""
    out = {}
    for block in sass.split("Function : ")[1:]:
        m = re.match(r"\S*bwd_kernelINS1_9BwdTraitsILi(\d+)ELi(\d+)EN7cutlass(\d+)(\w+?)_tE", block)
        if m:
            out[(int(m.group(1)), int(m.group(2)), m.group(4))] = block
    return out


def spill_stores(ptxas, kernel=r"bwd_kernel\w*"):
    """Bytes of spill stores ptxas reports for each entry function whose name matches."""
    return [
        int(n)
        for n in re.findall(
            rf"Compiling entry function '\w*{kernel}'.*?\n.*?\n\s*\d+ bytes stack frame, "
            r"(\d+) bytes spill stores",
            ptxas,
        )
    ]


def _functions(sass):
    """Keyed by (d, dtype): the kernels here have d = d_v."""
    return {(d, t): block for (d, _, t), block in kernels_by_dims(sass).items()}


@pytest.fixture(scope="module")
def hd96(compiled):
    return _functions(compiled[1])[(96, "bfloat16")]


def _source_int(name):
    m = re.search(rf"constexpr int {name} = (\d+);", KERNEL.read_text())
    assert m, name
    return int(m.group(1))


def test_one_kernel_per_head_dim_and_dtype(compiled):
    _, sass = compiled
    assert sorted(_functions(sass)) == sorted(
        (d, t) for d in HEAD_DIMS for t in ("bfloat16", "half")
    )


def test_spills_bounded(compiled):
    """≤ 8 bytes of spill stores per main kernel (two scalars saved at entry). Before Note
    [single-thread MMA issue] the MMA role ran on lane 0 alone: 40 bytes at d = 96 (the
    compute warpgroups' dK/dV row addresses), and 124 with single-lane issue helpers, whose
    descriptors left the uniform registers. Run by the whole warp, with one elected lane issuing,
    the role's values stay uniform."""
    ptxas, _ = compiled
    main = spill_stores(ptxas)
    assert len(main) == 2 * len(HEAD_DIMS), ptxas
    assert max(main) <= 8, ptxas


def test_mma_role_run_by_the_whole_warp():
    """Note [single-thread MMA issue]: the backward's MMA role is entered by all 32 lanes of its
    warp (elect.sync inside needs them all: entered by lane 0 alone, as before, it would wait
    for lanes that never come), and it issues through the elected helpers."""
    roles = (ROOT / "csrc/sm100/bwd/roles.cuh").read_text()
    assert "if (role == Role::kMma) mma_role<T>(ss, tmem, t);" in roles
    body = roles[roles.index("__device__ void mma_role") : roles.index("// ---- Compute roles")]
    assert "elected_umma_commit(" in body and "elected_umma_ss(" in body
    assert re.search(r"(?<!elected_)umma_(ss|ts|commit)\(", body) is None


def test_ss_mmas_s_dp_dq(hd96):
    """S = K·Qᵀ, dP = V·dOᵀ and dQ = dSᵀ·K: both operands from shared-memory descriptors. Per
    Q block d/16 + d/16 + 128/16 = 20 at hd 96; the prologue issues S and dP once more."""
    ss = re.findall(r"UTCHMMA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", hd96)
    assert len(ss) >= 20, len(ss)


def test_ts_mmas_dv_dk(hd96):
    """dV += P·dO and dK += dS·Q: A (P, dS: 16-bit) from TMEM, B from shared memory (TS form),
    128/16 K slices each."""
    ts = re.findall(r"UTCHMMA tmem\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", hd96)
    assert len(ts) >= 2 * 128 // 16, len(ts)


def test_dq_reduce_adds(hd96):
    """Note [sm100 dQ]: d/32 TMA reduce-adds (128 × 32 fp32 sub-tiles) per Q block, i.e. 3 at
    hd 96, each after a named barrier of the reduce warpgroup."""
    assert len(re.findall(r"UTMAREDG\.3D\.ADD", hd96)) == 96 // 32


@pytest.mark.parametrize(
    "op, why",
    [
        (r"LDTM\.x32", "tcgen05.ld of S, dP (compute), dQ (reduce), dK/dV (epilogue)"),
        (r"STTM\.x16", "tcgen05.st of 16-bit P over S and dS over dP"),
        (r"UTCATOMSWS\.FIND_AND_SET", "tcgen05.alloc"),
        (r"UTCATOMSWS\.AND", "tcgen05.dealloc"),
        (r"UTCBAR \[UR\d+\]", "tcgen05.commit arriving on an mbarrier"),
        (r"UTMALDG\.4D", "K, V, Q, dO loaded by TMA"),
        (r"UBLKCP\.S\.G", "lse₂ and D rows bulk-copied with Q"),
        (r"SYNCS\.PHASECHK", "mbarrier waits"),
        (r"MUFU\.EX2", "P = exp2(S·c − lse₂)"),
        (r"LDG\.E\.STRONG\.GPU", "deterministic mode: the turn counter's acquire load"),
    ],
)
def test_sass_has(hd96, op, why):
    assert re.search(op, hd96), f"{op} missing: {why}"


def test_setmaxnreg_follows_the_register_table(hd96):
    got = set(re.findall(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP\d+, )?(0x[0-9a-f]+)", hd96))
    want = {
        ("DEALLOC", hex(_source_int("kRegsOther"))),
        ("TRY_ALLOC", hex(_source_int("kRegsReduce"))),
        ("TRY_ALLOC", hex(_source_int("kRegsCompute"))),
    }
    assert got == want, got


def test_head_dim_dispatch():
    """hd 64 and 96 run the 1-CTA kernel, hd 128 the 2-CTA kernel, hd 192, (192, 128) and 256 the
    1-CTA kernel with the head dim split over two CTAs (Note [bwd head-dim split]:
    tests/test_sass_sm100_bwd_split.py)."""
    src = (ROOT / "csrc/bwd_sm100.cu").read_text()
    assert re.findall(r"bwd::launch_bwd_dtype<(\d+, \d+)>", src) == [
        "64, 64",
        "96, 96",
        "192, 192",
        "192, 128",
        "256, 256",
    ]
    assert re.findall(r"bwd2::launch_bwd_dtype<(\d+), \d+>", src) == ["128"]


def test_sm90a_pass_compiles_an_empty_body(tmp_path_factory):
    """A multi-arch build also compiles bwd_sm100.cu for sm_90a: the main kernel's body is guarded
    by __CUDA_ARCH_FEAT_SM100_ALL, so that pass has no tcgen05 code."""
    _, sass = _compile(tmp_path_factory, "csrc/bwd_sm100.cu", "-DFA4_HDIM_64", arch="90a")
    assert "UTCHMMA" not in sass and "LDTM" not in sass
