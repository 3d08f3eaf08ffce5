"""Note [padded head dims] on an H100/H200: head dims that no instance compiles (any multiple of 8
up to 256, d and d_v independent) run on the compiled instance that covers them, forward,
backward and decode, against the fp32 reference (tolerance rule of DESIGN.md §5), outputs
poisoned (gpu_helpers.poison). The inputs are column slices of wider tensors whose extra columns
hold NaN, so a kernel that read past d (instead of TMA's zero fill) or wrote past d_v fails.
"""

import pytest
import torch
from gpu_helpers import BWD_CASES, FWD_CASES, compiled_hdims, cu_seqlens, poison, reference_grads
from helpers import assert_tolerance

import fa4
from fa4 import build_info, manifest, reference

pytestmark = pytest.mark.gpu

PADDED = [(8, 8), (32, 32), (40, 40), (72, 72), (80, 80), (112, 112), (128, 64), (64, 128),
          (136, 136), (160, 128), (200, 200), (248, 248)]  # fmt: skip
FWD_PICK = [0, 1, 3, 5, 7, 8, 11]  # plain, causal 1k, short causal, empty rows, window, ...
BWD_PICK = [0, 1, 3, 5, 6, 9]


@pytest.fixture(autouse=True)
def _needs_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device")


def _served(direction, dims, family="sm90"):
    """The compiled pair that runs `dims`; skips when none covers them or they are native."""
    if family == "decode":
        compiled = [tuple(p) for p in build_info.KERNELS.get("fwd", {}).get("decode", [])]
    else:
        compiled = compiled_hdims(direction, family)
    k = manifest.cover(compiled, *dims)
    if k is None:
        pytest.skip(f"no compiled {family} {direction} instance covers {dims} (FA4_HDIMS)")
    if k == tuple(dims):
        pytest.skip(f"{dims} is compiled natively")
    return k


def _sliced(shape, d, dtype, g):
    """A (…, d) view of a (…, d + 24) tensor whose last 24 columns are NaN."""
    wide = torch.full((*shape, d + 24), float("nan"), device="cuda", dtype=dtype)
    wide[..., :d] = torch.randn(*shape, d, device="cuda", generator=g).to(dtype)
    return wide[..., :d]


