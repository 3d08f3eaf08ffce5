"""The support matrix: features x archs x head dims x dtypes, forward and backward, generated.

Nothing in the matrix is typed in except EVIDENCE (which GPU tests exercise which cell, and the
passing GPU run they belong to) and NO_HARDWARE. Every other fact is asked of the code:
- a feature's probe (PROBES) calls the public API (fa4.attention, attention_varlen,
  attention_with_kvcache) on meta tensors; a probe that raises is "not supported";
- the fa4::fwd / fa4::bwd call that the API makes is recorded (a TorchDispatchMode), and its
  arguments are handed to dispatch.kernel_for and _ops.takes_decode with the device's compute
  capability and a build of the manifest's default archs simulated (simulated_build), which
  gives the kernel family that serves the cell, or None for the fp32 reference.
So a change of the manifest, the validation or the dispatch rules changes the matrix, and
tests/api/test_support_matrix.py fails until docs/support.md is regenerated:

    python -m fa4.support --write docs/support.md      (--check: exit 1 when it differs)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fa4

from . import _ops, build_info, dispatch, kvcache, manifest, value_checks

TESTED = "runs, GPU-tested"
AWAITING = "written, awaiting GPU run"
COMPILED = "compiled, not executed"
REFERENCE = "reference only"
UNSUPPORTED = "not supported"
# Weakest first: a cell served by two kernels (the KV append and the attention) gets the weaker.
STATUSES = (UNSUPPORTED, REFERENCE, COMPILED, AWAITING, TESTED)

ARCHS = ("sm90", "sm100", "reference")
ARCH_TITLE = {"sm90": "sm90", "sm100": "sm100", "reference": "cpu-reference"}
DIRECTIONS = ("fwd", "bwd")
DTYPE_NAMES = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
}  # fmt: skip
# The family name of the KV append kernel (csrc/api/kv_append.cu; not in the manifest).
KV_APPEND = "kv_append"

# Archs whose GPUs this project cannot run on: a kernel there is "compiled, not executed"
# whatever tests are written, until EVIDENCE records a passing run.
NO_HARDWARE = {"sm100": "no Blackwell GPU is available to this project"}


# ---- Evidence (hand-entered: update it after a GPU run) -------------------------------------


@dataclass(frozen=True)
class Run:
    """A GPU run in which the evidence's tests passed (docs/testing.md, "Last GPU run")."""

    date: str
    commit: str
    gpu: str
    command: str


@dataclass(frozen=True)
class Evidence:
    """The GPU tests (pytest node ids) that run `family`'s kernel on `feature` in `direction`
    on `arch`; run is None until they have passed on that arch's GPU."""

    feature: str
    arch: str
    direction: str
    family: str
    tests: tuple[str, ...]
    run: Run | None = None


SM90_RUN = Run(
    "2026-12-06", "2871554", "NVIDIA H100 80GB HBM3",
    "bash tools/gpu_suite.sh, every head dim (pytest tests/gpu tests/api: 510 passed)",
)  # fmt: skip
# The first decode kernel (a cp.async gather), the SM90 sink and the inference API on a GPU:
# build FA4_CUDA_ARCHS=90a FA4_HDIMS=64,128, tree of 7136377 (docs/testing.md, "Last GPU run").
SERVING_RUN = Run(
    "2026-12-06", "7136377", "NVIDIA H100 80GB HBM3",
    "pytest tests/gpu/test_decode.py (48 passed), tests/api/test_inference.py "
    "tests/gpu/test_kvcache_append_gpu.py (146 passed), tests/gpu/test_transformers_gpu.py "
    "(gpt-oss: SM90 sink forward and backward); compute-sanitizer memcheck and racecheck "
    "tools/sanitize_decode.py: 0 errors, 0 hazards",
)  # fmt: skip
# The decode kernel with its TMA producer (Note [tma blocks]), the FP8 cache and the FP8 forward
# on an H100 (docs/testing.md, "Last GPU run").
DECODE_RUN = Run(
    "2026-12-07", "c9046b9", "NVIDIA H100 80GB HBM3",
    "pytest tests/gpu/test_decode.py tests/gpu/test_decode_fp8.py (61 passed); compute-sanitizer "
    "racecheck and memcheck tools/sanitize_decode.py: 0 hazards, 0 errors",
)  # fmt: skip
FP8_FWD_RUN = Run(
    "2026-12-07", "8075b54", "NVIDIA H100 80GB HBM3",
    "pytest tests/gpu/test_fp8_fwd_gpu.py (16 passed); compute-sanitizer memcheck and racecheck "
    "on two FP8 forwards: 0 errors, 0 hazards",
)  # fmt: skip
KV_APPEND_RUN = Run(
    "2026-12-06", "087e8b9", "NVIDIA H100 80GB HBM3",
    "python3 -m pytest tests/gpu/test_kvcache_append_gpu.py (88 passed)",
)  # fmt: skip

