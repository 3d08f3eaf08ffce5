"""tools/sm100_bringup.sh without a GPU: bash's syntax check, then --dry-run as on a B200 (CC
10.0), an H100 (9.0) and a machine without a device, reading the plan it prints and the report
it writes: the steps, their order, the builds' flags, the smallest test cases first (node ids
from the test files' own collection), one sanitizer run per tool and kernel, and the SM100 steps
skipped with the reason elsewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "sm100_bringup.sh"


def _bash() -> str:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not found")
    return bash


def _dry(tmp_path: Path, cc: str) -> tuple[int, list[str], str]:
    out = tmp_path / f"cc{cc}"
    env = {**os.environ, "FA4_BRINGUP_CC": cc}
    env.pop("FA4_HDIMS", None)
    res = subprocess.run([_bash(), str(SCRIPT), "--dry-run", "--out", str(out)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    return res.returncode, res.stdout.splitlines(), (out / "report.md").read_text()


def _planned(lines: list[str]) -> list[str]:
    return [re.match(r"- \[plan\] (\S+)", ln).group(1) for ln in lines if ln.startswith("- [plan]")]


def _command(lines: list[str], step: str) -> str:
    (line,) = [ln for ln in lines if ln.startswith(f"- [plan] {step} ")]
    return line.split("): ", 1)[1]


def test_syntax():
    res = subprocess.run([_bash(), "-n", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_b200_plan(tmp_path):
    rc, lines, report = _dry(tmp_path, "10.0")
    assert rc == 0, lines
    steps = _planned(lines)
    sanitize = [f"{t}-{c}" for t in ("memcheck", "racecheck", "synccheck")
                for c in ("fwd128", "fwd256", "bwd64", "bwd128")]  # fmt: skip
    assert steps == [
        "build-debug", "debug-wait-proof",
        "debug-fwd-case2", "debug-fwd-case0", "trace-fwd",
        "debug-bwd-case2", "debug-bwd-case0", "trace-bwd",
        "build", "fa4-main", "tests-fwd", "tests-bwd",
        *sanitize, "bench", "bench-sm100-vs-flash-attn-4",
    ]  # fmt: skip
    debug, normal = _command(lines, "build-debug"), _command(lines, "build")
    assert "FA4_SM100_DEBUG=1" in debug and "FA4_CUDA_ARCHS=100a" in debug
    assert "FA4_SM100_DEBUG" not in normal and "FA4_CUDA_ARCHS=100a" in normal
    # the smallest cases: test_dense's seqlen-1 case (2), then seqlen 128 (0), every head dim
    for d in ("fwd", "bwd"):
        for case, ids in (("2", "case2"), ("0", "case0")):
            nodes = [w for w in _command(lines, f"debug-{d}-{ids}").split() if "::" in w]
            assert nodes, lines
            assert all(
                re.fullmatch(
                    rf"tests/gpu/test_{d}_sm100\.py::test_dense\[d\d+x\d+-{case}-dtype0\]", n
                )
                for n in nodes
            ), nodes
            assert any("[d128x128-" in n for n in nodes) and any("[d256x256-" in n for n in nodes)
    assert "FA4_DEBUG_TRACE=1" in _command(lines, "trace-fwd")
    assert "--tool synccheck" in _command(lines, "synccheck-bwd128")
    bench = _command(lines, "bench")
    assert "bench/bench.py" in bench and "flash-attn-4" in bench
    assert "skipped" not in report and report.count("- [plan]") == len(steps)
    assert "dry run, nothing was built or run" in report


def test_h100_plan_skips_the_sm100_steps_with_the_reason(tmp_path):
    rc, lines, report = _dry(tmp_path, "9.0")
    assert rc == 0, lines
    assert _planned(lines) == ["build-debug", "debug-wait-proof", "build", "fa4-main"]
    assert "FA4_CUDA_ARCHS=90a" in _command(lines, "build-debug")
    assert "FA4_CUDA_ARCHS=90a" in _command(lines, "build")
    skipped = [ln for ln in report.splitlines() if ": skipped: " in ln]
    assert len(skipped) == 4
    assert all("not an SM100 device (CC 9.0)" in ln for ln in skipped)
    assert any("compute-sanitizer" in ln for ln in skipped)
    assert any("benchmark" in ln for ln in skipped)


def test_no_device_stops(tmp_path):
    rc, lines, report = _dry(tmp_path, "none")
    assert rc == 1
    assert "no CUDA device" in report and not _planned(lines)
