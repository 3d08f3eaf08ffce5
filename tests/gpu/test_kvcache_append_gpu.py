"""fa4::_kv_append_kernel (csrc/api/kv_append.cu) through fa4.kvcache.append_rotary: bit for bit
the torch path (on the GPU and on the CPU; Note [rotary rounding]), every vector width, paged
and batch-indexed caches, the drops of out-of-range rows, and CUDA-graph capture and replay."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from kvcache_helpers import make_case, naive
from torch._subclasses.fake_tensor import FakeTensorMode

from fa4 import kvcache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.is_available() and not kvcache.kernel_available(),
        reason="this build of fa4._C has no fa4::_kv_append_kernel",
    ),
]


def kernel(case):
    """append_rotary on CUDA copies, asserting that the compiled op runs it."""
    args, kw = case.args(device="cuda")
    assert kvcache._kernel_fits(
        *args[:5], kw.get("rotary_cos"), kw.get("rotary_sin"), kw["rotary_interleaved"]
    ), "the layout should suit the kernel"
    q_used = kvcache.append_rotary(*args, **kw)
    return q_used, args[1], args[2]


def torch_path(case, device):
    args, kw = case.args(device=device)
    q_used = kvcache.append_rotary_torch(
        *args, kw.get("rotary_cos"), kw.get("rotary_sin"), kw["rotary_interleaved"],
        kw.get("cache_batch_idx"), kw.get("page_table"), kw["rotate_q_per_row"],
    )  # fmt: skip
    return q_used, args[1], args[2]


def assert_same(got, want, what=("q", "k_cache", "v_cache")):
    for name, g, w in zip(what, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g.cpu(), w.cpu()), f"{name}: differs in {(g.cpu() != w.cpu()).sum()}"


def check(case):
    got = kernel(case)
    assert_same(got, torch_path(case, "cuda"))
    assert_same(got, torch_path(case, "cpu"))
    return got


HDIMS = [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d, d_v", HDIMS)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary", ["full", "half", "none"])
def test_matches_torch_path(dtype, d, d_v, interleaved, rotary):
    rotary_dim = {"full": d, "half": d // 2, "none": 0}[rotary]
    case = make_case(dtype=dtype, d=d, d_v=d_v, h=8, h_kv=2, s_cache=64, rotary_dim=rotary_dim,
                     interleaved=interleaved, seed=d)  # fmt: skip
    check(case)


@pytest.mark.parametrize(
    "rotary_dim, interleaved", [(24, False), (20, False), (20, True), (2, True)]
)
def test_narrow_vectors(rotary_dim, interleaved):
    """rotary_dim / 2 = 12 gives 8-byte vectors, 10 and interleaved 2 give 4-byte ones."""
    check(make_case(d=64, d_v=64, rotary_dim=rotary_dim, interleaved=interleaved, seed=30))


def test_matches_naive():
    case = make_case(d=64, d_v=32, rotary_dim=32, page_size=16, batch_idx=True, per_row=True,
                     s_cache=48, seed=31)  # fmt: skip
    assert_same(kernel(case), naive(case))


@pytest.mark.parametrize("page_size", [1, 16, 256])
@pytest.mark.parametrize("batch_idx", [False, True])
def test_paged(page_size, batch_idx):
    check(make_case(d=128, d_v=128, rotary_dim=64, page_size=page_size, batch_idx=batch_idx,
                    s_cache=300, s_new=5, per_row=True, seed=32))  # fmt: skip


@pytest.mark.parametrize("seqlens", [[0, 0], [16, 32], [15, 31], [59, 11]])
def test_seqlens_edges(seqlens):
    """Empty caches, appends at a page boundary, across one, and up to the cache's end."""
    check(make_case(d=64, d_v=64, rotary_dim=64, seqlens=seqlens, s_cache=64, page_size=16,
                    seed=33))  # fmt: skip


@pytest.mark.parametrize("s_new, new_kv", [(1, True), (0, True), (5, False)])
def test_lengths_and_q_only(s_new, new_kv):
    check(make_case(d=128, d_v=128, s_new=s_new, new_kv=new_kv, per_row=True, seed=34))


def test_many_blocks():
    """A prefill-sized append: 3 x 257 rows of 8 heads into pages of 16."""
    check(make_case(b=3, s_q=257, h=16, h_kv=8, d=128, d_v=128, s_new=257, s_cache=600,
                    rotary_dim=128, page_size=16, per_row=True, seed=35))  # fmt: skip


def test_denormals_kept():
    """fp32 subnormal products survive (no flush to zero under --use_fast_math)."""
    case = make_case(d=64, d_v=64, rotary_dim=64, seed=36)
    case.k_new = case.k_new * 1e-36
    case.q = case.q * 1e-36
    got = check(case)
    assert (got[0].float().abs() < 1.2e-38).any(), "the case should reach subnormals"


def test_strided_views():
    """Views made on the GPU: k_new rows 66 elements apart (4-byte vectors), and a q one element
    off its allocation (not 4-byte aligned: the torch path)."""
    case = make_case(d=64, d_v=64, rotary_dim=32, seed=37)
    want = torch_path(case, "cpu")
    for arg, view in (
        (3, lambda t: F.pad(t, (0, 2))[..., :64]),
        (0, lambda t: F.pad(t, (1, 0))[..., 1:]),
    ):
        args, kw = case.args(device="cuda")
        args = list(args)
        args[arg] = view(args[arg])
        fits = kvcache._kernel_fits(*args[:5], kw["rotary_cos"], kw["rotary_sin"], False)
        assert fits == (arg == 3)
        q_used = kvcache.append_rotary(*args, **kw)
        assert_same((q_used, args[1], args[2]), want)


