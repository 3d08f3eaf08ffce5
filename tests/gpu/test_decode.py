"""The decode kernel (csrc/decode) through the compiled op torch.ops.fa4._fwd_kernel, against the
fp32 reference under the tolerance rule of DESIGN.md §5: dense and paged KV caches (page sizes 1
to 256, shuffled page tables, key counts at page boundaries and zero), packed GQA, key splits
(1 to 16 and the heuristic), learnable sinks with causal and sliding-window masks, kv_batch_idx,
leftpad, varlen queries with seqused_q, CUDA-graph capture and replay. Outputs are poisoned
(gpu_helpers.poison), so an unwritten element fails as NaN.

The expected values come from fa4.reference on the dense tensors, one sequence at a time; the
sink is folded in afterwards: lse' = logaddexp(lse, sink), out' = out * exp(lse - lse').
"""

import pytest
import torch
from gpu_helpers import poison
from helpers import assert_tolerance

from fa4 import build_info, reference

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 (H100/H200) device: the decode kernel is not executed elsewhere")


HDIMS = [tuple(p) for p in build_info.KERNELS.get("fwd", {}).get("decode", [])]


def _op(q, k, v, *, cu_q=None, seqused_k=None, seqused_q=None, page_table=None, kv_idx=None,
        leftpad=None, sink=None, max_q=0, max_k=0, causal=False, window=(-1, -1), softcap=0.0,
        splits=0):  # fmt: skip
    scale = q.shape[-1] ** -0.5
    poison()
    return torch.ops.fa4._fwd_kernel(
        q, k, v, cu_q, None, seqused_k, seqused_q, page_table, kv_idx, leftpad, sink,
        max_q, max_k, causal, scale, window[0], window[1], softcap, False, splits, 0, 0, None,
    )  # fmt: skip


def _expected(q, k_dense, v_dense, lens_k, *, leftpad=None, sink=None, used_q=None, **kw):
    """Per sequence b: q[b] against keys [leftpad[b], lens_k[b]) of k_dense[b] (fp32 reference
    and the naive low-precision one), then the sink; rows past used_q[b]: out 0, lse -inf."""
    outs, lses, pts, pt_lses = [], [], [], []
    for b in range(q.shape[0]):
        lo = 0 if leftpad is None else int(leftpad[b])
        kb, vb = k_dense[b : b + 1, lo : int(lens_k[b])], v_dense[b : b + 1, lo : int(lens_k[b])]
        qb = q[b : b + 1]
        o, lse = reference.attention_ref(qb, kb, vb, **kw)
        pt, pt_lse = reference.attention_ref(qb, kb, vb, upcast=False, **kw)
        o, pt, lse, pt_lse = o.float(), pt.float(), lse.float(), pt_lse.float()
        if sink is not None:
            s = sink.view(1, -1, 1)
            lse_s = torch.logaddexp(lse, s.expand_as(lse))
            w = torch.exp(lse - lse_s).transpose(1, 2).unsqueeze(-1)  # (1, s_q, h, 1)
            o, pt, lse = o * w, pt * w, lse_s
            pt_lse = torch.logaddexp(pt_lse, s.expand_as(pt_lse))
        if used_q is not None:
            u = int(used_q[b])
            o[:, u:], pt[:, u:], lse[:, :, u:] = 0, 0, float("-inf")
            pt_lse[:, :, u:] = float("-inf")
        outs.append(o)
        pts.append(pt)
        lses.append(lse)
        pt_lses.append(pt_lse)
    return torch.cat(outs), torch.cat(lses), torch.cat(pts), torch.cat(pt_lses)


def _check(out, lse, exp, dtype):
    ref, ref_lse, pt, pt_lse = exp
    assert_tolerance("out", out.float(), ref, pt, dtype)
    assert_tolerance("lse", lse, ref_lse, pt_lse, torch.float32)


