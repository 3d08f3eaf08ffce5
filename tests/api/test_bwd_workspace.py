"""The backward workspace layout (csrc/common/bwd_workspace.h) on the host: every word the kernels
address lies inside bwd_workspace_size's bytes, no two buffers or heads overlap, and the turn
counters exist only with deterministic (tests/cpp/bwd_workspace_harness.cpp)."""

import subprocess
from pathlib import Path

import pytest
from helpers import build_gxx

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.build


def test_workspace_layout(tmp_path_factory):
    exe = build_gxx(
        ROOT / "tests/cpp/bwd_workspace_harness.cpp", tmp_path_factory.mktemp("ws") / "ws"
    )
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("ok 112"), res.stdout + res.stderr
