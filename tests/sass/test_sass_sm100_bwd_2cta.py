"""The 2-CTA SM100 backward (csrc/sm100/bwd/kernel_2cta.cuh, hd 128) as the build compiles it for
sm_100a.

Compiled, not executed: no Blackwell GPU is available to this project. These tests hold the SASS
to Note [bwd 2-CTA] (docs/sm100.md): cta_group::2 MMAs in both operand forms, the pair's TMEM
allocation, commits multicast to both CTAs, cluster barriers, the dS exchange through distributed
shared memory with its cluster-scope fence and remote arrivals, the dQ reduce-adds of 64-row
sub-tiles, and the barrier table's arrival counts.

The instances are the manifest's hd 128 ones (sass_helpers.compile_instance: the generated
translation unit, the build's flags), bf16 and fp16. Runs in CI (CPU machine) with nvcc,
cuobjdump and nvdisasm.
"""

import re
from pathlib import Path

import pytest
from helpers import load_script
from sass_helpers import compile_ahead, compile_instance, entries, functions, threshold

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "csrc/sm100/bwd/kernel_2cta.cuh"
protocol_model = load_script(ROOT / "tools" / "protocol_model.py", "protocol_model")

pytestmark = pytest.mark.build
compile_ahead(__name__, [("sm100", "bwd", "128", t) for t in ("bf16", "fp16")])


def compiled(tmp_path_factory, dtype="bf16"):
    return compile_instance(tmp_path_factory, "sm100", "bwd", "128", dtype)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """SASS of the bf16 2-CTA kernel."""
    for name, body in functions(compiled(tmp_path_factory)[1]).items():
        if re.match(r"\S*bwd_kernel_2ctaI\S*bfloat16", name):
            return body
    raise AssertionError("no bf16 bwd_kernel_2cta in the SASS")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_2cta_kernel_and_no_1cta_kernel_at_hd128(tmp_path_factory, dtype):
    names = list(entries(compiled(tmp_path_factory, dtype)[0], "100a"))
    assert len([n for n in names if "bwd_kernel_2cta" in n]) == 1, names
    assert not [n for n in names if re.search(r"bwd_kernelI", n)], names


def test_pair_mmas(kernel):
    """Per Q block S and dP (d/16 = 8 K slices each) and dQ (256/16 = 16 over the pair's kv rows)
    from shared-memory descriptors, dV and dK (128/16 = 8 each) with A from TMEM; all
    cta_group::2, and no single-CTA MMA."""
    ss = re.findall(r"UTCHMMA\.2CTA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", kernel)
    ts = re.findall(r"UTCHMMA\.2CTA tmem\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", kernel)
    assert len(ss) >= 8 + 8 + 16, len(ss)
    assert len(ts) >= 8 + 8, len(ts)
    assert not re.search(r"UTCHMMA (?!\.)", kernel.replace("UTCHMMA.2CTA", "")), "1-CTA MMA"


@pytest.mark.parametrize(
    "op, why",
    [
        (r"UTCATOMSWS\.2CTA\.FIND_AND_SET", "tcgen05.alloc.cta_group::2 by both MMA warps"),
        (r"UTCATOMSWS\.AND", "tcgen05.dealloc.cta_group::2 (no .2CTA suffix in nvdisasm 13.0)"),
        (r"UTCBAR\.2CTA\.MULTICAST", "tcgen05.commit to both CTAs' barriers"),
        (r"UCGABAR_ARV", "cluster barrier (start: barriers initialized; end: no early exit)"),
        (r"UCGABAR_WAIT", "cluster barrier wait"),
        (r"ST\.E\.128 \[R\d+\]", "dS to the peer's shared memory (st.shared::cluster)"),
        (r"CGAERRBAR", "fence.proxy.async.shared::cluster before the dS arrival"),
        (r"SYNCS\.ARRIVE\.TRANS64\.RED\.A1T0 RZ, \[R\d+\+URZ\]", "arrival on the even CTA"),
        (r"UTMALDG\.4D", "K, V, Kd, Q, Qd, dO, dOd loaded by TMA"),
        (r"UBLKCP\.S\.G", "lse₂ and D rows bulk-copied with Q"),
        (r"LDTM\.x32", "tcgen05.ld of S, dP, dQ, dK, dV"),
        (r"STTM\.x16", "P over S, dS over dP"),
        (r"MUFU\.EX2", "P = exp2(S·c − lse₂)"),
    ],
)
def test_sass_has(kernel, op, why):
    assert re.search(op, kernel), f"{op} missing: {why}"


def test_dq_reduce_adds(kernel):
    """Each CTA adds its 64 query rows as d/32 = 4 sub-tiles of 64 × 32 fp32 per Q block (the
    loop body appears twice: with and without the deterministic turn)."""
    n = len(re.findall(r"UTMAREDG\.3D\.ADD", kernel))
    assert n % 4 == 0 and n >= 4, n


def test_barrier_table():
    """The arrival counts follow the roles: P and dS from both CTAs' 256 compute threads, dQ
    loaded by both CTAs' 128 reduce threads, everything else one arrival (a TMA transaction, the
    relay, or a commit)."""
    # rows in the order of enum Bar
    _, kinds, rows = protocol_model.parse_bar_table(KERNEL.read_text())
    assert kinds == ["kOnce"]
    assert {name: arrivals for name, _, arrivals in rows if arrivals != 1} == {
        "kPFull": 512,
        "kDsFull": 512,
        "kDqEmpty": 256,
    }


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_spills_bounded(tmp_path_factory, dtype):
    """At most sm100_bwd_2cta_spill_bytes_max bytes of spill stores (20), none of them in a
    per-block loop (test_sass_sm100_spills.py) and none of them S, P, dP, dS or dQ elements:
    scalars saved once per kernel (docs/sm100.md, "Spills")."""
    ptxas, _ = compiled(tmp_path_factory, dtype)
    main = [e for name, e in entries(ptxas, "100a").items() if "bwd_kernel_2cta" in name]
    assert len(main) == 1, ptxas
    assert main[0]["spill_stores"] <= threshold("sm100_bwd_2cta_spill_bytes_max"), ptxas


def test_setmaxnreg_follows_its_register_table(kernel):
    """The 2-CTA kernel's own register table: the reduce and MMA/load warpgroups give registers
    back (104, 56 < 128 at launch), the compute warpgroups take them (176)."""
    src = KERNEL.read_text()
    regs = {
        n: int(re.search(rf"constexpr int {n} = (\d+);", src).group(1))
        for n in ("kRegsCompute", "kRegsReduce", "kRegsOther")
    }
    got = set(re.findall(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP\d+, )?(0x[0-9a-f]+)", kernel))
    want = {
        ("DEALLOC", hex(regs["kRegsOther"])),
        ("DEALLOC", hex(regs["kRegsReduce"])),
        ("TRY_ALLOC", hex(regs["kRegsCompute"])),
    }
    assert got == want, got
