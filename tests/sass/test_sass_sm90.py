"""The SM90 kernels as the build compiles them for sm_90a: the instructions they must use and their
ptxas budget.

Every kernel here is one that dispatch launches (the forward's csrc/sm90/fwd/kernel.cuh and the
backward's csrc/sm90/bwd/kernel.cuh, both run by the GPU tests on H100 / H200); these tests hold
their SASS to the design. Runs in CI (CPU machine): each instance is the manifest's
(sass_helpers.compile_instance: its generated translation unit, the build's nvcc flags), compiled
to a cubin with nvcc and read with cuobjdump and nvdisasm (the nvidia-cuda-cuobjdump / -nvdisasm
wheels, or the toolkit's). The pinned numbers are sass_helpers.THRESHOLDS'.
"""

import re

import pytest
from sass_helpers import compile_ahead, compile_cubin, compile_instance, threshold

pytestmark = pytest.mark.build

FWD = [("128", "bf16"), ("128", "fp16"), ("64", "bf16"), ("96", "bf16"), ("256", "bf16")]
BWD = [(h, t) for h in ("128", "256", "64") for t in ("bf16", "fp16")]
WGMMA_RATE = "bench/wgmma_rate.cu"
compile_ahead(
    __name__,
    [("sm90", "fwd", h, t) for h, t in FWD] + [("sm90", "bwd", h, t) for h, t in BWD],
    cubins=[(WGMMA_RATE, "90a")],
)


def _instance(tmp_path_factory, direction, hdim, dtypes=("bf16",)):
    """ptxas's reports and the SASS of the SM90 instances of a direction and head dim, one per
    dtype, each compiled as the build compiles it, joined."""
    built = [compile_instance(tmp_path_factory, "sm90", direction, hdim, t) for t in dtypes]
    return "".join(ptxas for ptxas, _ in built), "".join(sass for _, sass in built)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _instance(tmp_path_factory, "fwd", "128")


@pytest.fixture(scope="module")
def compiled_fp16(tmp_path_factory):
    return _instance(tmp_path_factory, "fwd", "128", ("fp16",))


@pytest.fixture(scope="module")
def compiled_hd64(tmp_path_factory):
    return _instance(tmp_path_factory, "fwd", "64")


@pytest.fixture(scope="module")
def compiled_hd96(tmp_path_factory):
    return _instance(tmp_path_factory, "fwd", "96")


@pytest.fixture(scope="module")
def compiled_hd256(tmp_path_factory):
    return _instance(tmp_path_factory, "fwd", "256")


@pytest.fixture(scope="module")
def compiled_bwd(tmp_path_factory):
    return _instance(tmp_path_factory, "bwd", "128", ("bf16", "fp16"))


@pytest.fixture(scope="module")
def compiled_bwd_split(tmp_path_factory):
    return _instance(tmp_path_factory, "bwd", "256", ("bf16", "fp16"))


@pytest.fixture(scope="module")
def compiled_bwd_hd64(tmp_path_factory):
    return _instance(tmp_path_factory, "bwd", "64", ("bf16", "fp16"))


def test_one_kernel_per_dtype_and_no_spills(compiled, compiled_fp16):
    """The hd128 forward is one kernel per element type (no per-problem variant), and neither
    spills."""
    for (ptxas, _), dtype in ((compiled, "bfloat16"), (compiled_fp16, "half")):
        kernels = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", ptxas)
        assert len(kernels) == 1 and dtype in kernels[0], kernels
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas)
        assert spills and all(s == ("0", "0") for s in spills), ptxas


def _bf16_body(sass, kernel, tag=""):
    """(name, SASS text) of the bf16 instance of `kernel` whose mangled name also holds `tag`
    (e.g. "bfloat16_tELi1ELi64ELi3E": FwdTraits<64, 64, bf16, 1, 64, 3>, the three-CTA kernel)."""
    for body in re.split(r"\n\s*Function : ", sass):
        head = body.split("\n", 1)[0]
        if kernel in head and "bfloat16" in head and tag in head:
            return head, body
    raise AssertionError(f"no bf16 {kernel} {tag} in the SASS")


def _block_loop_ops(sass, kernel="fwd_kernel", tag=""):
    """Opcodes of the bf16 instance's KV-block loop: the shortest range that a backward branch
    closes and that holds both an HGMMA and a MUFU.EX2 (the tile loop around it is longer)."""
    head, body = _bf16_body(sass, kernel, tag)
    ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);", body)
    ins = [(int(a, 16), op, rest) for a, op, rest in ins]
    loops = []
    for a, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < a:
            ops = [o for x, o, _ in ins if int(target.group(1), 16) <= x <= a]
            if any(o.startswith("HGMMA") for o in ops) and "MUFU.EX2" in ops:
                loops.append(ops)
    assert loops, f"no KV-block loop in {head}"
    return min(loops, key=len)


