"""SM100 TMEM plan (csrc/tmem.cuh): checked on the host and in sm_100a SASS.

Compiled, not executed: no Blackwell GPU is available. The plan is checked for overlapping
regions and the 512-column limit for every head dim; the tcgen05 helpers must compile to the
TMEM instructions (alloc, ld, st) with no local memory.
"""

import itertools
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import build_gxx
from test_sass_sm90 import _tool

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    exe = build_gxx(ROOT / "tests/cpp/tmem_plan_harness.cpp", tmp_path_factory.mktemp("tm") / "p")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    keys = "d_v block_n q_tiles s0 s1 o0 o1 p_cols end alloc".split()
    return [dict(zip(keys, map(int, line.split()), strict=True)) for line in out.splitlines()]


def regions(p):
    out = [("S0", p["s0"], p["block_n"]), ("O0", p["o0"], p["d_v"])]
    if p["q_tiles"] == 2:
        out += [("S1", p["s1"], p["block_n"]), ("O1", p["o1"], p["d_v"])]
    return out


def test_every_head_dim_has_a_plan(plans):
    assert [p["d_v"] for p in plans] == [64, 96, 128, 192, 256]


def test_regions_disjoint_and_within_512_columns(plans):
    for p in plans:
        spans = sorted((start, start + width, name) for name, start, width in regions(p))
        for (a0, a1, an), (b0, b1, bn) in itertools.pairwise(spans):
            assert a1 <= b0, f"d_v={p['d_v']}: {an} [{a0},{a1}) overlaps {bn} [{b0},{b1})"
        assert spans[-1][1] == p["end"] <= p["alloc"] <= 512, p
        assert p["alloc"] >= 32 and p["alloc"] & (p["alloc"] - 1) == 0, "power of two >= 32"
        assert p["p_cols"] * 2 == p["block_n"], "16-bit P packs two values per column"


def test_ping_pong_wherever_two_tiles_fit(plans):
    by_dv = {p["d_v"]: p for p in plans}
    assert all(by_dv[d]["q_tiles"] == 2 for d in (64, 96, 128, 192))
    assert by_dv[256]["q_tiles"] == 1  # O0 | O1 alone would take all 512 columns
    assert by_dv[128]["end"] == 512


@pytest.fixture(scope="module")
def probe_sass(tmp_path_factory):
    nvcc, cuobjdump, nvdisasm = _tool("nvcc"), _tool("cuobjdump"), _tool("nvdisasm")
    if None in (nvcc, cuobjdump, nvdisasm):
        pytest.skip(f"needs nvcc, cuobjdump, nvdisasm (found {nvcc}, {cuobjdump}, {nvdisasm})")
    cubin = tmp_path_factory.mktemp("tmem") / "probe.cubin"
    cmd = [nvcc, "-cubin", str(ROOT / "tests/cpp/tmem_probe_sm100.cu"), "-o", str(cubin),
           "-std=c++17", "-O3", "-gencode=arch=compute_100a,code=sm_100a",
           f"-I{ROOT / 'csrc'}", "-Xptxas=-v"]  # fmt: skip
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    env = {**os.environ, "NVDISASM_PATH": str(Path(nvdisasm).parent)}
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    assert sass.returncode == 0, sass.stderr
    return build.stderr, sass.stdout


@pytest.mark.parametrize(
    "op, why",
    [
        ("UTCATOMSWS", "tcgen05.alloc / dealloc"),
        ("LDTM.x32", "tcgen05.ld of 32 columns (S and O chunks)"),
        ("STTM.x16", "tcgen05.st of a 16-bit P chunk"),
        ("STTM.x32", "tcgen05.st of a rescaled O chunk"),
    ],
)
def test_probe_sass_has(probe_sass, op, why):
    assert op in probe_sass[1], f"{op} missing: {why}"


def test_probe_uses_no_local_memory(probe_sass):
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", probe_sass[0])
    assert len(frames) == 4 and all(f == ("0", "0") for f in frames), probe_sass[0]
