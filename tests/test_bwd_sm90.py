"""SM90 backward kernel against the fp32 reference backward (tolerance rule of DESIGN.md §5), on an
H100/H200: every feature with awkward sizes, GQA, varlen, deterministic mode (bitwise equal
runs), and the parameter gradients of a tiny model. Outputs are poisoned as in test_fwd_sm90.

Each test body is a *_case(backend, ...) function, shared with tests/test_bwd_sm100.py (same
cases, another backend).
"""

import pytest
import torch
from helpers import assert_tolerance
from test_fwd_sm90 import make, poison

import fa4
from fa4 import build_info, manifest, reference

pytestmark = pytest.mark.gpu


def compiled_bwd_hdims(backend):
    """The (d, d_v) pairs this build compiled a backward for, on backend 'sm90' or 'sm100'."""
    return [tuple(p) for p in build_info.KERNELS.get("bwd", {}).get(backend, [])]


def _bwd_hdims():
    return compiled_bwd_hdims("sm90")


@pytest.fixture(autouse=True)
def _needs_sm90_bwd():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device")
    if not _bwd_hdims():
        pytest.skip(f"no SM90 backward kernel in this build: {build_info.CONFIG.get('reason')}")


def grads(q, k, v, dout, backend, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    poison()
    fa4.attention(*leaves, backend=backend, **kw).backward(dout)
    return [x.grad for x in leaves]


def _hdim_pairs():
    return manifest.head_dims_of("sm90", "bwd")


def reference_grads(q, k, v, dout, upcast, **kw):
    out, lse = reference.attention_ref(q, k, v, **kw)
    return reference.attention_ref_bwd(dout, q, k, v, out, lse, upcast=upcast, **kw)


CASES = [
    # (b, s_q, s_k, h, h_kv, kwargs)
    (2, 128, 128, 4, 4, {}),
    (2, 1024, 1024, 4, 2, {"causal": True}),
    (1, 1, 1, 2, 2, {}),
    (3, 17, 113, 4, 1, {"causal": True}),
    (2, 1013, 113, 4, 4, {"causal": True}),  # rows that see no key: their dq is 0
    (2, 300, 700, 6, 2, {"window_size": (64, 32)}),
    (2, 257, 257, 4, 4, {"softcap": 10.0}),
    (1, 333, 1000, 8, 1, {"causal": True, "softcap": 5.0}),  # MQA: dk, dv summed over 8 heads
    (2, 700, 200, 4, 2, {"window_size": (0, 0)}),  # s_q > s_k, diagonal band only
]


# The cases below are shared with tests/test_bwd_sm100.py (same cases, another backend).
def dense_case(backend, dims, case, dtype):
    d, d_v = dims
    b, s_q, s_k, h, h_kv, kw = CASES[case]
    q, k, v = make((b, s_q, h, d), (b, s_k, h_kv, d), d_v, dtype, seed=case * 17 + d + d_v)
    dout = torch.randn(b, s_q, h, d_v, device="cuda").to(dtype)
    got = grads(q, k, v, dout, backend, **kw)
    ref = reference_grads(q, k, v, dout, True, **kw)
    low = reference_grads(q, k, v, dout, False, **kw)
    for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low, strict=True):
        if s_k == 1 and name != "dv":
            # One key: P = 1 and dS = P·(dP − D) = 0 exactly (out = v), so dq = dk = 0 and the
            # rule's bound is 0. The kernel's dP (wgmma) and D (preprocess) are fp32 sums of d_v
            # products in different orders; their difference obeys the standard bound
            # d_v·eps·Σ|products|, scaled into dq by softmax_scale·|k| and into dk by |q|.
            eps = torch.finfo(torch.float32).eps
            ds_max = 2 * d_v * eps * (dout.float().abs() * v.float().abs().max()).sum(-1).max()
            other = (k if name == "dq" else q).float().abs().max() * h
            assert g.float().abs().max() <= ds_max * other, f"{name}: not ~0 with one key"
            continue
        assert_tolerance(name, g, r, lo, dtype)