def _ptxas_entry(ptxas, tag):
    """ptxas's report of the one kernel whose mangled name holds `tag`."""
    entry = [c for c in ptxas.split("Compiling entry function")[1:] if tag in c.split("\n")[0]]
    assert len(entry) == 1, ptxas
    return entry[0]


def _consumers_at(body, consumer_regs, producer_regs):
    """Asserts the kernel's setmaxnreg split and that its consumers' code (between the register
    increase and the producer's decrease) has no local memory."""
    assert f"USETMAXREG.TRY_ALLOC.CTAPOOL UP0, {consumer_regs:#x}" in body, "consumer registers"
    assert f"USETMAXREG.DEALLOC.CTAPOOL {producer_regs:#x}" in body, "producer registers"
    consumers = body[body.index("USETMAXREG.TRY_ALLOC") : body.index("USETMAXREG.DEALLOC")]
    assert not re.search(r"\b(LDL|STL)\b", consumers), "local memory in the consumers"


def test_hd64_three_consumers_and_bounded_spills(compiled_hd64):
    """Note [three consumers at hd64]: 512 threads, consumers raised to 160 registers, the
    producer lowered to 32. Only the producer spills: its 32 registers hold the scheduler's
    values around the per-tile atomic, the claim inside its block loop (Note [two Q buffers]) and
    the loads, one thread, 72 bytes at this commit (28 before that claim). The consumers'
    code (between the register increase and the producer's decrease) has no local memory."""
    ptxas, sass = compiled_hd64
    assert "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xa0" in sass, "consumers at 160 registers"
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x20" in sass, "producer at 32 registers"
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", ptxas)]
    assert spills and max(spills) <= threshold("sm90_fwd_hd64_spill_bytes_max"), ptxas
    _, body = _bf16_body(sass, "fwd_kernel", "bfloat16_tELi0E")
    consumers = body[body.index("USETMAXREG.TRY_ALLOC") : body.index("USETMAXREG.DEALLOC")]
    assert not re.search(r"\b(LDL|STL)\b", consumers), "local memory in the consumers"
    loop = _block_loop_ops(sass, tag="bfloat16_tELi0E")
    assert not [o for o in loop if o.startswith(("LDL", "STL"))], "local memory in the block loop"


def test_hd64_kernels(compiled_hd64):
    """Note [short causal hd64]: the hd64 instance is two kernels, the three-consumer one and the
    three-CTA one (next test) for short causal and local problems."""
    ptxas, _ = compiled_hd64
    kernels = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", ptxas)
    # FwdTraits<64, 64, bf16, kConsumerWGs_, kBlockN_, kCtasPerSm_, kEmuSixteenths_ = 0>
    tags = sorted(k.split("bfloat16_t")[1][:20] for k in kernels)
    assert tags == ["ELi0ELi0ELi1ELi0EEEE", "ELi1ELi64ELi3ELi0EEE"], kernels


def test_hd64_three_cta_kernel(compiled_hd64):
    """Note [three CTAs at short causal hd64]: FwdTraits<64, 64, bf16, 1, 64, 3> is launched with
    three CTAs per SM in mind (__launch_bounds__(256, 3): 80 registers at launch), setmaxnreg
    gives its one consumer warpgroup 128 and the producer 32 (RegisterSplit), and the consumer
    has no local memory. Its block loop holds one 64-key block (4 + 4 HGMMA 64x64x16, 32
    exponentials per thread) and no named barrier: one consumer, no ping-pong turns."""
    ptxas, sass = compiled_hd64
    tag = "bfloat16_tELi1ELi64ELi3E"
    entry = _ptxas_entry(ptxas, tag)
    regs = threshold("sm90_fwd_hd64_3cta_registers")
    assert f"Used {regs} registers" in entry, entry
    _, body = _bf16_body(sass, "fwd_kernel", tag)
    _consumers_at(body, 128, 32)
    assert set(re.findall(r"HGMMA\.\d+x\d+x\d+", body)) == {"HGMMA.64x64x16"}
    loop = _block_loop_ops(sass, tag=tag)
    assert sum(o.startswith("HGMMA") for o in loop) == 8
    assert loop.count("MUFU.EX2") >= 32
    assert not [o for o in loop if o.startswith("BAR")], "a turn barrier in the loop"


