"""The SM100 backward's head-dim split (Note [bwd head-dim split]) as the build compiles it for
sm_100a.

Compiled, not executed: no Blackwell GPU is available to this project. At d or d_v > 128 the
1-CTA kernel runs with two CTAs per kv tile, each owning half of the columns of dK, dV and dQ,
with 64-row Q blocks (docs/sm100.md, "Head-dim split"). These tests hold its SASS to that design:
the MMAs' instruction descriptors (shape, operand majors) as the UMOV immediates the MMA role
issues them with, the dQ TMA reduce-adds per Q block, the operand forms, and the spills.

The instances are the manifest's bf16 ones at hd 192, (192, 128) and 256
(sass_helpers.compile_instance: the generated translation units, the build's flags). Runs in CI
(CPU machine) with nvcc, cuobjdump and nvdisasm.
"""

import re

import pytest
from sass_helpers import compile_ahead, compile_instance, entries, sm100_bwd_kernels, threshold

from fa4 import manifest

pytestmark = pytest.mark.build

SPLIT = ("192", "192x128", "256")  # manifest.HEAD_DIMS keys
BLOCK_M = 64  # query rows per Q block in the split kernels (BwdTraits::kBlockM)
compile_ahead(__name__, [("sm100", "bwd", h, "bf16") for h in SPLIT])


def compiled(tmp_path_factory, hdim):
    return compile_instance(tmp_path_factory, "sm100", "bwd", hdim, "bf16")


def kernel(tmp_path_factory, hdim):
    """SASS of the instance's bf16 main kernel."""
    d, dv = manifest.HEAD_DIMS[hdim]
    return sm100_bwd_kernels(compiled(tmp_path_factory, hdim)[1])[(d, dv, "bfloat16")]


def idesc(m, n, a_mn, b_mn, bf16=True):
    """The upper word of a kind::f16 tcgen05.mma instruction descriptor (PTX ISA, instruction
    descriptor; CuTe's UMMA::InstrDescriptor): fp32 accumulator, bf16 or fp16 A and B, the
    operands' major modes, N >> 3 and M >> 4."""
    fmt = 1 if bf16 else 0
    return ((1 << 4) | (fmt << 7) | (fmt << 10) | (a_mn << 15) | (b_mn << 16) | (n >> 3) << 17) | (
        (m >> 4) << 24
    )


def test_idesc_encoding_matches_a_known_kernel_constant():
    # The 1-CTA kernel's S = K·Qᵀ at hd 64 (M 128 kv rows, N 128 query rows, both K-major) is
    # the constant 0x8200490 in its SASS (test_sass_sm100_bwd.py's kernel): the encoding above
    # is the hardware's, not a guess checked against itself.
    assert idesc(128, 128, 0, 0) == 0x8200490


@pytest.mark.parametrize("hdim", SPLIT)
def test_one_main_kernel_per_instance(tmp_path_factory, hdim):
    d, dv = manifest.HEAD_DIMS[hdim]
    assert list(sm100_bwd_kernels(compiled(tmp_path_factory, hdim)[1])) == [(d, dv, "bfloat16")]


@pytest.mark.parametrize("hdim", SPLIT)
def test_spills_bounded(tmp_path_factory, hdim):
    """At most sm100_bwd_split_spill_bytes_max bytes of spill stores in each (4: a scalar saved
    at entry, as the unsplit kernel). hd 256 spilled 32 with the MMA and load warps at 40
    registers (the S and dP MMAs walk 16 K slices each); the register table's 48 for them (reduce
    144) removed it. The bound fails on any growth."""
    ptxas, _ = compiled(tmp_path_factory, hdim)
    main = [e for name, e in entries(ptxas, "100a").items() if "bwd_kernel" in name]
    assert len(main) == 1, ptxas
    assert main[0]["spill_stores"] <= threshold("sm100_bwd_split_spill_bytes_max"), ptxas


@pytest.mark.parametrize("hdim", SPLIT)
def test_mma_shapes_are_the_split(tmp_path_factory, hdim):
    """S and dP: M 128 kv rows × N 64 query rows; dV: N = d_v / 2 and dK: N = d / 2 with the
    query rows as K (B = the CTA's slice of dO / Q, MN-major); dQ: M 64 query rows × N = d / 2
    (A = dSᵀ, B = the slice of K, both MN-major), the M = 64 layout Note [M = 64 dQ] reads."""
    d, dv = manifest.HEAD_DIMS[hdim]
    body = kernel(tmp_path_factory, hdim)
    imms = {int(x, 16) for x in re.findall(r"UMOV UR\d+, (0x[0-9a-f]+)", body)}
    want = {
        "S, dP": idesc(128, BLOCK_M, 0, 0),
        "dV": idesc(128, dv // 2, 0, 1),
        "dK": idesc(128, d // 2, 0, 1),
        "dQ": idesc(BLOCK_M, d // 2, 1, 1),
    }
    missing = {k: hex(v) for k, v in want.items() if v not in imms}
    assert not missing, missing
    # No MMA with the unsplit N: dK at N = d would not fit TMEM (Note [bwd TMEM plan]).
    assert idesc(128, d, 0, 1) not in imms


@pytest.mark.parametrize("hdim", SPLIT)
def test_dq_reduce_adds_per_block(tmp_path_factory, hdim):
    """Note [sm100 dQ]: (d / 2) / 32 TMA reduce-adds of 64 × 32 fp32 sub-tiles per Q block, each
    CTA its own columns."""
    d, dv = manifest.HEAD_DIMS[hdim]
    body = kernel(tmp_path_factory, hdim)
    assert len(re.findall(r"UTMAREDG\.3D\.ADD", body)) == d // 2 // 32


@pytest.mark.parametrize("hdim", SPLIT)
def test_operand_forms(tmp_path_factory, hdim):
    """Per Q block: S (d / 16 K slices), dP (d_v / 16) and dQ (128 / 16) from shared-memory
    descriptors; dV and dK (64 / 16 each) with P / dS from TMEM."""
    d, dv = manifest.HEAD_DIMS[hdim]
    body = kernel(tmp_path_factory, hdim)
    ss = re.findall(r"UTCHMMA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", body)
    ts = re.findall(r"UTCHMMA tmem\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\]", body)
    assert len(ss) >= d // 16 + dv // 16 + 128 // 16, len(ss)
    assert len(ts) >= 2 * BLOCK_M // 16, len(ts)


@pytest.mark.parametrize(
    "op, why",
    [
        (r"LDTM\.x32", "tcgen05.ld of S, dP (compute), dQ (reduce), dK/dV (epilogue)"),
        (r"STTM\.x16", "tcgen05.st of 16-bit P over S and dS over dP"),
        (r"UTMALDG\.4D", "K, V, Q, dO loaded by TMA"),
        (r"UBLKCP\.S\.G", "lse₂ and D rows bulk-copied with Q"),
        (r"MUFU\.EX2", "P = exp2(S·c − lse₂)"),
        (r"LDG\.E\.STRONG\.GPU", "deterministic mode: the turn counter's acquire load"),
    ],
)
def test_sass_has(tmp_path_factory, op, why):
    body = kernel(tmp_path_factory, "256")
    assert re.search(op, body), f"{op} missing: {why}"
