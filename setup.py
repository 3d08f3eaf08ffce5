"""Builds fa4: the Python package always; the CUDA extension fa4._C when torch has CUDA and nvcc
is found. Build flags (environment variables, documented in README.md):

  FA4_CUDA_ARCHS       archs to compile, ';' or ',' separated (default "90a;100a")
  FA4_HDIMS            head dims to compile: 64,96,128,192,256,192x128 (default all)
  FA4_DISABLE_BWD      1: compile no backward kernels
  FA4_SKIP_CUDA_BUILD  1: install the pure-Python package only
  FA4_NVCC_EXTRA       extra nvcc flags for measurement builds (e.g. -DFA4_TRACE)
  FA4_SM100_DEBUG      1: bring-up build, -DFA4_SM100_DEBUG: bounded mbarrier waits that name the
                       stuck barrier, and role traces (csrc/common/debug_wait.cuh, fa4/debug.py)

The kernel instances and the nvcc flags come from the kernel manifest, fa4/kernels.json (read
through fa4/manifest.py; CMakeLists.txt reads the same file): one generated translation unit per
selected instance, in build/generated/, so ninja compiles them in parallel. What was compiled is
written to fa4/_build_config.py, which dispatch reads.
"""

from __future__ import annotations

import importlib.util
import os
import pprint
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
GENERATED = ROOT / "build" / "generated"
VERSION = (ROOT / "fa4" / "VERSION").read_text().strip()


def _load_manifest():
    """fa4/manifest.py by path: standard library only, importable before torch is checked."""
    spec = importlib.util.spec_from_file_location("fa4_manifest", ROOT / "fa4" / "manifest.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


manifest = _load_manifest()


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


def _nvcc_flags(archs: list[str]) -> list[str]:
    # The manifest's -std=c++20 is what torch's extension builder would pick (from torch 2.10).
    flags = manifest.nvcc_flags() + [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    # Bring-up builds: every SM100 mbarrier wait bounded (docs/sm100.md, "Bring-up kit").
    if _truthy("FA4_SM100_DEBUG"):
        flags.append("-DFA4_SM100_DEBUG")
    # Measurement builds: extra flags such as -DFA4_TRACE.
    return flags + os.environ.get("FA4_NVCC_EXTRA", "").split()


def _extension(archs, hdims, bwd, config):
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    instances = manifest.instances(archs, hdims, bwd)
    units = manifest.generate(GENERATED, instances)
    config["kernels"] = manifest.build_kernels(instances)
    families = {(i.family, i.direction) for i in instances}
    entry = [f"csrc/{d}_{f}.cu" for f, d in sorted(families)]
    api = ["bindings.cpp", "dispatch.cu", "kv_append_binding.cpp", "kv_append.cu"]
    sources = [f"csrc/api/{f}" for f in api] + entry
    sources += [str(u.relative_to(ROOT)) for u in units]
    version = [f'-DFA4_VERSION="{VERSION}"']
    ext = CUDAExtension(
        "fa4._C",
        sources=sources,
        include_dirs=[str(ROOT / "csrc"), str(GENERATED), find_cutlass_include()],
        extra_compile_args={
            "cxx": [*manifest.cxx_flags(), *version],
            "nvcc": _nvcc_flags(archs) + version,
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
    archs = _list_flag("FA4_CUDA_ARCHS", ";".join(manifest.M["default_archs"]), manifest.ARCHS)
    hdims = _list_flag("FA4_HDIMS", ";".join(manifest.HEAD_DIMS), manifest.HEAD_DIMS)
    bwd = not _truthy("FA4_DISABLE_BWD")
    reason = _why_no_cuda()
    config = {"built": reason is None, "reason": reason, "archs": archs, "hdims": hdims,
              "bwd": bwd, "kernels": {"fwd": {}, "bwd": {}},
              "sm100_debug": _truthy("FA4_SM100_DEBUG")}  # fmt: skip
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
        package_data={"fa4": ["VERSION", "kernels.json"]},
        python_requires=">=3.10",
        install_requires=["torch>=2.4"],
        extras_require={
            "test": ["pytest", "numpy"],
            # fa4.integrations.transformers; the version its tests ran with
            "transformers": ["transformers>=5.25.0"],
        },
        ext_modules=ext_modules,
        cmdclass=cmdclass,
    )


if __name__ == "__main__":
    main()