_F90, _B90 = "tests/gpu/test_fwd_sm90.py::", "tests/gpu/test_bwd_sm90.py::"
_F100, _B100 = "tests/gpu/test_fwd_sm100.py::", "tests/gpu/test_bwd_sm100.py::"
_DEC, _INF = "tests/gpu/test_decode.py::", "tests/api/test_inference.py::"
_APPEND = "tests/gpu/test_kvcache_append_gpu.py::"
_HF = "tests/gpu/test_transformers_gpu.py::"


def _sm90(feature, direction, *tests):
    return Evidence(feature, "sm90", direction, "sm90", tests, SM90_RUN)


def _sm100(feature, direction, *tests):
    return Evidence(feature, "sm100", direction, "sm100", tests)


def _decode(feature, *tests, run=DECODE_RUN):
    return Evidence(feature, "sm90", "fwd", "decode", tests, run)


EVIDENCE: tuple[Evidence, ...] = (
    _sm90("dense", "fwd", _F90 + "test_dense"),
    _sm90("dense", "bwd", _B90 + "test_dense"),
    _sm90("varlen", "fwd", _F90 + "test_varlen"),
    _sm90("varlen", "bwd", _B90 + "test_varlen"),
    _sm90("causal", "fwd", _F90 + "test_dense", _F90 + "test_varlen"),
    _sm90("causal", "bwd", _B90 + "test_dense", _B90 + "test_varlen"),
    _sm90("window", "fwd", _F90 + "test_dense", _F90 + "test_varlen"),
    _sm90("window", "bwd", _B90 + "test_dense"),
    _sm90("softcap", "fwd", _F90 + "test_dense"),
    _sm90("softcap", "bwd", _B90 + "test_dense"),
    _sm90("gqa", "fwd", _F90 + "test_dense"),
    _sm90("gqa", "bwd", _B90 + "test_dense"),
    _sm90("deterministic", "bwd", _B90 + "test_deterministic_is_bitwise_reproducible",
          _B90 + "test_default_and_deterministic_modes_both_match_reference"),  # fmt: skip
    _sm90("lse", "fwd", _F90 + "test_dense"),  # checks the LSE; no GPU test has a dLSE
    _sm90("seqused_k", "fwd", _F90 + "test_varlen_seqused_k"),
    Evidence("sink", "sm90", "fwd", "sm90", (_HF + "test_logits",), SERVING_RUN),
    Evidence("sink", "sm90", "bwd", "sm90", (_INF + "test_sink_and_seqused_q_on_cuda",
                                             _HF + "test_gradients"), SERVING_RUN),
    Evidence("seqused_q", "sm90", "bwd", "sm90", (_INF + "test_sink_and_seqused_q_on_cuda",),
             SERVING_RUN),
    _decode("paged", _DEC + "test_paged", _DEC + "test_varlen_paged_seqused_q"),
    _decode("seqused_q", _DEC + "test_varlen_paged_seqused_q"),
    _decode("split_kv", _DEC + "test_dense_cache", _DEC + "test_long_sequence_heuristic_splits"),
    _decode("kvcache", _DEC + "test_dense_cache", _DEC + "test_kv_batch_idx_leftpad_softcap"),
    _decode("kv_append", _INF + "test_kvcache_decode_step_in_a_cuda_graph", run=SERVING_RUN),
    _decode("fp8_cache", "tests/gpu/test_decode_fp8.py::test_dense_fp8_cache",
            "tests/gpu/test_decode_fp8.py::test_paged_fp8_cache"),  # fmt: skip
    Evidence("fp8_fwd", "sm90", "fwd", "sm90",
             ("tests/gpu/test_fp8_fwd_gpu.py::test_dense",
              "tests/gpu/test_fp8_fwd_gpu.py::test_varlen"), FP8_FWD_RUN),
    Evidence("kv_append", "sm90", "fwd", KV_APPEND,
             (_APPEND + "test_matches_torch_path", _APPEND + "test_paged"), KV_APPEND_RUN),
    _sm100("dense", "fwd", _F100 + "test_dense"),
    _sm100("dense", "bwd", _B100 + "test_dense"),
    _sm100("varlen", "fwd", _F100 + "test_varlen"),
    _sm100("varlen", "bwd", _B100 + "test_varlen"),
    _sm100("seqused_k", "fwd", _F100 + "test_varlen_seqused_k"),
    _sm100("deterministic", "bwd", _B100 + "test_deterministic_is_bitwise_reproducible"),
)  # fmt: skip