def test_hd256_two_block_widths(compiled_hd256):
    """Note [hd256 narrow blocks]: the hd256 instance holds the 80-key kernel (S on 64x80 wgmma) and
    the 64-key one (64x64) for short problems, both with P·V at N = 256 and at most the 24 bytes
    of spills the stale-max vote left at hd256 (docs/decisions.md)."""
    ptxas, sass = compiled_hd256
    kernels = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", ptxas)
    assert sorted(k.split("bfloat16_t")[1][:10] for k in kernels) == ["ELi0ELi0EL", "ELi0ELi64E"]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", ptxas)]
    assert len(spills) == 2 and max(spills) <= threshold("sm90_fwd_hd256_spill_bytes_max"), ptxas
    for tag, s_gemm in (
        ("bfloat16_tELi0ELi0E", "HGMMA.64x80x16"),
        ("bfloat16_tELi0ELi64E", "HGMMA.64x64x16"),
    ):
        _, body = _bf16_body(sass, "fwd_kernel", tag)
        shapes = set(re.findall(r"HGMMA\.\d+x\d+x\d+", body))
        assert shapes == {s_gemm, "HGMMA.64x256x16"}, (tag, shapes)


def test_block_loop_shape(compiled, compiled_hd64):
    """The KV-block loop (what _block_loop_ops finds) holds one block's S and P·V GEMMs (hd128:
    8 + 8 HGMMA, hd64: 4 + 8) and its exponentials, and no local memory at hd128."""
    for (_, sass), hgmma in ((compiled, 16), (compiled_hd64, 12)):
        loop = _block_loop_ops(sass, tag="bfloat16_tELi0E")
        assert sum(o.startswith("HGMMA") for o in loop) == hgmma
        assert loop.count("MUFU.EX2") >= 64
        if hgmma == 16:
            assert not [o for o in loop if o.startswith(("LDL", "STL"))]


@pytest.mark.parametrize(
    "op, why",
    [
        ("HGMMA", "S = Q·Kᵀ and O += P·V on wgmma"),
        ("UTMALDG", "Q, K, V loaded by TMA"),
        ("USETMAXREG", "registers moved from the producer to the consumers"),
        ("MUFU.EX2", "the hardware exp2 of the softmax"),
        ("SYNCS", "mbarrier pipelines"),
        ("UTMASTG", "O stored by TMA (Note [TMA-store epilogue])"),
        ("STSM", "O to shared memory by stmatrix for the TMA store"),
        ("ATOMG.E.ADD.64", "the producer claims work tiles (Note [dynamic tiles])"),
        (
            "ATOMG.E.EXCH.64",
            "the last CTA resets the tile counter (Note [self-resetting tile counter])",
        ),
    ],
)
def test_sass_has(compiled, op, why):
    _, sass = compiled
    assert op in sass, f"{op} missing: {why}"


def test_o_store_is_one_tma_box_per_64_columns(compiled, compiled_hd64):
    """Each warpgroup stores its 64 rows of O with d_v / 64 TMA stores (64 x 64 boxes): hd128 has
    2 UTMASTG per kernel, hd64 1. With row-block-major staging atoms (before this test) the box
    was 8 rows and hd128 issued 16, which held the issuing thread ~1.7 k cycles per tile
    (Note [fwd trace])."""
    for (_, sass), stores in ((compiled, 2), (compiled_hd64, 1)):
        _, body = _bf16_body(sass, "fwd_kernel", "bfloat16_tELi0E")
        assert len(re.findall(r"UTMASTG", body)) == stores


def test_register_epilogue_stores_16_bytes(compiled):
    """Note [quad transpose]: the register epilogue (varlen, and d_v = 256 everywhere) writes O
    with 16-byte stores after a quad transpose: 2 rows x d_v / 32 per thread, 8 at hd128; the
    only 4-byte global stores left are the LSE's (two rows in each of the two epilogues). Before,
    O went out in 64 4-byte stores per thread at hd128."""
    _, body = _bf16_body(compiled[1], "fwd_kernel")
    stores = re.findall(r"\bSTG\.[A-Z0-9_.]+", body)
    assert stores.count("STG.E.128") == 8, sorted(set(stores))
    assert set(stores) == {"STG.E", "STG.E.128"} and stores.count("STG.E") <= 4, stores


def test_p_is_register_operand(compiled):
    """O += P·V takes P from registers: some HGMMA has a register (not descriptor) A operand."""
    _, sass = compiled
    hgmma = [line for line in sass.splitlines() if "HGMMA" in line]
    # SASS: "HGMMA.64x128x16.F32 R24, R88, gdesc[UR16].tnspB, R24" (A in R88: register form);
    # "HGMMA.64x128x16.F32 R88, gdesc[UR20], R88" (A from shared memory: descriptor form).
    assert any(re.search(r"HGMMA\.\S+\s+R\d+, R\d+, gdesc", line) for line in hgmma), hgmma[:4]
    assert any(re.search(r"HGMMA\.\S+\s+R\d+, gdesc", line) for line in hgmma), hgmma[:4]


