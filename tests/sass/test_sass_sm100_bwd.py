"""The SM100 backward's 1-CTA kernel (csrc/sm100/bwd/kernel.cuh) at hd 64 and 96 as the build
compiles it for sm_100a: its instructions and budget.

Compiled, not executed: no Blackwell GPU is available to this project. These tests hold the
1-CTA kernel's SASS (hd 64 and 96) to its design (docs/sm100.md, "Backward"): the
five MMAs in their operand forms (S, dP, dQ from shared-memory descriptors; dV, dK with P / dS
from TMEM), TMEM loads and stores, TMEM allocation, tcgen05.commit, TMA loads, bulk copies of the
row statistics, the dQ TMA reduce-adds, setmaxnreg with the source's register table. hd 128 runs
the 2-CTA kernel (test_sass_sm100_bwd_2cta.py), hd 192, (192, 128) and 256 the head-dim split
(test_sass_sm100_bwd_split.py).

Each instance is the manifest's (sass_helpers.compile_instance: its generated translation unit,
the build's flags): bf16 at hd 64 and 96, fp16 at hd 96. Runs in CI (CPU machine) with nvcc,
cuobjdump and nvdisasm.
"""

import re
from pathlib import Path

import pytest
from sass_helpers import compile_ahead, compile_instance, entries, sm100_bwd_kernels, threshold

from fa4 import manifest

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "csrc/sm100/bwd/kernel.cuh"
pytestmark = pytest.mark.build

HDIMS = ("64", "96")  # the 1-CTA kernel's unsplit head dims
INSTANCES = [(h, "bf16") for h in HDIMS] + [("96", "fp16")]
ELEMENT = {"bf16": "bfloat16", "fp16": "half"}  # in the mangled names (cutlass::bfloat16_t, ...)
compile_ahead(
    __name__,
    [("sm100", "bwd", h, t) for h, t in INSTANCES] + [("sm100", "bwd", "64", "bf16", "90a")],
)


def compiled(tmp_path_factory, hdim, dtype="bf16"):
    return compile_instance(tmp_path_factory, "sm100", "bwd", hdim, dtype)


@pytest.fixture(scope="module")
def hd96(tmp_path_factory):
    return sm100_bwd_kernels(compiled(tmp_path_factory, "96")[1])[(96, 96, "bfloat16")]


def _source_int(name):
    m = re.search(rf"constexpr int {name} = (\d+);", KERNEL.read_text())
    assert m, name
    return int(m.group(1))


@pytest.mark.parametrize("hdim, dtype", INSTANCES)
def test_one_main_kernel_per_instance(tmp_path_factory, hdim, dtype):
    d, dv = manifest.HEAD_DIMS[hdim]
    assert list(sm100_bwd_kernels(compiled(tmp_path_factory, hdim, dtype)[1])) == [
        (d, dv, ELEMENT[dtype])
    ]


@pytest.mark.parametrize("hdim, dtype", INSTANCES)
def test_spills_bounded(tmp_path_factory, hdim, dtype):
    """At most sm100_bwd_spill_bytes_max bytes of spill stores in the main kernel (8: two
    scalars saved at entry). Before Note [single-thread MMA issue] the MMA role ran on lane 0
    alone: 40 bytes at d = 96 (the compute warpgroups' dK/dV row addresses), and 124 with
    single-lane issue helpers, whose descriptors left the uniform registers. Run by the whole
    warp, with one elected lane issuing, the role's values stay uniform."""
    ptxas, _ = compiled(tmp_path_factory, hdim, dtype)
    main = [e for name, e in entries(ptxas, "100a").items() if "bwd_kernel" in name]
    assert len(main) == 1, ptxas
    assert main[0]["spill_stores"] <= threshold("sm100_bwd_spill_bytes_max"), ptxas


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
    """hd 64 and 96 run the 1-CTA kernel, hd 128 the 2-CTA kernel (test_sass_sm100_bwd_2cta.py),
    hd 192, (192, 128) and 256 the 1-CTA kernel with the head dim split over two CTAs (Note [bwd
    head-dim split]: test_sass_sm100_bwd_split.py): those are the manifest's SM100 backward head
    dims, and the family's instance header takes the 2-CTA kernel at d = d_v = 128 only."""
    assert sorted(manifest.head_dims_of("sm100", "bwd")) == [
        (64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)
    ]  # fmt: skip
    src = (ROOT / "csrc/sm100/bwd/instance.cuh").read_text()
    body = src[src.index("Status bwd_instance(") :]
    assert re.findall(r"if constexpr \((.*)\) \{\s*return (\w+)::launch_bwd<", body) == [
        ("D == 128 && DV == 128", "bwd2")
    ]
    assert re.search(r"\} else \{\s*return bwd::launch_bwd<bwd::BwdTraits<D, DV, ", body)


def test_sm90a_pass_compiles_an_empty_body(tmp_path_factory):
    """The default build (90a and 100a) also compiles each SM100 instance for sm_90a: the main
    kernel's body is guarded by __CUDA_ARCH_FEAT_SM100_ALL, so that pass has no tcgen05 code."""
    _, sass = compile_instance(tmp_path_factory, "sm100", "bwd", "64", "bf16", arch="90a")
    assert "UTCHMMA" not in sass and "LDTM" not in sass
