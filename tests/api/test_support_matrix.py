"""The generated support matrix (fa4/support.py, docs/support.md): the document is the generator's
output; each cell agrees with what the API and _ops' CUDA functions actually do on CPU tensors
(device and build simulated as in test_validation.py); the evidence names GPU tests that exist."""

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch

from fa4 import _ops, build_info, dispatch, manifest, support

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "support.md"


def test_doc_is_the_generated_matrix(tmp_path):
    """docs/support.md is regenerated whenever the manifest, the rules or EVIDENCE change."""
    assert DOC.read_text() == support.render(), (
        "docs/support.md is stale: python -m fa4.support --write docs/support.md"
    )
    assert support.main(["--check", str(DOC)]) == 0
    stale = tmp_path / "support.md"
    stale.write_text(DOC.read_text().replace(support.TESTED, support.COMPILED, 1))
    assert support.main(["--check", str(stale)]) == 1


def test_statuses_are_the_five():
    assert set(support.STATUSES) == {
        "runs, GPU-tested", "compiled, not executed", "reference only", "not supported",
        "written, awaiting GPU run",
    }  # fmt: skip
    seen = set()
    for f in support.FEATURES:
        for arch in support.ARCHS:
            for direction in f.directions:
                seen |= {c.status for c in support.feature_cells(f.name, arch, direction).values()}
    assert seen <= set(support.STATUSES)
    assert {support.TESTED, support.REFERENCE, support.UNSUPPORTED} <= seen  # AWAITING: none now


def test_cells_follow_the_build(monkeypatch):
    """A build without a head dim's kernel turns its cells into "reference only"."""
    full = support.default_build()
    partial = {**full, "kernels": {"fwd": {"sm90": [[64, 64]]}, "bwd": {}}}
    monkeypatch.setattr(support, "default_build", lambda: partial)
    assert support.cell("dense", "sm90", "fwd", (64, 64), torch.bfloat16).status == support.TESTED
    assert support.cell("dense", "sm90", "fwd", (128, 128), torch.bfloat16).status == (
        support.REFERENCE
    )
    assert support.cell("dense", "sm90", "bwd", (64, 64), torch.bfloat16).status == (
        support.REFERENCE
    )


# ---- The cells against the code --------------------------------------------------------------

GRID_DIMS = [(64, 64), (192, 128), (72, 72)]  # 72: padded or refused, as the rules say
GRID_DTYPES = [torch.bfloat16, torch.float32]


def _simulate(monkeypatch, arch):
    """test_validation.py's way: the device's capability and a build of the manifest's kernels."""
    cc = dispatch._ARCH_OF_BACKEND[arch]
    monkeypatch.setattr(dispatch, "_capability", lambda *_: cc)

    def missing(family, direction, hdims):  # Note [padded head dims]: a covering instance
        compiled = manifest.head_dims_of(family, direction)
        return None if manifest.cover(compiled, *hdims) else "not covered"

    monkeypatch.setattr(build_info, "missing_kernel", missing)

    def missing_of_dtype(family, direction, hdims, dtype):  # the FP8 forward's e4m3 instances
        compiled = [i.dims for i in manifest.instances() if (i.family, i.direction, i.dtype) ==
                    (family, direction, dtype)]  # fmt: skip
        return None if manifest.cover(compiled, *hdims) else "not covered"

    monkeypatch.setattr(build_info, "missing_instance", missing_of_dtype)


class _Spy:
    def __init__(self):
        self.called = []

    def _fwd_kernel(self, *args):
        self.called.append("fwd")
        return "out", "lse"

    def _bwd_kernel(self, *args):
        self.called.append("bwd")
        return "dq", "dk", "dv"


def _op_call(feature, direction, dims, dtype):
    """The fa4::fwd / fa4::bwd call the public API makes for the feature's probe, on CPU."""
    rec = support._OpRecorder()
    with rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, lse = support.FEATURE[feature].probe("cpu", dtype, *dims, direction == "bwd")
        if direction == "bwd":
            (out.float().sum() + lse[torch.isfinite(lse)].sum()).backward()
    return rec.calls[direction]