@pytest.mark.parametrize(
    "op, why",
    [
        (r"HGMMA\.\S+\s+R\d+, gdesc", "Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dQ = dS·K from shared memory"),
        (r"HGMMA\.\S+\s+R\d+, R\d+, gdesc", "dV += Pᵀ·dO, dK += dSᵀ·Q with Pᵀ, dSᵀ in registers"),
        (r"UTMALDG", "K, V, Q, dO loaded by TMA"),
        (r"UBLKRED\.G\.S\.ADD\.F32", "dQ bulk reduce-add, one per block (Note [dQ reduce])"),
        (r"USETMAXREG", "registers moved from the producer to the consumers"),
        (r"MUFU\.EX2", "P recomputed with the hardware exp2"),
        (r"ATOMG\.E\.EXCH\.64", "the tile counter reset (Note [self-resetting tile counter])"),
    ],
)
def test_bwd_sass_has(compiled_bwd, op, why):
    assert re.search(op, compiled_bwd[1]), f"{op} missing: {why}"


def test_bwd_spills_bounded(compiled_bwd):
    """At d = 128 the kernel spills at most 136 bytes (124 at 2b018fc, before the persistent grid
    of Note [persistent bwd]; 252 before Note [Q blocks in closed form] took the binary searches
    out of the tile boundary), in the producer warpgroup: its TMA thread and dQ reducer at 40
    registers also walk the tile ring.
    The paired P/dS conversion had pushed two per-thread offsets out of the
    consumers' registers, reloaded from L2 every Q block (148 bytes, the loop's top stall in ncu);
    Note [fresh tid] rebuilds them in the loop instead."""
    ptxas, _ = compiled_bwd
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", ptxas)]
    # Note [early dPᵀ]: +12 bytes (248), the three values that the masked softcap path now keeps
    # in local memory (test_bwd_loop_reads_local_memory_once); Note [block needs mask]: +4 (252),
    # a fourth on that path. Note [Q blocks in closed form] and Note [TMA-store dK/dV]: 252 -> 128.
    # Note [GQA head slices]: +8 (136) outside the per-block loop (the loop's local loads are
    # test_bwd_loop_reads_local_memory_once's).
    assert spills and max(spills) <= threshold("sm90_bwd_hd128_spill_bytes_max"), ptxas


@pytest.mark.parametrize("variant", ["compiled", "compiled_bwd", "compiled_bwd_split"])
def test_named_barriers_in_the_user_range(variant, request):
    """A named barrier with a thread count uses a hardware id in 8..15 (CUTLASS adds its 8
    reserved ids to ours, NamedBarrier::ReservedNamedBarrierCount). Id 8 of the backward's enum
    became hardware barrier 16, which does not exist: ptxas encoded it as 0, __syncthreads'
    barrier, without a warning (Note [TMA-store dK/dV]'s kDkDvRead once had id 8). Ids held in
    registers are not checked here."""
    _, sass = request.getfixturevalue(variant)
    ids = re.findall(r"\bBAR\.(?:SYNC|ARV|RED)[A-Z._]*\s+(0x[0-9a-f]+), (?:0x[0-9a-f]+|R\d+)", sass)
    assert ids, "no named barrier with an immediate id"
    assert all(8 <= int(i, 16) <= 15 for i in ids), sorted(set(ids))


def test_bwd_dk_dv_leave_by_tma_boxes(compiled_bwd):
    """Note [TMA-store dK/dV]: at d = 128 the dQ reducer stores dK and dV of a dense problem with
    one TMA box per 64 columns, 4 UTMASTG; the 16-byte row stores stay for varlen (16 per thread,
    test_bwd_dk_dv_stores_are_16_bytes)."""
    _, body = _bf16_body(compiled_bwd[1], "bwd_kernel")
    assert len(re.findall(r"UTMASTG", body)) == 4
    assert len(re.findall(r"\bSTG\.E\.128", body)) == 16


@pytest.mark.parametrize("variant", ["compiled_bwd", "compiled_bwd_split"])
def test_bwd_dk_dv_stores_are_16_bytes(variant, request):
    """Note [dK/dV epilogue]: the main kernel's only global stores are 16-byte ones: 8 columns
    of a row after quad_transpose (Note [split epilogue], and at d <= 128 Note [dK/dV from
    registers]); the 4-byte pair stores from the fragments took 6.7 us per CTA at hd128 1k. dQ
    leaves by reduce-adds, which are not STG."""
    _, sass = request.getfixturevalue(variant)
    _, body = _bf16_body(sass, "bwd_kernel")
    stores = re.findall(r"\bSTG\.[A-Z0-9_.]+", body)
    assert stores and set(stores) == {"STG.E.128"}, sorted(set(stores))


