"""What the GPU tests of the SM90 and SM100 kernels share (tests/gpu): inputs, poisoned outputs,
the reference checks, and each test's body as a *_case(backend, ...) function, run by the SM90
tests on an H100 / H200 and by the SM100 tests, unchanged, on a B200 (backend "sm100").

Outputs are poisoned: before each call the caching allocator's free blocks are filled with NaN
(poison), so an element a kernel fails to write shows up as NaN in the comparison. Importable
from every folder of tests/ (pyproject.toml: pythonpath = ["tests"]).
"""

import torch
from helpers import assert_tolerance

import fa4
from fa4 import build_info, reference


def compiled_hdims(direction, backend):
    """The (d, d_v) pairs this build compiled for `direction` ("fwd", "bwd") on backend "sm90"
    or "sm100"."""
    return [tuple(p) for p in build_info.KERNELS.get(direction, {}).get(backend, [])]


# ---- Forward ------------------------------------------------------------------------------------


def cu_seqlens(lens):
    """int32 CUDA (len(lens) + 1,): 0 and the running sums of the sequence lengths."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).cuda()


def poison():
    """Fill the allocator's free memory with NaN so unwritten outputs are visible."""
    free, _ = torch.cuda.mem_get_info()
    n = min(free // 8, 1 << 28)  # up to 1 GiB of fp32
    torch.empty(n, device="cuda", dtype=torch.float32).fill_(float("nan"))


def make(shape_q, shape_k, d_v, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(*shape_q, device="cuda", generator=g).to(dtype)
    k = torch.randn(*shape_k, device="cuda", generator=g).to(dtype)
    v = torch.randn(*shape_k[:-1], d_v, device="cuda", generator=g).to(dtype)
    return q, k, v


def check(q, k, v, out, lse, **kw):
    ref, ref_lse = reference.attention_ref(q, k, v, **kw)
    pt, pt_lse = reference.attention_ref(q, k, v, upcast=False, **kw)
    assert_tolerance("out", out, ref, pt, q.dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def run(q, k, v, backend="sm90", **kw):
    poison()
    return fa4.attention(q, k, v, return_lse=True, backend=backend, **kw)


FWD_CASES = [
    # (b, s_q, s_k, h, h_kv, kwargs)
    (2, 128, 128, 4, 4, {}),
    (2, 1024, 1024, 4, 4, {"causal": True}),
    (1, 1, 1, 2, 2, {}),
    (3, 17, 17, 4, 2, {"causal": True}),
    (2, 113, 1013, 4, 1, {}),
    (2, 1013, 113, 4, 4, {"causal": True}),  # rows that see no key: out 0, lse -inf
    (1, 4224, 4224, 2, 2, {"causal": True}),
    (2, 300, 700, 6, 2, {"window_size": (64, 32)}),
    (2, 500, 500, 4, 4, {"causal": True, "window_size": (100, 0)}),
    (2, 257, 257, 4, 4, {"softcap": 10.0}),
    (1, 256, 320, 8, 1, {"causal": True, "softcap": 5.0, "softmax_scale": 0.05}),
    # flash-attn's window rules: shifted edges (rows 450.. see no key), causal clipping right
    (2, 600, 600, 4, 2, {"window_size": (-150, None)}),
    (1, 500, 700, 4, 4, {"window_size": (300, -100)}),
    (1, 400, 400, 4, 2, {"causal": True, "window_size": (64, 64)}),
]


def fwd_dense_case(backend, hdims, case, dtype):
    b, s_q, s_k, h, h_kv, kw = FWD_CASES[case]
    d, d_v = hdims
    q, k, v = make((b, s_q, h, d), (b, s_k, h_kv, d), d_v, dtype, seed=case * 31 + d)
    out, lse = run(q, k, v, backend, **kw)
    check(q, k, v, out, lse, **kw)


def fwd_varlen_case(backend, hdims, kw):
    d, d_v = hdims
    lens_q = [0, 1, 17, 300, 129, 0, 1013]
    lens_k = [5, 0, 40, 300, 128, 0, 900]
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
    q, k, v = make((sum(lens_q), 4, d), (sum(lens_k), 2, d), d_v, torch.bfloat16, seed=5)
    poison()
    out, lse = fa4.attention_varlen(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True, backend=backend, **kw
    )
    ref, ref_lse = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, **kw)
    pt, pt_lse = reference.attention_varlen_ref(q, k, v, cu_q, cu_k, upcast=False, **kw)
    assert_tolerance("out", out, ref, pt, q.dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def seqused_k_case(backend, hdims):
    d, d_v = hdims
    lens = [200, 333, 64]
    cu = torch.tensor([0, 200, 533, 597], dtype=torch.int32).cuda()
    used = torch.tensor([150, 333, 1], dtype=torch.int32).cuda()
    q, k, v = make((597, 2, d), (597, 2, d), d_v, torch.bfloat16, seed=6)
    poison()
    out, lse = fa4.attention_varlen(
        q, k, v, cu, cu, max(lens), max(lens), seqused_k=used, causal=True, return_lse=True,
        backend=backend,
    )  # fmt: skip
    kw = {"seqused_k": used, "causal": True}
    ref, ref_lse = reference.attention_varlen_ref(q, k, v, cu, cu, **kw)
    pt, pt_lse = reference.attention_varlen_ref(q, k, v, cu, cu, upcast=False, **kw)
    assert_tolerance("out", out, ref, pt, q.dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def strided_many_tiles_case(backend, d):
    """Strided q (a slice of a packed qkv tensor) and more tiles than the grid has CTAs."""
    qkv = torch.randn(64, 130, 3, 16, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    out, lse = run(q, k, v, backend, causal=True)
    check(q, k, v, out, lse, causal=True)


def repeatable_case(backend, hdims):
    """Same inputs, same bits: a moving result would mean a race."""
    d, d_v = hdims
    q, k, v = make((4, 2048, 8, d), (4, 2048, 8, d), d_v, torch.bfloat16, seed=9)
    first = run(q, k, v, backend, causal=True)
    for _ in range(3):
        again = run(q, k, v, backend, causal=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


# ---- Backward -----------------------------------------------------------------------------------


def grads(q, k, v, dout, backend, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    poison()
    fa4.attention(*leaves, backend=backend, **kw).backward(dout)
    return [x.grad for x in leaves]


def reference_grads(q, k, v, dout, upcast, **kw):
    out, lse = reference.attention_ref(q, k, v, **kw)
    return reference.attention_ref_bwd(dout, q, k, v, out, lse, upcast=upcast, **kw)


BWD_CASES = [
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
    (2, 600, 600, 4, 2, {"window_size": (-150, None)}),  # shifted: rows 450.. see no key
    (1, 500, 700, 4, 4, {"window_size": (300, -100)}),
    (1, 300, 300, 2, 2, {"window_size": (-20, 10)}),  # left + right < 0: no row sees a key
]


def bwd_dense_case(backend, dims, case, dtype):
    d, d_v = dims
    b, s_q, s_k, h, h_kv, kw = BWD_CASES[case]
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


def bwd_varlen_case(backend, d):
    lens_q, lens_k = [0, 1, 17, 300, 129], [5, 0, 40, 300, 128]
    cu_q = cu_seqlens(lens_q)
    cu_k = cu_seqlens(lens_k)
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
