"""Builds fa4: the Python package always; the CUDA extension fa4._C when torch has CUDA and nvcc
is found. Build flags (environment variables, documented in README.md):

  FA4_CUDA_ARCHS       archs to compile, ';' or ',' separated (default "90a;100a")
  FA4_HDIMS            head dims to compile: 64,96,128,192,256,192x128 (default all)
  FA4_DISABLE_BWD      1: compile no backward kernels
  FA4_SKIP_CUDA_BUILD  1: install the pure-Python package only
  FA4_NVCC_EXTRA       extra nvcc flags for measurement builds (e.g. -DFA4_SM90_PINGPONG=0)

What was compiled is written to fa4/_build_config.py, which dispatch reads.
"""

from __future__ import annotations

import os
import pprint
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
VERSION = (ROOT / "fa4" / "VERSION").read_text().strip()
KNOWN_ARCHS = ("90a", "100a", "100f", "103a")
ALL_HDIMS = {"64": (64, 64), "96": (96, 96), "128": (128, 128), "192": (192, 192),
             "256": (256, 256), "192x128": (192, 128)}  # fmt: skip
# Kernel sources per (arch family, direction): the dispatch file plus one instantiation file per
# head-dim pair ("{h}" is the FA4_HDIMS name, lower case), so ninja compiles them in parallel
# (the SM90 forward's in two, bf16 and fp16: its longest file took 89 s for both).
# Filled as kernels land (issues 3-6); the extension itself always carries the API dispatch.
KERNEL_SOURCES: dict[tuple[str, str], list[str]] = {
    ("sm90", "fwd"): ["csrc/fwd_sm90.cu", "csrc/fwd_sm90_hd{h}.cu", "csrc/fwd_sm90_hd{h}_fp16.cu"],
    ("sm90", "bwd"): ["csrc/bwd_sm90.cu", "csrc/bwd_sm90_hd{h}.cu"],
    # Compiled, not executed (no Blackwell GPU available to this project): docs/sm100.md.
    ("sm100", "fwd"): ["csrc/fwd_sm100.cu"],
    ("sm100", "bwd"): ["csrc/bwd_sm100.cu"],
}
# Kernels that cover only some head dims (the rest run the reference, with dispatch's warning);
# absent: every head dim.
KERNEL_HDIMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("sm100", "fwd"): ("64", "96", "128", "192", "256", "192x128"),
    # 1-CTA kernel at 64/96, 2-CTA at 128, 1-CTA with the head dim split over two CTAs above.
    ("sm100", "bwd"): ("64", "96", "128", "192", "256", "192x128"),
}
ARCH_FAMILY = {"90a": "sm90", "100a": "sm100", "100f": "sm100", "103a": "sm100"}


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _list_flag(name: str, default: str, known) -> list[str]:
    items = [s.strip() for s in os.environ.get(name, default).replace(",", ";").split(";")]
    items = [s for s in items if s]
    bad = [s for s in items if s not in known]
    if bad or not items:
        sys.exit(f"fa4: {name}={os.environ.get(name)!r}: unknown {bad}; choose from {list(known)}")
    return items


def _why_no_cuda() -> str | None:
    if _truthy("FA4_SKIP_CUDA_BUILD"):
        return "FA4_SKIP_CUDA_BUILD is set"
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return "torch is not installed in the build environment"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (no CUDA)"
    if CUDA_HOME is None or not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return "nvcc not found (set CUDA_HOME to a CUDA toolkit)"
    if not (Path(CUDA_HOME) / "include" / "cuda_runtime_api.h").exists():
        # e.g. /usr/local/bin/nvcc being a wrapper script makes torch guess CUDA_HOME=/usr/local
        return f"CUDA_HOME={CUDA_HOME} has no include/cuda_runtime_api.h (set CUDA_HOME)"
    return None


def find_cutlass_include() -> str:
    """CUTLASS/CuTe headers, in order: $CUTLASS_PATH, third_party/cutlass/include, the wheel."""
    tried = []
    env = os.environ.get("CUTLASS_PATH")
    if env:
        tried.append(f"CUTLASS_PATH={env} (looked in {env}/include)")
        if (Path(env) / "include" / "cute" / "tensor.hpp").exists():
            return str(Path(env) / "include")
    else:
        tried.append("CUTLASS_PATH (unset)")
    local = ROOT / "third_party" / "cutlass" / "include"
    tried.append(f"{local} (fill it: python third_party/cutlass/fetch_headers.py)")
    if (local / "cute" / "tensor.hpp").exists():
        return str(local)
    try:
        import cutlass_library

        wheel = Path(cutlass_library.source_path) / "include"
        tried.append(f"the nvidia-cutlass wheel ({wheel})")
        if (wheel / "cute" / "tensor.hpp").exists():
            return str(wheel)
    except ImportError:
        tried.append(
            "the nvidia-cutlass wheel (not installed: pip install nvidia-cutlass==4.2.0.0)"
        )
    sys.exit("fa4: CUTLASS headers not found. Tried:\n  " + "\n  ".join(tried))