def varlen_case(backend, d):
    lens_q, lens_k = [0, 1, 17, 300, 129], [5, 0, 40, 300, 128]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32).cuda()
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32).cuda()
    q, k, v = make((sum(lens_q), 4, d), (sum(lens_k), 2, d), d, torch.bfloat16, seed=3)
    dout = torch.randn_like(q)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    poison()
    out = fa4.attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                               backend=backend)  # fmt: skip
    out.backward(dout)
    kw = {"causal": True}
    ref_out, ref_lse = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, **kw)
    ref = reference.attention_varlen_ref_bwd(dout, q, k, v, ref_out, ref_lse, cu_q, cu_k, **kw)
    low = reference.attention_varlen_ref_bwd(
        dout, q, k, v, ref_out, ref_lse, cu_q, cu_k, upcast=False, **kw
    )
    for name, x, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low, strict=True):
        assert_tolerance(name, x.grad, r, lo, torch.bfloat16)


def deterministic_case(backend, d):
    """deterministic=True: dq from 5 runs byte-equal (Note [deterministic dQ]); still correct."""
    q, k, v = make((2, 1500, 8, d), (2, 1500, 2, d), d, torch.bfloat16, seed=5)
    dout = torch.randn_like(q)
    runs = [grads(q, k, v, dout, backend, causal=True, deterministic=True) for _ in range(5)]
    for later in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], later, strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name} differs"
    ref = reference_grads(q, k, v, dout, True, causal=True)
    low = reference_grads(q, k, v, dout, False, causal=True)
    for name, g, r, lo in zip(("dq", "dk", "dv"), runs[0], ref, low, strict=True):
        assert_tolerance(name, g, r, lo, torch.bfloat16)


def default_and_deterministic_case(backend, d):
    """fp16, non-causal, one long sequence (many kv tiles add to each dQ block) in both modes."""
    q, k, v = make((1, 2000, 4, d), (1, 2000, 4, d), d, torch.float16, seed=9)
    dout = torch.randn_like(q)
    fast = grads(q, k, v, dout, backend)
    det = grads(q, k, v, dout, backend, deterministic=True)
    ref = reference_grads(q, k, v, dout, True)
    low = reference_grads(q, k, v, dout, False)
    for name, a, b, r, lo in zip(("dq", "dk", "dv"), fast, det, ref, low, strict=True):
        assert_tolerance(name, a, r, lo, torch.float16)
        assert_tolerance(name, b, r, lo, torch.float16)


class TinyBlock(torch.nn.Module):
    """One pre-norm attention block (GQA 8/2, causal): enough to exercise the autograd wiring."""

    def __init__(self, dim, heads, heads_kv, attend):
        super().__init__()
        self.heads, self.heads_kv, self.attend = heads, heads_kv, attend
        self.d = dim // heads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * heads_kv) * self.d)
        self.proj = torch.nn.Linear(heads * self.d, dim)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(self.norm(x)).view(b, s, self.heads + 2 * self.heads_kv, self.d)
        q, k, v = qkv.split([self.heads, self.heads_kv, self.heads_kv], dim=2)
        return x + self.proj(self.attend(q, k, v).reshape(b, s, -1))


