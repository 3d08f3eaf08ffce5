"""The SM100 backward's head-dim split (Note [bwd head-dim split]) as compiled for sm_100a.

Compiled, not executed: no Blackwell GPU is available to this project. At d or d_v > 128 the
1-CTA kernel runs with two CTAs per kv tile, each owning half of the columns of dK, dV and dQ,
with 64-row Q blocks (docs/sm100.md, "Head-dim split"). These tests hold its SASS to that design:
the MMAs' instruction descriptors (shape, operand majors) as the UMOV immediates the MMA role
issues them with, the dQ TMA reduce-adds per Q block, the operand forms, and the spills.

Runs in CI (CPU machine) with nvcc and cuobjdump, like tests/test_sass_sm100_bwd.py.
"""

import re

import pytest
from test_sass_sm90 import _compile
from test_sass_sm100_bwd import kernels_by_dims as _functions
from test_sass_sm100_bwd import spill_stores

pytestmark = pytest.mark.build

SPLIT = ((192, 192), (192, 128), (256, 256))
DEFINES = ("-DFA4_HDIM_192", "-DFA4_HDIM_192X128", "-DFA4_HDIM_256")
BLOCK_M = 64  # query rows per Q block in the split kernels (BwdTraits::kBlockM)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _compile(tmp_path_factory, "csrc/bwd_sm100.cu", *DEFINES, arch="100a")


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


def test_one_kernel_per_head_dim_and_dtype(compiled):
    _, sass = compiled
    assert sorted(_functions(sass)) == sorted(
        (d, dv, t) for d, dv in SPLIT for t in ("bfloat16", "half")
    )


def test_spills_bounded(compiled):
    """4 bytes of spill stores in each (a scalar saved at entry, as the unsplit kernel). hd 256
    spilled 32 with the MMA and load warps at 40 registers (the S and dP MMAs walk 16 K slices
    each); the register table's 48 for them (reduce 144) removed it. The bound fails on any
    growth."""
    ptxas, _ = compiled
    every = spill_stores(ptxas)
    assert len(every) == 2 * len(SPLIT), ptxas
    assert max(every) <= 4, ptxas


@pytest.mark.parametrize("dims", SPLIT, ids=lambda p: f"d{p[0]}x{p[1]}")
def test_mma_shapes_are_the_split(compiled, dims):
    """S and dP: M 128 kv rows × N 64 query rows; dV: N = d_v / 2 and dK: N = d / 2 with the
    query rows as K (B = the CTA's slice of dO / Q, MN-major); dQ: M 64 query rows × N = d / 2
    (A = dSᵀ, B = the slice of K, both MN-major), the M = 64 layout Note [M = 64 dQ] reads."""
    d, dv = dims
    body = _functions(compiled[1])[(d, dv, "bfloat16")]
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


@pytest.mark.parametrize("dims", SPLIT, ids=lambda p: f"d{p[0]}x{p[1]}")
def test_dq_reduce_adds_per_block(compiled, dims):
    """Note [sm100 dQ]: (d / 2) / 32 TMA reduce-adds of 64 × 32 fp32 sub-tiles per Q block, each
    CTA its own columns."""
    d, dv = dims
    body = _functions(compiled[1])[(d, dv, "bfloat16")]
    assert len(re.findall(r"UTMAREDG\.3D\.ADD", body)) == d // 2 // 32


@pytest.mark.parametrize("dims", SPLIT, ids=lambda p: f"d{p[0]}x{p[1]}")
def test_operand_forms(compiled, dims):
    """Per Q block: S (d / 16 K slices), dP (d_v / 16) and dQ (128 / 16) from shared-memory
    descriptors; dV and dK (64 / 16 each) with P / dS from TMEM."""
    d, dv = dims
    body = _functions(compiled[1])[(d, dv, "bfloat16")]
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
def test_sass_has(compiled, op, why):
    body = _functions(compiled[1])[(256, 256, "bfloat16")]
    assert re.search(op, body), f"{op} missing: {why}"
