"""SM90 backward kernel against the fp32 reference backward (tolerance rule of DESIGN.md §5), on an
H100/H200: every feature with awkward sizes, GQA, varlen, deterministic mode (bitwise equal
runs), and the parameter gradients of a tiny model. Outputs are poisoned (gpu_helpers.poison).

Each test body is a *_case(backend, ...) function of gpu_helpers, shared with
tests/gpu/test_bwd_sm100.py (same cases, another backend).
"""

import pytest
import torch
from gpu_helpers import (
    BWD_CASES,
    bwd_dense_case,
    bwd_varlen_case,
    compiled_hdims,
    cu_seqlens,
    default_and_deterministic_case,
    deterministic_case,
    grads,
    make,
    many_ctas_case,
    poison,
    reference_grads,
    tiny_model_case,
)
from helpers import assert_tolerance

import fa4
from fa4 import build_info, manifest, reference

pytestmark = pytest.mark.gpu


def _bwd_hdims():
    return compiled_hdims("bwd", "sm90")


@pytest.fixture(autouse=True)
def _needs_sm90_bwd():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device")
    if not _bwd_hdims():
        pytest.skip(f"no SM90 backward kernel in this build: {build_info.CONFIG.get('reason')}")


def _hdim_pairs():
    return manifest.head_dims_of("sm90", "bwd")


def over_2_31_case(backend):
    """int64 offsets in the backward: q, k, v, dout of 2^31 + 2^21 elements each (batch 8320 x
    128 x 16 x 128); the gradients of the last batch entries (offsets past 2^31) against the
    reference on those slices."""
    if torch.cuda.get_device_properties(0).total_memory < 80 << 30:
        pytest.skip("needs ~60 GB of device memory")
    d = 128
    if (d, d) not in compiled_hdims("bwd", backend):
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
@pytest.mark.parametrize("case", range(len(BWD_CASES)))
@pytest.mark.parametrize("dims", _hdim_pairs(), ids=lambda p: f"d{p[0]}x{p[1]}")
def test_dense(dims, case, dtype):
    if dims not in _bwd_hdims():
        pytest.skip(f"head dims {dims} have no SM90 backward in this build")
    bwd_dense_case("sm90", dims, case, dtype)


def test_varlen():
    bwd_varlen_case("sm90", _bwd_hdims()[0][0])


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
            bwd_dense_case("sm90", dims_i, case, dtype)
        bwd_varlen_case("sm90", dims_i[0])
    for (d, d_v), (q, k, v, dout), ref in zip(reps, inputs, full, strict=True):
        capped = grads(q, k, v, dout, "sm90", causal=True, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), ref, capped, strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"d={d},{d_v}: {name}"


@pytest.mark.parametrize("sms, heads", [(0, 2), (3, 2), (0, 1), (3, 3)])
def test_gqa_head_slices(monkeypatch, sms, heads):
    """Note [GQA head slices]: outside deterministic mode a kv head's q heads are dealt over
    items of `heads` (FA4_BWD_TILE_ORDER=heads<n>; these rows are too few for
    BwdGrid::slice_heads to slice), whose dK / dV go through fp32 accumulators and a
    postprocess. Groups of 5 (slices 2, 2, 1) and 7, varlen with empty and partial sequences,
    causal and a window, every compiled head dim, on the full grid and on 3 CTAs (FA4_NUM_SMS:
    each CTA walks many slices); the dK / dV of a kv head is the sum over all its q heads."""
    monkeypatch.setenv("FA4_BWD_TILE_ORDER", f"heads{heads}")
    if sms:
        monkeypatch.setenv("FA4_NUM_SMS", str(sms))
    lens_q, lens_k = [0, 130, 17, 300], [5, 260, 0, 301]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    dims = _bwd_hdims()
    for (d, d_v), (h, h_kv), kw in (
        (dims[0], (10, 2), {"causal": True}),
        (dims[0], (7, 1), {"window_size": (100, 20)}),
        (dims[-1], (10, 2), {"causal": True}),
    ):
        q, k, v = make((sum(lens_q), h, d), (sum(lens_k), h_kv, d), d_v, torch.bfloat16, seed=d)
        dout = torch.randn(sum(lens_q), h, d_v, device="cuda").to(torch.bfloat16)
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        poison()
        out = fa4.attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), backend="sm90",
                                   **kw)  # fmt: skip
        out.backward(dout)
        ref_out, ref_lse = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, **kw)
        ref = reference.attention_varlen_ref_bwd(dout, q, k, v, ref_out, ref_lse, cu_q, cu_k, **kw)
        low = reference.attention_varlen_ref_bwd(
            dout, q, k, v, ref_out, ref_lse, cu_q, cu_k, upcast=False, **kw
        )
        for name, x, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low, strict=True):
            assert_tolerance(f"d={d},{d_v} {h}:{h_kv} {name}", x.grad, r, lo, torch.bfloat16)


def test_gqa_head_slices_by_size(monkeypatch):
    """Note [GQA head slices], the built-in choice: 4099 rows, 14:2 at d = 128 are 30 MB of Q,
    dO, dQ and row statistics a group, past half the L2, so BwdGrid::slice_heads deals each
    group of 7 over items of 2 (2, 2, 2, 1); causal, the default walk, against the reference."""
    if (128, 128) not in _bwd_hdims():
        pytest.skip("hd128 backward not compiled (FA4_HDIMS)")
    monkeypatch.delenv("FA4_BWD_TILE_ORDER", raising=False)
    q, k, v = make((1, 4099, 14, 128), (1, 4099, 2, 128), 128, torch.bfloat16, seed=7)
    dout = torch.randn(1, 4099, 14, 128, device="cuda").to(torch.bfloat16)
    got = grads(q, k, v, dout, "sm90", causal=True)
    ref = reference_grads(q, k, v, dout, True, causal=True)
    low = reference_grads(q, k, v, dout, False, causal=True)
    for name, x, r, lo in zip(("dq", "dk", "dv"), got, ref, low, strict=True):
        assert_tolerance(f"4099 rows 14:2 {name}", x, r, lo, torch.bfloat16)
