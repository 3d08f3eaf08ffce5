"""The FP8 forward (fa4.attention / attention_varlen with float8_e4m3fn q, k, v; docs/numerics.md
"FP8") on the CPU: every validation rule with its message, the reference route against
fa4.reference_fp8 and independent formulas (GQA descales, varlen, masks, outlier channels), a
blockwise model of the kernel's softmax (tau = 0, P scaled by 2^8) under the tolerance rule, and
the kernel route with the compiled op mocked (which instance it needs, the arguments it passes).
The kernel itself: tests/gpu/test_fp8_fwd_gpu.py."""

import math

import pytest
import torch
from helpers import assert_tolerance

import fa4
from fa4 import _ops, build_info, dispatch, manifest
from fa4 import reference_fp8 as r8

E4M3 = torch.float8_e4m3fn
I32 = torch.int32


def _qkv8(b=2, s_q=9, s_k=33, h=4, h_kv=2, d=64, d_v=None, seed=0, outlier=1.0):
    """Quantized q, k, v ((b, s, h, d) e4m3) and their per-(batch, kv head) descales."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h, d, generator=g)
    k = torch.randn(b, s_k, h_kv, d, generator=g)
    v = torch.randn(b, s_k, h_kv, d_v or d, generator=g)
    q[..., ::16] *= outlier  # outlier channels, larger in batch 0's first kv head
    k[..., ::16] *= outlier
    k[0, :, 0] *= 3.0
    (q8, qd), (k8, kd), (v8, vd) = (r8.quantize(x, h_kv) for x in (q, k, v))
    return q8, k8, v8, {"q_descale": qd, "k_descale": kd, "v_descale": vd}


# ---- validation ----------------------------------------------------------------------------


def _bad(case):
    """(args, kwargs) of a call that breaks one rule."""
    q8, k8, v8, ds = _qkv8(b=2, s_q=4, s_k=8, d=32)
    kw = dict(ds)
    if case == "e5m2_q":
        q8, k8, v8 = (x.float().to(torch.float8_e5m2) for x in (q8, k8, v8))
    elif case == "e5m2_v":
        v8 = v8.float().to(torch.float8_e5m2)
    elif case == "mixed_k_bf16":
        k8 = k8.float().to(torch.bfloat16)
    elif case == "mixed_q_bf16":
        q8 = q8.float().to(torch.bfloat16)
        kw = {}
    elif case == "descale_dtype":
        kw["k_descale"] = ds["k_descale"].double()
    elif case == "descale_shape":
        kw["q_descale"] = ds["q_descale"].repeat_interleave(2, dim=1)  # (b, h): per q head
    elif case == "descale_device":
        kw["v_descale"] = ds["v_descale"].to("meta")
    elif case == "descale_type":
        kw["q_descale"] = 0.5
    elif case == "descale_16bit":
        q8, k8, v8 = (x.float().to(torch.bfloat16) for x in (q8, k8, v8))
        kw = {"v_descale": ds["v_descale"]}
    elif case == "sink":
        kw["learnable_sink"] = torch.zeros(4)
    elif case == "head_dim":
        q8, k8, v8, kw = _qkv8(b=2, s_q=4, s_k=8, d=40)
    elif case == "head_dim_v":
        q8, k8, v8, kw = _qkv8(b=2, s_q=4, s_k=8, d=32, d_v=24)
    return (q8, k8, v8), kw


@pytest.mark.parametrize(
    "case,exc,needle",
    [
        ("e5m2_q", TypeError, "q: dtype torch.float8_e5m2 not supported"),
        ("e5m2_v", TypeError, "v: dtype torch.float8_e5m2 not supported"),
        ("mixed_k_bf16", TypeError, "k: dtype torch.bfloat16 with float8_e4m3fn q"),
        ("mixed_q_bf16", TypeError, "k: dtype torch.float8_e4m3fn with torch.bfloat16 q"),
        ("descale_dtype", TypeError, "k_descale: dtype must be torch.float32"),
        ("descale_shape", ValueError, "q_descale: shape (2, 4) must be (batch, kv heads) = (2, 2)"),
        ("descale_device", ValueError, "v_descale: device meta differs"),
        ("descale_type", TypeError, "q_descale: expected a torch.Tensor"),
        ("descale_16bit", ValueError, "v_descale: is for the FP8 forward"),
        ("sink", ValueError, "learnable_sink: is not supported by the FP8 forward"),
        ("head_dim", ValueError, "q: head dim 40: the FP8 forward needs multiples of 16"),
        ("head_dim_v", ValueError, "v: head dim 24: the FP8 forward needs multiples of 16"),
    ],
)  # fmt: skip
def test_validation_errors(case, exc, needle):
    args, kw = _bad(case)
    with pytest.raises(exc, match="fa4: " + _escaped(needle)):
        fa4.attention(*args, backend="reference", **kw)


def _escaped(text):
    return "".join("\\" + c if c in "()[].*+?" else c for c in text)


def test_requires_grad_raises_and_no_grad_runs():
    """torch lets an e4m3 tensor require grad; the FP8 forward has no backward, so it raises
    before any work when autograd would record the call, and runs under no_grad."""
    q8, k8, v8, ds = _qkv8(d=32)
    for t in (q8, k8, v8):
        t8 = t.detach().requires_grad_()
        args = [t8 if x is t else x for x in (q8, k8, v8)]
        with pytest.raises(ValueError, match="FP8 forward has no backward.*torch.no_grad"):
            fa4.attention(*args, backend="reference", **ds)
        with torch.no_grad():
            assert fa4.attention(*args, backend="reference", **ds).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="has no backward"):
        _ops.check_differentiable(None, None, _ops.NO_SERVING, q8)


def test_varlen_validation_errors():
    q8, k8, v8, ds = _qkv8(b=1, s_q=10, s_k=12, d=32)
    q8, k8, v8 = q8[0], k8[0], v8[0]
    cu_q, cu_k = torch.tensor([0, 4, 10], dtype=I32), torch.tensor([0, 5, 12], dtype=I32)
    good = {n: t.expand(2, -1).contiguous() for n, t in ds.items()}  # (num sequences, kv heads)
    call = dict(backend="reference", **good)
    assert fa4.attention_varlen(q8, k8, v8, cu_q, cu_k, 6, 7, **call).shape == (10, 4, 32)
    with pytest.raises(ValueError, match=_escaped("(num sequences, kv heads) = (2, 2)")):
        fa4.attention_varlen(q8, k8, v8, cu_q, cu_k, 6, 7, backend="reference", **ds)
    used_q = torch.tensor([4, 6], dtype=I32)
    for kw, needle in (
        ({"seqused_q": used_q}, "seqused_q: is not supported by the FP8 forward"),
        ({"num_splits": 2}, "num_splits: is not supported by the FP8 forward"),
        ({"learnable_sink": torch.zeros(4)}, "learnable_sink: is not supported"),
    ):
        with pytest.raises(ValueError, match=needle):
            fa4.attention_varlen(q8, k8, v8, cu_q, cu_k, 6, 7, **call, **kw)
    pages = k8[:12].reshape(3, 4, 2, 32)
    with pytest.raises(ValueError, match="page_table: is not supported by the FP8 forward"):
        fa4.attention_varlen(
            q8, pages, pages, cu_q, None, 6, 7, seqused_k=torch.tensor([4, 5], dtype=I32),
            page_table=torch.tensor([[0, 1], [2, 0]], dtype=I32), **call,
        )  # fmt: skip
    assert fa4.attention_varlen(q8, k8, v8, cu_q, cu_k, 6, 7, num_splits=1, **call).shape[0] == 10


def test_kvcache_keeps_its_rules():
    """attention_with_kvcache: 16-bit q with an e4m3 cache (unchanged); e4m3 q is refused."""
    q8, k8, v8, ds = _qkv8(b=2, s_q=1, s_k=16, d=32)
    kd, vd = ds["k_descale"], ds["v_descale"]
    out = fa4.attention_with_kvcache(
        q8.float(), k8, v8, 16, backend="reference", k_descale=kd, v_descale=vd
    )
    assert out.dtype == torch.float32
    with pytest.raises(TypeError, match="FP8 queries are not supported by attention_with_kvcache"):
        fa4.attention_with_kvcache(q8, k8, v8, 16, backend="reference")


# ---- the reference route -------------------------------------------------------------------


MASKS = [{}, {"causal": True}, {"window_size": (7, 3)}, {"softcap": 5.0}, {"causal": True,
         "softcap": 20.0, "softmax_scale": 0.3}]  # fmt: skip


@pytest.mark.parametrize("kw", MASKS)
@pytest.mark.parametrize("h,h_kv", [(4, 4), (4, 2), (6, 1)])
def test_reference_route_is_attention_fp8_ref(kw, h, h_kv):
    q8, k8, v8, ds = _qkv8(s_q=17, s_k=40, h=h, h_kv=h_kv, seed=h + h_kv)
    out, lse = fa4.attention(q8, k8, v8, return_lse=True, backend="reference", **ds, **kw)
    ref, ref_lse = r8.attention_fp8_ref(q8, k8, v8, *ds.values(), **kw)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert out.shape == (2, 17, h, 64) and lse.shape == (2, h, 17)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_auto_on_cpu_runs_the_reference():
    q8, k8, v8, ds = _qkv8(seed=5)
    with pytest.warns(UserWarning, match="runs the reference"):
        dispatch._warned.discard(dispatch.AUTO_ON_HOST.format(device="cpu"))
        out = fa4.attention(q8, k8, v8, **ds)
    assert torch.equal(out, fa4.attention(q8, k8, v8, backend="reference", **ds))


def test_gqa_descales_broadcast_to_the_q_heads_of_each_kv_head():
    """q head j of batch b is q8 x q_descale[b, j // (h / h_kv)]: against fp32 attention on inputs
    dequantized head by head here, with descales that differ per (batch, kv head)."""
    q8, k8, v8, _ = _qkv8(s_q=5, s_k=21, h=6, h_kv=2, seed=7)
    ds = {n: torch.tensor([[0.5, 2.0], [0.125, 3.0]]) * (i + 1) for i, n in
          enumerate(("q_descale", "k_descale", "v_descale"))}  # fmt: skip
    out, lse = fa4.attention(q8, k8, v8, return_lse=True, backend="reference", **ds)
    deq = [x.float().clone() for x in (q8, k8, v8)]
    for b in range(2):
        for j in range(6):
            deq[0][b, :, j] *= ds["q_descale"][b, j // 3]
        for j in range(2):
            deq[1][b, :, j] *= ds["k_descale"][b, j]
            deq[2][b, :, j] *= ds["v_descale"][b, j]
    want, want_lse = fa4.attention(*deq, return_lse=True, backend="reference")
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float(), atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=1e-6)
    none = fa4.attention(q8, k8, v8, backend="reference")  # None = 1
    assert torch.equal(none, fa4.attention(*(x.float() for x in (q8, k8, v8)),
                                           backend="reference").to(torch.bfloat16))  # fmt: skip


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (4, 0), "softcap": 8.0}])
def test_varlen_is_dense_per_sequence(kw):
    """Packed sequences (one empty, one of a single query) with (num sequences, kv heads)
    descales equal the dense reference run per sequence with that sequence's descale row."""
    lens_q, lens_k = [5, 0, 1, 12], [9, 4, 1, 30]
    seqs = [
        _qkv8(b=1, s_q=sq, s_k=sk, seed=i)
        for i, (sq, sk) in enumerate(zip(lens_q, lens_k, strict=True))
    ]
    q8, k8, v8 = (torch.cat([s[i][0] for s in seqs]) for i in range(3))
    ds = {n: torch.cat([s[3][n] for s in seqs]) for n in seqs[0][3]}  # (4, h_kv)
    cu = [
        torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=I32) for x in (lens_q, lens_k)
    ]
    out, lse = fa4.attention_varlen(q8, k8, v8, *cu, 12, 30, return_lse=True,
                                    backend="reference", **ds, **kw)  # fmt: skip
    assert out.dtype == torch.bfloat16 and out.shape == (18, 4, 64) and lse.shape == (4, 18)
    for i, s in enumerate(seqs):
        lo, hi = int(cu[0][i]), int(cu[0][i + 1])
        want, want_lse = r8.attention_fp8_ref(*s[:3], *s[3].values(), **kw)
        torch.testing.assert_close(out[lo:hi], want[0], atol=0, rtol=0)
        torch.testing.assert_close(lse[:, lo:hi], want_lse[0], atol=1e-6, rtol=1e-6)
    used = torch.tensor([3, 4, 0, 30], dtype=I32)
    out_u = fa4.attention_varlen(q8, k8, v8, *cu, 12, 30, seqused_k=used, backend="reference", **ds)
    want = r8.attention_fp8_ref(
        seqs[0][0], seqs[0][1][:, :3], seqs[0][2][:, :3], *seqs[0][3].values()
    )
    torch.testing.assert_close(out_u[:5], want[0][0], atol=0, rtol=0)
    assert torch.equal(out_u[5], torch.zeros_like(out_u[5]))  # sequence 2 sees no key