def _make(b, s_q, s_k, h, h_kv, dims, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    d, d_v = dims
    return (_sliced((b, s_q, h), d, dtype, g), _sliced((b, s_k, h_kv), d, dtype, g),
            _sliced((b, s_k, h_kv), d_v, dtype, g))  # fmt: skip


@pytest.mark.parametrize("case", FWD_PICK)
@pytest.mark.parametrize("dims", PADDED)
def test_forward(dims, case):
    _served("fwd", dims)
    b, s_q, s_k, h, h_kv, kw = FWD_CASES[case]
    q, k, v = _make(b, s_q, s_k, h, h_kv, dims, torch.bfloat16, seed=case + dims[0])
    poison()
    out, lse = fa4.attention(q, k, v, return_lse=True, backend="sm90", **kw)
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    ref, ref_lse = reference.attention_ref(qc, kc, vc, **kw)
    pt, pt_lse = reference.attention_ref(qc, kc, vc, upcast=False, **kw)
    assert out.shape[-1] == dims[1]
    assert_tolerance("out", out, ref, pt, q.dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


@pytest.mark.parametrize("dims", [(40, 40), (80, 80), (128, 64), (200, 200)])
def test_forward_varlen(dims):
    _served("fwd", dims)
    lens_q, lens_k = [0, 1, 17, 300, 129], [5, 0, 40, 300, 128]
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    q, k, v = (x[0] for x in _make(1, sum(lens_q), sum(lens_k), 4, 2, dims, torch.bfloat16, 9))
    poison()
    out, lse = fa4.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                    return_lse=True, backend="sm90")  # fmt: skip
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    ref, ref_lse = reference.attention_varlen_ref(qc, kc, vc, cu_q, cu_k, causal=True)
    pt, pt_lse = reference.attention_varlen_ref(qc, kc, vc, cu_q, cu_k, causal=True, upcast=False)
    assert_tolerance("out", out, ref, pt, q.dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


@pytest.mark.parametrize("case", BWD_PICK)
@pytest.mark.parametrize("dims", PADDED)
def test_backward(dims, case):
    _served("bwd", dims)
    b, s_q, s_k, h, h_kv, kw = BWD_CASES[case]
    q, k, v = _make(b, s_q, s_k, h, h_kv, dims, torch.bfloat16, seed=3 * case + dims[1])
    dout = torch.randn(b, s_q, h, dims[1], device="cuda").to(torch.bfloat16)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    poison()
    fa4.attention(*leaves, backend="sm90", **kw).backward(dout)
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    ref = reference_grads(qc, kc, vc, dout, True, **kw)
    low = reference_grads(qc, kc, vc, dout, False, **kw)
    for name, x, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low, strict=True):
        if s_k == 1 and name != "dv":
            continue  # one key: dq = dk = 0 up to rounding (test_bwd_sm90's bound covers it)
        assert x.grad.shape == r.shape
        assert_tolerance(name, x.grad, r, lo, torch.bfloat16)


@pytest.mark.parametrize("dims", [(40, 40), (80, 80), (128, 64), (64, 128)])
def test_backward_varlen(dims):
    """Varlen takes the register epilogues of dK / dV (no TMA store across packed sequences)."""
    _served("bwd", dims)
    lens_q, lens_k = [0, 1, 17, 300, 129], [5, 0, 40, 300, 128]
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    q, k, v = (x[0] for x in _make(1, sum(lens_q), sum(lens_k), 4, 2, dims, torch.bfloat16, 11))
    dout = torch.randn(sum(lens_q), 4, dims[1], device="cuda").to(torch.bfloat16)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    poison()
    out = fa4.attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                               backend="sm90")  # fmt: skip
    out.backward(dout)
    qc, kc, vc = (x.contiguous() for x in (q, k, v))
    ref_out, ref_lse = reference.attention_varlen_ref(qc, kc, vc, cu_q, cu_k, causal=True)
    ref = reference.attention_varlen_ref_bwd(dout, qc, kc, vc, ref_out, ref_lse, cu_q, cu_k,
                                             causal=True)  # fmt: skip
    low = reference.attention_varlen_ref_bwd(dout, qc, kc, vc, ref_out, ref_lse, cu_q, cu_k,
                                             causal=True, upcast=False)  # fmt: skip
    for name, x, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low, strict=True):
        assert_tolerance(name, x.grad, r, lo, torch.bfloat16)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dims", [(40, 40), (80, 80), (128, 64), (200, 200)])
def test_decode(dims, splits):
    """The decode kernel (paged cache, packed GQA, key splits) at padded head dims."""
    _served("fwd", dims, family="decode")
    b, cap, h, h_kv, page = 3, 700, 8, 2, 64
    g = torch.Generator(device="cuda").manual_seed(dims[0] + splits)
    d, d_v = dims
    q = _sliced((b, 2, h), d, torch.bfloat16, g)
    k_cache = _sliced((b, cap, h_kv), d, torch.bfloat16, g)
    v_cache = _sliced((b, cap, h_kv), d_v, torch.bfloat16, g)
    seqlens = torch.tensor([700, 1, 333], dtype=torch.int32, device="cuda")
    per = cap // page + 1
    pad = per * page - cap
    kp = torch.nn.functional.pad(k_cache, (0, 0, 0, 0, 0, pad)).reshape(b * per, page, h_kv, d)
    vp = torch.nn.functional.pad(v_cache, (0, 0, 0, 0, 0, pad)).reshape(b * per, page, h_kv, d_v)
    table = torch.arange(b * per, dtype=torch.int32, device="cuda").view(b, per)
    poison()
    out, lse = fa4.attention_with_kvcache(q, kp, vp, seqlens, page_table=table, causal=True,
                                          num_splits=splits, return_lse=True)  # fmt: skip
    for i in range(b):
        n = int(seqlens[i])
        qi, ki, vi = q[i : i + 1].contiguous(), k_cache[i : i + 1, :n], v_cache[i : i + 1, :n]
        ref, ref_lse = reference.attention_ref(qi, ki.contiguous(), vi.contiguous(), causal=True)
        pt, pt_lse = reference.attention_ref(qi, ki.contiguous(), vi.contiguous(), causal=True,
                                             upcast=False)  # fmt: skip
        assert_tolerance("out", out[i : i + 1], ref, pt, torch.bfloat16)
        assert_tolerance("lse", lse[i : i + 1], ref_lse, pt_lse, torch.float32)