def evidence_for(feature: str, arch: str, direction: str, family: str) -> Evidence | None:
    for e in EVIDENCE:
        if (e.feature, e.arch, e.direction, e.family) == (feature, arch, direction, family):
            return e
    return None


# ---- Probes: one small problem per feature, through the public API -------------------------

B, S, H = 2, 4, 2  # batch, tokens, query heads of every probe


@dataclass(frozen=True)
class Feature:
    name: str  # EVIDENCE's key
    title: str
    probe: Callable  # probe(device, dtype, d, d_v, grad) -> (out, lse)
    directions: tuple[str, ...] = DIRECTIONS
    lse_loss: bool = False  # the backward's loss includes the LSE (a dLSE reaches fa4::bwd)


def _rand(shape, dtype, device, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)


def _i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _dense_qkv(device, dtype, d, d_v, grad, h_kv=H, h=H):
    q = _rand((B, S, h, d), dtype, device, grad, 1)
    k = _rand((B, S, h_kv, d), dtype, device, grad, 2)
    return q, k, _rand((B, S, h_kv, d_v), dtype, device, grad, 3)


def _dense(**kw):
    def probe(device, dtype, d, d_v, grad):
        q, k, v = _dense_qkv(device, dtype, d, d_v, grad)
        return fa4.attention(q, k, v, return_lse=True, backend="reference", **kw)

    return probe


def _gqa(device, dtype, d, d_v, grad):
    q, k, v = _dense_qkv(device, dtype, d, d_v, grad, h_kv=1, h=2 * H)
    return fa4.attention(q, k, v, return_lse=True, backend="reference")


def _sink(device, dtype, d, d_v, grad):
    q, k, v = _dense_qkv(device, dtype, d, d_v, grad)
    sink = _rand((H,), torch.float32, device, grad, 4)
    return fa4.attention(q, k, v, learnable_sink=sink, return_lse=True, backend="reference")


_CU_Q, _CU_K = [0, 2, 6], [0, 3, 7]  # two sequences: 2 + 4 query rows, 3 + 4 keys


