"""`python -m fa4.perfmodel`'s arguments: bad ones end in argparse's usage error (exit 2, one line
naming the argument), not a traceback; --plot without matplotlib says what to install."""

import subprocess
import sys
from pathlib import Path

import pytest

from fa4 import perfmodel as pm
from fa4.perfmodel import cli

ROOT = Path(__file__).resolve().parents[2]


def usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as info:
        pm.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--seqlen", "0"], ["--seqlen", "must be >= 1, got 0"]),
        (["--seqlen", "-5"], ["--seqlen", "must be >= 1, got -5"]),
        (["--seqlen", "1k"], ["--seqlen", "expected an integer, got '1k'"]),
        (["--bwd", "--seqlen", "0"], ["--seqlen", "must be >= 1"]),
        (["--hdim", "0"], ["--hdim", "must be >= 1"]),
        (["--batch", "0"], ["--batch", "must be >= 1"]),
        (["--heads", "0"], ["--heads", "must be >= 1"]),
        (["--block-n", "0"], ["--block-n", "must be >= 1"]),
        (["--emu", "5"], ["--emu", "must lie in [0, 1]", "got 5"]),
        (["--emu", "-0.1"], ["--emu", "must lie in [0, 1]"]),
        (["--emu", "nan"], ["--emu", "must lie in [0, 1]"]),
        (["--emu", "half"], ["--emu", "expected a number in [0, 1]"]),
        (["--validate", "/no/such.csv"], ["--validate", "no such file", "/no/such.csv"]),
        (["--validate-bwd", "/no/such.csv"], ["--validate-bwd", "no such file"]),
    ],
)
def test_bad_arguments_are_usage_errors(capsys, argv, words):
    line = usage_error(capsys, argv)
    assert line.startswith("python -m fa4.perfmodel: error: argument"), line
    for w in words:
        assert w in line, line


@pytest.mark.parametrize("emu", ["0", "0.25", "1"])
def test_emu_range_ends_are_accepted(capsys, emu):
    pm.main(["--emu", emu])
    assert f"emu {float(emu):.3f}" in capsys.readouterr().out


def test_a_directory_is_no_csv(capsys, tmp_path):
    assert "no such file" in usage_error(capsys, ["--validate", str(tmp_path)])


def test_plot_without_matplotlib_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setattr(cli, "plot_all", lambda *a: pytest.fail("plot_all ran"))
    line = usage_error(capsys, ["--plot", str(tmp_path / "png")])
    assert "--plot needs matplotlib" in line and "pip install matplotlib" in line
    assert not (tmp_path / "png").exists()


def test_module_entry_point_exits_2_without_traceback():
    res = subprocess.run(
        [sys.executable, "-m", "fa4.perfmodel", "--seqlen", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "--seqlen: must be >= 1" in res.stderr, res.stderr
