"""The kernel manifest (fa4/kernels.json): which kernel instances exist and how they are compiled.

setup.py, CMakeLists.txt (which reads the JSON itself and writes the same files), tools/ and
tests read it here; `python -m fa4` and the GPU tests take their head-dim lists from it. A build
selects instances by arch and head dim and generates, into its build folder:
- one translation unit per instance (instance_source): the kernel family's instance header and
  one FA4_INSTANCE_<DIR> line, so ninja compiles every (head dim, dtype) in parallel;
- fa4_instances.h (instances_header): FA4_INSTANCES_<FAMILY>_<DIR>(X), one X(d, d_v, dtype) per
  instance, which the dispatch entry points (csrc/fwd_sm90.cu, ...) and csrc/api/dispatch.cu
  expand. A family with no instance has no macro, and dispatch reports it as not compiled.

Standard library only: setup.py imports it before torch is known to be there, and
tools/sass_diff.py loads it from another commit's tree. Command line:
  python fa4/manifest.py flags                       the nvcc flags, one per line
  python fa4/manifest.py list [--archs A] [--hdims H] [--no-bwd]
  python fa4/manifest.py generate OUT_DIR [--archs A] [--hdims H] [--no-bwd]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

PATH = Path(__file__).resolve().parent / "kernels.json"
GENERATED_BY = "// Generated from fa4/kernels.json by fa4/manifest.py or CMake: do not edit.\n"
HEADER_NAME = "fa4_instances.h"


def load() -> dict:
    return json.loads(PATH.read_text())


M = load()
ARCHS: dict[str, str] = M["archs"]  # arch -> kernel family
HEAD_DIMS: dict[str, tuple[int, int]] = {k: tuple(v) for k, v in M["head_dims"].items()}
DTYPES: dict[str, str] = M["dtypes"]  # name -> fa4::DType enumerator


@dataclass(frozen=True)
class Instance:
    family: str  # sm90, sm100, decode
    direction: str  # fwd, bwd
    hdim: str  # a HEAD_DIMS key
    dtype: str  # a DTYPES key
    header: str  # the family's instance header, relative to csrc/

    @property
    def dims(self) -> tuple[int, int]:
        return HEAD_DIMS[self.hdim]

    @property
    def filename(self) -> str:
        return f"{self.family}_{self.direction}_hd{self.hdim}_{self.dtype}.cu"


def nvcc_flags() -> list[str]:
    """The nvcc flags of every kernel translation unit, in both builds (no -gencode, no -I)."""
    return list(M["nvcc_flags"])


def cxx_flags() -> list[str]:
    return list(M["cxx_flags"])


def instances(archs=None, hdims=None, bwd: bool = True) -> list[Instance]:
    """The instances a build of `archs` and `hdims` (None: the defaults / all) compiles."""
    archs = list(M["default_archs"]) if archs is None else list(archs)
    hdims = list(HEAD_DIMS) if hdims is None else list(hdims)
    for name, known, given in (("arch", ARCHS, archs), ("head dim", HEAD_DIMS, hdims)):
        bad = [x for x in given if x not in known]
        if bad:
            raise ValueError(f"unknown {name} {bad}; the manifest has {list(known)}")
    families = {ARCHS[a] for a in archs}
    if families:  # compiled for every arch of the build (kernels.json "portable")
        families |= set(M.get("portable", []))
    out = []
    for k in M["kernels"]:
        if k["family"] not in families or (k["direction"] == "bwd" and not bwd):
            continue
        for h in k["head_dims"]:
            if h in hdims:
                for t in k["dtypes"]:
                    out.append(Instance(k["family"], k["direction"], h, t, k["header"]))
    return out


def instance_source(inst: Instance) -> str:
    d, dv = inst.dims
    return (
        GENERATED_BY
        + f'#include "{inst.header}"\n'
        + f"FA4_INSTANCE_{inst.direction.upper()}({inst.family}, {d}, {dv}, {DTYPES[inst.dtype]})\n"
    )


def instances_header(insts: list[Instance]) -> str:
    lines = [GENERATED_BY.rstrip("\n"), "#pragma once"]
    # one list per (family, direction), whose instances may come from several kernels entries
    # (the SM90 forward's e4m3 instances have head dims of their own)
    pairs = list(dict.fromkeys((k["family"], k["direction"]) for k in M["kernels"]))
    for family, direction in pairs:
        k = {"family": family, "direction": direction}
        mine = [i for i in insts if (i.family, i.direction) == (family, direction)]
        if mine:
            cases = " ".join(f"X({i.dims[0]}, {i.dims[1]}, {DTYPES[i.dtype]})" for i in mine)
            name = f"FA4_INSTANCES_{k['family'].upper()}_{k['direction'].upper()}"
            lines.append(f"#define {name}(X) {cases}")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    """Writes only on change, so that ninja does not recompile an unchanged instance."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(out_dir: Path, insts: list[Instance]) -> list[Path]:
    """Writes the instance translation units and fa4_instances.h into out_dir; returns the units."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / HEADER_NAME, instances_header(insts))
    keep = {HEADER_NAME}
    units = []
    for inst in insts:
        _write(out_dir / inst.filename, instance_source(inst))
        keep.add(inst.filename)
        units.append(out_dir / inst.filename)
    for stale in out_dir.glob("*.cu"):
        if stale.name not in keep:
            stale.unlink()
    return units


def generate_sources(out_dir: Path, archs, hdims, bwd: bool = True) -> list[tuple[str, Path]]:
    """(arch, translation unit) per instance, for tools that compile one arch per unit."""
    arch_of = {}
    for a in archs:
        arch_of.setdefault(ARCHS[a], a)
    insts = instances(archs, hdims, bwd)
    return [(arch_of[i.family], p) for i, p in zip(insts, generate(out_dir, insts), strict=True)]


def build_kernels(insts: list[Instance]) -> dict:
    """{"fwd": {"sm90": [[d, d_v], ...]}, "bwd": {...}}: the (d, d_v) pairs compiled per family,
    as fa4/_build_config.py records them for dispatch."""
    out: dict = {"fwd": {}, "bwd": {}}
    for i in insts:
        pairs = out[i.direction].setdefault(i.family, [])
        if list(i.dims) not in pairs:
            pairs.append(list(i.dims))
    return out


def cover(compiled, d: int, dv: int) -> tuple[int, int] | None:
    """The compiled (D, D_v) pair that serves head dims (d, dv), as csrc/common/head_dims.h's
    cover picks it (Note [padded head dims]): D >= d and D_v >= dv, the least D + D_v, then the
    least D; None when no pair covers them."""
    fits = [(a, b) for a, b in (tuple(p) for p in compiled) if a >= d and b >= dv]
    return min(fits, key=lambda p: (p[0] + p[1], p[0])) if fits else None


def head_dims_of(family: str, direction: str) -> list[tuple[int, int]]:
    """Every (d, d_v) the manifest has for a kernel family: the GPU tests' parameter lists."""
    for k in M["kernels"]:
        if (k["family"], k["direction"]) == (family, direction):
            return [HEAD_DIMS[h] for h in k["head_dims"]]
    raise KeyError((family, direction))


def _split(s: str | None) -> list[str] | None:
    return None if s is None else [x for x in s.replace(";", ",").split(",") if x]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["flags", "list", "generate"])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--archs")
    ap.add_argument("--hdims")
    ap.add_argument("--no-bwd", action="store_true")
    a = ap.parse_args(argv)
    if a.what == "flags":
        print("\n".join(nvcc_flags()))
        return
    insts = instances(_split(a.archs), _split(a.hdims), not a.no_bwd)
    if a.what == "list":
        for i in insts:
            print(i.filename[: -len(".cu")])
    else:
        if not a.out:
            ap.error("generate needs OUT_DIR")
        for p in generate(Path(a.out), insts):
            print(p)


if __name__ == "__main__":
    main()