def _opcodes(body):
    """Opcodes of a SASS text, predicates dropped."""
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", body)


def _main_loop_ops(sass, kernel="bwd_kernel"):
    """Opcodes between the first and the last HGMMA of the bf16 instance of `kernel`."""
    _, body = _bf16_body(sass, kernel)
    ops = _opcodes(body)
    hgmma = [i for i, o in enumerate(ops) if o.startswith("HGMMA")]
    return [o.split(".")[0] for o in ops[hgmma[0] : hgmma[-1] + 1]]


def test_bwd_descriptors_uniform_and_pairs_converted(compiled_bwd):
    """Note [uniform descriptors]: the wgmma descriptors stay in uniform registers (sliced by
    thread index, 47 R2UR moves sat between the loop's HGMMAs); P and dS are converted in pairs
    (converted one by one, the compiler shuffled halves with ~74 PRMT)."""
    ops = _main_loop_ops(compiled_bwd[1])
    assert ops.count("R2UR") <= threshold("sm90_bwd_hd128_loop_r2ur_max"), ops.count("R2UR")
    assert ops.count("PRMT") == 0, ops.count("PRMT")


def test_bwd_descriptor_steps_are_64_bit(compiled_bwd):
    """Note [64-bit descriptor steps]: between the bf16 hd128 backward's first and last HGMMA the
    descriptors step by UIADD3.64 (46 when written), and the constant high word is
    rematerialized (UMOV URn, 0x40000040) 22 times, the early dPᵀ's 16 among them; with CuTe's
    32-bit steps everywhere there were no UIADD3.64 and 70 such UMOVs."""
    _, body = _bf16_body(compiled_bwd[1], "bwd_kernel")
    loop = body[body.index("HGMMA") : body.rindex("HGMMA")]
    steps = len(re.findall(r"UIADD3\.64", loop))
    hi = len(re.findall(r"UMOV UR\d+, 0x40000040", loop))
    assert steps >= threshold("sm90_bwd_hd128_loop_uiadd3_64_min"), steps
    assert hi <= threshold("sm90_bwd_hd128_loop_umov_hi_max"), hi


def test_bwd_loop_reads_local_memory_once(compiled_bwd):
    """At most four local loads inside hd128's Q-block loop (Note [early dPᵀ] below; one before
    it, none after Note [band test]; the softcap variant had spilled four temporaries with the
    persistent grid's tile state live across the loop, and the per-thread offsets that the
    paired conversion had spilled were reloaded on every path of every block, Note [fresh
    tid])."""
    ops = _main_loop_ops(compiled_bwd[1])
    # Note [early dPᵀ]: three, on the masked softcap path only (which values, not analysed; the
    # other three paths of p_and_ds have none); a fourth there since Note [block needs mask].
    assert ops.count("LDL") <= threshold("sm90_bwd_hd128_loop_ldl_max"), ops.count("LDL")


@pytest.mark.parametrize("variant", ["compiled_bwd", "compiled_bwd_hd64"])
def test_bwd_loop_thread_offsets_unsigned(variant, request):
    """Note [known thread range]: inside the Q-block loop the thread offsets of Note [fresh tid]
    are divided unsigned: no sign extraction (SHF.R.S32.HI Rd, RZ, 0x1f, Rs), which each signed
    division by a power of two begins with (3 in hd128's loop and hd64's without the stated
    range, and 9 / 10 LEA.HI)."""
    _, body = _bf16_body(request.getfixturevalue(variant)[1], "bwd_kernel")
    loop = body[body.index("HGMMA") : body.rindex("HGMMA")]
    assert not re.findall(r"SHF\.R\.S32\.HI R\d+, RZ, 0x1f, R\d+", loop)
    assert len(re.findall(r"\bLEA\.HI\b", loop)) <= threshold("sm90_bwd_loop_lea_hi_max")


def test_bwd_masked_block_is_short(compiled_bwd):
    """Note [band test]: the masked, softcap-free elementwise path (between the Sᵀ wait and the
    join of the four variants) is one add and one unsigned compare per element on top of the
    unmasked path's: under 300 instructions (sm90_bwd_hd128_masked_path_instructions_max); with
    col_bounds(...).contains per element it was 539 instructions against 181 unmasked
    (2026-12-01, hd128). The variants are told apart by MUFU.TANH (softcap) and
    by size; the masked no-softcap path is the largest of the two without TANH."""
    _, body = _bf16_body(compiled_bwd[1], "bwd_kernel")
    blocks = re.split(r"\bBRA 0x[0-9a-f]+ ;", body)
    no_tanh = [b for b in blocks if "MUFU.EX2" in b and "MUFU.TANH" not in b]
    sizes = sorted(len(re.findall(r"/\*[0-9a-f]{4,}\*/", b)) for b in no_tanh)
    assert len(sizes) >= 2, sizes
    assert sizes[-1] <= threshold("sm90_bwd_hd128_masked_path_instructions_max"), sizes