# ---- outlier channels, the tolerance rule and a model of the kernel's softmax ----------------


def _kernel_model(q8, k8, v8, ds, *, causal=False, block_n=128):
    """The FP8 kernel's softmax (Note [fp8 P scale], docs/numerics.md "FP8") key block by key
    block: tau = 0 (m is the running max, O rescaled whenever it grows), P' = exp2(s·log2e - m
    + 8) rounded to e4m3 for P·V, l = sum of the unrounded P'; returns out, lse, max P'."""
    h_kv = k8.shape[2]
    q, k, v = (r8.dequantize(x, d, h_kv) for x, d in zip((q8, k8, v8), ds.values(), strict=True))
    b, s_q, h, d = q.shape
    kh, vh = (x.repeat_interleave(h // h_kv, dim=2).transpose(1, 2) for x in (k, v))
    s2 = torch.matmul(q.transpose(1, 2), kh.transpose(-1, -2)) * d**-0.5 * math.log2(math.e)
    if causal:
        keep = torch.ones(s_q, k.shape[1], dtype=torch.bool).tril(k.shape[1] - s_q)
        s2 = s2.masked_fill(~keep, -math.inf)
    m = torch.full((b, h, s_q, 1), -math.inf)
    o, l_sum, p_max = torch.zeros(b, h, s_q, v.shape[-1]), torch.zeros(b, h, s_q, 1), 0.0
    for j in range(0, k.shape[1], block_n):
        blk = s2[..., j : j + block_n]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        alpha = torch.exp2(m - m_safe)  # 0 where m was -inf
        p = torch.exp2(blk - m_safe + 8.0)
        p_max = max(p_max, p.max().item())
        o = o * alpha + torch.matmul(p.to(E4M3).float(), vh[..., j : j + block_n, :])
        l_sum, m = l_sum * alpha + p.sum(-1, keepdim=True), m_new
    out = (o / l_sum).transpose(1, 2)
    lse = ((m + torch.log2(l_sum) - 8.0) * math.log(2.0)).squeeze(-1)
    return out, lse, p_max


@pytest.mark.parametrize("causal", [False, True])
def test_outlier_channels_within_the_documented_bound(causal):
    """30x outlier channels in q and k, descales per (batch, kv head): the baseline (emulate_p)
    stays within p_rounding_bound of the reference, the reference route equals the reference,
    and the model of the kernel's softmax meets the GPU tests' tolerance rule against them with
    every P' <= 256 (no e4m3 saturation)."""
    q8, k8, v8, ds = _qkv8(s_q=64, s_k=300, seed=11, outlier=30.0)
    assert ds["k_descale"].std() > 0 and ds["q_descale"].std() > 0
    ref, ref_lse = r8.attention_fp8_ref(q8, k8, v8, *ds.values(), causal=causal,
                                        out_dtype=torch.float32)  # fmt: skip
    emu, emu_lse = r8.attention_fp8_ref(q8, k8, v8, *ds.values(), causal=causal,
                                        out_dtype=torch.float32, emulate_p=True)  # fmt: skip
    err = (emu - ref).abs().max().item()
    assert 0 < err <= r8.p_rounding_bound(v8, ds["v_descale"], n_keys=300)
    torch.testing.assert_close(emu_lse, ref_lse, atol=1e-5, rtol=1e-5)
    out = fa4.attention(q8, k8, v8, causal=causal, backend="reference", **ds)
    assert_tolerance("out (reference route)", out.float(), ref, emu, torch.bfloat16)
    model, model_lse, p_max = _kernel_model(q8, k8, v8, ds, causal=causal)
    assert p_max <= r8.P_SCALE
    assert_tolerance("out (kernel model)", model.to(torch.bfloat16).float(), ref, emu,
                     torch.bfloat16)  # fmt: skip
    torch.testing.assert_close(model_lse, ref_lse, atol=1e-4, rtol=1e-5)


# ---- the kernel route (compiled op mocked) ----------------------------------------------------


def _e4m3_build(monkeypatch, hdims=("64", "128", "256"), family="sm90", cc=(9, 0)):
    """A build whose instances include e4m3 forwards of `family` at `hdims`, on a device of
    compute capability cc."""
    header = "sm90/fwd/instance.cuh"
    insts = [manifest.Instance("sm90", "fwd", "128", "bf16", header)]
    insts += [manifest.Instance(family, "fwd", h, "e4m3", header) for h in hdims]
    monkeypatch.setitem(build_info.CONFIG, "built", True)
    monkeypatch.setattr(build_info, "INSTANCES", insts)
    monkeypatch.setattr(build_info, "KERNELS", {"fwd": {"sm90": [[128, 128]]}, "bwd": {}})
    monkeypatch.setattr(dispatch, "_capability", lambda *_: cc)


class _Spy:
    def __init__(self):
        self.calls = []

    def _fwd_kernel(self, *args):
        self.calls.append(args)
        return "out", "lse"


def _schema_names():
    from test_inference import _fwd_kernel_schema  # csrc/api/bindings.cpp's m.def

    return [a.name for a in _fwd_kernel_schema().arguments]


def test_kernel_route_passes_the_descales(monkeypatch):
    """With an e4m3 instance built, the FP8 forward takes the prefill family (not the decode
    kernel) and hands q_descale, k_descale, v_descale to fa4::_fwd_kernel at the positions
    csrc/api/bindings.cpp declares (q_descale last)."""
    _e4m3_build(monkeypatch)
    spy = _Spy()
    monkeypatch.setattr(torch.ops, "fa4", spy)
    q8, k8, v8, ds = _qkv8(d=128)
    cu = torch.tensor([0, 9, 18], dtype=I32)
    sv = _ops.Serving(**ds)
    assert _ops.fwd_route(q8, k8, v8, None, None, None, sv, "auto") == "sm90"
    assert _ops.fwd_route(q8[0], k8[0], v8[0], cu, cu, None, sv, "sm90") == "sm90"
    opts = (True, 0.125, -1, 0, 0.0, False, "auto")
    assert _ops._fwd_cuda(q8, k8, v8, None, None, None, 0, 0, *opts, **ds) == ("out", "lse")
    (args,) = spy.calls
    names = _schema_names()
    assert names[-3:] == ["k_descale", "v_descale", "q_descale"], names
    assert len(args) == len(names)
    got = dict(zip(names, args, strict=True))
    for n in ("q", "k", "v"):
        assert got[n] is {"q": q8, "k": k8, "v": v8}[n]
    for n, t in ds.items():
        assert got[n] is t, n
    assert got["causal"] is True and got["softmax_scale"] == 0.125


def test_kernel_route_without_descales_and_16bit_calls(monkeypatch):
    """None descales are passed as None; a 16-bit call passes q_descale None too."""
    _e4m3_build(monkeypatch)
    spy = _Spy()
    monkeypatch.setattr(torch.ops, "fa4", spy)
    q8, k8, v8, _ = _qkv8(d=64)
    opts = (False, 0.125, -1, -1, 0.0, False, "auto")
    _ops._fwd_cuda(q8, k8, v8, None, None, None, 0, 0, *opts)
    assert spy.calls[-1][-3:] == (None, None, None)
    q = torch.zeros(1, 8, 2, 128, dtype=torch.bfloat16)
    _ops._fwd_cuda(q, q, q, None, None, None, 0, 0, *opts)
    assert len(spy.calls) == 2 and len(spy.calls[-1]) == len(_schema_names())
    assert spy.calls[-1][-1] is None


def test_padded_head_dims_take_the_covering_e4m3_instance(monkeypatch):
    # Note [padded head dims]: d = 96 runs on the hd 128 e4m3 instance (csrc/fwd_sm90.cu covers
    # per dtype)
    _e4m3_build(monkeypatch)
    q8, k8, v8, _ = _qkv8(d=96)
    assert dispatch.kernel_for(q8, v8, "auto", "fwd", (q8, k8, v8)) == "sm90"


def test_kernel_route_warns_only_where_it_has_not_run(monkeypatch, recwarn):
    # SM90's FP8 forward ran on an H200 (tests/gpu/test_fp8_fwd_gpu.py): no warning; SM100's
    # has never run: one warning per process.
    _e4m3_build(monkeypatch)
    dispatch._warned.clear()
    q8, k8, v8, _ = _qkv8(d=256)
    for _ in range(2):
        assert dispatch.kernel_for(q8, v8, "auto", "fwd", (q8, k8, v8)) == "sm90"
    assert not [w for w in recwarn if "never executed" in str(w.message)]
    assert ("sm100", "fwd e4m3") in dispatch.UNVERIFIED
    dispatch._warn_unverified("sm100", "fwd e4m3")
    dispatch._warn_unverified("sm100", "fwd e4m3")
    said = [str(w.message) for w in recwarn if "never executed" in str(w.message)]
    assert len(said) == 1 and "sm100 fwd e4m3" in said[0]


@pytest.mark.parametrize(
    "build,cc,d,backend",
    [
        (None, (9, 0), 128, "auto"),  # no e4m3 instance at all (the manifest before the entry)
        (("64",), (9, 0), 128, "auto"),  # no instance covers this head dim
        (("64",), (9, 0), 96, "sm90"),
        (("64", "128", "256"), (10, 0), 128, "auto"),  # SM100: not built
        (("64", "128", "256"), (10, 0), 128, "sm100"),
        (("64", "128", "256"), (8, 0), 128, "auto"),  # no kernel family at all
    ],
)  # fmt: skip
def test_no_e4m3_instance_raises(monkeypatch, build, cc, d, backend):
    """Where no e4m3 instance serves the call, the FP8 forward raises (no silent fallback to the
    fp32 reference), naming backend='reference'."""
    _e4m3_build(monkeypatch, hdims=build or (), cc=cc)
    monkeypatch.setattr(torch.ops, "fa4", _Spy())
    q8, k8, v8, ds = _qkv8(d=d)
    opts = (False, 0.125, -1, -1, 0.0, False, backend)
    with pytest.raises(RuntimeError, match=_escaped(dispatch.NO_FP8_KERNEL)):
        _ops._fwd_cuda(q8, k8, v8, None, None, None, 0, 0, *opts, **ds)
    assert not torch.ops.fa4.calls


def test_build_info_reads_instance_dtypes(monkeypatch):
    """missing_instance asks the compiled instances (with their dtypes): this unbuilt checkout
    has none, and a build's instances come from its archs, head dims and the manifest."""
    assert build_info.missing_instance("sm90", "fwd", (128, 128), "e4m3") is not None
    monkeypatch.setattr(build_info, "CONFIG", {"built": True, "archs": ["90a"],
                        "hdims": ["128"], "bwd": False})  # fmt: skip
    insts = build_info._instances()
    assert {(i.family, i.direction, i.hdim, i.dtype) for i in insts if i.dtype == "bf16"} >= {
        ("sm90", "fwd", "128", "bf16")
    }
    assert not any(i.direction == "bwd" for i in insts)
    e4m3 = [i for i in insts if i.dtype == "e4m3" and i.family == "sm90"]
    monkeypatch.setattr(build_info, "INSTANCES", insts)
    monkeypatch.setattr(build_info, "KERNELS", {"fwd": {"sm90": [[128, 128]]}, "bwd": {}})
    if e4m3:  # the manifest has the FP8 forward's entry
        assert build_info.missing_instance("sm90", "fwd", (128, 128), "e4m3") is None
    else:
        assert "no sm90 fwd kernels of dtype e4m3" in build_info.missing_instance(
            "sm90", "fwd", (128, 128), "e4m3"
        )
    monkeypatch.setitem(build_info.CONFIG, "instances", ["sm90_fwd_hd128_bf16"])
    assert [i.filename for i in build_info._instances()] == ["sm90_fwd_hd128_bf16.cu"]


def test_fake_kernel_gives_bf16_out():
    """The op's meta kernel (torch.compile, FakeTensorMode): bf16 out, fp32 LSE for e4m3 q."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 4, 64, dtype=E4M3)
        k = torch.empty(2, 16, 2, 64, dtype=E4M3)
        out, lse = _ops.fwd(q, k, k, None, None, None, 0, 0, False, 0.125, -1, -1, 0.0, False,
                            "reference")  # fmt: skip
    assert out.dtype == torch.bfloat16 and out.shape == (2, 8, 4, 64)
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 8)