def _run_cuda_function(monkeypatch, direction, call):
    """_ops._fwd_cuda / _bwd_cuda on the recorded arguments (backend 'auto', as on CUDA):
    (whether it called the compiled op, whether its route was the decode kernel)."""
    names = [a.name for a in getattr(torch.ops.fa4, direction).default._schema.arguments]
    args = [call[n] for n in names]
    args[names.index("backend")] = "auto"
    spy = _Spy()
    monkeypatch.setattr(torch.ops, "fa4", spy)
    monkeypatch.setattr(dispatch, "_warned", set())
    routes = []
    route = _ops.fwd_route
    monkeypatch.setattr(_ops, "fwd_route", lambda *a: routes.append(route(*a)) or routes[-1])
    fn = _ops._fwd_cuda if direction == "fwd" else _ops._bwd_cuda
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(*args)
    return bool(spy.called), routes == ["decode"]


def _raises(feature, direction, dims, dtype) -> bool:
    try:
        _op_call(feature, direction, dims, dtype)
    except (ValueError, TypeError, RuntimeError):
        return True
    return False


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("feature", [f.name for f in support.FEATURES])
def test_kernel_cells_agree_with_dispatch(monkeypatch, feature, arch):
    """Where the matrix names a kernel family, _ops' CUDA function calls the compiled op (the
    decode kernel: with its warning); "reference only": it runs the reference; "not supported":
    the API raises."""
    for direction in support.FEATURE[feature].directions:
        for dims in GRID_DIMS:
            for dtype in GRID_DTYPES:
                c = support.cell(feature, arch, direction, dims, dtype)
                where = (feature, arch, direction, dims, dtype, c)
                if c.status == support.UNSUPPORTED:
                    assert _raises(feature, direction, dims, dtype), where
                    continue
                call = _op_call(feature, direction, dims, dtype)
                with monkeypatch.context() as m:
                    _simulate(m, arch)
                    kernel, decode = _run_cuda_function(m, direction, call)
                attention = c.families[:1]
                assert kernel == (c.status != support.REFERENCE) == bool(attention), where
                assert decode == (attention == ("decode",)), where
                if kernel and not decode:
                    assert attention == (arch,), where


@pytest.mark.parametrize("feature", [f.name for f in support.FEATURES])
def test_reference_cells_agree_with_the_api(feature):
    for direction in support.FEATURE[feature].directions:
        for dtype in support.dtypes_of("reference"):
            for dims in GRID_DIMS:
                c = support.cell(feature, "reference", direction, dims, dtype)
                assert c.status in (support.REFERENCE, support.UNSUPPORTED)
                raised = _raises(feature, direction, dims, dtype)
                assert raised == (c.status == support.UNSUPPORTED), (feature, direction, dims)


def test_decode_and_sm100_are_never_called_tested_without_a_run():
    """The decode kernel's and SM100's cells say "GPU-tested" only with a recorded passing run."""
    for f in support.FEATURES:
        for arch in ("sm90", "sm100"):
            for direction in f.directions:
                for c in support.feature_cells(f.name, arch, direction).values():
                    if c.status != support.TESTED:
                        continue
                    for fam in c.families:
                        ev = support.evidence_for(f.name, arch, direction, fam)
                        assert ev is not None and ev.run is not None, (f.name, arch, fam)
    decode = support.cell("paged", "sm90", "fwd", (128, 128), torch.bfloat16)
    assert decode.families == ("decode",)
    ev = support.evidence_for("paged", "sm90", "fwd", "decode")
    assert decode.status == (support.TESTED if ev.run else support.AWAITING)


# ---- The evidence table ----------------------------------------------------------------------


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_evidence_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _marks(module, fn) -> set[str]:
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return {m.name for m in marks + getattr(fn, "pytestmark", [])}


def test_evidence_names_gpu_tests_that_exist():
    modules = {}
    for e in support.EVIDENCE:
        assert e.tests, e
        for node in e.tests:
            path, name = node.split("::")
            file = ROOT / path
            assert file.is_file(), node
            module = modules.get(path) or modules.setdefault(path, _load(file))
            fn = getattr(module, name, None)
            assert callable(fn), f"{node}: no such test"
            assert "gpu" in _marks(module, fn), f"{node} is not a GPU test"


def test_evidence_matches_the_derived_cells():
    """Each entry is about a feature, column and kernel the matrix derives (a routing change
    makes old evidence stale instead of silently applying), with a complete run record."""
    for e in support.EVIDENCE:
        assert e.feature in support.FEATURE and e.arch in ("sm90", "sm100"), e
        c = support.cell(e.feature, e.arch, e.direction, (128, 128), torch.bfloat16)
        assert c is not None and e.family in c.families, (e, c)
        if e.run is not None:
            assert all((e.run.date, e.run.commit, e.run.gpu, e.run.command)), e
