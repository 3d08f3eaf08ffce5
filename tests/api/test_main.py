"""`python -m fa4` (the README's install command ends with it): the build, the manifest's kernel
families, the device, and one attention checked against the fp32 reference and timed against
torch SDPA. On a CPU machine it runs the reference and must pass its own check."""

import subprocess
import sys

import torch

from fa4 import manifest, support


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


def test_main_prints_the_devices_support_column():
    """The support matrix's column for this device (docs/support.md), one line per feature."""
    res = subprocess.run(
        [sys.executable, "-m", "fa4", "--seqlen", "17", "--heads", "2", "--hdim", "64"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arch = support.local_arch(device)
    head = f"support on this device ({support.ARCH_TITLE[arch]} column of docs/support.md):"
    start = lines.index(head)
    section = lines[start + 1 : start + 1 + len(support.FEATURES)]
    assert section == support.local_lines(arch)[1:]
    for f, line in zip(support.FEATURES, section, strict=True):
        assert line.startswith(f"  {f.title}: fwd ") and " | bwd " in line
    if device.type == "cpu":
        assert (
            "dense (batch, seqlen, heads, d): fwd reference only | bwd reference only"
            in lines[start + 1]
        )
