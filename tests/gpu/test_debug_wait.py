"""The bring-up kit's bounded wait (csrc/common/debug_wait.cuh) on a real GPU: the planted-bug
kernel tests/gpu/debug_probe.cu, built with nvcc for this device (sm_90a on the H100), uses the
same debug::wait, kernel_begin, site_tile / site_block and trace as the SM100 kernels in a
FA4_SM100_DEBUG build.

- clean run: every block arrives, the kernel finishes, no record, and the trace rings hold each
  warp's waits and arrivals in clock order;
- planted bug (the producer leaves out block 3's arrival): the launch fails (the trap) and
  fa4.debug turns the area into the message naming the consumer warp, kFull[1], phase 1, block 3
  and tile (b 0, h 2, m 1), and the producer, which waits on kEmpty[1] behind it.
Each run is a subprocess: the trap ends the CUDA context of its process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import need_tool

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "gpu" / "debug_probe.cu"
# ~30 ms at 1.7 GHz: the hang is reported in well under a second
TIMEOUT_CYCLES = 50_000_000

CHILD = r"""
import ctypes, json, sys
from fa4 import debug
path, blocks, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lib = ctypes.CDLL(path)
out = (ctypes.c_int * blocks)()
err = lib.probe_run(blocks, skip, out)
buf = debug.read_library(path)
area = debug.decode(buf) if buf is not None else None
rings = [] if area is None else [
    {"index": r.index, "role": r.role, "events": [[e.clock, e.kind, e.row, e.copy, e.parity,
     e.block] for e in r.events]} for r in area.rings]
print(json.dumps({"err": err, "out": list(out), "rings": rings,
                  "message": None if area is None else debug.message(area),
                  "records": None if area is None else len(area.records)}))
"""


def _cutlass_include() -> str:
    """setup.py's order: $CUTLASS_PATH, third_party/cutlass/include, the nvidia-cutlass wheel."""
    env = os.environ.get("CUTLASS_PATH")
    local = ROOT / "third_party" / "cutlass" / "include"
    for cand in ([Path(env) / "include"] if env else []) + [local]:
        if (cand / "cute" / "tensor.hpp").exists():
            return str(cand)
    cutlass_library = pytest.importorskip("cutlass_library", reason="CUTLASS headers not found")
    return str(Path(cutlass_library.source_path) / "include")


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    nvcc = need_tool("nvcc", "build the debug probe")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major >= 9 else "")
    lib = tmp_path_factory.mktemp("debug_probe") / "debug_probe.so"
    cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", "--expt-relaxed-constexpr",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{ROOT / 'csrc'}",
           f"-I{_cutlass_include()}", str(PROBE), "-o", str(lib)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr[-4000:]}"
    return lib


def _run(lib: Path, blocks: int, skip: int, trace: bool = False) -> dict:
    env = {**os.environ, "FA4_DEBUG_WAIT_CYCLES": str(TIMEOUT_CYCLES)}
    env["FA4_DEBUG_TRACE"] = "1" if trace else "0"
    res = subprocess.run([sys.executable, "-c", CHILD, str(lib), str(blocks), str(skip)],
                         capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_clean_run_finishes_without_a_record_and_traces_every_wait(probe):
    got = _run(probe, blocks=6, skip=-1, trace=True)
    assert got["err"] == 0
    assert got["out"] == list(range(6))
    assert got["records"] == 0 and got["message"] is None
    rings = {r["index"]: r for r in got["rings"]}
    assert sorted(rings) == [0, 1]  # CTA 0: warp 0 (producer), warp 1 (consumer)
    assert (rings[0]["role"], rings[1]["role"]) == (0, 1)
    cons = rings[1]["events"]
    # per block: wait on kFull[n % 2] (row 0) with parity (n / 2) & 1, its end, kEmpty's arrival
    assert [(e[1], e[2], e[3], e[4], e[5]) for e in cons] == [
        ev for n in range(6) for ev in
        [("wait", 0, n % 2, (n // 2) & 1, n), ("done", 0, n % 2, (n // 2) & 1, n),
         ("arrive", 1, n % 2, 0, n)]
    ]  # fmt: skip
    prod = rings[0]["events"]
    assert [e[1] for e in prod].count("arrive") == 6
    assert [(e[1], e[2]) for e in prod if e[1] != "arrive"] == [("wait", 1), ("done", 1)] * 4
    for ring in (cons, prod):
        clocks = [e[0] for e in ring]
        assert clocks == sorted(clocks)


def test_planted_missing_arrive_names_barrier_role_phase_and_site(probe):
    got = _run(probe, blocks=6, skip=3)
    assert got["err"] != 0, "the kernel must fail (trap) when a wait expires"
    text = got["message"]
    assert text is not None, "no record in the debug area after the trap"
    assert text.startswith("debug probe (tests/gpu/test_debug_wait.py) hung: "), text
    consumer = "consumer warp waited on kFull[1] phase 1 at block 3 of tile (b 0, h 2, m 1)"
    producer = "producer warp waited on kEmpty[1] phase 1 at block 5 of tile (b 0, h 2, m 1)"
    assert consumer in text and producer in text, text
    assert got["records"] == 2, text  # one per waiting warp, not per thread
    assert "CTA (0, 0, 0) rank 0, warp 1, SM" in text and "CTA (0, 0, 0) rank 0, warp 0, SM" in text