def _nvcc_flags(archs: list[str], hdims: list[str], bwd: bool) -> list[str]:
    # No -std: torch's extension builder picks the standard its headers need (C++20 from 2.10).
    # NDEBUG: CUTLASS's pipelines otherwise keep a role check (and its register) in every wait.
    flags = ["-O3", "--expt-relaxed-constexpr", "--use_fast_math", "-lineinfo", "-DNDEBUG"]
    flags += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    flags += [f"-DFA4_HDIM_{h.upper()}" for h in hdims]
    # Measurement builds: compile-time switches such as -DFA4_SM90_PINGPONG=0.
    flags += os.environ.get("FA4_NVCC_EXTRA", "").split()
    return flags + ([] if bwd else ["-DFA4_DISABLE_BWD"])


def _extension(archs, hdims, bwd, config):
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    sources = ["csrc/api/bindings.cpp", "csrc/api/dispatch.cu"]
    kernels: dict = {"fwd": {}, "bwd": {}}
    for (family, direction), files in KERNEL_SOURCES.items():
        if direction == "bwd" and not bwd:
            continue
        covered = [h for h in hdims if h in KERNEL_HDIMS.get((family, direction), ALL_HDIMS)]
        if covered and any(ARCH_FAMILY[a] == family for a in archs):
            sources += sorted({f.format(h=h.lower()) for f in files for h in covered})
            kernels[direction][family] = [list(ALL_HDIMS[h]) for h in covered]
    config["kernels"] = kernels
    # api/dispatch.cu's kernel table: FA4_HAS_<ARCH>_<DIR> for each kernel file compiled in.
    defines = [f"-DFA4_HAS_{fam.upper()}_{d.upper()}" for d, per in kernels.items() for fam in per]
    version = [f'-DFA4_VERSION="{VERSION}"', *defines]
    ext = CUDAExtension(
        "fa4._C",
        sources=sources,
        include_dirs=[str(ROOT / "csrc"), find_cutlass_include()],
        extra_compile_args={
            "cxx": ["-O3", *version],
            "nvcc": _nvcc_flags(archs, hdims, bwd) + version,
        },
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


def _write_config(config: dict) -> None:
    text = (
        '"""Written by setup.py: what this installation compiled. Do not edit."""\n\n'
        f"CONFIG = {pprint.pformat(config, sort_dicts=True)}\n"
    )
    (ROOT / "fa4" / "_build_config.py").write_text(text)


def main():
    archs = _list_flag("FA4_CUDA_ARCHS", "90a;100a", KNOWN_ARCHS)
    hdims = _list_flag("FA4_HDIMS", ";".join(ALL_HDIMS), ALL_HDIMS)
    bwd = not _truthy("FA4_DISABLE_BWD")
    reason = _why_no_cuda()
    config = {"built": reason is None, "reason": reason, "archs": archs, "hdims": hdims,
              "bwd": bwd, "kernels": {"fwd": {}, "bwd": {}}}  # fmt: skip
    ext_modules, cmdclass = [], {}
    if reason is None:
        import torch

        config["torch"], config["cuda"] = torch.__version__, torch.version.cuda
        ext_modules, cmdclass = _extension(archs, hdims, bwd, config)
    else:
        print(f"fa4: CUDA kernels not built: {reason}; installing the pure-Python package "
              "(CPU reference only).", file=sys.stderr)  # fmt: skip
    _write_config(config)
    setup(
        name="fa4",
        version=VERSION,
        description="FlashAttention-4 kernels for Blackwell (SM100) and Hopper (SM90)",
        packages=find_packages(include=["fa4", "fa4.*"]),
        package_data={"fa4": ["VERSION"]},
        python_requires=">=3.10",
        install_requires=["torch>=2.4"],
        extras_require={"test": ["pytest", "numpy"]},
        ext_modules=ext_modules,
        cmdclass=cmdclass,
    )


main()