@pytest.mark.parametrize(
    "op, why",
    [
        (r"HGMMA\.64x32x16\S*\s+R\d+, gdesc", "Sᵀ, dPᵀ: each warpgroup 32 query columns"),
        (r"HGMMA\.\S+\s+R\d+, gdesc\[UR\d+\]\.tnspA", "dV, dK read Pᵀ, dSᵀ from smem"),
        (r"STSM\.16\.MT88", "Pᵀ, dSᵀ stored with stmatrix"),
        (r"REDG\.E\.ADD\.F32x4", "dQ added four elements per reduce, no return value"),
    ],
)
def test_bwd_split_sass_has(compiled_bwd_split, op, why):
    assert re.search(op, compiled_bwd_split[1]), f"{op} missing: {why}"


def test_bwd_split_spills_bounded(compiled_bwd_split):
    """d = 256 (split variant): at most 180 bytes (32 before Note [persistent bwd] reached this
    variant), all in the producer warpgroup, whose TMA thread walks the tile ring at 40 registers
    as at d <= 128; the consumers, from their register allocation to the producer's, touch no
    local memory."""
    ptxas, sass = compiled_bwd_split
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", ptxas)]
    assert spills and max(spills) <= threshold("sm90_bwd_hd256_spill_bytes_max"), ptxas
    _, body = _bf16_body(sass, "bwd_kernel")
    consumers = body[body.index("USETMAXREG.TRY_ALLOC") : body.index("USETMAXREG.DEALLOC")]
    assert not re.search(r"\b(LDL|STL)\b", consumers), "local memory in the split consumers"


def test_bwd_split_epilogue_from_registers(compiled_bwd_split):
    """Note [split epilogue]: at d = 256 each consumer thread writes 2 rows x 4 chunks of dK and
    of dV with 16-byte stores, after quad_transpose's two xor-shuffle rounds (4 SHFL.BFLY per four
    chunks); no shared-memory staging, so no barrier between the last GEMM and the stores."""
    _, sass = compiled_bwd_split
    _, body = _bf16_body(sass, "bwd_kernel")
    assert len(re.findall(r"\bSTG\.E\.128\b", body)) == 16
    assert len(re.findall(r"\bSHFL\.BFLY\b", body)) == 64


@pytest.mark.parametrize(
    "which", ["compiled", "compiled_bwd", "compiled_bwd_hd64", "compiled_bwd_split"]
)
def test_wgmma_not_serialized(which, request):
    """ptxas serializes every wgmma of a kernel (a wait after each) when registers run short
    (C7512) or when registers a wgmma reads are written between arrive and wgmma (C7519); either
    costs most of the overlap. Found in the first backward (230 TFLOP/s at hd128). In the
    backward, Note [early dPᵀ] keeps the next block's dPᵀ in flight across the loop's back edge at
    hd128: issued only where a next block exists, ptxas serialized every wgmma (C7512), and with
    an injected wait (C7517) it would wait for it at the wrong place. So no backward variant may
    have C7517 either, and its bf16 kernel keeps a handful of wgmma waits (serialized, it had one
    after each of its ~40 HGMMAs)."""
    ptxas, sass = request.getfixturevalue(which)
    assert "C7512" not in ptxas and "C7519" not in ptxas, [
        line for line in ptxas.splitlines() if "C751" in line
    ][:2]
    if which.startswith("compiled_bwd"):
        assert "C7517" not in ptxas, [ln for ln in ptxas.splitlines() if "C751" in ln][:2]
        _, body = _bf16_body(sass, "bwd_kernel")
        assert len(re.findall(r"WARPGROUP\.DEPBAR", body)) <= threshold("sm90_bwd_wgmma_waits_max")


def test_wgmma_rate_bench_compiles(tmp_path_factory):
    """bench/wgmma_rate.cu (the small-N wgmma rate the backward model needs, run on the H200)
    stays buildable: every shape it times is a real HGMMA, not serialized."""
    ptxas, sass = compile_cubin(tmp_path_factory, WGMMA_RATE, arch="90a")
    assert "C751" not in ptxas, [line for line in ptxas.splitlines() if "C751" in line][:2]
    for n in (32, 64, 128, 256):
        assert re.search(rf"HGMMA\.64x{n}x16", sass), f"no 64x{n}x16 wgmma"


