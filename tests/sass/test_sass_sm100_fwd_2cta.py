"""The 2-CTA SM100 forward (csrc/sm100/fwd/kernel_2cta.cuh, d = d_v = 192 and 256) as the build
compiles it for sm_100a.

Compiled, not executed: no Blackwell GPU is available to this project. These tests hold the SASS
to Note [fwd 2-CTA] (docs/sm100.md): cta_group::2 MMAs in both operand forms and no single-CTA
MMA, the pair's TMEM allocation, commits multicast to both CTAs, cluster barriers at the start and
the end, remote arrivals on the even CTA (softmax, correction, relay), the exp2 split, the
register table, no spill, and the barrier table's arrival counts.

The instances are the manifest's hd 192 and hd 256 ones (sass_helpers.compile_instance: the
generated translation unit, the build's flags), which hold the 1-CTA kernel too; bf16 and fp16.
Runs in CI (CPU machine) with nvcc, cuobjdump and nvdisasm.
"""

import re
from pathlib import Path

import pytest
from helpers import load_script
from sass_helpers import compile_ahead, compile_instance, entries, functions, threshold

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "csrc/sm100/fwd/kernel_2cta.cuh"
FWD_KERNEL = ROOT / "csrc/sm100/fwd/kernel.cuh"
protocol_model = load_script(ROOT / "tools" / "protocol_model.py", "protocol_model")

pytestmark = pytest.mark.build
INSTANCES = [("256", "bf16"), ("256", "fp16"), ("192", "bf16")]
compile_ahead(__name__, [("sm100", "fwd", h, t) for h, t in INSTANCES])


def compiled(tmp_path_factory, hdim="256", dtype="bf16"):
    return compile_instance(tmp_path_factory, "sm100", "fwd", hdim, dtype)


def pair_kernel(tmp_path_factory, hdim="256", dtype="bf16"):
    (body,) = [
        b for n, b in functions(compiled(tmp_path_factory, hdim, dtype)[1]).items() if "2cta" in n
    ]
    return body


@pytest.fixture(scope="module")
def hd256(tmp_path_factory):
    return pair_kernel(tmp_path_factory)


@pytest.mark.parametrize("hdim, d", [("256", 256), ("192", 192)])
def test_pair_mmas(tmp_path_factory, hdim, d):
    """Per KV block S from shared-memory descriptors (d / 16 K slices; the issue appears twice:
    the prologue's S(0), S(1) and the loop's S(i + 2)) and P·V with A from TMEM (128 / 16 = 8
    K slices); all cta_group::2, and no single-CTA MMA (ptxas rejects mixing them)."""
    sass = pair_kernel(tmp_path_factory, hdim)
    ss = re.findall(r"UTCHMMA\.2CTA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", sass)
    ts = re.findall(r"UTCHMMA\.2CTA tmem\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", sass)
    assert len(ss) >= d // 16 and len(ss) % (d // 16) == 0, len(ss)
    assert len(ts) == 128 // 16, len(ts)
    assert not re.search(r"UTCHMMA (?!\.)", sass.replace("UTCHMMA.2CTA", "")), "1-CTA MMA"


@pytest.mark.parametrize(
    "op, why",
    [
        (r"UTCATOMSWS\.2CTA\.FIND_AND_SET", "tcgen05.alloc.cta_group::2 by both MMA warps"),
        (r"UTCATOMSWS\.AND", "tcgen05.dealloc.cta_group::2"),
        (r"UTCBAR\.2CTA\.MULTICAST", "tcgen05.commit to both CTAs' barriers"),
        (r"UCGABAR_ARV", "cluster barrier (start: barriers initialized; end: no early exit)"),
        (r"UCGABAR_WAIT", "cluster barrier wait"),
        (r"SYNCS\.ARRIVE\.TRANS64\.RED\.A1T0 RZ, \[R\d+\+URZ\]", "arrival on the even CTA"),
        (r"UTMALDG\.4D", "Q, K halves and V halves loaded by TMA"),
        (r"LDTM\.x32", "tcgen05.ld of S and O"),
        (r"STTM\.x16", "P over S"),
        (r"STTM\.x32", "O rescaled in TMEM (Note [conditional rescale])"),
        (r"MUFU\.EX2", "P = exp2(S·c − m)"),
        (r"STG\.E\.128", "O stored by the correction warpgroup (no TMA-store epilogue)"),
    ],
)
def test_sass_has(hd256, op, why):
    assert re.search(op, hd256), f"{op} missing: {why}"


