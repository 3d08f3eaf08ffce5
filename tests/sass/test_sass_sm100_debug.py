"""The bring-up build of the SM100 kernels (-DFA4_SM100_DEBUG, setup.py's FA4_SM100_DEBUG=1;
csrc/common/debug_wait.cuh) against the normal build, both compiled for sm_100a:

- the debug build compiles, and every mbarrier wait loop of the kernel reads the clock (a
  backward branch over a SYNCS...TRYWAIT has a CS2R SR_CLOCKLO in its range), except the two
  waits inside CUTLASS's 2-SM TMEM allocator (cute::TMEM::Allocator2Sm) in the 2-CTA backward;
- the debug build still has the kernel's structure: the same barrier inits (SYNCS.EXCH.64) and
  TMA descriptor prefetches, and every tcgen05 / TMA instruction family of the normal build
  (device code that reads the host barrier table at a run-time index is undefined, and ptxas
  then drops the whole thread-0 block, barrier init included: kRowStart keeps it constant);
- the normal build reads neither the clock nor %smid nor %globaltimer: its wait loops are try_wait
  alone. (Its SASS is byte for byte that of the sources without the kit, compared by hand for fwd
  and bwd hd 128.)

Compiled, not executed: whether the bounded waits report a real hang on SM100 is unproven;
tests/gpu/test_debug_wait.py runs the same helper on an SM90 GPU.
"""

from __future__ import annotations

import re

import pytest
from sass_helpers import compile_ahead, compile_instance, functions

pytestmark = pytest.mark.build

DEBUG = "-DFA4_SM100_DEBUG"
# (direction, head dim, kernel name part, unbounded wait loops allowed in the debug build)
KERNELS = [
    ("fwd", "128", "fwd_kernel", 0),  # two Q tiles
    ("fwd", "256", "fwd_kernel", 0),  # one Q tile (Note [one-tile order])
    ("bwd", "64", "bwd_kernel", 0),  # 1-CTA
    ("bwd", "128", "bwd_kernel_2cta", 2),  # 2-CTA: Allocator2Sm's own waits
]
compile_ahead(__name__, [("sm100", d, h, "bf16") for d, h, _, _ in KERNELS])
IDS = [f"{d}-hd{h}" for d, h, _, _ in KERNELS]


def _kernel(tmp_path_factory, direction, hdim, name, *defines) -> str:
    _, sass = compile_instance(tmp_path_factory, "sm100", direction, hdim, "bf16", *defines)
    found = [body for fn, body in functions(sass).items() if re.search(rf"\d{name}I", fn)]
    assert len(found) == 1, list(functions(sass))
    return found[0]


def _instructions(sass: str) -> list[tuple[int, str]]:
    return [
        (int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    ]


def wait_loops(sass: str) -> list[bool]:
    """Per backward branch whose range holds an mbarrier try_wait: whether the range reads the
    clock."""
    ins = _instructions(sass)
    at = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (addr, text) in enumerate(ins):
        m = re.search(r"\bBRA (?:\S+ )?0x([0-9a-f]+)$", text)
        if not m or int(m.group(1), 16) > addr or int(m.group(1), 16) not in at:
            continue
        body = [t for _, t in ins[at[int(m.group(1), 16)] : i + 1]]
        if any("TRYWAIT" in t for t in body):
            loops.append(any("SR_CLOCKLO" in t for t in body))
    return loops


def _count(sass: str, op: str) -> int:
    return len(re.findall(rf"\b{re.escape(op)}\b", sass))


def _families(sass: str) -> set[str]:
    return set(
        re.findall(r"\b(UTCHMMA|UTCBAR|UTCATOMSWS|UTMALDG|UTMASTG|UTMAREDG|LDTM|STTM)", sass)
    )


@pytest.mark.parametrize("direction, hdim, name, allowed", KERNELS, ids=IDS)
def test_debug_build_bounds_every_wait(tmp_path_factory, direction, hdim, name, allowed):
    sass = _kernel(tmp_path_factory, direction, hdim, name, DEBUG)
    loops = wait_loops(sass)
    assert len(loops) >= 8, f"only {len(loops)} wait loops found: is the parser still right?"
    assert loops.count(False) == allowed, f"{loops.count(False)} wait loops without a clock read"
    assert _count(sass, "BPT.TRAP") > _count(
        _kernel(tmp_path_factory, direction, hdim, name), "BPT.TRAP"
    )


@pytest.mark.parametrize("direction, hdim, name, allowed", KERNELS, ids=IDS)
def test_debug_build_keeps_the_kernel(tmp_path_factory, direction, hdim, name, allowed):
    debug = _kernel(tmp_path_factory, direction, hdim, name, DEBUG)
    normal = _kernel(tmp_path_factory, direction, hdim, name)
    for op in ("SYNCS.EXCH.64", "UTMACCTL.PF"):  # barrier inits, TMA descriptor prefetches
        assert _count(debug, op) == _count(normal, op) > 0, op
    assert _families(normal) <= _families(debug)


@pytest.mark.parametrize("direction, hdim, name, allowed", KERNELS, ids=IDS)
def test_normal_build_waits_are_try_wait_alone(tmp_path_factory, direction, hdim, name, allowed):
    sass = _kernel(tmp_path_factory, direction, hdim, name)
    loops = wait_loops(sass)
    assert loops and not any(loops)
    for debug_only in ("SR_CLOCKLO", "SR_GLOBALTIMERLO", "SR_VIRTUALSMID"):
        assert debug_only not in sass, debug_only