def test_bwd_hd64_dq_split_by_rows(compiled_bwd_hd64):
    """Note [dQ split by rows]: at hd64 (128-row Q blocks) each warpgroup's dQ is 64 rows x the
    whole head dim, 8 HGMMA.64x64x16 per block (k = 128 kv rows), where splitting the head dim
    took 16 HGMMA.64x32x16 with 1.5x the shared-memory reads. Per bf16 kernel: Sᵀ and dPᵀ
    4 x 64x128x16 each (dPᵀ beside Sᵀ: no early dPᵀ with 128-row blocks, BwdTraits::kEarlyDp);
    dV, dK and dQ 8 x 64x64x16 each."""
    _, sass = compiled_bwd_hd64
    _, body = _bf16_body(sass, "bwd_kernel")
    shapes = re.findall(r"HGMMA\.(\d+x\d+x\d+)", body)
    assert "64x32x16" not in shapes, sorted(set(shapes))
    assert shapes.count("64x128x16") == 8 and shapes.count("64x64x16") == 24, shapes


def test_bwd_dq_from_registers_at_hd64_only(compiled_bwd, compiled_bwd_hd64):
    """Note [dQ from registers]: at hd64 the consumers add dQ with 16-byte reduce-adds, 8 per
    thread and block (64 rows x 64 columns of fp32 over 128 threads, 4 per reduce), and the
    reducer's bulk reduce-add stays for deterministic mode; at hd128 (64-row blocks, where the
    reduce-adds measured -4 %) dQ goes through the reducer only. The other 16-byte reduce-adds
    are a GQA head slice's dK and dV (Note [GQA head slices], red_dk_dv), once per tile: a
    thread's fragment of each, 32 floats at hd64 (128 kv rows x 64 over 256 threads), 64 at
    hd128 (a warpgroup's 64 kv rows x 128 over 128 threads)."""
    _, body64 = _bf16_body(compiled_bwd_hd64[1], "bwd_kernel")
    redg64 = len(re.findall(r"REDG\.E\.ADD\.F32x4", body64))
    assert redg64 == 8 + 2 * 32 // 4, f"hd64: 8 dQ and 16 dK/dV reduce-adds, not {redg64}"
    assert re.search(r"UBLKRED\.G\.S\.ADD\.F32", body64), "hd64: the reducer (deterministic)"
    _, body128 = _bf16_body(compiled_bwd[1], "bwd_kernel")
    # (REDG.E.ADD.S32 remains: deterministic mode's turn counters.)
    redg128 = re.findall(r"REDG\.E\.ADD\.F32\S*", body128)
    assert len(redg128) == 2 * 64 // 4 and all(r.startswith("REDG.E.ADD.F32x4") for r in redg128), (
        f"hd128: dQ through the reducer only; 32 dK/dV reduce-adds, not {redg128}"
    )


def test_bwd_early_dp_at_hd128(compiled_bwd):
    """Note [early dPᵀ] (64-row blocks, BwdTraits::kEarlyDp): per bf16 kernel Sᵀ = K·Qᵀ is
    8 HGMMA.64x64x16 (a warpgroup's 64 kv rows x 64 Q rows, k = d = 128) and dPᵀ = V·dOᵀ the
    same at each of its two issue sites (a tile's first, and the next block's behind dK); dQ
    8 x 64x64x16 (half of d each); dV and dK 4 x 64x128x16 each. With dPᵀ beside Sᵀ the kernel
    has 24 of the 64x64x16."""
    _, body = _bf16_body(compiled_bwd[1], "bwd_kernel")
    shapes = re.findall(r"HGMMA\.(\d+x\d+x\d+)", body)
    assert shapes.count("64x64x16") == 32 and shapes.count("64x128x16") == 8, shapes


def test_bwd_split_dq_reduce_adds_overlap_dv_dk(compiled_bwd_split):
    """Note [split dQ first]: dQ is issued first and waited for alone (a wgmma wait that leaves
    two batches, dV and dK, in flight); its 16 reduce-adds (hd256) follow that wait and precede
    the block's last wait (no early dPᵀ in the split variant: it measured -2-3 % at hd256)."""
    _, body = _bf16_body(compiled_bwd_split[1], "bwd_kernel")
    ops = re.findall(r"(WARPGROUP\.DEPBAR\.LE gsb0, 0x\d|REDG\.E\.ADD\.F32x4)", body)
    first = ops.index("REDG.E.ADD.F32x4")
    assert ops[first - 1] == "WARPGROUP.DEPBAR.LE gsb0, 0x2", ops
    after = ops[first:]
    assert after[:16] == ["REDG.E.ADD.F32x4"] * 16, ops
    assert after[16] == "WARPGROUP.DEPBAR.LE gsb0, 0x0", ops
    # the rest: a GQA head slice's dK / dV (Note [GQA head slices]), 64 floats each a thread
    assert after.count("REDG.E.ADD.F32x4") == 16 + 2 * 64 // 4, ops