def _varlen(paged=False, **kw):
    def probe(device, dtype, d, d_v, grad):
        q = _rand((_CU_Q[-1], H, d), dtype, device, grad, 1)
        shape = (4, 2) if paged else (_CU_K[-1],)  # paged: 4 pages of 2 keys
        k = _rand((*shape, H, d), dtype, device, grad, 2)
        v = _rand((*shape, H, d_v), dtype, device, grad, 3)
        extra = dict(kw)
        if paged:
            extra.update(page_table=_i32([[0, 1], [2, 3]], device), seqused_k=_i32([3, 4], device))
        for name in ("seqused_q", "seqused_k"):
            if isinstance(extra.get(name), list):
                extra[name] = _i32(extra[name], device)
        cu_k = None if paged else _i32(_CU_K, device)
        return fa4.attention_varlen(
            q, k, v, _i32(_CU_Q, device), cu_k, 4, 4, return_lse=True, backend="reference",
            **extra,
        )  # fmt: skip

    return probe


def _kvcache(append: bool):
    def probe(device, dtype, d, d_v, grad):
        q = _rand((B, 1, H, d), dtype, device, grad, 1)
        k_cache = _rand((B, 6, H, d), dtype, device, grad, 2)
        v_cache = _rand((B, 6, H, d_v), dtype, device, grad, 3)
        kw = {"cache_batch_idx": _i32([1, 0], device), "cache_leftpad": _i32([1, 0], device)}
        if append:
            kw = {
                "k_new": _rand((B, 1, H, d), dtype, device, grad, 5),
                "v_new": _rand((B, 1, H, d_v), dtype, device, grad, 6),
                "rotary_cos": _rand((8, d // 2), dtype, device, False, 7),
                "rotary_sin": _rand((8, d // 2), dtype, device, False, 8),
                "causal": True,
            }
        return fa4.attention_with_kvcache(
            q, k_cache, v_cache, _i32([3, 4], device), return_lse=True, backend="reference", **kw
        )

    return probe


def _fp8_cache(device, dtype, d, d_v, grad):
    """An e4m3 cache with per-(sequence, kv head) descales and an appended token."""
    q = _rand((B, 1, H, d), dtype, device, grad, 1)
    e4m3 = torch.float8_e4m3fn
    k_cache, v_cache = (_rand((B, 6, H, n), e4m3, device, False, s) for n, s in ((d, 2), (d_v, 3)))
    kw = {"k_new": _rand((B, 1, H, d), dtype, device, grad, 5),
          "v_new": _rand((B, 1, H, d_v), dtype, device, grad, 6),
          "k_descale": _rand((B, H), torch.float32, device, False, 7).abs(),
          "v_descale": _rand((B, H), torch.float32, device, False, 8).abs()}  # fmt: skip
    return fa4.attention_with_kvcache(
        q, k_cache, v_cache, _i32([3, 4], device), return_lse=True, backend="reference", **kw
    )


def _fp8_fwd(device, dtype, d, d_v, grad):
    """The FP8 forward: e4m3 q, k, v with per-(batch, kv head) descales (the column's dtype is
    not used: the inputs are e4m3 and out is bf16); no backward (it raises)."""
    e4m3 = torch.float8_e4m3fn
    q, k, v = (t.to(e4m3) for t in _dense_qkv(device, torch.float32, d, d_v, False))
    q.requires_grad_(grad)
    kw = {f"{n}_descale": _rand((B, H), torch.float32, device, False, 7 + i).abs()
          for i, n in enumerate("qkv")}  # fmt: skip
    return fa4.attention(q, k, v, return_lse=True, backend="reference", **kw)


FEATURES: tuple[Feature, ...] = (
    Feature("dense", "dense (batch, seqlen, heads, d)", _dense()),
    Feature("varlen", "varlen (cu_seqlens)", _varlen()),
    Feature("causal", "causal", _dense(causal=True)),
    Feature("window", "sliding window", _dense(window_size=(2, 1))),
    Feature("softcap", "softcap", _dense(softcap=5.0)),
    Feature("gqa", "GQA / MQA", _gqa),
    Feature("deterministic", "deterministic backward", _dense(deterministic=True), ("bwd",)),
    Feature("lse", "LSE output / gradient", _dense(), lse_loss=True),
    Feature("sink", "learnable sink", _sink),
    Feature("paged", "paged KV (page_table)", _varlen(paged=True)),
    Feature("seqused_q", "seqused_q", _varlen(seqused_q=[1, 3])),
    Feature("seqused_k", "seqused_k (varlen)", _varlen(seqused_k=[2, 3])),
    Feature("split_kv", "split-KV (num_splits > 1)", _varlen(num_splits=3)),
    Feature("kvcache", "KV cache (cache_batch_idx, cache_leftpad)", _kvcache(append=False)),
    Feature("kv_append", "KV append + rotary (attention_with_kvcache)", _kvcache(append=True)),
    Feature("fp8_cache", "FP8 (e4m3) KV cache + descales (attention_with_kvcache)", _fp8_cache),
    Feature("fp8_fwd", "FP8 (e4m3) q, k, v + descales, bf16 out (attention)", _fp8_fwd),
    # torch.compile traces the same ops (their fake kernels) and runs the same CUDA kernels; the
    # probe is the dense one, so only EVIDENCE can tell it apart (no GPU test compiles yet).
    Feature("compile", "torch.compile", _dense()),
)
FEATURE = {f.name: f for f in FEATURES}


# ---- Recording the op call, simulating a device and a build --------------------------------


class _OpRecorder(TorchDispatchMode):
    """Records the arguments of every fa4::fwd / fa4::bwd call, by schema name."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, dict] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        if schema.name in ("fa4::fwd", "fa4::bwd"):
            named = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
            named.update(zip([a.name for a in schema.arguments], args, strict=False))
            named.update(kwargs)
            self.calls[schema.name.split("::")[1]] = named
        return func(*args, **kwargs)


def default_build() -> dict:
    """build_info.CONFIG of a build of the manifest's default archs and every head dim."""
    kernels = manifest.build_kernels(manifest.instances())
    return {"built": True, "archs": manifest.M["default_archs"], "kernels": kernels}


@contextlib.contextmanager
def simulated_build(arch: str, config: dict | None = None):
    """Dispatch sees a device of `arch` (its compute capability) and a build of `config`
    (default_build()); its one-time warnings are silenced and forgotten afterwards. Changes
    module state: for this module's generator and the tests, not for concurrent calls."""
    config = default_build() if config is None else config
    saved = (dispatch._capability, build_info.CONFIG, build_info.KERNELS, build_info.INSTANCES,
             set(dispatch._warned))  # fmt: skip
    cc = dispatch._ARCH_OF_BACKEND[arch]
    dispatch._capability = lambda index: cc
    build_info.CONFIG, build_info.KERNELS = config, config.get("kernels", {})
    # the instances by dtype (the FP8 forward's e4m3 ones): those of the manifest's default archs
    build_info.INSTANCES = manifest.instances() if config.get("built") else []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        dispatch._capability, build_info.CONFIG, build_info.KERNELS = saved[:3]
        build_info.INSTANCES = saved[3]
        dispatch._warned.clear()
        dispatch._warned.update(saved[4])


def fwd_family(call: dict) -> str | None:
    """The kernel family that _ops._fwd_cuda runs for a recorded fa4::fwd call on CUDA tensors
    (backend "auto"): _ops.fwd_route on the call; None: the fp32 reference."""
    serving = _ops.Serving(**{n: call[n] for n in _ops.Serving._fields})
    return _ops.fwd_route(call["q"], call["k"], call["v"], call["cu_seqlens_q"],
                          call["cu_seqlens_k"], call["seqused_k"], serving, "auto")  # fmt: skip


def bwd_family(call: dict) -> str | None:
    """As fwd_family, for a recorded fa4::bwd call (_ops._bwd_cuda)."""
    cu_q = call["cu_seqlens_q"]
    if cu_q is not None and cu_q.shape[0] < 2:
        return None
    tensors = tuple(call[n] for n in ("dout", "q", "k", "v", "out"))
    return dispatch.kernel_for(call["q"], call["v"], "auto", "bwd", tensors)


def append_family(dtype: torch.dtype) -> str | None:
    """The KV append's kernel (kvcache._kernel_fits, for the probes' even, aligned rows) or None
    (its torch path). Assumes a CUDA build registers fa4::_kv_append_kernel, as setup.py's and
    CMake's builds do (csrc/api/kv_append.cu, compiled for every arch)."""
    return KV_APPEND if dtype in kvcache.KERNEL_DTYPES else None


# ---- The cells ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    status: str
    families: tuple[str, ...] = ()  # the kernels that serve it (none: the reference)
    why: str = ""  # the exception's text, when not supported


@functools.cache
def record(feature: str, direction: str, dims: tuple[int, int], dtype: torch.dtype):
    """Runs the feature's probe on meta tensors (forward, and its backward for "bwd"): the
    recorded fa4::fwd / fa4::bwd arguments, or the exception's text when the API raises."""
    f = FEATURE[feature]
    grad = direction == "bwd"
    rec = _OpRecorder()
    try:
        with rec, value_checks.values_checked(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, lse = f.probe("meta", dtype, *dims, grad)
            if grad:
                loss = out.float().sum() + (lse.sum() if f.lse_loss else 0)
                loss.backward()
    except (ValueError, TypeError, RuntimeError) as e:
        return str(e).split("\n")[0]
    return rec.calls


def _kernel_status(feature: str, arch: str, direction: str, family: str) -> str:
    ev = evidence_for(feature, arch, direction, family)
    if ev is not None and ev.run is not None:
        return TESTED
    if arch in NO_HARDWARE:
        return COMPILED
    return AWAITING if ev is not None else COMPILED


def _families(feature, arch, direction, dtype, calls) -> tuple[str | None, ...]:
    with simulated_build(arch):
        if direction == "bwd":
            return (bwd_family(calls["bwd"]),)
        families = (fwd_family(calls["fwd"]),)
    if feature == "kv_append":
        families += (append_family(dtype),)
    return families


def cell(feature: str, arch: str, direction: str, dims, dtype: torch.dtype) -> Cell | None:
    """The status of one cell; None where the feature has no such direction."""
    if direction not in FEATURE[feature].directions:
        return None
    calls = record(feature, direction, tuple(dims), dtype)
    if isinstance(calls, str):
        return Cell(UNSUPPORTED, why=calls)
    if arch == "reference":
        return Cell(REFERENCE)
    families = _families(feature, arch, direction, dtype, calls)
    if families[0] is None:  # the attention runs the reference
        return Cell(REFERENCE)
    statuses = [_kernel_status(feature, arch, direction, f) for f in families if f is not None]
    weakest = min(statuses, key=STATUSES.index)
    return Cell(weakest, tuple(f for f in families if f is not None))


# ---- Head dims and dtypes -------------------------------------------------------------------


def candidate_hdims() -> list[tuple[int, int]]:
    """The (d, d_v) pairs the matrix asks about: d = d_v, every multiple of 8 up to 256, and
    the manifest's pairs (with d != d_v)."""
    pairs = {(d, d) for d in range(8, 257, 8)} | set(manifest.HEAD_DIMS.values())
    return sorted(pairs)


def kernel_hdims() -> list[tuple[int, int]]:
    """The manifest's head dims: the feature table's cells are over these."""
    return sorted(set(manifest.HEAD_DIMS.values()))


def dtypes_of(arch: str) -> tuple[torch.dtype, ...]:
    return dispatch.REFERENCE_DTYPES if arch == "reference" else dispatch.KERNEL_DTYPES


def feature_cells(feature: str, arch: str, direction: str) -> dict:
    """{(dims, dtype): Cell} over the manifest's head dims and the arch's dtypes."""
    return {
        (dims, dt): cell(feature, arch, direction, dims, dt)
        for dims in kernel_hdims()
        for dt in dtypes_of(arch)
    }


# ---- Rendering ------------------------------------------------------------------------------


def _dims_text(dims) -> str:
    d, dv = dims
    return f"{d}" if d == dv else f"{d}x{dv}"


def _ranges(hdims: list[tuple[int, int]]) -> str:
    """Head dims as text, runs of consecutive multiples of 8 folded: 8–56, 64, 192x128."""
    square = sorted(d for d, dv in hdims if d == dv)
    parts, run = [], []
    for d in square:
        if run and d != run[-1] + 8:
            parts.append(run)
            run = []
        run.append(d)
    if run:
        parts.append(run)
    text = [t for r in parts for t in ([f"{r[0]}–{r[-1]}"] if len(r) >= 3 else map(str, r))]
    text += [_dims_text(p) for p in hdims if p[0] != p[1]]
    return ", ".join(text) or "none"


def _summary(cells: dict) -> str:
    """One table cell: the status, with the kernels when they are not the column's own, and
    the head dims / dtypes per status when they differ."""
    by_status: dict[str, list] = {}
    for key, c in cells.items():
        label = c.status + (f" ({' + '.join(c.families)})" if c.families else "")
        by_status.setdefault(label, []).append(key)
    if len(by_status) == 1:
        return next(iter(by_status))
    all_dims, all_dts = {k[0] for k in cells}, {k[1] for k in cells}
    out = []
    for label, keys in by_status.items():
        dims, dts = {k[0] for k in keys}, {k[1] for k in keys}
        where = [] if dims == all_dims else [f"hd {_ranges(sorted(dims))}"]
        if dts != all_dts:
            where.append("/".join(DTYPE_NAMES[t] for t in dispatch.REFERENCE_DTYPES if t in dts))
        out.append(f"{label}: {', '.join(where)}")
    return "; ".join(out)


def _kernel_label(c: Cell, arch: str) -> str:
    """A cell in the narrow tables: the status, and the kernel family when it is not the arch's
    own prefill kernel."""
    own = {arch}
    extra = [f for f in c.families if f not in own]
    return c.status + (f" ({' + '.join(extra)})" if extra else "")


def feature_text(feature: str, arch: str, direction: str) -> str:
    """A feature table's cell: "—" where the feature has no such direction."""
    cells = feature_cells(feature, arch, direction)
    if any(c is None for c in cells.values()):
        return "—"
    return _summary({k: Cell(_kernel_label(c, arch)) for k, c in cells.items()})


def feature_rows() -> list[list[str]]:
    return [
        [f.title, *(feature_text(f.name, a, d) for a in ARCHS for d in DIRECTIONS)]
        for f in FEATURES
    ]


def hdim_rows() -> list[list[str]]:
    """Per arch and direction, the dense bf16 problem's head dims by status."""
    rows = []
    for arch in ARCHS:
        for direction in DIRECTIONS:
            by: dict[str, list] = {}
            for dims in candidate_hdims():
                c = cell("dense", arch, direction, dims, torch.bfloat16)
                by.setdefault(c.status, []).append(dims)
            served = [by.get(s, []) for s in (TESTED, AWAITING, COMPILED)]
            rows.append([
                f"{ARCH_TITLE[arch]} {direction}",
                _ranges(sorted(sum(served, []))),
                _ranges(by.get(REFERENCE, [])),
                _ranges(by.get(UNSUPPORTED, [])),
            ])  # fmt: skip
    return rows


def dtype_rows() -> list[list[str]]:
    """Per dtype, the dense problem at head dim 128 in every column."""
    rows = []
    for dt in dispatch.REFERENCE_DTYPES:
        row = [DTYPE_NAMES[dt]]
        for arch in ARCHS:
            for direction in DIRECTIONS:
                row.append(_kernel_label(cell("dense", arch, direction, (128, 128), dt), arch))
        rows.append(row)
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _columns() -> list[str]:
    return [f"{ARCH_TITLE[a]} {d}" for a in ARCHS for d in DIRECTIONS]


LEGEND = (
    f"- **{TESTED}**: a compiled kernel serves it, and GPU tests that exercise it passed on that "
    "arch (the evidence below).",
    f"- **{AWAITING}**: a compiled kernel serves it and its GPU tests are written, but they have "
    "not yet passed on a GPU for the kernel's current version.",
    f"- **{COMPILED}**: a compiled kernel serves it, but no GPU test of this project has run it "
    "(every SM100 cell: no Blackwell GPU is available to this project).",
    f"- **{REFERENCE}**: the fp32 reference (fa4.reference, PyTorch ops) computes it: on the CPU, "
    "or on a GPU when no kernel covers the problem (backend='auto' warns once).",
    f"- **{UNSUPPORTED}**: the API raises before any work.",
    "- In parentheses: the kernel when it is not the column's own prefill kernel (decode: "
    f"csrc/decode; {KV_APPEND}: csrc/api/kv_append.cu); a cell served by two kernels shows the "
    "weaker status. —: the feature has no such direction.",
)


def _evidence_lines() -> list[str]:
    rows = []
    for e in EVIDENCE:
        run = f"{e.run.date}, {e.run.commit}, {e.run.gpu}" if e.run else "none yet"
        tests = "<br>".join(f"`{t}`" for t in e.tests)
        rows.append([e.feature, f"{e.arch} {e.direction}", e.family, tests, run])
    return _table(["feature", "column", "kernel", "GPU tests", "passing run"], rows)


def render() -> str:
    lines = [
        "# Support matrix",
        "",
        "Generated by `python -m fa4.support --write docs/support.md` from fa4/kernels.json, the",
        "dispatch rules (fa4/dispatch.py, fa4/_ops.py) and the evidence table in fa4/support.py;",
        "never edit it by hand (tests/api/test_support_matrix.py checks it).",
        "",
        "## Legend",
        "",
        *LEGEND,
        "",
        "## Features",
        "",
        "Each cell: a small problem with the feature, at every head dim of the manifest "
        f"({_ranges(kernel_hdims())}) and the column's dtypes (kernels: fp16, bf16; reference: "
        "also fp32, fp64), as `backend='auto'` runs it on that device with a build of the "
        "manifest's default archs.",
        "",
        *_table(["feature", *_columns()], feature_rows()),
        "",
        "## Head dims (d = d_v unless d x d_v; dense bf16 problem)",
        "",
        *_table(["column", "kernel", REFERENCE, UNSUPPORTED], hdim_rows()),
        "",
        "## Dtypes (dense problem, head dim 128)",
        "",
        *_table(["dtype", *_columns()], dtype_rows()),
        "",
        "## Evidence (hand-entered in fa4/support.py EVIDENCE; update it after a GPU run)",
        "",
        *_evidence_lines(),
    ]
    return "\n".join(lines) + "\n"


# ---- The local device (python -m fa4) -------------------------------------------------------


def local_arch(device: torch.device) -> str:
    """The matrix column of a device: its kernel family, else the reference."""
    if device.type != "cuda":
        return "reference"
    cc = torch.cuda.get_device_capability(device)
    fams = [f for f, a in dispatch._ARCH_OF_BACKEND.items() if a == cc]
    return fams[0] if fams else "reference"


def local_lines(arch: str) -> list[str]:
    """One line per feature: its forward and backward status in the arch's column."""
    lines = [f"support on this device ({ARCH_TITLE[arch]} column of docs/support.md):"]
    for f in FEATURES:
        fwd, bwd = (feature_text(f.name, arch, d) for d in DIRECTIONS)
        lines.append(f"  {f.title}: fwd {fwd} | bwd {bwd}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa4.support", description=__doc__.split("\n")[0])
    ap.add_argument("--write", metavar="PATH", help="write the matrix (markdown) to PATH")
    ap.add_argument("--check", metavar="PATH", help="exit 1 when PATH differs from the matrix")
    a = ap.parse_args(argv)
    text = render()
    if a.write:
        Path(a.write).write_text(text)
    if a.check:
        path = Path(a.check)
        if not path.exists() or path.read_text() != text:
            print(f"{a.check} is stale: run python -m fa4.support --write {a.check}")
            return 1
    if not (a.write or a.check):
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
