"""The decode kernel (csrc/decode) as the build compiles it, for both archs it is built for:
sm_90a (run by tests/gpu/test_decode.py on H100 / H200) and sm_100a (compiled, not executed).
Each instance is the manifest's (sass_helpers.compile_instance); the SASS must show the design:
tensor-core MMAs from ldmatrix'd shared memory (HMMA, LDSM), K/V blocks by TMA tiles (UTMALDG)
with 16-byte cp.async chunks (LDGSTS) for the blocks TMA cannot take, both completing an
mbarrier, no spills, and registers within the occupancy that decode/plan.h's ctas_per_sm
promises (__launch_bounds__ enforces it; this pins it). Each tile shape (warps_n 4, 2, 1) has a
16-bit-cache kernel and an FP8-cache one (Note [fp8 cache]), each with the TMA producer
(variant 3) and the gather it falls back to where the cache admits no descriptor (variant 2);
the FP8 ones unpack e4m3 pairs to fp16 in registers (F2FP.F16.E4M3.UNPACK_B, Note [fp8
fragments]) and run fp16 MMAs.
"""

import re

import pytest
from sass_helpers import compile_ahead, compile_instance, entries, functions

pytestmark = pytest.mark.build

CASES = [("128", "bf16", "90a"), ("256", "bf16", "90a"), ("128", "fp16", "100a"),
         ("128", "bf16", "100a"), ("256", "bf16", "100a"), ("64", "bf16", "90a"),
         ("96", "bf16", "90a"), ("192", "bf16", "90a")]  # fmt: skip
compile_ahead(__name__, [("decode", "fwd", h, t) for h, t, _ in CASES])

# decode/plan.h's ctas_per_sm per (head dim, FP8 cache), for warps_n 4, 2 and 1: 65536
# registers per SM over that many CTAs of 160 threads, at most 255 (the ISA's cap). The FP8
# caches' counts are the register cap's (their shared memory would allow more).
CTAS_PER_SM = {("64", False): (2, 2, 2), ("64", True): (3, 3, 3), ("96", False): (2, 2, 2),
               ("96", True): (3, 3, 2), ("128", False): (2, 2, 2), ("128", True): (2, 2, 2),
               ("192", False): (2, 1, 1), ("192", True): (2, 1, 1), ("256", False): (1, 1, 1),
               ("256", True): (1, 1, 1)}  # fmt: skip
NAME = re.compile(r"decode_kernelILi\d+ELi\d+EN7cutlass\w+ELi([124])ELb([01])ELb([01])EE")


def _shape(name):
    """(warps_n, fp8 cache, TMA producer) from the kernel's mangled name."""
    m = NAME.search(name)
    assert m, name
    return int(m.group(1)), m.group(2) == "1", m.group(3) == "1"


@pytest.mark.parametrize("hdim,dtype,arch", CASES)
def test_decode_sass(tmp_path_factory, hdim, dtype, arch):
    ptxas, sass = compile_instance(tmp_path_factory, "decode", "fwd", hdim, dtype, arch=arch)
    reports = {n: r for n, r in entries(ptxas, arch).items() if "decode_kernel" in n}
    shapes = sorted(_shape(n) for n in reports)
    # per tile shape and cache type: the TMA producer and the gather it falls back to
    want = sorted((w, fp8, t) for w in (4, 2, 1) for fp8 in (False, True) for t in (False, True))
    assert shapes == want, f"two kernels per tile shape and cache type, got {list(reports)}"
    for name, r in reports.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)
        warps_n, fp8, _ = _shape(name)
        ctas = CTAS_PER_SM[hdim, fp8][(4, 2, 1).index(warps_n)]
        cap = min(255, 65536 // (ctas * 160) // 8 * 8)
        assert r["registers"] <= cap, (name, r, cap)
    kernels = {n: f for n, f in functions(sass).items() if "decode_kernel" in n}
    assert len(kernels) == 12
    for name, text in kernels.items():
        _, fp8, tma = _shape(name)
        assert "LDSM" in text, f"{name}: no ldmatrix"
        assert "LDGSTS" in text, f"{name}: no cp.async (Note [row gather])"
        assert ("UTMALDG" in text) == tma, f"{name}: TMA iff the TMA producer"
        want = _copy_batch(int(hdim), fp8)
        assert _longest_copy_run(text) >= want, f"{name}: copies not batched (copy_block)"
        assert "SYNCS" in text, f"{name}: no mbarrier operation"
        # fp16 MMAs with an FP8 cache whatever q's dtype; else the cache's type
        mma = (
            r"\bHMMA\.16816\.F32\.BF16\b" if dtype == "bf16" and not fp8 else r"\bHMMA\.16816\.F32 "
        )
        assert re.search(mma, text), f"{name}: no m16n8k16 tensor-core MMA of the expected type"
        assert ("F2FP.F16.E4M3.UNPACK_B" in text) == fp8, f"{name}: e4m3 unpack iff an FP8 cache"
        # Note [pdl combine]: griddepcontrol.launch_dependents, before any global load
        assert _first_index(text, r"\bPREEXIT\b") < _first_index(text, r"\bLDG\b"), name
    combines = [f for n, f in functions(sass).items() if "combine_kernel" in n]
    assert len(combines) == 1, "one combine kernel per instance"
    # Note [pdl combine]: griddepcontrol.wait before the partials are used (their float4 loads,
    # the exp2 of their LSEs); the sequence lengths may be read before it.
    at = _first_index(combines[0], r"\bACQBULK\b")
    assert at < len(combines[0].splitlines()), "combine without griddepcontrol.wait"
    assert at < _first_index(combines[0], r"\bLDG\.E\.128\b"), "partials loaded before the wait"
    assert at < _first_index(combines[0], r"\bMUFU\.EX2\b"), "LSEs used before the wait"


def _first_index(text, pattern):
    """Index of the first SASS line matching pattern (`@!PT` padding aside); len(lines) if none."""
    lines = [x for x in text.splitlines() if "@!PT" not in x]
    return next((i for i, x in enumerate(lines) if re.search(pattern, x)), len(lines))


def _copy_batch(hdim, fp8):
    """copy_block's kBatch: the copies whose offsets it loads before issuing any (decode/copy.cuh),
    8 where a block's 16-byte chunks per lane divide by 8 (4 for an hd96 e4m3 block: 12)."""
    iters = 64 * (hdim * (1 if fp8 else 2) // 16) // 32
    return next(b for b in (8, 4, 2, 1) if iters % b == 0)


def _longest_copy_run(text):
    """The most LDGSTS in a row with no shared-memory load between them (never-taken `@!PT LDS`
    padding aside): 1-2 when each copy waits for its own row offset, 8 or more for batches."""
    run = best = 0
    for line in text.splitlines():
        if "@!PT" in line:
            continue
        if "LDGSTS" in line:
            run += 1
            best = max(best, run)
        elif re.search(r"\bLDS(\.\w+)?\b", line):
            run = 0
    return best