def test_bwd_dk_dv_from_registers_at_hd64_only(compiled_bwd, compiled_bwd_hd64):
    """Note [dK/dV from registers] (BwdTraits::kDkDvRegs): at hd64 each consumer thread writes its
    two rows of dK and of dV as 4 + 4 16-byte chunks after quad_transpose (32 SHFL.BFLY), with
    no read-back of a staged tile (LDS.128). hd128 measured slower with it and keeps the staged
    epilogue (Note [dK/dV epilogue]), whose row chunks are read back with LDS.128."""
    ops = _opcodes(_bf16_body(compiled_bwd_hd64[1], "bwd_kernel")[1])
    assert ops.count("STG.E.128") == 8 and ops.count("SHFL.BFLY") == 32, sorted(set(ops))
    assert "LDS.128" not in ops
    assert "LDS.128" in _opcodes(_bf16_body(compiled_bwd[1], "bwd_kernel")[1])


@pytest.mark.parametrize("variant", ["compiled_bwd_hd64", "compiled_bwd", "compiled_bwd_split"])
def test_bwd_postprocess_from_registers_at_hd64_and_hd128(variant, request):
    """Note [postprocess from registers] (kPostRegs): at hd64 and hd128 each thread converts its
    32 fp32 dQ values and writes 4 16-byte row chunks after quad_transpose (two rounds of two
    SHFL.BFLY per four chunks): no shared memory, no barrier. The split variant (not measured
    with it) keeps the shared-memory copy and its barrier."""
    ops = _opcodes(_bf16_body(request.getfixturevalue(variant)[1], "bwd_postprocess_sm90")[1])
    smem = [o for o in ops if o.startswith(("BAR", "STS", "LDS"))]
    if variant != "compiled_bwd_split":
        assert ops.count("STG.E.128") == 4 and ops.count("SHFL.BFLY") == 16, ops
        assert not smem, sorted(set(ops))
    else:
        assert any(o.startswith("BAR") for o in smem), sorted(set(ops))


def _immediate_compares(body):
    """Registers compared (ISETP.GT.AND) against 31 or more distinct immediates."""
    hits = re.findall(r"ISETP\.GT\.AND P\d, PT, (R\d+)(?:\.reuse)?, (0x[0-9a-f]+), PT ;", body)
    per_reg = {}
    for reg, imm in hits:
        per_reg.setdefault(reg, set()).add(imm)
    return sum(len(v) >= 31 for v in per_reg.values())


def test_right_edge_mask_compares_against_immediates(compiled, compiled_hd64, compiled_hd96):
    """Note [right-edge mask] (default_right_edge_mask, every head dim but 96): a causal masked
    block tests each of a thread's 32 elements per row with one ISETP of a per-row bound register
    against the element's column offset as an immediate (0x1, 0x8, 0x9, ...), in the tile's first
    block and in the KV-block loop: at least two bound registers with 31 or more such compares,
    in the three-consumer hd64 kernel and at hd128. hd96 keeps the two-edge apply_mask (register
    against register, ISETP.GT.AND / .OR pairs per element), where the one-compare test cost its
    non-causal points 1.2-1.9 %."""
    assert (
        _immediate_compares(_bf16_body(compiled_hd64[1], "fwd_kernel", "bfloat16_tELi0E")[1]) >= 2
    )
    assert _immediate_compares(_bf16_body(compiled[1], "fwd_kernel")[1]) >= 2
    assert _immediate_compares(_bf16_body(compiled_hd96[1], "fwd_kernel")[1]) == 0


def test_stale_max_vote(compiled, compiled_hd64, compiled_hd96):
    """Note [stale-max vote] (every head dim): the KV-block loop votes once (VOTE.ALL) and its
    wait for its own P·V (WARPGROUP.DEPBAR.LE gsb0, 0x0) follows the row max (the last FMNMX)
    instead of preceding it, so the max overlaps that P·V; the row max's four SHFL.BFLY stay in
    the loop for the rare path. Checked at hd128, hd96 and in the three-consumer hd64 kernel."""

    def loop(sass, tag=""):
        ops = _block_loop_ops(sass, tag=tag)
        wait = ops.index("WARPGROUP.DEPBAR.LE", ops.index("WARPGROUP.DEPBAR.LE") + 1)
        last_max = max(i for i, o in enumerate(ops) if o == "FMNMX.FTZ")
        return ops, wait, last_max

    cases = [(compiled, ""), (compiled_hd96, ""), (compiled_hd64, "bfloat16_tELi0E")]
    for built, tag in cases:
        ops, wait, last_max = loop(built[1], tag)
        assert ops.count("VOTE.ALL") == 1 and ops.count("SHFL.BFLY") == 4, (tag, sorted(set(ops)))
        assert wait > last_max, (tag, wait, last_max)