def _inputs(b, s_q, cap, h, h_kv, d, d_v, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s_q, h, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(b, cap, h_kv, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(b, cap, h_kv, d_v, device="cuda", generator=g).to(dtype)
    return q, k, v


def _paged(k, v, page_size, seed):
    """The dense (b, cap, h_kv, d) caches as a shuffled pool of pages and its page table."""
    b, cap = k.shape[:2]
    per = -(-cap // page_size)
    pad = per * page_size - cap
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(b * per, page_size, *k.shape[2:])
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(b * per, page_size, *v.shape[2:])
    g = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(b * per, generator=g).cuda()
    pool_k, pool_v = torch.empty_like(kp), torch.empty_like(vp)
    pool_k[perm], pool_v[perm] = kp, vp  # logical page i lives at pool page perm[i]
    table = perm.view(b, per).to(torch.int32).contiguous()
    return pool_k, pool_v, table


@pytest.mark.parametrize("hdims", HDIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "s_q,h,h_kv,causal,splits",
    [(1, 8, 2, False, 0), (1, 8, 8, False, 3), (4, 8, 2, True, 1), (8, 16, 2, True, 0),
     (3, 4, 1, True, 16), (40, 8, 2, True, 0)],
)  # fmt: skip
def test_dense_cache(hdims, dtype, s_q, h, h_kv, causal, splits):
    d, d_v = hdims
    q, k, v = _inputs(3, s_q, 1000, h, h_kv, d, d_v, dtype, seed=d + s_q)
    lens = torch.tensor([0, 1, 777], dtype=torch.int32, device="cuda")
    out, lse = _op(q, k, v, seqused_k=lens, causal=causal, splits=splits)
    _check(out, lse, _expected(q, k, v, lens.tolist(), causal=causal), dtype)


@pytest.mark.parametrize("page_size", [1, 16, 32, 48, 64, 256])
@pytest.mark.parametrize("splits", [1, 0, 5])
def test_paged(page_size, splits):
    d = 128
    q, k, v = _inputs(4, 2, 700, 8, 2, d, d, torch.bfloat16, seed=page_size + splits)
    pool_k, pool_v, table = _paged(k, v, page_size, seed=page_size)
    lens = [0, page_size * (600 // page_size), 699, 3]  # zero, at a page boundary, odd
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = _op(q, pool_k, pool_v, seqused_k=used, page_table=table, max_k=700, splits=splits)
    _check(out, lse, _expected(q, k, v, lens), torch.bfloat16)


@pytest.mark.parametrize("fp16", [False, True])
def test_paged_leftpad_boxes(fp16):
    """Note [tma boxes]: with leftpad 32 and 16 every whole block of a 64-row page crosses into
    the next page and goes by 16-row boxes; leftpad 8 puts a box across pages, so those blocks
    are gathered. Three sequences, one of each, with partial last blocks."""
    d, dtype = 128, torch.float16 if fp16 else torch.bfloat16
    q, k, v = _inputs(3, 2, 700, 8, 2, d, d, dtype, seed=11)
    pool_k, pool_v, table = _paged(k, v, 64, seed=3)
    lens, pad = [650, 600, 700], [32, 8, 16]
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    left = torch.tensor(pad, dtype=torch.int32, device="cuda")
    out, lse = _op(q, pool_k, pool_v, seqused_k=used, page_table=table, leftpad=left, max_k=700)
    _check(out, lse, _expected(q, k, v, lens, leftpad=pad), dtype)


@pytest.mark.parametrize("window", [(-1, -1), (100, -1), (64, 0)])
@pytest.mark.parametrize("splits", [1, 4])
def test_sink_causal_window(window, splits):
    d = 128
    q, k, v = _inputs(2, 6, 512, 8, 2, d, d, torch.bfloat16, seed=7)
    sink = torch.randn(8, device="cuda") * 2
    lens = [500, 0]  # sequence 1 sees no key: lse = sink, out = 0
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    causal = window[1] == 0
    out, lse = _op(q, k, v, seqused_k=used, sink=sink, causal=causal, window=window, splits=splits)
    kw = {"causal": causal, "window_size": window}
    _check(out, lse, _expected(q, k, v, lens, sink=sink, **kw), torch.bfloat16)


def test_kv_batch_idx_leftpad_softcap():
    d = 64
    q, _, _ = _inputs(3, 2, 10, 8, 4, d, d, torch.float16, seed=3)
    _, k, v = _inputs(5, 1, 300, 8, 4, d, d, torch.float16, seed=4)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device="cuda")
    lens = torch.tensor([300, 17, 200], dtype=torch.int32, device="cuda")
    pad = torch.tensor([10, 17, 0], dtype=torch.int32, device="cuda")
    out, lse = _op(q, k, v, seqused_k=lens, kv_idx=idx, leftpad=pad, causal=True, softcap=5.0)
    exp = _expected(q, k[idx.long()], v[idx.long()], lens.tolist(), leftpad=pad.tolist(),
                    causal=True, softcap=5.0)  # fmt: skip
    _check(out, lse, exp, torch.float16)


@pytest.mark.parametrize("splits", [1, 0, 3])
def test_varlen_paged_seqused_q(splits):
    d = 128
    lens_q, used_q, lens_k = [3, 1, 5], [2, 1, 0], [100, 257, 64]
    b = len(lens_q)
    q, k, v = _inputs(b, max(lens_q), 300, 8, 2, d, d, torch.bfloat16, seed=11)
    pool_k, pool_v, table = _paged(k, v, 16, seed=5)
    qv = torch.cat([q[i, : lens_q[i]] for i in range(b)])
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device="cuda")
    uq = torch.tensor(used_q, dtype=torch.int32, device="cuda")
    uk = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    out, lse = _op(qv, pool_k, pool_v, cu_q=cu, seqused_k=uk, seqused_q=uq, page_table=table,
                   max_q=5, max_k=300, causal=True, splits=splits)  # fmt: skip
    for i in range(b):
        qi = q[i : i + 1, : used_q[i]]
        exp = _expected(qi, k[i : i + 1], v[i : i + 1], [lens_k[i]], causal=True)
        rows = slice(int(cu[i]), int(cu[i]) + used_q[i])
        _check(out[rows].unsqueeze(0), lse[:, rows].unsqueeze(0), exp, torch.bfloat16)
        rest = slice(int(cu[i]) + used_q[i], int(cu[i + 1]))
        assert torch.equal(out[rest], torch.zeros_like(out[rest]))
        assert torch.isneginf(lse[:, rest]).all()


def test_cuda_graph_replay():
    d = 128
    q, k, v = _inputs(4, 1, 4096, 32, 8, d, d, torch.bfloat16, seed=9)
    pool_k, pool_v, table = _paged(k, v, 64, seed=9)
    used = torch.tensor([4096, 100, 2000, 1], dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _op(q, pool_k, pool_v, seqused_k=used, page_table=table, max_k=4096)  # warm up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, lse = torch.ops.fa4._fwd_kernel(
                q, pool_k, pool_v, None, None, used, None, table, None, None, None, 0, 4096,
                False, d**-0.5, -1, -1, 0.0, False, 0, 0, 0, None,
            )  # fmt: skip
    torch.cuda.current_stream().wait_stream(stream)
    for lens in ([4096, 100, 2000, 1], [7, 4000, 0, 3000]):
        used.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, lse, _expected(q, k, v, lens), torch.bfloat16)


def test_long_sequence_heuristic_splits():
    """batch 1 x 8 KV heads over 64k keys: the heuristic splits every tile many ways."""
    d = 128
    q, k, v = _inputs(1, 1, 65536, 32, 8, d, d, torch.bfloat16, seed=1)
    used = torch.tensor([65536], dtype=torch.int32, device="cuda")
    out, lse = _op(q, k, v, seqused_k=used)
    _check(out, lse, _expected(q, k, v, [65536]), torch.bfloat16)
