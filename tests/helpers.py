"""Shared test helpers: the tolerance rule of DESIGN.md §5, input makers, script loading, the
CUDA tools. Importable from every test folder (pyproject.toml: pythonpath = ["tests"]); the SASS
tests' compile helpers and thresholds are in tests/sass_helpers.py, the GPU tests' shared cases in
tests/gpu_helpers.py."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def rounding_noise(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """Largest error of storing ref in dtype: the dtype's rounding noise at the output's scale."""
    if dtype == torch.float64:
        return 0.0
    finite = ref[torch.isfinite(ref)].double()
    if finite.numel() == 0:
        return 0.0
    return (finite.to(dtype).double() - finite).abs().max().item()


def assert_tolerance(name, out, ref, out_pt, dtype, slack: float = 2.0) -> None:
    """max|out - ref| <= slack * max|out_pt - ref| + 2 * rounding noise (DESIGN.md §5).

    out: the implementation under test; ref: fp32 math on the same low-precision inputs;
    out_pt: the same computation done naively in the low dtype. Infinite entries (LSE of rows
    that see no key) must match exactly; NaN anywhere fails.
    """
    out, ref, out_pt = out.double(), ref.double(), out_pt.double()
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), f"{name}: NaN in output"
    inf = torch.isinf(ref)
    assert torch.equal(out[inf], ref[inf]), f"{name}: infinite entries differ"
    fin = ~inf
    err = (out[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    base = (out_pt[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    atol = 2 * rounding_noise(ref, dtype)
    bound = slack * base + atol
    assert err <= bound, f"{name}: max err {err:.3e} > {slack}*{base:.3e} + {atol:.3e}"


def randn(*shape, dtype=torch.bfloat16, requires_grad=False, generator=None):
    t = torch.randn(*shape, generator=generator).to(dtype)
    return t.requires_grad_(requires_grad)


def build_gxx(src: Path, exe: Path) -> Path:
    """Compiles a host test harness (tests/cpp/*.cpp) with g++, warnings as errors; skips the
    calling test when g++ is missing."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip(f"g++ not found: cannot build {src.name}")
    cmd = [gxx, "-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'csrc'}",
           "-o", str(exe), str(src)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"g++ failed on {src}:\n{res.stderr}")
    return exe


def need_tool(name: str, why: str) -> str:
    """find_tool(name), or skips the calling test with the reason."""
    found = find_tool(name)
    if found is None:
        pytest.skip(f"{name} not found (PATH, nvidia-* wheels, CUDA_HOME): cannot {why}")
    return found


def load_script(path: Path, name: str):
    """A script outside any package (tools/) imported as module `name`; registered in
    sys.modules first, which dataclasses need to resolve the module of their fields. Loaded once:
    a second call (another test file, or a tool that imports it) gets the same module."""
    loaded = sys.modules.get(name)
    where = getattr(loaded, "__file__", None)
    if where is not None and Path(where).resolve() == Path(path).resolve():
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def header_constant(header: Path, name: str) -> int:
    """The value of `constexpr int|uint32_t name = ...;` (decimal or hex) in a C++ header."""
    m = re.search(
        rf"constexpr (?:int|uint32_t) {name} = (0x[0-9A-Fa-f]+u?|\d+)", header.read_text()
    )
    assert m, f"{name} not in {header}"
    return int(m.group(1).rstrip("u"), 0)


def find_tool(name: str) -> str | None:
    """A CUDA tool (nvcc, cuobjdump, nvdisasm), found as tools/sass_diff.py finds it."""
    return load_script(ROOT / "tools" / "sass_diff.py", "sass_diff").find_tool(name)


def naive_attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, sink=None):
    """Attention written out in float64, independent of fa4.reference, for one sequence: q (s_q,
    h, d), k/v (n, h_kv, ·) -> out (s_q, h, d_v), lse (h, s_q). The mask is bottom-right aligned
    on (s_q, n), a window entry of -1 or None leaves its side unbounded and any other is literal
    (negative: shifted past the diagonal); the sink is one more softmax column with no value."""
    s_q, h, d = q.shape
    n, h_kv = k.shape[0], k.shape[1]
    scale = scale if scale is not None else d**-0.5
    kk, vv = (x.double().repeat_interleave(h // h_kv, 1) for x in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(s_q)[:, None] + (n - s_q)
    j = torch.arange(n)[None, :]
    keep = torch.ones(s_q, n, dtype=torch.bool)
    left, right = (-1 if w is None else w for w in window)
    right = 0 if causal else right
    if right != -1:
        keep &= j <= i + right
    if left != -1:
        keep &= j >= i - left
    s = s.masked_fill(~keep, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.double().view(h, 1, 1).expand(h, s_q, 1)], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows with no key and no sink: 0
    return torch.einsum("hqk,khd->qhd", p[..., :n], vv), lse


class BenchStubImpl:
    """A stand-in for bench_impls' implementations in the bench harness's CPU tests: never
    skipped, no JIT, its forward a copy of q; `calls` (if given) records each forward's name."""

    jit = False

    def __init__(self, name: str, calls: list | None = None):
        self.name, self.calls = name, calls

    def skip_reason(self, d, hdim):
        return None

    def context(self):
        return contextlib.nullcontext()

    def prepare(self, *inputs):
        return inputs

    def fwd(self, q, k, v, causal):
        if self.calls is not None:
            self.calls.append(self.name)
        return q.clone()

    def to_bshd(self, x):
        return x
