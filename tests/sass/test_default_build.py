"""The default build (setup.py's FA4_CUDA_ARCHS "90a;100a") compiles host code for each kernel
translation unit, which the SASS tests (device code only, `nvcc -cubin`) never do. The SM100
sources once failed there: their templates called tcgen05 helpers that tmem.cuh declared for the
device pass only ("identifier tmem_wait_ld is undefined"), so a default `pip install` with a CUDA
toolkit could not build. `nvcc -cuda` runs the front end of both passes (no ptxas), which is
where that failed: here on the manifest's generated instance units of both SM100 kernels (the
1-CTA backward at hd 64, the 2-CTA one at hd 128) and on the SM100 dispatch entry points, with
the build's flags.

Runs in CI (CPU machine) with nvcc.
"""

import subprocess

import pytest
from helpers import ROOT, need_tool
from sass_helpers import cutlass_include, instance

from fa4 import manifest

pytestmark = pytest.mark.build

ARCHS = tuple(manifest.M["default_archs"])  # setup.py's default: 90a, 100a
UNITS = [("fwd", "64"), ("bwd", "64"), ("bwd", "128")]  # sm100 (direction, head dim), bf16


def _host_pass(nvcc, source, out, *includes):
    flags = manifest.nvcc_flags() + [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    cmd = [nvcc, "-cuda", str(source), "-o", str(out), *flags, f"-I{ROOT / 'csrc'}",
           *(f"-I{i}" for i in includes), f"-I{cutlass_include()}"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.parametrize("direction, hdim", UNITS, ids=[f"{d}_hd{h}" for d, h in UNITS])
def test_sm100_instances_compile_host_code(tmp_path, direction, hdim):
    nvcc = need_tool("nvcc", "compile the SM100 instances' host code")
    inst = instance("sm100", direction, hdim, "bf16")
    (unit,) = manifest.generate(tmp_path / "generated", [inst])
    _host_pass(nvcc, unit, tmp_path / "out.ii", unit.parent)


# ids not "sm100": that keyword is the hardware marker of tests/conftest.py
@pytest.mark.parametrize("family", ["sm90", "sm100"], ids=["sm90_e4m3", "sm100_e4m3"])
def test_fp8_forward_instances_compile_host_code(tmp_path, family):
    """The e4m3 forward instances (Note [fp8 forward]) through both archs' passes of the default
    build: each compiles the other family's kernel as an empty body, and the Vᵀ kernel and
    the e4m3 packing for both."""
    nvcc = need_tool("nvcc", "compile the FP8 instances' host code")
    inst = instance(family, "fwd", "128", "e4m3")
    (unit,) = manifest.generate(tmp_path / "generated", [inst])
    _host_pass(nvcc, unit, tmp_path / "out.ii", unit.parent)


@pytest.mark.parametrize("source", ["csrc/fwd_sm90.cu", "csrc/fwd_sm100.cu", "csrc/bwd_sm100.cu"])
def test_sm100_entry_points_compile_host_code(tmp_path, source):
    """The dispatch entry points expand fa4_instances.h's X-macro over every SM100 instance of
    the default build."""
    nvcc = need_tool("nvcc", "compile the SM100 entry points' host code")
    generated = tmp_path / "generated"
    manifest.generate(generated, manifest.instances(ARCHS))
    _host_pass(nvcc, ROOT / source, tmp_path / "out.ii", generated)