def tiny_model_case(backend, d):
    """Parameter gradients of a bf16 block running fa4 against the same block in fp32 with the
    reference attention; the naive bf16 block (attention rounded at every step) sets the bar."""

    def naive(q, k, v):
        return reference.attention_ref(q, k, v, causal=True, upcast=False)[0]

    def reference_attention(q, k, v):
        return fa4.attention(q, k, v, causal=True, backend="reference")

    def kernel(q, k, v):
        return fa4.attention(q, k, v, causal=True, backend=backend)

    torch.manual_seed(0)
    base = TinyBlock(8 * d, 8, 2, None).cuda()
    x = torch.randn(2, 777, 8 * d, device="cuda")
    got = {}
    for name, attend, dtype in (
        ("fa4", kernel, torch.bfloat16),
        ("ref", reference_attention, torch.float32),
        ("low", naive, torch.bfloat16),
    ):
        model = TinyBlock(8 * d, 8, 2, attend).cuda()
        model.load_state_dict(base.state_dict())
        model.to(dtype)
        model(x.to(dtype)).float().square().mean().backward()
        got[name] = {n: p.grad.float() for n, p in model.named_parameters()}
    for n in got["ref"]:
        assert_tolerance(n, got["fa4"][n], got["ref"][n], got["low"][n], torch.bfloat16)


def many_ctas_case(backend, dims):
    """More CTAs than SMs (64 x 16 heads), and the awkward length 4224, causal."""
    d, d_v = dims
    for b, s, h in ((64, 130, 16), (1, 4224, 2)):
        q, k, v = make((b, s, h, d), (b, s, h, d), d_v, torch.bfloat16, seed=s)
        dout = torch.randn(b, s, h, d_v, device="cuda").to(torch.bfloat16)
        got = grads(q, k, v, dout, backend, causal=True)
        ref = reference_grads(q, k, v, dout, True, causal=True)
        low = reference_grads(q, k, v, dout, False, causal=True)
        for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low, strict=True):
            assert_tolerance(f"{name} b={b} s={s}", g, r, lo, torch.bfloat16)


