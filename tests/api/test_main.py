"""`python -m fa4` (the README's install command ends with it): the build, the manifest's kernel
families, the device, and one attention checked against the fp32 reference and timed against
torch SDPA. On a CPU machine it runs the reference and must pass its own check."""

import subprocess
import sys

from fa4 import manifest


def test_main_checks_and_times_one_attention():
    res = subprocess.run(
        [sys.executable, "-m", "fa4", "--seqlen", "97", "--heads", "4", "--hdim", "64"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    for k in manifest.M["kernels"]:
        assert f"{k['family']} {k['direction']}: built for head dims" in out
    assert "seqlen 97, heads 4 (kv 1), head dim 64, causal" in out
    assert ": ok" in out and "FAILED" not in out
    assert "torch SDPA" in out and " ms" in out