def test_packed_cache_views():
    """k_cache and v_cache as the halves of one (pages, page_size, h_kv, 2d) tensor, written in
    place through the views."""
    case = make_case(d=64, d_v=64, rotary_dim=64, page_size=16, s_cache=64, seed=46)
    want = torch_path(case, "cpu")
    args, kw = case.args(device="cuda")
    packed = torch.cat([args[1], args[2]], dim=-1)
    args = (args[0], packed[..., :64], packed[..., 64:], *args[3:])
    q_used = kvcache.append_rotary(*args, **kw)
    assert_same((q_used, packed[..., :64], packed[..., 64:]), want)


def test_out_of_range_rows_are_dropped():
    """What the CPU path rejects: the kernel writes nothing outside the tensors, drops the rows
    past the cache or behind a bad page, and gives NaN past the cos/sin table."""
    case = make_case(d=64, d_v=64, rotary_dim=64, seqlens=[62, 0], s_cache=64, s_new=4, s_q=1,
                     seqlen_ro=64, seed=38)  # fmt: skip
    got = kernel(case)
    # The same append into caches two rows longer, cut back: rows 64 and 65 are the dropped ones.
    longer = replace(case, k_cache=torch.cat([case.k_cache, case.k_cache[:, :2]], 1),
                     v_cache=torch.cat([case.v_cache, case.v_cache[:, :2]], 1))  # fmt: skip
    q_want, k_want, v_want = torch_path(longer, "cpu")
    assert_same(got, (q_want, k_want[:, :64], v_want[:, :64]))

    case = make_case(d=64, d_v=64, rotary_dim=64, seqlens=[60, 0], s_cache=64, s_new=4,
                     seqlen_ro=62, seed=39)  # fmt: skip
    _, k_cache, _ = kernel(case)
    assert k_cache[0, 62:].isnan().all() and not k_cache[0, :62].isnan().any()

    case = make_case(d=64, d_v=64, rotary_dim=0, seqlens=[0, 6], s_cache=16, s_new=4,
                     page_size=4, seed=40)  # fmt: skip
    table = case.kw["page_table"]
    table[1, 2] = -1  # positions 8, 9 of sequence 1
    before = case.k_cache.clone()
    _, k_cache, _ = kernel(case)
    assert torch.equal(k_cache[table[1, 1], 2:].cpu(), case.k_new[1, :2].contiguous())
    others = torch.ones(k_cache.shape[0], dtype=torch.bool)
    others[table[0, 0]], others[table[1, 1]] = False, False
    assert torch.equal(k_cache[others].cpu(), before[others])


def test_op_checks_its_arguments():
    case = make_case(d=64, d_v=64, rotary_dim=64, seed=41)
    args, kw = case.args(device="cuda")
    q, k_cache, v_cache, k_new, v_new, seqlens = args
    cos, sin = kw["rotary_cos"], kw["rotary_sin"]
    with pytest.raises(RuntimeError, match="fa4: q_out: must be given exactly when rotary_cos"):
        torch.ops.fa4._kv_append_kernel(q, k_cache, v_cache, k_new, v_new, seqlens, cos, sin,
                                        None, False, None, None, False)  # fmt: skip
    with pytest.raises(RuntimeError, match="fa4: k_cache: batch must equal q's"):
        torch.ops.fa4._kv_append_kernel(q, k_cache[:1], v_cache[:1], k_new, v_new, seqlens, None,
                                        None, None, False, None, None, False)  # fmt: skip


def test_fake_tensor_mode():
    case = make_case(d=64, d_v=64, rotary_dim=64, seed=42)
    args, kw = case.args(device="cuda")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(a) for a in args]
        fkw = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        out = kvcache.append_rotary(*fake, **fkw)
    assert out.shape == case.q.shape


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_cuda_graph_replay(path):
    """Captured once, replayed with new lengths and rows: each replay equals an eager call."""
    case = make_case(d=128, d_v=128, rotary_dim=64, page_size=16, s_cache=128, per_row=True,
                     seqlens=[0, 0], seed=43)  # fmt: skip
    args, kw = case.args(device="cuda")
    q, k_cache, v_cache, k_new, v_new, seqlens = args
    rot = (kw["rotary_cos"], kw["rotary_sin"], False, None, kw["page_table"], True)

    def step():
        if path == "kernel":
            return kvcache.append_rotary(q, k_cache, v_cache, k_new, v_new, seqlens, **kw)
        return kvcache.append_rotary_torch(q, k_cache, v_cache, k_new, v_new, seqlens, *rot)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for i, lens in enumerate(([3, 40], [17, 0], [100, 123])):
        new = make_case(d=128, d_v=128, rotary_dim=64, page_size=16, s_cache=128, seed=44 + i)
        case.q, case.k_new, case.v_new, case.seqlens = new.q, new.k_new, new.v_new, lens
        case.k_cache, case.v_cache = k_cache.cpu(), v_cache.cpu()
        want = torch_path(case, "cpu")
        for dst, src in ((q, new.q), (k_new, new.k_new), (v_new, new.v_new)):
            dst.copy_(src)
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert_same((out, k_cache, v_cache), want)


def test_torch_compile():
    """Traced through the op's fake (the caches as mutated inputs): same as eager."""
    case = make_case(d=64, d_v=64, rotary_dim=32, page_size=16, per_row=True, seed=45)
    args, kw = case.args(device="cuda")
    compiled = torch.compile(kvcache.append_rotary, backend="aot_eager")
    q_used = compiled(*args, **kw)
    assert_same((q_used, args[1], args[2]), torch_path(case, "cpu"))