def over_2_31_case(backend):
    """int64 offsets in the backward: q, k, v, dout of 2^31 + 2^21 elements each (batch 8320 x
    128 x 16 x 128); the gradients of the last batch entries (offsets past 2^31) against the
    reference on those slices."""
    if torch.cuda.get_device_properties(0).total_memory < 80 << 30:
        pytest.skip("needs ~60 GB of device memory")
    d = 128
    if (d, d) not in compiled_bwd_hdims(backend):
        pytest.skip("hd128 backward not compiled (FA4_HDIMS)")
    b, s, h = 8320, 128, 16
    assert b * s * h * d > 2**31
    g = torch.Generator(device="cuda").manual_seed(37)
    q, k, v, dout = (
        torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4)
    )
    got = grads(q, k, v, dout, backend, causal=True)
    tail = slice(b - 3, b)
    ref = reference_grads(q[tail], k[tail], v[tail], dout[tail], True, causal=True)
    low = reference_grads(q[tail], k[tail], v[tail], dout[tail], False, causal=True)
    for name, gr, r, lo in zip(("dq", "dk", "dv"), got, ref, low, strict=True):
        assert_tolerance(name, gr[tail], r, lo, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dims", _hdim_pairs(), ids=lambda p: f"d{p[0]}x{p[1]}")
def test_dense(dims, case, dtype):
    if dims not in _bwd_hdims():
        pytest.skip(f"head dims {dims} have no SM90 backward in this build")
    dense_case("sm90", dims, case, dtype)


def test_varlen():
    varlen_case("sm90", _bwd_hdims()[0][0])


def test_deterministic_is_bitwise_reproducible():
    deterministic_case("sm90", _bwd_hdims()[-1][0])


def test_default_and_deterministic_modes_both_match_reference():
    default_and_deterministic_case("sm90", _bwd_hdims()[0][0])


def test_tiny_model_parameter_gradients():
    tiny_model_case("sm90", _bwd_hdims()[-1][0])


def test_many_ctas_and_seqlen_4224():
    many_ctas_case("sm90", _bwd_hdims()[0])


def test_over_2_31_elements():
    over_2_31_case("sm90")


@pytest.mark.parametrize("shape", [(4, 1100, 8, 2), (40, 512, 16, 16)])
def test_bwd_tile_orders_agree(monkeypatch, shape):
    """Note [bwd tile order options]: FA4_BWD_TILE_ORDER walks the (batch, kv head) pairs in
    sections (the wave's, the L2's, of 3 pairs, the partial one first). Deterministic mode adds
    dQ in a fixed order whatever the walk, so every order's gradients are bit-equal to the pair
    by pair walk's; the default mode's are checked against the reference. An unknown token is
    refused before any launch."""
    dims = _bwd_hdims()
    d, d_v = dims[0]
    b, s, h, h_kv = shape
    q, k, v = make((b, s, h, d), (b, s, h_kv, d), d_v, torch.bfloat16, seed=s + b)
    dout = torch.randn(b, s, h, d_v, device="cuda").to(torch.bfloat16)
    monkeypatch.delenv("FA4_BWD_TILE_ORDER", raising=False)
    base = grads(q, k, v, dout, "sm90", causal=True, deterministic=True)
    ref = reference_grads(q, k, v, dout, True, causal=True)
    low = reference_grads(q, k, v, dout, False, causal=True)
    for order in ("plain", "wave", "l2,first", "3,first", "wave,first"):
        monkeypatch.setenv("FA4_BWD_TILE_ORDER", order)
        got = grads(q, k, v, dout, "sm90", causal=True, deterministic=True)
        for name, a, g in zip(("dq", "dk", "dv"), base, got, strict=True):
            assert torch.equal(a.view(torch.int16), g.view(torch.int16)), f"{order}: {name}"
        fast = grads(q, k, v, dout, "sm90", causal=True)
        for name, g, r, lo in zip(("dq", "dk", "dv"), fast, ref, low, strict=True):
            assert_tolerance(name, g, r, lo, torch.bfloat16)
    monkeypatch.setenv("FA4_BWD_TILE_ORDER", "wave,bogus")
    with pytest.raises(RuntimeError, match="FA4_BWD_TILE_ORDER=wave,bogus"):
        grads(q, k, v, dout, "sm90", causal=True)


@pytest.mark.parametrize("sms", [1, 3])
def test_persistent_walk_with_few_ctas(monkeypatch, sms):
    """Note [persistent bwd]: capped at `sms` CTAs (FA4_NUM_SMS), each CTA walks many kv tiles,
    which the full grid of the other tests rarely does at their sizes: the tile ring, kv_full's
    and kv_empty's phases, the dQ buffer handed over between tiles, the dK/dV staging reused
    (d <= 128) and the P/dS stages alternating across tiles with dK/dV stored from registers (the
    split variant, Note [split epilogue]). Every compiled head dim: dense causal GQA, softcap,
    rows that see no key, varlen with empty sequences (skipped tiles); deterministic mode bitwise
    equal to the full grid's result for one head dim of each variant (1100 rows: 9 tiles of 128,
    18 of 64, so tiles with odd block counts)."""
    dims = _bwd_hdims()
    if not dims:
        pytest.skip("no SM90 backward in this build")
    reps = [p for p in dims if max(p) <= 128][:1] + [p for p in dims if max(p) > 128][:1]
    inputs, full = [], []
    for d, d_v in reps:
        q, k, v = make((2, 1100, 8, d), (2, 1100, 2, d), d_v, torch.bfloat16, seed=sms)
        dout = torch.randn(2, 1100, 8, d_v, device="cuda").to(torch.bfloat16)
        inputs.append((q, k, v, dout))
        full.append(grads(q, k, v, dout, "sm90", causal=True, deterministic=True))
    monkeypatch.setenv("FA4_NUM_SMS", str(sms))
    for dims_i in dims:
        for case, dtype in ((1, torch.bfloat16), (6, torch.float16), (4, torch.bfloat16)):
            dense_case("sm90", dims_i, case, dtype)
        varlen_case("sm90", dims_i[0])
    for (d, d_v), (q, k, v, dout), ref in zip(reps, inputs, full, strict=True):
        capped = grads(q, k, v, dout, "sm90", causal=True, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), ref, capped, strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"d={d},{d_v}: {name}"
