"""The kernel manifest (fa4/kernels.json) drives both builds: setup.py and CMakeLists.txt generate
the same instance translation units and fa4_instances.h from it and compile them with the same
nvcc flags, so the C++ library runs the machine code the Python extension was tested with."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import load_script

from fa4 import manifest

ROOT = Path(__file__).resolve().parents[2]


def test_manifest_names_existing_files_and_known_values():
    m = manifest.load()
    assert set(m["default_archs"]) <= set(m["archs"])
    for k in m["kernels"]:
        assert (ROOT / "csrc" / k["header"]).is_file(), k["header"]
        assert (ROOT / "csrc" / f"{k['direction']}_{k['family']}.cu").is_file(), k
        assert set(k["head_dims"]) <= set(m["head_dims"]), k
        assert set(k["dtypes"]) <= set(m["dtypes"]), k
        assert k["family"] in set(m["archs"].values()) | set(m.get("portable", [])), k


def test_selection_follows_archs_hdims_and_bwd(tmp_path):
    everything = manifest.instances(["90a"], ["128", "192x128"], bwd=False)
    # The portable decode family comes with any arch (kernels.json "portable").
    assert {i.family for i in everything} == {"sm90", "decode"}
    assert manifest.instances([], ["128"]) == []
    insts = [i for i in everything if i.family == "sm90"]
    assert {i.direction for i in insts} == {"fwd"}
    assert {(i.dims, i.dtype) for i in insts} == {
        ((128, 128), "bf16"),
        ((128, 128), "fp16"),
        ((192, 128), "bf16"),
        ((192, 128), "fp16"),
        ((128, 128), "e4m3"),  # the FP8 forward (hd 64, 128, 256: a kernels entry of its own)
    }
    units = manifest.generate(tmp_path, insts)
    assert sorted(p.name for p in tmp_path.glob("*.cu")) == sorted(p.name for p in units)
    header = (tmp_path / "fa4_instances.h").read_text()
    # one list per family and direction, the e4m3 entry's instances after the 16-bit ones
    want = (
        "#define FA4_INSTANCES_SM90_FWD(X) X(128, 128, kBFloat16) X(128, 128, kFloat16) "
        "X(192, 128, kBFloat16) X(192, 128, kFloat16) X(128, 128, kE4M3)\n"
    )
    assert want in header
    assert header.count("FA4_INSTANCES_SM90_FWD") == 1
    assert "SM90_BWD" not in header and "SM100" not in header
    # A narrower selection removes the units it no longer has.
    manifest.generate(tmp_path, insts[:1])
    assert [p.name for p in tmp_path.glob("*.cu")] == [insts[0].filename]
    with pytest.raises(ValueError, match="unknown head dim"):
        manifest.instances(["90a"], ["80"])


def test_build_config_lists_pairs_per_family():
    insts = manifest.instances(["90a", "100a"], ["64", "256"])
    kernels = manifest.build_kernels(insts)
    assert kernels["fwd"]["sm90"] == [[64, 64], [256, 256]]
    assert kernels["bwd"]["sm100"] == [[64, 64], [256, 256]]


def _cmake_configure(tmp_path, hdims):
    cmake, nvcc = shutil.which("cmake"), shutil.which("nvcc")
    if cmake is None or nvcc is None:
        pytest.skip(f"needs cmake and nvcc (found {cmake}, {nvcc})")
    build = tmp_path / "cmake"
    cmd = [cmake, "-S", str(ROOT), "-B", str(build), f"-DFA4_HDIMS={';'.join(hdims)}",
           "-DFA4_CUDA_ARCHS=90a;100a", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return build


@pytest.mark.build
def test_cmake_generates_what_setup_generates_with_the_same_flags(tmp_path):
    hdims = ["96", "192x128"]
    build = _cmake_configure(tmp_path, hdims)
    ours = tmp_path / "ours"
    manifest.generate(ours, manifest.instances(["90a", "100a"], hdims))
    theirs = build / "generated"
    assert sorted(p.name for p in theirs.iterdir()) == sorted(p.name for p in ours.iterdir())
    for p in ours.iterdir():
        assert (theirs / p.name).read_text() == p.read_text(), p.name

    setup = load_script(ROOT / "setup.py", "fa4_setup")
    want = setup._nvcc_flags(["90a", "100a"])
    commands = json.loads((build / "compile_commands.json").read_text())
    units = [c for c in commands if "/generated/" in c["file"]]
    assert len(units) == len(list(ours.glob("*.cu")))
    for c in units + [c for c in commands if c["file"].endswith("csrc/api/dispatch.cu")]:
        args = c["command"].split()
        flags = [a for a in want if not a.startswith("-gencode")]
        start = args.index(flags[0])
        assert args[start : start + len(flags)] == flags, c["command"]
        stds = [a for a in args if a.startswith("-std=")]
        assert stds == [f for f in flags if f.startswith("-std=")], stds
        archs = sorted(a.split("code=")[-1].strip("[]") for a in args if "--generate-code" in a)
        assert archs == ["sm_100a", "sm_90a"], c["command"]
        assert not any("compute_" in a.split("code=")[-1] for a in args if "generate-code" in a)