def test_commits(hd256):
    """Multicast commits only: per block kSFull and kKEmpty after S, kOFull and kVEmpty after
    P·V (the issue of S appears twice)."""
    assert "UTCBAR " not in hd256.replace("UTCBAR.2CTA", ""), "a single-CTA commit"
    assert len(re.findall(r"UTCBAR\.2CTA\.MULTICAST", hd256)) == 2 * 2 + 2


def test_mma_role_run_by_the_whole_warp(hd256):
    """The MMA role runs on its whole warp with one elected lane issuing (ptxas 13.0 crashed on
    cta_group::2 MMAs issued from lane 0 alone); elect.sync, no collective warp sync."""
    assert re.search(r"\bELECT\b", hd256)
    assert "WARPSYNC.COLLECTIVE" not in hd256


def test_exp2_split(tmp_path_factory, hd256):
    """kEmuSixteenths: 0 at hd 256 (every exponential on MUFU: 128 per row and block, plus the
    row factor's), 4/16 at hd 192 (Note [exp2 column split])."""
    assert len(re.findall(r"MUFU\.EX2", hd256)) == 128 + 1
    hd192 = pair_kernel(tmp_path_factory, "192")
    assert len(re.findall(r"MUFU\.EX2", hd192)) == 128 * 12 // 16 + 1


@pytest.mark.parametrize("hdim, dtype", INSTANCES)
def test_no_spill(tmp_path_factory, hdim, dtype):
    ptxas, _ = compiled(tmp_path_factory, hdim, dtype)
    (report,) = [e for name, e in entries(ptxas, "100a").items() if "2cta" in name]
    assert report["spill_stores"] <= threshold("sm100_fwd_2cta_spill_bytes_max"), ptxas


def test_setmaxnreg_follows_the_register_table(hd256):
    """The 1-CTA forward's table (sm100/fwd/kernel.cuh): the softmax warpgroup takes 192, the
    correction warpgroup and the MMA / load / relay warpgroup give back to 80 and 48; the second
    softmax warpgroup has no work and keeps the launch's 128."""
    src = FWD_KERNEL.read_text()
    regs = {
        n: int(re.search(rf"constexpr int {n} = (\d+);", src).group(1))
        for n in ("kRegsSoftmax", "kRegsCorrection", "kRegsOther")
    }
    got = set(re.findall(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP\d+, )?(0x[0-9a-f]+)", hd256))
    want = {
        ("DEALLOC", hex(regs["kRegsOther"])),
        ("DEALLOC", hex(regs["kRegsCorrection"])),
        ("TRY_ALLOC", hex(regs["kRegsSoftmax"])),
    }
    assert got == want, got


def test_barrier_table():
    """kBarriersPair: the rows of the forward's enum; P and the rescaled O from both CTAs' 128
    threads on the even CTA's copy (256), the statistics within a CTA (128), the relay's peer
    barriers one arrival; the tile ring, the O staging and the next tile's Q / O waits are not
    in this kernel (kNone)."""
    text = FWD_KERNEL.read_text() + KERNEL.read_text()
    _, kinds, rows = protocol_model.parse_bar_table(text, "kBarriersPair")
    assert "kNone" in kinds
    assert {name: arrivals for name, _, arrivals in rows if arrivals != 1} == {
        "kPFull": 256,
        "kStatsFull": 128,
        "kStatsEmpty": 128,
        "kORescaled": 256,
        "kOEmpty": 128,
        "kOStageFull": 128,
    }
    assert sorted(name for name, kind, _ in rows if kind == "kNone") == sorted(
        ["kQEmpty", "kOEmpty", "kOStageFull", "kOStageEmpty", "kTileFull", "kTileEmpty"]
    )
    _, _, one_cta = protocol_model.parse_bar_table(FWD_KERNEL.read_text())
    assert [n for n, kind, _ in one_cta if kind == "kNone"] == [
        "kPeerQFull",
        "kPeerKFull",
        "kPeerVFull",
    ]
