"""The plain C++ API as a CMake consumer sees it.

Builds and installs fa4 with CMake (once per library kind), then builds examples/cpp and
tests/cpp (test_api.cpp) against the install prefix through find_package(fa4) and runs them.
Only sm_90a is compiled to keep the build short; the API's behaviour does not depend on it.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import find_tool

ROOT = Path(__file__).resolve().parents[2]


CMAKE = shutil.which("cmake")
NVCC = find_tool("nvcc")


def _run(label: str, cmd: list, **kwargs) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    print(f"[{time.monotonic() - start:6.1f}s] {label} (rc={proc.returncode})")
    return proc


def _run_ok(label: str, cmd: list, **kwargs) -> subprocess.CompletedProcess:
    proc = _run(label, cmd, **kwargs)
    if proc.returncode != 0:
        pytest.fail(
            f"{label} failed with rc={proc.returncode}\n$ {' '.join(map(str, cmd))}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture(scope="module", params=["static", "shared"])
def fa4_prefix(request, tmp_path_factory) -> Path:
    """Install prefix of a Release fa4 build (static and BUILD_SHARED_LIBS=ON)."""
    if CMAKE is None:
        pytest.skip("cmake not found on PATH")
    if NVCC is None:
        pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"fa4_{kind}")
    build, prefix = tmp / "build", tmp / "prefix"
    start = time.monotonic()
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DFA4_CUDA_ARCHS=90a",
        "-DFA4_HDIMS=",  # the API alone: test_api.cpp expects kUnsupported from run_fwd
        f"-DBUILD_SHARED_LIBS={'ON' if kind == 'shared' else 'OFF'}",
        f"-DCMAKE_CUDA_COMPILER={NVCC}",
        f"-DCMAKE_INSTALL_PREFIX={prefix}",
        # The interpreter running the tests has the pinned nvidia-cutlass wheel; CMake's own
        # search might pick a system python without it.
        f"-DPython3_EXECUTABLE={sys.executable}",
    ]
    _run_ok(f"configure fa4 ({kind})", [CMAKE, "-S", ROOT, "-B", build, *flags])
    _run_ok(f"build fa4 ({kind})", [CMAKE, "--build", build, "-j1"])
    _run_ok(f"install fa4 ({kind})", [CMAKE, "--install", build])
    print(f"[{time.monotonic() - start:6.1f}s] fa4 ({kind}) configured, built and installed")
    return prefix


def _build_consumer(name: str, src: Path, prefix: Path, tmp: Path) -> Path:
    build = tmp / f"build_{name}"
    _run_ok(
        f"configure {name}",
        [
            CMAKE,
            "-S",
            src,
            "-B",
            build,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={prefix}",
        ],
    )
    _run_ok(f"build {name}", [CMAKE, "--build", build, "-j1"])
    return build


@pytest.mark.build
def test_install_layout(fa4_prefix):
    assert (fa4_prefix / "include" / "fa4" / "fa4.h").is_file()  # <fa4/fa4.h>
    configs = list(fa4_prefix.glob("lib*/cmake/fa4"))
    assert len(configs) == 1, f"expected one <prefix>/lib*/cmake/fa4, found {configs}"
    for name in ("fa4Config.cmake", "fa4ConfigVersion.cmake", "fa4Targets.cmake"):
        assert (configs[0] / name).is_file(), name
    libs = list(configs[0].parent.parent.glob("libfa4.*"))
    assert libs, f"no libfa4.* next to {configs[0]}"
    targets = (configs[0] / "fa4Targets.cmake").read_text()
    assert "add_library(fa4::fa4 " in targets
    assert "CUDA::cudart" in targets


def _env(**tile_orders: str) -> dict[str, str]:
    """This process's environment with FA4_TILE_ORDER / FA4_BWD_TILE_ORDER as given (else unset):
    the library reads them once, at a process's first run_fwd / run_bwd."""
    env = {k: v for k, v in os.environ.items() if k not in ("FA4_TILE_ORDER", "FA4_BWD_TILE_ORDER")}
    return env | tile_orders


def _run_checks(label: str, cmd: list, env: dict[str, str]) -> None:
    proc = _run(label, cmd, timeout=60, env=env)
    assert proc.returncode == 0, f"{proc.returncode} failed checks:\n{proc.stdout}\n{proc.stderr}"
    assert re.search(r"\d+ checks, 0 failed", proc.stdout), proc.stdout
    # The installed library reports fa4/VERSION (CMake read it; test_api checked it against the
    # package's fa4_VERSION).
    assert proc.stdout.startswith(f"fa4 {_version()} "), proc.stdout


@pytest.mark.build
def test_cpp_api(fa4_prefix, tmp_path):
    build = _build_consumer("test_api", ROOT / "tests" / "cpp", fa4_prefix, tmp_path)
    _run_checks("run test_api", [build / "test_api"], _env())
    # Note [tile order options]: the process defaults of null tile orders, in a process whose
    # variables hold text the library refuses.
    bad = _env(FA4_TILE_ORDER="first,bogus", FA4_BWD_TILE_ORDER="l2,")
    _run_checks("run test_api env-defaults", [build / "test_api", "env-defaults"], bad)


@pytest.mark.build
def test_example(fa4_prefix, tmp_path):
    build = _build_consumer("example", ROOT / "examples" / "cpp", fa4_prefix, tmp_path)
    proc = _run("run example", [build / "app"], timeout=120, env=_env())
    out = proc.stdout
    assert proc.returncode == 0, f"example exited {proc.returncode}:\n{out}\n{proc.stderr}"
    assert "): ok" in out, out  # the valid problem passes validate()
    assert "invalid: head_dim=84 not supported" in out, out
    # With a device, run_fwd ran; this build has no kernel yet, so it must say so.
    assert "no CUDA device" in out or "run_fwd: unsupported: fa4 " in out, out
    assert "fa4 behaved as documented" in out, out


def _version() -> str:
    return (ROOT / "fa4" / "VERSION").read_text().strip()


def test_version_fallback_matches():
    """api/dispatch.cu's FA4_VERSION fallback (for builds that pass none) follows fa4/VERSION."""
    dispatch = (ROOT / "csrc" / "api/dispatch.cu").read_text()
    fallback = re.search(r'#define FA4_VERSION "([^"]+)"', dispatch)
    assert fallback, "no FA4_VERSION fallback in csrc/api/dispatch.cu"
    assert fallback.group(1) == _version()
