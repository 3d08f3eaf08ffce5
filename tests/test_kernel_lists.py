"""The head dims each kernel covers are listed in four places that must agree: setup.py
(KERNEL_HDIMS, which also feeds fa4/_build_config.py and so dispatch), CMakeLists.txt, the
dispatch function of each kernel's .cu file (one launch per FA4_HDIM_* guard), and its GPU tests.
Plain CPU test: it reads the files."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = {(64, 64): "64", (96, 96): "96", (128, 128): "128", (192, 192): "192",
         (256, 256): "256", (192, 128): "192x128"}  # fmt: skip


def _setup_dict(name):
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in setup.py")


def _setup_hdims(family, direction):
    all_hdims = _setup_dict("ALL_HDIMS")
    return set(_setup_dict("KERNEL_HDIMS").get((family, direction), tuple(all_hdims)))


def _cmake_list(name):
    """The values of `set(NAME a b c)`, or of `set(NAME "a;b;c" CACHE ...)`."""
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(rf'set\({name} "([^"]*)"', text) or re.search(rf"set\({name} ([^)\n]*)\)", text)
    assert m, name
    return set(m.group(1).replace(";", " ").split())


def _launched(path, fn):
    """Head-dim pairs the dispatch function launches, each under its FA4_HDIM_* guard."""
    text = (ROOT / path).read_text()
    pairs = set()
    for guard, body in re.findall(r"#ifdef FA4_HDIM_(\w+)\n(.*?)#endif", text, re.S):
        m = re.search(rf"{fn}<(\d+), (\d+)>", body)
        assert m, (path, guard)
        pair = (int(m.group(1)), int(m.group(2)))
        assert NAMES[pair].upper() == guard, (path, guard, pair)
        pairs.add(NAMES[pair])
    return pairs


@pytest.mark.parametrize(
    "family, direction, cu, fn, cmake",
    [
        ("sm90", "fwd", "csrc/fwd_sm90.cu", "launch_dtype", "FA4_HDIMS"),
        ("sm90", "bwd", "csrc/bwd_sm90.cu", "launch_bwd_dtype", "FA4_SM90_BWD_HDIMS"),
        ("sm100", "fwd", "csrc/fwd_sm100.cu", "launch_dtype", "fa4_sm100_fwd_hdims"),
        ("sm100", "bwd", "csrc/bwd_sm100.cu", "launch_bwd_dtype", "fa4_sm100_bwd_hdims"),
    ],
)
def test_setup_cmake_and_dispatch_agree(family, direction, cu, fn, cmake):
    want = _setup_hdims(family, direction)
    assert _launched(cu, fn) == want
    assert _cmake_list(cmake) == want


@pytest.mark.parametrize(
    "test_file, family, direction",
    [("tests/test_fwd_sm100.py", "sm100", "fwd"), ("tests/test_bwd_sm100.py", "sm100", "bwd")],
)
def test_gpu_tests_cover_every_compiled_head_dim(test_file, family, direction):
    m = re.search(r"^HDIMS = (\[.*?\])", (ROOT / test_file).read_text(), re.M)
    assert m, test_file
    listed = {NAMES[tuple(p)] for p in ast.literal_eval(m.group(1))}
    assert listed == _setup_hdims(family, direction)
